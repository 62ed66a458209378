"""
Checks (expected to pass): CallbackResource.running returns to 0 after a callback that
fails synchronously, one whose client disconnects mid token call, and one that times out.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

import edgegw.gateway
import edgegw.identity.provider
from tests.login_attacks.test_stall import StallingTokenIdP, within
from tests.support.backends import SiteBackend, answer
from tests.test_login import LoginWorld

reactor: Any = _reactor


class ExchangeCounter(TestCase):
    def setUp(self) -> None:
        self.patch(edgegw.identity.provider, "CALL_TIMEOUT", 1.0)
        self.patch(edgegw.gateway, "CALL_TIMEOUT", 1.0)

    async def test_counter_settles(self) -> None:
        idp = StallingTokenIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start()
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
