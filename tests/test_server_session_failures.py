"""
Server-side sessions when things happen at once or go wrong, on real sockets: a
listening gateway with browser login and a C{kvstore} state provider on a real
redis-server (L{tests.support.redis}), the fake OpenID provider and a recording backend
that can hold a server-sent-events stream open (L{tests.support.sessions}).

  - A refresh in flight does not resurrect a session ended meanwhile (back-channel or
    front-channel logout), nor let the request that waited for it go on.
  - Back-channel logout: a store failure after the logout token's C{jti} was taken
    does not make the IdP's retry of the same token a replay; the IdP's connection
    going away does not abandon the ending; a login of the user during a logout by
    C{sub} stays in the index; a logout token naming the IdP's C{sub} ends the user's
    sessions under any C{identity.subjectClaim}; a chunked body over the cap is refused
    while it streams in.
  - A client leaving while its session is read: the cancelled request goes no further.
  - Public routes never touch the store (a frozen Redis does not hold them up).
  - The opened-record cache keeps no record over C{MAX_OPENED_SIZE}, as the cookie
    cache, so its memory is not a matter of what IdP accounts carry.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.server import Request

from edgegw.identity.session_cookie import MAX_OPENED_SIZE
from edgegw.sessions.server import ServerSessions
from edgegw.state.kvstore import KvStoreService
from edgegw.state.store import StoreUnavailableError
from tests.support.backends import SiteBackend
from tests.support.browser import USER_AGENT, Browser, BrowserResponse
from tests.support.fake_idp import FakeIdP
from tests.support.rawclient import connect
from tests.support.redis import RedisServer, redis_server
from tests.support.sessions import COOKIE, SessionGateway, open_stream, sleep, stream_backend

reactor: Any = _reactor

LOGOUT_TYP = {"typ": "logout+jwt"}


class World:
    """
    A redis-server, the fake IdP, a backend and one gateway with server-side sessions
    (a L{SessionGateway}).

    Routes: C{/app/} (app, login required, forwardAccessToken), C{/api/} (service,
    login required, forwardAccessToken), C{/open/} (app, public).
    """

    def __init__(self, test: TestCase) -> None:
        self.test = test
        self.redis: RedisServer
        self.idp: FakeIdP
        self.backend: SiteBackend
        self.held: list[Request]
        self.gw: SessionGateway

    async def start(self, token_lifetime: int = 300, identity_extra: str = "") -> World:
        test = self.test
        self.redis = await redis_server(test)
        self.idp = FakeIdP()
        self.idp.token_lifetime = token_lifetime
        await self.idp.start(test)
        self.backend, self.held = stream_backend()
        test.addCleanup(self.backend.stop)
        gateway = SessionGateway(
            test, self.idp, self.backend, self.redis, identity_extra=identity_extra
        )
        self.gw = await gateway.start()
        return self

    @property
    def port(self) -> int:
        return self.gw.port

    @property
    def store(self) -> KvStoreService:
        return self.gw.store

    @property
    def sessions(self) -> ServerSessions:
        sessions = self.gw.gateway.sessions
        assert sessions is not None
        return sessions

    def url(self, path: str) -> str:
        return self.gw.url(path)

    async def login(self) -> Browser:
        """
        A browser logged in (the callback's redirect not followed).
        """
        browser = Browser()
        start = await browser.get(self.url(f"/auth/login?return_to={quote('/open/x', safe='')}"))
        assert start.status == 302 and start.location is not None, start
        at_idp = await browser.get(start.location)
        assert at_idp.location is not None, at_idp
        back = await browser.get(at_idp.location)
        self.test.assertEqual(back.status, 302, back.body)
        self.test.assertIn(COOKIE, browser.cookies)
        return browser

    def session_id(self, browser: Browser) -> str:
        return self.gw.session_id(browser.cookies[COOKIE])

    async def stored(self, browser: Browser) -> bytes | None:
        """
        The sealed record of C{browser}'s session in Redis now (L{None}: none).
        """
        return await self.store.get(self.session_id(browser).encode("ascii"))

    async def gone(self, browser: Browser) -> bool:
        """
        Whether C{browser}'s session record is gone from Redis.
        """
        return await self.stored(browser) is None

    async def api(self, browser: Browser) -> BrowserResponse:
        return await browser.get(self.url("/api/data"))

    async def backchannel(self, token: str) -> BrowserResponse:
        return await Browser().request(
            "POST",
            self.url("/auth/backchannel-logout"),
            {"Content-Type": "application/x-www-form-urlencoded"},
            urlencode({"logout_token": token}).encode("ascii"),
            cookies=False,
        )

    async def until_refresh_started(self, within: float = 5.0) -> None:
        deadline = reactor.seconds() + within
        while self.idp.refresh_grants == 0:
            if reactor.seconds() > deadline:
                raise AssertionError("no refresh grant reached the IdP")
            await sleep(0.01)


class RefreshVersusLogoutTests(TestCase):
    """
    A refresh that lands after the session was ended does not write it back, nor let
    the request that waited for it go on.

    The IdP issues 30 s tokens at login (inside the 60 s refreshSkew: the first request
    of the session refreshes) and answers the refresh grant after 1.5 s; the session is
    ended by a back-channel logout while the refresh is in flight.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start(token_lifetime=30)
        self.browser = await self.w.login()
        self.w.idp.token_lifetime = 3600
        self.w.idp.refresh_delay = 1.5

    async def logout_during_refresh(self) -> None:
        w = self.w
        await w.until_refresh_started()
        ended = await w.backchannel(
            w.idp.mint_logout_token(sid=w.idp.sessions[-1], header=LOGOUT_TYP)
        )
        self.assertEqual(ended.status, 200, ended.body)
        self.assertTrue(await w.gone(self.browser), "the logout deleted the record")

    async def test_refresh_in_flight_does_not_resurrect_a_backchannel_logout(self) -> None:
        w = self.w
        waiting = Deferred.fromCoroutine(w.api(self.browser))
        await self.logout_during_refresh()
        await waiting
        self.assertEqual(w.idp.refresh_grants, 1)
        # The IdP ended the user's session: nothing of it may be left in the store, and
        # the browser (which still holds its cookie: back-channel logout cannot clear
        # it) is not authenticated any more.
        self.assertTrue(
            await w.gone(self.browser),
            "the refresh that landed after the back-channel logout wrote the record back",
        )
        after = await w.api(self.browser)
        self.assertEqual(after.status, 401, "the session outlived its back-channel logout")

    async def test_stream_admitted_during_refresh_is_closed_by_the_logout(self) -> None:
        """
        A server-sent-events request waiting for the refresh when the session is ended
        must not end up as an open stream of the ended session.
        """
        w = self.w
        stream = await open_stream(
            w.port, "/app/events", self.browser.cookies[COOKIE], first_event=False
        )
        self.addCleanup(lambda: None if stream.closed.called else stream.close())
        await self.logout_during_refresh()
        # The refresh lands 1.5 s after it began; then give the gateway time to close
        # (or never open) the stream.
        await sleep(2.5)
        opened = b"data: hello" in stream.received
        self.assertFalse(
            opened and not stream.closed.called,
            "a stream of the back-channel-logged-out session is still open: "
            + repr(stream.received[:200]),
        )


class BackchannelStoreFailureTests(TestCase):
    """
    The logout token's jti is spent before the sessions are ended: a store failure
    after that, or the IdP going away, must not leave the sessions alive.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()
        self.browser = await self.w.login()
        response = await self.w.api(self.browser)
        self.assertEqual(response.status, 200)

    async def test_retry_after_a_store_failure_is_not_refused_as_a_replay(self) -> None:
        """
        The store fails once after the jti was taken (a timeout on the index read): 503,
        which tells the IdP to retry. The retry of the same token must end the session.
        """
        w = self.w
        store = w.store
        real = store.index_members
        failures = [1]

        def flaky(index_key: bytes) -> Deferred[frozenset[bytes]]:
            if failures[0]:
                failures[0] -= 1
                d: Deferred[frozenset[bytes]] = Deferred()
                d.errback(StoreUnavailableError("no answer from Redis within 1s"))
                return d
            return real(index_key)

        store.index_members = flaky  # type: ignore[method-assign]
        self.addCleanup(setattr, store, "index_members", real)
        token = w.idp.mint_logout_token(sid=w.idp.sessions[-1], header=LOGOUT_TYP)
        first = await w.backchannel(token)
        self.assertEqual(first.status, 503, first.body)
        retried = await w.backchannel(token)
        self.assertEqual(
            retried.status,
            200,
            f"the retry of a logout that was never done was refused: {retried.body!r}",
        )
        self.assertEqual((await w.api(self.browser)).status, 401)

    async def test_idp_leaving_mid_logout_does_not_abandon_it(self) -> None:
        """
        The store is slow (0.5 s, within its 1 s timeout) when the sessions are looked
        up, and the IdP's HTTP client gives up after 0.2 s. The logout token was valid
        and its jti is spent: the gateway must still end the session.
        """
        w = self.w
        store = w.store
        real = store.index_members

        async def slow(index_key: bytes) -> frozenset[bytes]:
            await sleep(0.5)
            return await real(index_key)

        store.index_members = (  # type: ignore[method-assign]
            lambda index_key: Deferred.fromCoroutine(slow(index_key))
        )
        self.addCleanup(setattr, store, "index_members", real)
        token = w.idp.mint_logout_token(sid=w.idp.sessions[-1], header=LOGOUT_TYP)
        body = urlencode({"logout_token": token}).encode("ascii")
        client = await connect(w.port)
        client.send(
            b"POST /auth/backchannel-logout HTTP/1.1\r\n"
            + f"Host: 127.0.0.1:{w.port}\r\n".encode()
            + b"Content-Type: application/x-www-form-urlencoded\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        await sleep(0.2)
        await client.close()
        await sleep(1.5)
        self.assertTrue(await w.gone(self.browser), "the session record was left")
        self.assertEqual(
            (await w.api(self.browser)).status,
            401,
            "the IdP's disconnect cancelled the logout: the session is still alive",
        )


class BackchannelIndexRaceTests(TestCase):
    """
    Ending the sessions of a C{sub} reads the index (C{SMEMBERS}) and ends those
    sessions. A login of the same user that lands in between adds its id to the index;
    deleting the whole index afterwards (C{DEL}) would drop it, and a later logout of
    that user would miss the new session.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()

    async def test_a_login_during_a_logout_by_sub_stays_in_the_index(self) -> None:
        w = self.w
        await w.login()
        store = w.store
        real = store.index_members

        async def slow(index_key: bytes) -> frozenset[bytes]:
            # The members are read at once; ending them takes a while (a slow store, a
            # user with many sessions).
            members = await real(index_key)
            await sleep(0.5)
            return members

        store.index_members = (  # type: ignore[method-assign]
            lambda index_key: Deferred.fromCoroutine(slow(index_key))
        )
        first = Deferred.fromCoroutine(
            w.backchannel(w.idp.mint_logout_token(sub="alice", header=LOGOUT_TYP))
        )
        await sleep(0.1)
        late = await w.login()
        self.assertEqual((await first).status, 200)
        store.index_members = real  # type: ignore[method-assign]
        self.assertEqual((await w.api(late)).status, 200, "logged in after the first logout")
        second = await w.backchannel(w.idp.mint_logout_token(sub="alice", header=LOGOUT_TYP))
        self.assertEqual(second.status, 200, second.body)
        self.assertEqual(
            (await w.api(late)).status,
            401,
            "a logout of the user missed the session that logged in during the previous one",
        )


class BackchannelBySubjectTests(TestCase):
    """
    With C{identity.subjectClaim: email}, the principal's subject is the e-mail
    address; a logout token names the IdP's C{sub} (OIDC Back-Channel Logout 1.0, 2.4:
    the same C{sub} as the id_token's), and ends the sessions all the same.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start(identity_extra="    subjectClaim: email")
        self.browser = await self.w.login()
        response = await self.w.api(self.browser)
        self.assertEqual(response.status, 200)
        seen = self.w.backend.requests[-1].header(b"X-User-Id")
        self.assertEqual(seen, b"alice@example.com")

    async def test_logout_by_the_idp_sub_ends_the_users_sessions(self) -> None:
        w = self.w
        ended = await w.backchannel(w.idp.mint_logout_token(sub="alice", header=LOGOUT_TYP))
        self.assertEqual(ended.status, 200, ended.body)
        self.assertEqual(
            (await w.api(self.browser)).status,
            401,
            "a logout token naming the user's sub ended none of the user's sessions",
        )


class PublicRouteTests(TestCase):
    """
    A public route and a frozen Redis (SIGSTOP: connections stay open, nothing answers;
    the store timeout is 1 s): public routes never read the store.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()

    async def test_public_route_does_not_wait_for_a_frozen_store(self) -> None:
        w = self.w
        browser = await w.login()
        self.assertEqual((await w.api(browser)).status, 200)
        w.redis.pause()
        started = reactor.seconds()
        response = await browser.get(w.url("/open/x"))
        took = reactor.seconds() - started
        self.assertEqual((response.status, response.body), (200, b"backend"))
        self.assertLess(
            took,
            0.5,
            f"a public route waited {took:.2f}s on the state store (timeout 1s); "
            "docs/architecture.md: public routes never touch the store",
        )


class CancelledReadTests(TestCase):
    """
    A client that leaves while its session is read from the store: the cancelled chain
    goes no further. Were the cancellation taken for L{StoreUnavailableError} and that
    for "no session", the chain would go on: on a public route into the proxy, whose
    request has lost its exchange (C{TypeError}, logged as an unhandled error in the
    route) -- or, had it not, a request of a client that is gone would be sent upstream.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()

    async def test_a_request_whose_client_left_goes_no_further(self) -> None:
        w = self.w
        browser = await w.login()
        self.assertEqual((await w.api(browser)).status, 200)
        w.redis.pause()
        client = await connect(w.port)
        client.send(
            b"GET /open/gone HTTP/1.1\r\n"
            + f"Host: 127.0.0.1:{w.port}\r\nUser-Agent: {USER_AGENT}\r\n".encode()
            + f"Cookie: {COOKIE}={browser.cookies[COOKIE]}\r\n\r\n".encode()
        )
        await sleep(0.2)
        await client.close()
        await sleep(1.5)
        errors = [str(f.value) for f in self.flushLoggedErrors()]
        self.assertEqual(errors, [], "the cancelled request ran on into the proxy")
        self.assertNotIn(
            b"/open/gone",
            [r.uri for r in w.backend.requests],
            "the request of a client that had left was sent upstream",
        )


class OpenedCacheTests(TestCase):
    """
    The opened-record cache of server-side sessions is bounded in bytes too.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()

    async def test_large_records_are_not_kept_opened(self) -> None:
        w = self.w
        # A user in many groups (what directories commonly hold): a record of tens of
        # kilobytes, well under every limit the login applies.
        w.idp.user["groups"] = [f"cn={'g' * 200}{i},ou=groups,dc=example,dc=com" for i in range(40)]
        browser = await w.login()
        response = await w.api(browser)
        self.assertEqual(response.status, 200)
        sealed = await w.stored(browser)
        assert sealed is not None
        self.assertGreater(len(sealed), MAX_OPENED_SIZE)
        kept = [value for (_, value) in w.sessions._opened]
        self.assertEqual(
            [len(value) for value in kept if len(value) > MAX_OPENED_SIZE],
            [],
            "the server-side record cache keeps records of any size (up to "
            f"{len(w.sessions._opened)} x the largest an IdP account makes); the cookie "
            f"cache keeps none over {MAX_OPENED_SIZE} bytes",
        )


class ChunkedBackchannelTests(TestCase):
    """
    A back-channel logout body without Content-Length (chunked) and over the 32 KiB cap:
    refused while it streams in, never buffered whole; the session survives.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await World(self).start()

    async def test_oversized_chunked_body_refused_while_streaming(self) -> None:
        w = self.w
        browser = await w.login()
        client = await connect(w.port)
        self.addCleanup(client.close)
        client.send(
            b"POST /auth/backchannel-logout HTTP/1.1\r\n"
            + f"Host: 127.0.0.1:{w.port}\r\n".encode()
            + b"Content-Type: application/x-www-form-urlencoded\r\n"
            + b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 8192
        for _ in range(6):  # 48 KiB, past the cap; the last chunk never comes
            client.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        head = await client.until(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), head[:200])
        self.assertIn(b"invalid_request", await client.until(b"invalid_request"))
        self.assertEqual((await w.api(browser)).status, 200)
