"""
Finding: IdP calls time out only until the response head (treq's timeout and the agent's
addTimeout both stop at the head); reading the body (read_json) has no deadline. An IdP --
or anything between it and the gateway -- that sends a response head and then stalls:

  - on the token endpoint: the callback never answers (the browser hangs, the request
    stays in flight; a graceful shutdown waits for it);
  - on discovery or the key set: IdentityProvider._running never completes, and since
    _refresh() returns while _running is set, discovery and the key set are never
    refreshed again (before the first success: login answers 503 for ever);
  - on a refetch for an unknown kid: _refetching never completes and every later login
    whose id_token names an unknown kid waits on it for ever.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

import edgegw.assembly.identity_wiring
import edgegw.identity.provider
from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP
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
        from twisted.web.server import Site

        from tests.support.processes import listen_local, port_of

        site = Site(root, timeout=None)
        port = listen_local(site)
        self.addCleanup(port.stopListening)
        from edgegw.config.model import IdpSpec
        from edgegw.upstream.agent import UpstreamAgent
        from edgegw.upstream.pool import UpstreamClient

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
