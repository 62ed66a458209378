"""
Finding: the session writer accepts a sealed session of up to 64 chunks x 3800 chars
(~243 KB), but the gateway itself refuses any request whose header section exceeds
16384 bytes (431). A session above ~15 KB (a long claim, many groups, a large JWT access
token kept for forwardAccessToken) is set by the callback and then locks the browser out
of the whole gateway -- /auth/logout and /auth/login included -- for the session's ttl
(8 h by default). The callback should refuse (502, no session) rather than set a cookie
that can never come back, and the limit should be derived from the header limit.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.test_login import world


class SessionLargerThanTheHeaderLimit(TestCase):
    async def test_a_session_is_never_set_that_cannot_be_sent_back(self) -> None:
        w = await world(self, gateway_spec=", fingerprintHeaders: []")
        w.idp.user["name"] = "N" * 14000
        w.idp.userinfo_only = {"name"}  # the id_token stays small; userinfo carries it
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        back = await w.browser.get(at_idp.location or "")
        total = sum(len(n) + len(v) + 2 for n, v in w.browser.cookies.items())
        if back.status == 302:
            # A session was set: the browser must be able to use it (or at least log out).
            statuses = {}
            for method, path in (
                ("GET", "/app/x"),
                ("GET", "/auth/login"),
                ("POST", "/auth/logout"),
            ):
                statuses[f"{method} {path}"] = (await w.browser.request(method, w.url(path))).status
            self.assertNotIn(
                431, statuses.values(), f"locked out: {statuses} ({total} cookie bytes)"
            )
