"""
Finding: login-state cookies can be stacked until the browser's Cookie header exceeds the
gateway's own 16 KiB request-header limit (Twisted's HTTPChannel.totalHeadersSize), after
which every request from that browser -- /auth/login and /auth/logout included, so the
gateway cannot clear them -- is answered 431 until the cookies expire (Max-Age=600).

return_to is now capped at 2048 characters, but MAX_PENDING=5 login cookies of ~3.1 KiB
each (2048-char return_to, sealed and base64url'd) plus a normal session cookie and a
User-Agent already exceed 16384 bytes. An attacker page can plant them with top-level
navigations to /auth/login?return_to=/<2047 chars> (SameSite=Lax cookies are set on
top-level GET navigations; each navigation lands on the IdP, the login never completes).
"""

from __future__ import annotations

from urllib.parse import quote

from twisted.trial.unittest import TestCase

from tests.test_login import world

BROWSER_COOKIE_LIMIT = 4096  # name + value, per cookie, in every major browser


class LoginCookieBomb(TestCase):
    async def test_pending_logins_cannot_lock_a_browser_out(self) -> None:
        w = await world(self)
        # The victim is logged in as usual.
        final = await w.login("/app/x")
        self.assertEqual(final.status, 200)
        victim = w.browser
        # Five navigations that an attacker's page starts.
        return_to = "/x?" + "a" * 2045
        for _ in range(5):
            start = await victim.get(w.url("/auth/login?return_to=" + quote(return_to, safe="")))
            self.assertEqual(start.status, 302)
        sizes = {n[:24]: len(n) + len(v) for n, v in victim.cookies.items()}
        self.assertTrue(all(size <= BROWSER_COOKIE_LIMIT for size in sizes.values()), sizes)
        statuses = {}
        for method, path in (("GET", "/app/x"), ("GET", "/auth/login"), ("POST", "/auth/logout")):
            statuses[f"{method} {path}"] = (await victim.request(method, w.url(path))).status
        self.assertNotIn(431, statuses.values(), f"locked out: {statuses}; cookie sizes {sizes}")
