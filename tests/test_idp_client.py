"""
The IdP client (L{edgegw.identity.provider}, L{edgegw.identity.key_source}) against an
IdP that stalls, fails at once or answers too much.

IdP calls have a deadline for the whole call, the body included (treq's timeout and the
agent's C{addTimeout} both stop at the response head). An IdP -- or anything between it
and the gateway -- that sends a response head and then stalls must not:

  - on the token endpoint: leave the callback unanswered (the browser hanging, the
    request in flight, a graceful shutdown waiting for it), nor leave the stalled
    connection busy in the pool (1024 by default per upstream; past that every IdP
    call would queue and fail: login, refresh, refetch), nor leak the callback's count
    of exchanges in progress;
  - on discovery or the key set: wedge the provider's refresh (before the first success,
    login would answer 503 for ever);
  - on a refetch for an unknown kid: make every later login whose id_token names an
    unknown kid wait on it for ever.

Cancelling a body read drops the connection even for the treq response wrappers the IdP
client reads (C{_Response}, C{_BufferedResponse}: C{proxyForInterface} exposes only
C{IResponse}'s attributes, so C{abort} is not one of them). An error answer's body is
read with the same cap as a document (C{MAX_DOCUMENT}), and a key-set refetch that fails
synchronously (the agent or pool failing the request at once) is a failed refetch, not
an C{AttributeError}.
"""

from __future__ import annotations

from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.client import ResponseDone
from twisted.web.iweb import UNKNOWN_LENGTH
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

import edgegw.assembly.identity_wiring
import edgegw.identity.provider
from edgegw.config.model import IdpSpec
from edgegw.identity.discovery import ProviderMetadata, parse_discovery
from edgegw.identity.provider import MAX_DOCUMENT, IdentityProvider, IdPError
from edgegw.upstream.agent import NullCookieJar, UpstreamAgent
from edgegw.upstream.pool import UpstreamClient
from edgegw.upstream.shared import read_body
from edgegw.upstream.upstreams import Upstream
from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of
from tests.test_login import LoginWorld

reactor: Any = _reactor


class _StallBody(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Any] = []

    def render(self, request: Any) -> Any:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"content-length", b"1000")
        request.write(b'{"access_token": "')
        self.held.append(request)
        return NOT_DONE_YET


class StallingTokenIdP(FakeIdP):
    def _resource(self) -> Resource:
        root = super()._resource()
        root.putChild(b"token", _StallBody())
        return root


async def within(seconds: float, d: Deferred[Any]) -> Any:
    """The result of d, or the string 'HUNG' when it did not fire within seconds."""
    done: list[Any] = []

    def keep(result: Any) -> Any:
        done.append(result)
        return result

    d.addBoth(keep)
    waited = 0.0
    while not done and waited < seconds:
        await deferLater(reactor, 0.1, lambda: None)
        waited += 0.1
    return done[0] if done else "HUNG"


class StallTestCase(TestCase):
    """
    A login world whose token endpoint answers a head and then stalls, with 1 s IdP
    call deadlines.
    """

    def setUp(self) -> None:
        self.patch(edgegw.identity.provider, "CALL_TIMEOUT", 1.0)
        self.patch(edgegw.assembly.identity_wiring, "CALL_TIMEOUT", 1.0)

    async def stalling_world(self) -> tuple[StallingTokenIdP, LoginWorld]:
        idp = StallingTokenIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start()
        return idp, w

    async def stalled_callback(self, w: LoginWorld) -> Deferred[Any]:
        """
        Begin a login and visit its callback, whose token call stalls: the response.
        """
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        return Deferred.fromCoroutine(w.browser.get(at_idp.location or ""))


class StalledIdPBodies(StallTestCase):
    async def test_callback_answers_when_the_token_endpoint_stalls(self) -> None:
        idp, w = await self.stalling_world()
        pending = await self.stalled_callback(w)
        result = await within(6.0, pending)
        if result == "HUNG":
            await idp.stop()  # lets the hung call fail so the test can clean up
            await within(3.0, pending)
        self.assertNotEqual(result, "HUNG", "callback still unanswered 6 s after it began")

    async def test_discovery_recovers_from_a_stalled_body(self) -> None:
        stall = _StallBody()
        root = Resource()
        wk = Resource()
        root.putChild(b".well-known", wk)
        wk.putChild(b"openid-configuration", stall)
        site = Site(root, timeout=None)
        port = listen_local(site)
        self.addCleanup(port.stopListening)
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        spec = IdpSpec(name="i", issuer=f"http://127.0.0.1:{port_of(port)}", client_id="gw")
        provider = edgegw.identity.provider.IdentityProvider(
            spec, UpstreamAgent(client, reactor, timeout=1.0), reactor, first_retry=0.1
        )
        provider.startService()

        def drop() -> Deferred[None]:
            provider.stopService()
            for request in stall.held:
                # The gateway aborted it at its deadline already (no channel left).
                if request.channel is not None:
                    request.channel.transport.abortConnection()
            return deferLater(reactor, 0.5, lambda: None)

        self.addCleanup(drop)
        await deferLater(reactor, 5.0, lambda: None)
        # After 5 s with 1 s call timeouts the failed discovery must have been noticed
        # (and be retried); instead it is still "running".
        self.assertIsNotNone(provider.last_error, "discovery wedged: no error, no retry")


class ExchangeCounter(StallTestCase):
    """
    C{CallbackResource.running} returns to 0 after a callback that fails
    synchronously, one whose client disconnects mid token call, and one that times out.
    """

    async def test_counter_settles(self) -> None:
        idp, w = await self.stalling_world()
        callback = w.gateway.site.resource.dispatcher.reserved["/auth/callback"].resource
        # synchronous failure
        r = await w.browser.get(w.url("/auth/callback?state=x&code=y"))
        self.assertEqual(r.status, 400)
        self.assertEqual(callback.running, 0)
        # disconnect mid token call
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        pending = Deferred.fromCoroutine(w.browser.get(at_idp.location or ""))
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(callback.running, 1)
        pending.cancel()
        pending.addErrback(lambda _: None)
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(callback.running, 0, "disconnect leaked the exchange slot")
        # timeout
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        result = await within(5.0, Deferred.fromCoroutine(w.browser.get(at_idp.location or "")))
        self.assertEqual(result.status, 502)
        self.assertEqual(callback.running, 0)
        await idp.stop()
        await deferLater(reactor, 0.2, lambda: None)


class StalledTokenBodyConnection(StallTestCase):
    async def test_timed_out_token_call_drops_its_connection(self) -> None:
        idp, w = await self.stalling_world()
        pending = await self.stalled_callback(w)
        result = await within(6.0, pending)
        self.assertNotEqual(result, "HUNG")
        self.assertEqual(result.status, 502)
        await deferLater(reactor, 1.0, lambda: None)
        idp_upstream = Upstream.from_url(idp.issuer)
        pool = w.gateway.upstream_client
        still_open = pool.open_connections(idp_upstream) - pool.idle_connections(idp_upstream)
        # cleanup: let the held connection go so the test can finish
        await idp.stop()
        await deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(
            still_open, 0, "the timed-out token call's stalled connection is still open (busy)"
        )


def stall(request: Request) -> Any:
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"content-length", b"1000")
    request.write(b'{"partial": ')
    return NOT_DONE_YET


class CancelledReadDropsConnection(TestCase):
    def setUp(self) -> None:
        self.backend = SiteBackend(stall).start()
        self.addCleanup(self.backend.stop)
        self.origin = f"http://127.0.0.1:{self.backend.port}"
        self.upstream = Upstream.from_url(self.origin)
        self.pool = UpstreamClient(reactor)
        self.addCleanup(self.pool.close)

    async def _check(self, unbuffered: bool) -> None:
        # As IdentityProvider._http: treq HTTPClient over a plain UpstreamAgent.
        http = HTTPClient(UpstreamAgent(self.pool, reactor), cookiejar=NullCookieJar())  # type: ignore[arg-type]
        response = await http.request(
            "GET", self.origin + "/x", allow_redirects=False, unbuffered=unbuffered
        )
        reading = read_body(response, 4096)
        reading.cancel()
        with self.assertRaises(CancelledError):
            await reading
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(
            self.pool.open_connections(self.upstream),
            0,
            "cancelled body read left its upstream connection open",
        )

    async def test_buffered_treq_response_as_the_idp_client_reads_it(self) -> None:
        await self._check(unbuffered=False)

    async def test_unbuffered_treq_response(self) -> None:
        await self._check(unbuffered=True)


class _Transport:
    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True

    pauseProducing = resumeProducing = loseConnection = abortConnection = stopProducing


class _HugeErrorResponse:
    code = 401
    phrase = b"Unauthorized"
    length = UNKNOWN_LENGTH
    headers: Any = None

    def __init__(self, total: int) -> None:
        self.total = total
        self.delivered = 0

    def deliverBody(self, protocol: Any) -> None:
        transport = _Transport()
        protocol.makeConnection(transport)
        chunk = b"x" * 65536
        while self.delivered < self.total and not transport.stopped:
            protocol.dataReceived(chunk)
            self.delivered += len(chunk)
        protocol.connectionLost(Failure(ResponseDone()))


class _Client:
    def __init__(self, response: _HugeErrorResponse) -> None:
        self.response = response

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return succeed(self.response)


class ErrorBodies(TestCase):
    async def test_error_body_is_read_with_a_cap(self) -> None:
        spec = IdpSpec(name="i", issuer="https://i.example", client_id="gw")
        provider = IdentityProvider(spec, None, reactor)  # type: ignore[arg-type]
        response = _HugeErrorResponse(64 * MAX_DOCUMENT)
        provider._http = _Client(response)  # type: ignore[assignment]
        metadata = ProviderMetadata(
            issuer="https://i.example",
            authorization_endpoint="https://i.example/a",
            token_endpoint="https://i.example/t",
            jwks_uri="https://i.example/j",
            userinfo_endpoint="https://i.example/u",
            id_token_algorithms=("RS256",),
            token_auth_method="client_secret_basic",
            access_token_jwks_uri="https://i.example/j",
        )
        with self.assertRaises(IdPError):
            await provider.userinfo(metadata, "token")
        self.assertLessEqual(
            response.delivered, 2 * MAX_DOCUMENT, f"buffered {response.delivered} bytes"
        )


class FailingAgent:
    def request(
        self, method: bytes, uri: bytes, headers: Any = None, bodyProducer: Any = None
    ) -> Any:
        return fail(ConnectionRefusedError("refused at once"))


class SyncRefetch(TestCase):
    async def test_refetch_failing_synchronously(self) -> None:
        issuer = "http://idp.test"
        spec = IdpSpec(name="i", issuer=issuer, client_id="gw")
        clock = Clock()
        clock.advance(1000)
        provider = IdentityProvider(spec, FailingAgent(), clock)  # type: ignore[arg-type]
        provider.metadata = parse_discovery(
            {
                "issuer": issuer,
                "authorization_endpoint": issuer + "/authorize",
                "token_endpoint": issuer + "/token",
                "jwks_uri": issuer + "/jwks",
            },
            issuer,
        )
        source = getattr(provider, "id_token_keys", None)
        if source is not None:  # the IdP client's KeySource
            source.url = issuer + "/jwks"
            keys = await source.keys_for("unknown-kid")
            self.assertIs(keys, source.keys)
        else:  # an IdP client keeping its key set itself
            keys = await provider.keys_for("unknown-kid")
            self.assertIs(keys, provider.keys)
