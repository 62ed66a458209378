"""
Checks (expected to pass): CallbackResource.running returns to 0 after a callback that
fails synchronously, one whose client disconnects mid token call, and one that times out.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from tests.login_attacks.test_stall import StallTestCase, within

reactor: Any = _reactor


class ExchangeCounter(StallTestCase):
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
