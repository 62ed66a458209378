"""
End to end: a token endpoint that sends a head and stalls. The callback now answers
(the whole-call deadline works), but the gateway never drops the stalled connection:
every such login leaves one busy connection to the IdP in the pool (1024 by default
per upstream; past that every IdP call queues and fails: login, refresh, refetch).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater

from edgegw.upstream.pool import Upstream
from tests.login_attacks.test_stall import StallTestCase, within

reactor: Any = _reactor


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
