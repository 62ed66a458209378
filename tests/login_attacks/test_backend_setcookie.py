"""
Finding: the gateway keeps its own cookies away from backends on the way in (forwardCookies
drops them) but not on the way out: a backend's Set-Cookie for the session cookie, one of
its chunks or a login-state cookie reaches the browser unchanged. Any proxied backend (or a
header-injection bug in one) can therefore replace a visitor's session with another sealed
session it holds -- e.g. its operator's own, captured from any browser -- which is login
CSRF / session fixation across every route of the gateway, or log visitors out at will.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.support.backends import answer
from tests.test_login import world


class BackendSetsGatewayCookies(TestCase):
    async def test_backend_cannot_set_the_session_cookie(self) -> None:
        w = await world(self)
        await w.login("/app/x")
        mine = w.browser.cookies["gw_session"]
        w.backend.responder = answer(
            body=b"ok",
            headers=[
                (b"Set-Cookie", b"gw_session=ATTACKERS_SEALED_SESSION; Path=/; HttpOnly"),
                (b"Set-Cookie", b"gw_session.login.abc=x; Path=/"),
                (b"Set-Cookie", b"theme=dark; Path=/"),
            ],
        )
        response = await w.browser.get(w.url("/open/page"))
        self.assertEqual(response.status, 200)
        self.assertEqual(w.browser.cookies.get("theme"), "dark")
        self.assertEqual(w.browser.cookies.get("gw_session"), mine, "backend replaced the session")
        self.assertNotIn("gw_session.login.abc", w.browser.cookies)
