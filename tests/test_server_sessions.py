"""
Server-side sessions in Redis (issue 14), end to end on real sockets: a listening
gateway with browser login and a C{kvstore} state provider, a real redis-server on a
free loopback port (L{tests.support.redis}), the fake OpenID provider
(L{tests.support.fake_idp}) and a recording backend.

The store is read and written behind the gateway's back through a plain Redis
connection (L{RedisProbe}), to see what the gateway stores and to tamper with it.
"""

from __future__ import annotations

import os
import secrets
from typing import Any
from urllib.parse import urlencode

import jwt
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Request
from zope.interface import provider

from edgegw.assembly.assemble import build_gateway
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.identity.sealing import SESSION_RECORD_AAD, Sealer
from edgegw.state.store import StoreUnavailableError
from tests.support.backends import RecordedRequest, SiteBackend
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import problems_of, write_tree
from tests.support.fake_idp import FakeIdP, SigningKey
from tests.support.rawclient import RawClient
from tests.support.redis import RedisProbe, RedisServer, TestCA, redis_server
from tests.support.sessions import (
    COOKIE,
    KEY,
    OTHER_KEY,
    PREFIX,
    SessionGateway,
    index_key,
    open_stream,
    server_session_config,
    sleep,
    stream_backend,
)

reactor: Any = _reactor

LOGOUT_TYP = {"typ": "logout+jwt"}
"""The header of an explicitly typed logout token (Back-Channel Logout 1.0, 2.4)."""

SESSION_TTL = 8 * 3600
"""The session block's default ttl."""


class World:
    """
    What every test here has: a redis-server, the fake IdP, a backend (with a streaming
    path) and one gateway over them; more gateways can share them.
    """

    def __init__(
        self,
        test: TestCase,
        redis: RedisServer,
        idp: FakeIdP,
        backend: SiteBackend,
        held: list[Request],
    ) -> None:
        self.test = test
        self.redis = redis
        self.idp = idp
        self.backend = backend
        self.held = held
        self.probe = RedisProbe(redis)
        self.gw: SessionGateway

    async def gateway(self, wait_for_store: bool = True, **options: Any) -> SessionGateway:
        gateway = SessionGateway(self.test, self.idp, self.backend, self.redis, **options)
        return await gateway.start(wait_for_store)

    def last_request(self, path_prefix: bytes) -> RecordedRequest:
        for request in reversed(self.backend.requests):
            if request.uri.startswith(path_prefix):
                return request
        raise AssertionError(f"the backend received no request for {path_prefix!r}")


async def world(
    test: TestCase, *, tls: bool = False, token_lifetime: int = 300, **options: Any
) -> World:
    redis = await redis_server(test, tls=tls)
    idp = FakeIdP()
    idp.token_lifetime = token_lifetime
    await idp.start(test)
    backend, held = stream_backend()
    test.addCleanup(backend.stop)
    built = World(test, redis, idp, backend, held)
    built.gw = await built.gateway(**options)
    return built


async def logged_in(w: World, gw: SessionGateway | None = None) -> Browser:
    """
    A browser logged in through C{gw} (the world's gateway by default), no request with
    its session made yet.
    """
    browser = Browser()
    back = await (gw or w.gw).login(browser)
    w.test.assertEqual((back.status, back.location), (302, "/open/landing"), back.body)
    w.test.assertIn(COOKIE, browser.cookies)
    return browser


def bearer(w: World, path_prefix: bytes) -> bytes | None:
    return w.last_request(path_prefix).header(b"Authorization")


async def app(w: World, browser: Browser, gw: SessionGateway | None = None) -> BrowserResponse:
    return await browser.get((gw or w.gw).url("/app/page"))


async def api(w: World, browser: Browser, gw: SessionGateway | None = None) -> BrowserResponse:
    return await browser.get((gw or w.gw).url("/api/data"))


async def backchannel(
    w: World,
    token: str | None = None,
    gw: SessionGateway | None = None,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> BrowserResponse:
    """
    POST a logout token to the back-channel logout endpoint as an IdP would: a form,
    no cookies (or C{body} as it is, with C{headers} added or replacing).
    """
    sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    raw = body if body is not None else urlencode({"logout_token": token or ""}).encode()
    url = (gw or w.gw).url("/auth/backchannel-logout")
    return await Browser().request("POST", url, sent, raw, cookies=False)


async def subscribed(test: TestCase, w: World, count: int = 1, within: float = 20.0) -> None:
    """
    Wait until C{count} connections listen on the logout channel (each gateway's).
    """
    deadline = reactor.seconds() + within
    while await w.probe.subscribers(PREFIX + "logout") < count:
        if reactor.seconds() > deadline:
            test.fail(f"fewer than {count} gateways listen for ended sessions")
        await sleep(0.05)


def refusal_reasons(test: TestCase) -> list[str]:
    """
    The reasons the back-channel logout endpoint logs for the requests it refuses, from
    now until C{test} ends.
    """
    reasons: list[str] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        text = formatEvent(event)
        if text.startswith("back-channel logout refused: "):
            reasons.append(text.removeprefix("back-channel logout refused: "))

    globalLogPublisher.addObserver(observe)
    test.addCleanup(globalLogPublisher.removeObserver, observe)
    return reasons


async def upstream_gone(request: Request, within: float = 5.0) -> None:
    """
    Wait until the backend's side of a held streaming request has lost its connection.
    """
    deadline = reactor.seconds() + within
    while not request._disconnected:
        if reactor.seconds() > deadline:
            raise AssertionError(f"the upstream stream was still open after {within}s")
        await sleep(0.02)


async def closed_within(stream: RawClient, seconds: float) -> None:
    """
    Wait until the gateway has closed C{stream}, failing after C{seconds}.
    """
    try:
        await stream.closed.addTimeout(seconds, reactor)
    except DeferredTimeoutError:
        raise AssertionError(f"the stream was still open {seconds}s later") from None


async def close_stream(stream: RawClient) -> None:
    if not stream.closed.called:
        await stream.close()


class SessionCheck:
    """
    Assertions on whether a browser's session counts at a gateway.
    """

    def __init__(self, test: TestCase, w: World) -> None:
        self.test = test
        self.w = w

    async def works(self, browser: Browser, gw: SessionGateway | None = None) -> None:
        response = await app(self.w, browser, gw)
        self.test.assertEqual(response.status, 200, response.body)
        self.test.assertEqual(self.w.last_request(b"/app/").header(b"X-User-Id"), b"alice")
        service = await api(self.w, browser, gw)
        self.test.assertEqual(service.status, 200, service.body)

    async def refused(self, browser: Browser, gw: SessionGateway | None = None) -> None:
        """
        The session does not count: an app route sends the browser to log in, a service
        route answers 401.
        """
        response = await app(self.w, browser, gw)
        self.test.assertEqual(response.status, 302, response.body)
        self.test.assertTrue((response.location or "").startswith("/auth/login"), response)
        service = await api(self.w, browser, gw)
        self.test.assertEqual(service.status, 401, service.body)


# -- 1, 2: the record --------------------------------------------------------------------


class RecordTests(TestCase):
    """
    What login stores, and records that must not open.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self)
        self.check = SessionCheck(self, self.w)

    async def test_login_stores_a_sealed_record_and_the_cookie_holds_only_its_id(self) -> None:
        w = self.w
        browser = await logged_in(w)
        # The cookie: one small value, a sealed session id, nothing of the user's.
        cookie = browser.cookies[COOKIE]
        self.assertEqual([name for name in browser.cookies if name.startswith(COOKIE)], [COOKIE])
        self.assertLess(len(cookie), 120, cookie)
        session_id = w.gw.session_id(cookie)
        self.assertRegex(session_id, r"^[A-Za-z0-9_-]{32}$")
        self.assertNotIn("alice", cookie)
        # The store: the record under prefix + id, and the two indexes; nothing else.
        sid = w.idp.sessions[-1]
        record_key = (PREFIX + session_id).encode()
        subject_index = PREFIX.encode() + index_key("sub", "alice")
        idp_index = PREFIX.encode() + index_key("idp", sid)
        self.assertEqual(await w.probe.keys(), {record_key, subject_index, idp_index})
        # The record lives as long as the session.
        ttl = await w.probe.pttl(record_key)
        self.assertLessEqual(ttl, SESSION_TTL * 1000)
        self.assertGreater(ttl, (SESSION_TTL - 30) * 1000)
        for index in (subject_index, idp_index):
            self.assertGreater(await w.probe.pttl(index), (SESSION_TTL - 30) * 1000)
            self.assertEqual(await w.probe.command("SMEMBERS", index), [session_id.encode("ascii")])
        # Sealed: none of what it holds can be read in Redis.
        sealed = await w.probe.get(record_key)
        assert sealed is not None
        record = await w.gw.stored_record(browser)
        assert record is not None
        self.assertEqual(record.subject, "alice")
        self.assertEqual(record.idp_session, sid)
        self.assertEqual(record.expires_at - record.issued_at, SESSION_TTL)
        assert record.access_token is not None
        assert record.refresh_token is not None
        assert record.id_token is not None
        for secret in (
            b"alice",
            record.access_token.encode(),
            record.refresh_token.encode(),
            record.id_token.encode(),
            record.access_token.split(".")[1].encode(),
            sid.encode(),
        ):
            self.assertNotIn(secret, sealed)
        # The session authenticates: identity headers on an app route, with the token.
        response = await app(w, browser)
        self.assertEqual(response.status, 200)
        seen = w.last_request(b"/app/")
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(seen.header(b"X-User-Email"), b"alice@example.com")
        self.assertEqual(seen.header(b"X-User-Groups"), b"admins")
        self.assertEqual(seen.header(b"Authorization"), b"Bearer " + record.access_token.encode())
        self.assertIsNone(seen.header(b"Cookie"))
        service = await api(w, browser)
        self.assertEqual(service.status, 200)
        self.assertEqual(w.last_request(b"/api/").header(b"X-User-Id"), b"alice")
        # Reading the session is one GET, and nothing else is asked of Redis.
        await w.probe.command("CONFIG", "RESETSTAT")
        self.assertEqual((await app(w, browser)).status, 200)
        stats = await w.probe.command("INFO", "commandstats")
        calls = {
            line.split(":", 1)[0].removeprefix("cmdstat_"): line
            for line in stats.decode().splitlines()
            if line.startswith("cmdstat_")
        }
        calls.pop("info", None)
        calls.pop("config|resetstat", None)
        self.assertEqual(list(calls), ["get"], calls)
        self.assertIn("calls=1,", calls["get"])
        # The session view says who, never a token.
        view = await browser.get(w.gw.url("/auth/session"))
        self.assertEqual(view.status, 200)
        self.assertEqual(view.json()["subject"], "alice")
        self.assertNotIn(record.access_token.encode(), view.body)

    async def test_without_the_record_the_cookie_is_nothing(self) -> None:
        w = self.w
        browser = await logged_in(w)
        await self.check.works(browser)
        self.assertEqual(await w.probe.command("DEL", w.gw.record_key(browser)), 1)
        await self.check.refused(browser)

    async def test_the_cookie_in_another_browser_is_no_session(self) -> None:
        w = self.w
        browser = await logged_in(w)
        thief = Browser(cookies=dict(browser.cookies), user_agent="another browser")
        await self.check.refused(thief)
        await self.check.works(browser)

    async def test_tampered_record(self) -> None:
        w = self.w
        browser = await logged_in(w)
        key = w.gw.record_key(browser)
        sealed = await w.probe.get(key)
        assert sealed is not None
        middle = len(sealed) // 2
        flipped = b"A" if sealed[middle : middle + 1] != b"A" else b"B"
        await w.probe.replace(key, sealed[:middle] + flipped + sealed[middle + 1 :])
        await self.check.refused(browser)
        # Put back as it was, the same cookie works: only the flipped byte mattered.
        await w.probe.replace(key, sealed)
        await self.check.works(browser)

    async def test_record_sealed_with_another_key(self) -> None:
        w = self.w
        browser = await logged_in(w)
        key = w.gw.record_key(browser)
        session_id = w.gw.session_id(browser.cookies[COOKIE])
        sealed = await w.probe.get(key)
        assert sealed is not None
        aad = SESSION_RECORD_AAD + PREFIX.encode() + session_id.encode()
        plaintext = Sealer(KEY.encode()).unseal(sealed, aad)
        assert plaintext is not None
        # The same plaintext, bound to the same key and prefix, under another key.
        other = Sealer(OTHER_KEY.encode()).seal(plaintext, aad).encode("ascii")
        await w.probe.replace(key, other)
        await self.check.refused(browser)
        # Sealed again under the gateway's key, it opens.
        await w.probe.replace(key, Sealer(KEY.encode()).seal(plaintext, aad).encode("ascii"))
        await self.check.works(browser)

    async def test_record_copied_to_another_session_id(self) -> None:
        w = self.w
        browser = await logged_in(w)
        # Used first, so that the gateway has seen (and opened) this very value before.
        await self.check.works(browser)
        sealed = await w.probe.get(w.gw.record_key(browser))
        assert sealed is not None
        # Another session id, with a genuine cookie naming it, holding a copy of the record.
        other_id = secrets.token_urlsafe(24)
        await w.probe.command("SET", PREFIX + other_id, sealed, "PX", 600_000)
        thief = Browser()
        thief.cookies[COOKIE] = w.gw.seal_session_id(other_id)
        await self.check.refused(thief)
        # The original still works.
        await self.check.works(browser)

    async def test_record_of_another_prefix(self) -> None:
        w = self.w
        # A second gateway with the same key, keeping its sessions under another prefix.
        other = await w.gateway(prefix="other:")
        browser = await logged_in(w, other)
        await self.check.works(browser, other)
        session_id = other.session_id(browser.cookies[COOKIE])
        sealed = await w.probe.get("other:" + session_id)
        assert sealed is not None
        await self.check.refused(browser, w.gw)
        # The same record copied under this gateway's prefix: the same cookie, which
        # this gateway can open, finds a record bound to the other prefix.
        await w.probe.command("SET", PREFIX + session_id, sealed, "PX", 600_000)
        await self.check.refused(browser, w.gw)
        await self.check.works(browser, other)


# -- 3 to 6: silent refresh --------------------------------------------------------------


class RefreshTests(TestCase):
    """
    Access tokens refreshed before the request goes on. The IdP issues tokens for 30s
    at login, within the 60s refreshSkew: the first request of the session finds its
    token due.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self, token_lifetime=30)
        self.check = SessionCheck(self, self.w)

    async def test_a_due_token_is_refreshed_before_the_request_goes_on(self) -> None:
        w = self.w
        browser = await logged_in(w)
        before = await w.gw.stored_record(browser)
        assert before is not None and before.access_token is not None
        self.assertEqual(w.idp.refresh_grants, 0)
        # Tokens issued from now on are not due at once.
        w.idp.token_lifetime = 3600
        response = await app(w, browser)
        self.assertEqual(response.status, 200)
        self.assertEqual(w.idp.refresh_grants, 1)
        sent = w.idp.token_requests[-1]
        self.assertEqual(sent["grant_type"], "refresh_token")
        self.assertEqual(sent["refresh_token"], before.refresh_token)
        after = await w.gw.stored_record(browser)
        assert after is not None and after.access_token is not None
        self.assertNotEqual(after.access_token, before.access_token)
        # The backend saw the new token, never the old one.
        self.assertEqual(bearer(w, b"/app/"), b"Bearer " + after.access_token.encode())
        assert after.access_token_expires_at is not None
        self.assertGreater(after.access_token_expires_at, reactor.seconds() + 3000)
        # The rest of the session is as it was.
        self.assertEqual(after.subject, before.subject)
        self.assertEqual(after.expires_at, before.expires_at)
        self.assertEqual(after.idp_session, before.idp_session)
        # Not due any more: the next request refreshes nothing.
        await self.check.works(browser)
        self.assertEqual(w.idp.refresh_grants, 1)
        self.assertEqual(bearer(w, b"/api/"), b"Bearer " + after.access_token.encode())

    async def test_concurrent_requests_of_a_session_refresh_once(self) -> None:
        w = self.w
        browser = await logged_in(w)
        before = await w.gw.stored_record(browser)
        assert before is not None
        w.idp.token_lifetime = 3600
        w.idp.refresh_delay = 1.0
        count = 20
        inflight = w.gw.gateway.inflight
        waiting = [0]

        def reached_backend() -> bool:
            return any(r.uri == b"/app/page" for r in w.backend.requests)

        async def watch() -> None:
            # How many requests were in the gateway at once before any reached the
            # backend, that is while they waited for the refresh.
            deadline = reactor.seconds() + 30
            while not reached_backend() and reactor.seconds() < deadline:
                waiting[0] = max(waiting[0], inflight.count)
                await sleep(0.01)

        watching = Deferred.fromCoroutine(watch())
        responses = await gatherResults(
            [Deferred.fromCoroutine(app(w, browser)) for _ in range(count)]
        )
        await watching
        self.assertEqual([r.status for r in responses], [200] * count)
        self.assertEqual(w.idp.refresh_grants, 1)
        self.assertGreater(waiting[0], 1)
        after = await w.gw.stored_record(browser)
        assert after is not None and after.access_token is not None
        self.assertNotEqual(after.access_token, before.access_token)
        seen = [r.header(b"Authorization") for r in w.backend.requests if r.uri == b"/app/page"]
        self.assertEqual(seen, [b"Bearer " + after.access_token.encode()] * count)

    async def test_rotated_refresh_tokens_are_used_in_turn(self) -> None:
        w = self.w
        self.assertTrue(w.idp.rotate_refresh_tokens)
        browser = await logged_in(w)
        first = await w.gw.stored_record(browser)
        assert first is not None and first.refresh_token is not None
        tokens: list[str] = []
        refresh_tokens = [first.refresh_token]
        # Every token issued is due at once (30s): each request refreshes.
        for expected in (1, 2):
            response = await app(w, browser)
            self.assertEqual(response.status, 200)
            self.assertEqual(w.idp.refresh_grants, expected)
            # Sent with the refresh token the last refresh stored, which was accepted.
            self.assertEqual(w.idp.token_requests[-1]["refresh_token"], refresh_tokens[-1])
            record = await w.gw.stored_record(browser)
            assert record is not None and record.access_token is not None
            assert record.refresh_token is not None
            self.assertNotIn(record.refresh_token, refresh_tokens)
            refresh_tokens.append(record.refresh_token)
            self.assertNotIn(record.access_token, tokens)
            tokens.append(record.access_token)
            self.assertEqual(bearer(w, b"/app/"), b"Bearer " + record.access_token.encode())
        # The first refresh token is spent at the IdP.
        spent = await Browser().post(
            w.idp.url("/token"),
            {"grant_type": "refresh_token", "refresh_token": first.refresh_token},
            headers={"Authorization": "Basic Z3c6Z3ctc2VjcmV0"},  # gw:gw-secret
        )
        self.assertEqual((spent.status, spent.json()["error"]), (400, "invalid_grant"))

    async def test_refused_refresh_before_expiry_keeps_the_session(self) -> None:
        w = self.w
        browser = await logged_in(w)
        before = await w.gw.stored_record(browser)
        assert before is not None and before.access_token is not None
        w.idp.refresh_error = "invalid_grant"
        response = await app(w, browser)
        self.assertEqual(response.status, 200)
        self.assertEqual(w.idp.refresh_grants, 1)
        # The old token is still valid: the request goes on with it.
        self.assertEqual(bearer(w, b"/app/"), b"Bearer " + before.access_token.encode())
        self.assertEqual(w.last_request(b"/app/").header(b"X-User-Id"), b"alice")
        self.assertEqual(await w.gw.stored_record(browser), before)
        await self.check.works(browser)


class RefusedThenExpiredTests(TestCase):
    """
    A refresh refused while the access token is valid keeps the session only until
    that token expires.
    """

    async def test_the_session_ends_once_the_token_refused_a_refresh_expires(self) -> None:
        """
        Tokens of 3s (due at once: refreshSkew 60s). The first request is refused a
        refresh while its token is still valid (on a machine too slow for that, the
        session has ended already, which the end checks as well); once the token has
        expired, the session must be over, whether or not the gateway asks the IdP
        again.
        """
        w = await world(self, token_lifetime=3)
        check = SessionCheck(self, w)
        browser = await logged_in(w)
        record = await w.gw.stored_record(browser)
        assert record is not None and record.access_token is not None
        expires = record.access_token_expires_at
        assert expires is not None
        w.idp.refresh_error = "invalid_grant"
        started = reactor.seconds()
        response = await app(w, browser)
        self.assertEqual(w.idp.refresh_grants, 1)
        if started < expires - 0.5:
            self.assertEqual(response.status, 200)
            self.assertEqual(bearer(w, b"/app/"), b"Bearer " + record.access_token.encode())
        while reactor.seconds() < expires + 0.2:
            await sleep(0.1)
        # The refresh token was refused and the access token has expired: no session.
        await check.refused(browser)


class ExpiredRefreshTests(TestCase):
    """
    A refresh that fails once the access token has expired (tokens of 1s).
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self, token_lifetime=1)
        self.check = SessionCheck(self, self.w)
        self.browser = await logged_in(self.w)
        record = await self.w.gw.stored_record(self.browser)
        assert record is not None and record.access_token_expires_at is not None
        self.record = record
        while reactor.seconds() < record.access_token_expires_at + 0.2:
            await sleep(0.1)

    async def test_refused_refresh_after_expiry_ends_the_session(self) -> None:
        w = self.w
        w.idp.refresh_error = "invalid_grant"
        response = await app(w, self.browser)
        self.assertEqual(response.status, 302)
        self.assertTrue((response.location or "").startswith("/auth/login"))
        self.assertEqual(w.idp.refresh_grants, 1)
        self.assertIsNone(await w.probe.get(w.gw.record_key(self.browser)))
        # Ended, not just refused once: the IdP is no longer asked.
        w.idp.refresh_error = None
        await self.check.refused(self.browser)
        self.assertEqual(w.idp.refresh_grants, 1)

    async def test_failed_refresh_after_expiry_keeps_the_session_without_its_token(self) -> None:
        """
        The token endpoint answers 500 (C{server_error}): not a refusal of the refresh
        token, so the session goes on (the record is kept as it was), but the expired
        access token is not forwarded: the backend gets the identity headers and no
        C{Authorization}.
        """
        w = self.w
        w.idp.refresh_error = "server_error"
        response = await app(w, self.browser)
        self.assertEqual(response.status, 200)
        self.assertEqual(w.idp.refresh_grants, 1)
        seen = w.last_request(b"/app/")
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertIsNone(seen.header(b"Authorization"))
        self.assertEqual(await w.gw.stored_record(self.browser), self.record)
        service = await api(w, self.browser)
        self.assertEqual(service.status, 200)
        self.assertIsNone(bearer(w, b"/api/"))


# -- 7: Redis away -----------------------------------------------------------------------

STORE_TIMEOUT = 1.0
"""The store timeout the gateways here are configured with (C{timeout: 1s})."""

BOUND = STORE_TIMEOUT + 4.0
"""The longest a request may take while Redis is away: the timeout, and slack for a
loaded machine (a request stuck on the store would take far longer)."""


async def timed(call: Any) -> tuple[BrowserResponse, float]:
    started = reactor.seconds()
    response = await call
    return response, reactor.seconds() - started


class StoreOutageTests(TestCase):
    """
    Redis stopped or frozen under a running gateway, then back.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self)
        self.check = SessionCheck(self, self.w)
        self.before = 0  # backend requests before the outage

    async def assert_fails_closed(self, browser: Browser) -> None:
        w = self.w
        response, took = await timed(app(w, browser))
        self.assertEqual(response.status, 302)
        self.assertTrue((response.location or "").startswith("/auth/login"), response)
        self.assertLess(took, BOUND)
        service, took = await timed(api(w, browser))
        self.assertEqual(service.status, 401)
        self.assertLess(took, BOUND)
        # Public routes keep serving, with the session cookie or without.
        for cookies in (True, False):
            public, took = await timed(browser.get(w.gw.url("/open/x"), cookies=cookies))
            self.assertEqual((public.status, public.body), (200, b"backend"))
            self.assertIsNone(w.last_request(b"/open/").header(b"X-User-Id"))
            self.assertLess(took, BOUND)
        # Nothing was sent to the backend for the refused requests.
        self.assertNotIn(b"/app/page", [r.uri for r in w.backend.requests[self.before :]])

    async def eventually_works(self, browser: Browser, within: float = 20.0) -> None:
        deadline = reactor.seconds() + within
        while (await app(self.w, browser)).status != 200:
            if reactor.seconds() > deadline:
                self.fail(f"the session did not work again within {within}s")
            await sleep(0.1)
        await self.check.works(browser)

    async def test_frozen_redis_fails_closed_within_the_timeout_then_recovers(self) -> None:
        w = self.w
        browser = await logged_in(w)
        await self.check.works(browser)
        self.before = len(w.backend.requests)
        w.redis.pause()
        await self.assert_fails_closed(browser)
        # A login cannot store its session: refused, not begun.
        fresh = Browser()
        back, took = await timed(w.gw.login(fresh))
        self.assertEqual(back.status, 503)
        self.assertNotIn(COOKIE, fresh.cookies)
        self.assertLess(took, BOUND + STORE_TIMEOUT)
        w.redis.resume()
        # Redis kept the record: the same session works again, the gateway untouched.
        await self.eventually_works(browser)

    async def test_stopped_redis_fails_closed_then_restarted_redis_serves_again(self) -> None:
        w = self.w
        browser = await logged_in(w)
        await self.check.works(browser)
        self.before = len(w.backend.requests)
        await w.redis.stop()
        await self.assert_fails_closed(browser)
        fresh = Browser()
        back = await w.gw.login(fresh)
        self.assertEqual(back.status, 503)
        self.assertNotIn(COOKIE, fresh.cookies)
        # A back-channel logout cannot be done now: the IdP is told to try again later.
        token = w.idp.mint_logout_token(sid=w.idp.sessions[-1], header=LOGOUT_TYP)
        later = await backchannel(w, token)
        self.assertEqual(later.status, 503)
        self.assertIsNotNone(later.header("Retry-After"))
        # A logout still clears the browser's cookie.
        tab = Browser(cookies=dict(browser.cookies))
        out = await tab.post(w.gw.url("/auth/logout"), headers={"Origin": w.gw.origin})
        self.assertEqual(out.status, 302)
        self.assertNotIn(COOKIE, tab.cookies)
        await w.redis.start()
        # The restarted redis-server keeps nothing on disk: the old session is gone
        # (no session, not an error), and a new login works without restarting the
        # gateway once it has reconnected.
        deadline = reactor.seconds() + 20.0
        while True:
            again = Browser()
            back = await w.gw.login(again)
            if back.status == 302:
                break
            self.assertEqual(back.status, 503)
            if reactor.seconds() > deadline:
                self.fail("no login worked within 20s of Redis coming back")
            await sleep(0.1)
        await self.check.works(again)
        await self.check.refused(browser)
        # Back-channel logout works over the new connections too (pub/sub included).
        await self.eventually_subscribed()
        stream = await open_stream(w.gw.port, "/app/events", again.cookies[COOKIE])
        self.addCleanup(close_stream, stream)
        ended = await backchannel(
            w, w.idp.mint_logout_token(sid=w.idp.sessions[-1], header=LOGOUT_TYP)
        )
        self.assertEqual(ended.status, 200)
        await closed_within(stream, 1.0)
        await self.check.refused(again)

    async def eventually_subscribed(self, count: int = 1, within: float = 20.0) -> None:
        await subscribed(self, self.w, count, within)


# -- 8: TLS to Redis ---------------------------------------------------------------------


class TLSTests(TestCase):
    """
    Redis on its TLS port only, with a certificate from a test CA; the gateway is given
    that CA as its trust root (C{state_options}).
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self, tls=True)
        self.check = SessionCheck(self, self.w)

    async def test_sessions_over_tls(self) -> None:
        w = self.w
        self.assertTrue(w.redis.tls)
        browser = await logged_in(w)
        await self.check.works(browser)
        record = await w.gw.stored_record(browser)
        assert record is not None
        self.assertEqual(record.subject, "alice")

    async def test_a_redis_certificate_of_another_ca_fails_closed(self) -> None:
        w = self.w
        browser = await logged_in(w)
        await self.check.works(browser)
        # A second gateway sharing the store and the key, trusting another CA only.
        directory = self.mktemp()
        os.makedirs(directory)
        other_ca = TestCA(directory, "some other CA")
        doubtful = await w.gateway(
            wait_for_store=False, state_options={"trust_root": other_ca.trust_root()}
        )
        await sleep(0.5)  # several connection attempts, each refused by the handshake
        # The session the first gateway began is no session there.
        await self.check.refused(browser, doubtful)
        public = await browser.get(doubtful.url("/open/x"))
        self.assertEqual(public.status, 200)
        # No login can begin there either; the gateway goes on answering.
        fresh = Browser()
        back = await doubtful.login(fresh)
        self.assertEqual(back.status, 503)
        self.assertNotIn(COOKIE, fresh.cookies)
        await self.check.refused(browser, doubtful)
        # The store itself never became usable.
        with self.assertRaises(StoreUnavailableError):
            await doubtful.store.get(b"probe")
        await self.check.works(browser, w.gw)


# -- 9: logout ---------------------------------------------------------------------------


class LogoutTests(TestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self)
        self.check = SessionCheck(self, self.w)

    async def test_logout_deletes_the_record_and_clears_the_cookie(self) -> None:
        w = self.w
        browser = await logged_in(w)
        await self.check.works(browser)
        cookie = browser.cookies[COOKIE]
        key = w.gw.record_key(browser)
        self.assertIsNotNone(await w.probe.get(key))
        out = await browser.post(w.gw.url("/auth/logout"), headers={"Origin": w.gw.origin})
        self.assertEqual((out.status, out.location), (302, "/"))
        line = browser.set_cookie(COOKIE)
        assert line is not None
        self.assertIn("Max-Age=0", line)
        self.assertNotIn(COOKIE, browser.cookies)
        self.assertIsNone(await w.probe.get(key))
        await self.check.refused(browser)
        # Unlike a cookie-only session, the cookie kept from before is worth nothing now.
        browser.cookies[COOKIE] = cookie
        await self.check.refused(browser)

    async def test_logout_during_a_refresh_is_not_undone_by_it(self) -> None:
        """
        The user logs out (in another tab) while a request of the session is refreshing
        its token: once the refresh lands, the record must still be gone.
        """
        w = self.w
        w.idp.token_lifetime = 30  # due at once (refreshSkew 60s)
        browser = await logged_in(w)
        cookie = browser.cookies[COOKIE]
        key = w.gw.record_key(browser)
        w.idp.token_lifetime = 3600
        w.idp.refresh_delay = 1.0
        pending = Deferred.fromCoroutine(app(w, browser))
        deadline = reactor.seconds() + 10
        while w.idp.refresh_grants == 0:
            self.assertLess(reactor.seconds(), deadline, "no refresh was asked for")
            await sleep(0.01)
        tab = Browser(cookies={COOKIE: cookie})
        out = await tab.post(w.gw.url("/auth/logout"), headers={"Origin": w.gw.origin})
        self.assertEqual(out.status, 302)
        self.assertIsNone(await w.probe.get(key))
        await pending
        self.assertEqual(w.idp.refresh_grants, 1)
        self.assertIsNone(await w.probe.get(key), "the refresh wrote the ended session back")
        await self.check.refused(Browser(cookies={COOKIE: cookie}))


# -- 10: back-channel logout -------------------------------------------------------------


class BackchannelLogoutTests(TestCase):
    """
    OIDC Back-Channel Logout 1.0: the IdP posts a logout token; the gateway ends the
    sessions it names, in the store and in every open stream.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self)
        self.check = SessionCheck(self, self.w)

    def token(self, **claims: Any) -> str:
        return self.w.idp.mint_logout_token(header=LOGOUT_TYP, **claims)

    async def assert_invalid(self, response: BrowserResponse, what: str) -> None:
        self.assertEqual(response.status, 400, f"{what}: {response.body!r}")
        self.assertEqual(response.json(), {"error": "invalid_request"}, what)

    async def test_logout_by_idp_session_ends_that_session_only(self) -> None:
        w = self.w
        one = await logged_in(w)
        two = await logged_in(w)
        sid_one, sid_two = w.idp.sessions[-2:]
        self.assertNotEqual(sid_one, sid_two)
        await self.check.works(one)
        await self.check.works(two)
        key_one, key_two = w.gw.record_key(one), w.gw.record_key(two)
        response = await backchannel(w, self.token(sid=sid_one))
        self.assertEqual(response.status, 200, response.body)
        self.assertEqual(response.header("Cache-Control"), "no-store")
        self.assertIsNone(await w.probe.get(key_one))
        self.assertIsNotNone(await w.probe.get(key_two))
        await self.check.refused(one)
        await self.check.works(two)

    async def test_logout_by_subject_ends_all_its_sessions(self) -> None:
        w = self.w
        browsers = [await logged_in(w) for _ in range(2)]
        keys = [w.gw.record_key(browser) for browser in browsers]
        for browser in browsers:
            await self.check.works(browser)
        response = await backchannel(w, self.token(sub="alice"))
        self.assertEqual(response.status, 200, response.body)
        for key in keys:
            self.assertIsNone(await w.probe.get(key))
        for browser in browsers:
            await self.check.refused(browser)
        # A subject with no session: done all the same.
        nobody = await backchannel(w, self.token(sub="bob"))
        self.assertEqual(nobody.status, 200)

    async def test_tokens_typed_jwt_or_untyped_are_accepted(self) -> None:
        """
        Explicit typing is recommended, not required (Back-Channel Logout 1.0, 2.4):
        tokens typed C{JWT}, as many providers send them, and untyped ones are taken.
        """
        w = self.w
        one = await logged_in(w)
        two = await logged_in(w)
        sid_one, sid_two = w.idp.sessions[-2:]
        typed_jwt = w.idp.mint_logout_token(sid=sid_one, header={"typ": "JWT"})
        untyped = w.idp.mint_logout_token(sid=sid_two, header={"typ": None})
        self.assertEqual(jwt.get_unverified_header(typed_jwt)["typ"], "JWT")
        self.assertNotIn("typ", jwt.get_unverified_header(untyped))
        self.assertEqual((await backchannel(w, typed_jwt)).status, 200)
        await self.check.refused(one)
        await self.check.works(two)
        self.assertEqual((await backchannel(w, untyped)).status, 200)
        await self.check.refused(two)

    async def test_cross_origin_post_is_not_refused_as_csrf(self) -> None:
        w = self.w
        browser = await logged_in(w)
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        # The CSRF check is on: the browser-facing logout is refused like this...
        refused = await browser.post(w.gw.url("/auth/logout"), headers=evil)
        self.assertEqual(refused.status, 403)
        await self.check.works(browser)
        # ...but the back-channel endpoint is called server to server.
        response = await backchannel(w, self.token(sid=w.idp.sessions[-1]), headers=evil)
        self.assertEqual(response.status, 200, response.body)
        await self.check.refused(browser)

    async def test_refused_logout_tokens(self) -> None:
        w = self.w
        idp = w.idp
        browser = await logged_in(w)
        sid = idp.sessions[-1]
        impostor = SigningKey.generate(idp.signing_kid, idp.signing_key.alg)
        unknown = SigningKey.generate("rsa-unknown", "RS256")
        reasons = refusal_reasons(self)
        # Each token is a good one but for one thing; the word the logged reason must
        # hold shows it was refused for that thing.
        bad_tokens = {
            "signed with another key under the IdP's key id": (
                self.token(sid=sid, key=impostor),
                "signature",
            ),
            "signed with a key the IdP does not list": (
                self.token(sid=sid, key=unknown),
                "key",
            ),
            "for another audience": (self.token(sid=sid, aud="another-client"), "audience"),
            "from another issuer": (self.token(sid=sid, iss="http://issuer.invalid"), "issuer"),
            "without events": (self.token(sid=sid, drop=["events"]), "events"),
            "with other events": (self.token(sid=sid, events={"urn:other": {}}), "event"),
            "with a nonce": (self.token(sid=sid, nonce="n-0S6_WzA2Mj"), "nonce"),
            "naming neither sid nor sub": (self.token(), "sid"),
            "typed as an access token": (
                idp.mint_logout_token(sid=sid, header={"typ": "at+jwt"}),
                "typ",
            ),
            "without jti": (self.token(sid=sid, drop=["jti"]), "jti"),
            "issued long ago": (self.token(sid=sid, iat=int(reactor.seconds()) - 3600), "ago"),
        }
        for what, (token, word) in bad_tokens.items():
            await self.assert_invalid(await backchannel(w, token), what)
            self.assertIn(word, reasons[-1], what)
        # Requests that are not a form with one logout token.
        good = self.token(sid=sid)
        as_form = urlencode({"logout_token": good}).encode()
        bad_requests = {
            "a bare JWT": (good.encode(), {"Content-Type": "application/jwt"}, "form"),
            "a form sent as JSON": (as_form, {"Content-Type": "application/json"}, "form"),
            "no content type": (as_form, {"Content-Type": ""}, "form"),
            "no logout_token": (b"", {}, "logout_token"),
            "two logout tokens": (
                urlencode([("logout_token", good)] * 2).encode(),
                {},
                "logout_token",
            ),
            "an oversized body": (
                urlencode({"logout_token": good, "padding": "x" * 40_000}).encode(),
                {},
                "large",
            ),
        }
        for what, (body, headers, word) in bad_requests.items():
            await self.assert_invalid(await backchannel(w, body=body, headers=headers), what)
            self.assertIn(word, reasons[-1], what)
        self.assertEqual(len(reasons), len(bad_tokens) + len(bad_requests))
        # None of that ended the session.
        self.assertIsNotNone(await w.probe.get(w.gw.record_key(browser)))
        await self.check.works(browser)
        # The same token, well sent, does.
        response = await backchannel(w, good)
        self.assertEqual(response.status, 200)
        await self.check.refused(browser)

    async def test_logout_during_a_refresh_is_not_undone_by_it(self) -> None:
        """
        The IdP ends the session while a request of it is refreshing its token: once the
        refresh lands, the session must still be over (its record not written back).
        """
        w = self.w
        w.idp.token_lifetime = 30  # due at once (refreshSkew 60s)
        browser = await logged_in(w)
        key = w.gw.record_key(browser)
        w.idp.token_lifetime = 3600
        w.idp.refresh_delay = 1.0
        pending = Deferred.fromCoroutine(app(w, browser))
        deadline = reactor.seconds() + 10
        while w.idp.refresh_grants == 0:
            self.assertLess(reactor.seconds(), deadline, "no refresh was asked for")
            await sleep(0.01)
        response = await backchannel(w, self.token(sid=w.idp.sessions[-1]))
        self.assertEqual(response.status, 200)
        self.assertIsNone(await w.probe.get(key))
        await pending  # the request that was refreshing (whatever it got)
        self.assertEqual(w.idp.refresh_grants, 1)
        self.assertIsNone(await w.probe.get(key), "the refresh wrote the ended session back")
        await self.check.refused(browser)

    async def test_a_replayed_logout_token_is_refused(self) -> None:
        w = self.w
        browser = await logged_in(w)
        # A token for an IdP session the gateway has no session of: done, nothing ended.
        token = self.token(sid="not-a-session-here")
        self.assertEqual((await backchannel(w, token)).status, 200)
        await self.assert_invalid(await backchannel(w, token), "replayed")
        await self.check.works(browser)
        # The jti is remembered in the store, for every gateway sharing it.
        other = await w.gateway()
        await self.assert_invalid(await backchannel(w, token, other), "replayed elsewhere")
        jti_keys = {k for k in await w.probe.keys() if k.startswith(PREFIX.encode() + b"jti:")}
        self.assertEqual(len(jti_keys), 1)

    async def test_an_open_stream_of_the_session_is_closed(self) -> None:
        w = self.w
        browser = await logged_in(w)
        other = await logged_in(w)
        stream = await open_stream(w.gw.port, "/app/events", browser.cookies[COOKIE])
        self.addCleanup(close_stream, stream)
        kept = await open_stream(w.gw.port, "/app/events", other.cookies[COOKIE])
        self.addCleanup(close_stream, kept)
        self.assertIn(b"200 OK", stream.received.split(b"\r\n", 1)[0])
        response = await backchannel(w, self.token(sid=w.idp.sessions[-2]))
        self.assertEqual(response.status, 200)
        await closed_within(stream, 1.0)
        # The other session's stream is still open.
        await sleep(0.2)
        self.assertFalse(kept.closed.called)
        # The ended stream's upstream request was given up too; the other one goes on.
        await upstream_gone(w.held[0])
        self.assertFalse(w.held[1].finished or w.held[1]._disconnected)

    async def test_an_open_stream_on_another_gateway_is_closed(self) -> None:
        w = self.w
        # A second gateway sharing the store, the key and the prefix: another instance.
        other = await w.gateway()
        await subscribed(self, w, 2)
        browser = await logged_in(w)
        await self.check.works(browser, other)
        stream = await open_stream(other.port, "/app/events", browser.cookies[COOKIE])
        self.addCleanup(close_stream, stream)
        response = await backchannel(w, self.token(sid=w.idp.sessions[-1]))
        self.assertEqual(response.status, 200)
        await closed_within(stream, 1.0)
        await self.check.refused(browser, other)

    async def test_a_stream_ended_by_logout_is_closed(self) -> None:
        w = self.w
        browser = await logged_in(w)
        stream = await open_stream(w.gw.port, "/app/events", browser.cookies[COOKIE])
        self.addCleanup(close_stream, stream)
        out = await browser.post(w.gw.url("/auth/logout"), headers={"Origin": w.gw.origin})
        self.assertEqual(out.status, 302)
        await closed_within(stream, 1.0)


# -- 11: configuration -------------------------------------------------------------------

IDP_DOCUMENT = """\
---
kind: IdP
metadata: {name: idp}
spec: {type: oidc, issuer: "https://idp.example", clientID: gw, clientSecret: s}
"""


class ConfigTests(SynchronousTestCase):
    """
    Configuration errors of server-side sessions, each located, reported at load or
    when the gateway is built (as startup and C{edgegw check} do).
    """

    def gateway_text(self, spec: str) -> str:
        return f"""\
kind: Gateway
metadata: {{name: g}}
spec:
  listen: "127.0.0.1:0"
{spec}{IDP_DOCUMENT}"""

    def build_problems(self, text: str) -> list[str]:
        root = write_tree(self.mktemp(), {"a.yaml": text})
        config = load_config(root, {})
        try:
            build_gateway(config, Clock())
        except ConfigError as e:
            prefix = os.path.join(root, "a.yaml") + ", "
            return [str(problem).removeprefix(prefix) for problem in e.problems]
        raise AssertionError("expected a ConfigError")

    def test_state_provider_without_a_session_block(self) -> None:
        text = self.gateway_text(
            '  stateProvider: {type: kvstore, config: {address: "127.0.0.1:6379"}}\n'
        )
        # The IdP says it needs a session block; the store alone is legal (plugins, the
        # assertions' record use it without sessions).
        problems = problems_of(self.mktemp(), text, gateway=False)
        self.assertEqual([p for p in problems if "spec.stateProvider" in p], [])
        self.assertNotEqual(problems, [])

    def test_unknown_state_provider_type(self) -> None:
        text = self.gateway_text(
            f'  session: {{key: "{KEY}"}}\n'
            "  stateProvider: {type: memcached, config: {servers: [a]}}\n"
        )
        self.assertEqual(
            self.build_problems(text),
            [
                'document 1, Gateway "g": spec.stateProvider.type: no state provider of type '
                '"memcached" is installed (installed: kvstore)'
            ],
        )

    def test_kvstore_config_problems_are_located(self) -> None:
        text = self.gateway_text(
            f'  session: {{key: "{KEY}"}}\n'
            "  stateProvider:\n"
            "    type: kvstore\n"
            "    refreshSkew: soon\n"
            '    config: {address: "redis", db: -1, tls: maybe, colour: red}\n'
        )
        problems = problems_of(self.mktemp(), text, gateway=False)
        fields = [p.split(": ", 2)[1] for p in problems]
        self.assertEqual(
            sorted(fields),
            sorted(
                [
                    "spec.stateProvider.refreshSkew",
                    "spec.stateProvider.config.address",
                    "spec.stateProvider.config.db",
                    "spec.stateProvider.config.tls",
                    "spec.stateProvider.config.colour",
                ]
            ),
            problems,
        )
        for problem in problems:
            self.assertTrue(problem.startswith('document 1, Gateway "g": '), problem)

    def test_backchannel_logout_is_mounted_only_with_a_state_provider(self) -> None:
        session = f'  session: {{key: "{KEY}"}}\n'
        state = '  stateProvider: {type: kvstore, config: {address: "127.0.0.1:6379"}}\n'
        backchannel = ("POST", "/auth/backchannel-logout")
        for spec, mounted in ((session, False), (session + state, True)):
            root = write_tree(self.mktemp(), {"a.yaml": self.gateway_text(spec)})
            gateway = build_gateway(load_config(root, {}), Clock())
            self.assertEqual(backchannel in gateway.auth_endpoints, mounted, spec)
            self.assertEqual(gateway.sessions is not None, mounted, spec)
            self.assertIn(("POST", "/auth/logout"), gateway.auth_endpoints)
        # Its path is configurable.
        moved = session + state + "  auth: {backchannelLogoutPath: /idp/logout}\n"
        root = write_tree(self.mktemp(), {"a.yaml": self.gateway_text(moved)})
        gateway = build_gateway(load_config(root, {}), Clock())
        self.assertIn(("POST", "/idp/logout"), gateway.auth_endpoints)
        self.assertNotIn(backchannel, gateway.auth_endpoints)


class ServiceTreeTests(TestCase):
    """
    Issue 14 point 1: the store (and the sessions over it) are child services of the
    gateway: they connect when the tree starts and close when it stops.
    """

    async def test_children_connect_at_start_and_close_at_stop(self) -> None:
        from edgegw.service import build_service

        server = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        text = server_session_config(
            key=KEY,
            redis_address=server.address,
            issuer=idp.issuer,
            upstream="http://127.0.0.1:9",
        )
        root = write_tree(self.mktemp(), {"a.yaml": text})
        service = build_service(
            load_config(root, {}),
            reactor,
            state_options={"first_retry": 0.05, "retry_cap": 0.2},
        )
        names = [child.name for child in service.generation]
        self.assertLess(names.index("state"), names.index("sessions"))
        self.assertLess(names.index("sessions"), names.index("idp"))
        self.assertIs(service.generation.getServiceNamed("state"), service.gateway.state)
        self.assertIs(service.generation.getServiceNamed("sessions"), service.gateway.sessions)
        probe = RedisProbe(server)

        async def clients() -> int:
            listing = await probe.command("CLIENT", "LIST")
            # The probe's own connection is one of them.
            return len(bytes(listing).strip().splitlines()) - 1

        self.assertEqual(await clients(), 0)
        service.startService()
        stopped = False

        async def stop() -> None:
            if not stopped:
                await service.stopService()

        self.addCleanup(stop)
        for _ in range(200):
            # The command connection, and the pub/sub one the logout channel needs.
            if await clients() == 2 and await probe.subscribers(f"{PREFIX}logout") == 1:
                break
            await sleep(0.05)
        else:
            self.fail(f"the store did not connect: {await clients()} client(s)")
        await service.stopService()
        stopped = True
        for _ in range(200):
            if await clients() == 0:
                break
            await sleep(0.05)
        self.assertEqual(await clients(), 0, "the store left connections open at stop")
