"""
End to end: a token endpoint that sends a head and stalls. The callback now answers
(the whole-call deadline works), but the gateway never drops the stalled connection:
every such login leaves one busy connection to the IdP in the pool (1024 by default
per upstream; past that every IdP call queues and fails: login, refresh, refetch).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

import edgegw.gateway
import edgegw.identity.provider
from edgegw.upstream.pool import Upstream
from tests.login_attacks.test_stall import StallingTokenIdP, within
from tests.support.backends import SiteBackend, answer
from tests.test_login import LoginWorld

reactor: Any = _reactor


class StalledTokenBodyConnection(TestCase):
    def setUp(self) -> None:
        self.patch(edgegw.identity.provider, "CALL_TIMEOUT", 1.0)
        self.patch(edgegw.gateway, "CALL_TIMEOUT", 1.0)

    async def test_timed_out_token_call_drops_its_connection(self) -> None:
        idp = StallingTokenIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start()
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        pending = Deferred.fromCoroutine(w.browser.get(at_idp.location or ""))
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
