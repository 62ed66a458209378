"""
The gateway's cookies never lock a browser out with the gateway's own 16 KiB
request-header limit (Twisted's C{HTTPChannel.totalHeadersSize}, answered 431): past it,
every request from that browser -- C{/auth/login} and C{/auth/logout} included, so the
gateway could not clear them -- would be refused until the cookies expire.

  - Pending logins: C{return_to} is capped at 2048 characters, yet C{MAX_PENDING}=5
    login cookies of ~3.1 KiB each (a 2048-char C{return_to}, sealed and base64url'd)
    plus a normal session cookie and a C{User-Agent} would exceed 16384 bytes. A page
    can plant them with top-level navigations to C{/auth/login?return_to=/<2047 chars>}
    (C{SameSite=Lax} cookies are set on top-level GET navigations; each navigation lands
    on the IdP, the login never completes).
  - A large session: the session writer takes a sealed session of up to 64 chunks x
    3800 chars (~243 KB); one above ~15 KB (a long claim, many groups, a large JWT
    access token kept for C{forwardAccessToken}) must not be set by the callback when it
    could never come back (for the session's ttl, 8 h by default).
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
