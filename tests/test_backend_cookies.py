"""
A backend cannot set the gateway's own cookies. The gateway keeps them away from
backends on the way in (C{forwardCookies} drops them) and on the way out: a backend's
C{Set-Cookie} for the session cookie, one of its chunks or a login-state cookie never
reaches the browser. Otherwise any proxied backend (or a header-injection bug in one)
could replace a visitor's session with another sealed session it holds -- its
operator's own, captured from any browser -- which is login CSRF / session fixation
across every route of the gateway, or log visitors out at will.

That includes a I{nameless} cookie: C{Set-Cookie: =gw_session=<sealed>; Path=/} has the
empty name (RFC 6265bis 5.6: name-value without a name), and browsers (Chrome, Firefox)
serialise a nameless cookie as its value alone, so the browser would then send
C{Cookie: gw_session=<sealed>} (after the real one when its path is as short and it is
newer; Twisted keeps the last duplicate).
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.support.backends import answer
from tests.test_login import world


def effective_name(line: bytes) -> bytes:
    """The name a browser sends a Set-Cookie line back under (nameless -> its value's)."""
    pair = line.partition(b";")[0]
    name, eq, value = pair.partition(b"=")
    name = name.strip(b" \t")
    if not eq:
        return b""  # "Set-Cookie: x": nameless, sent as "x" (no "=": no cookie to Twisted)
    if name:
        return name
    # Nameless: the browser sends the value alone, which reads as "name=value".
    return value.partition(b"=")[0].strip(b" \t")


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


class NamelessBackendCookie(TestCase):
    async def test_backend_cannot_toss_a_nameless_session_cookie(self) -> None:
        w = await world(self)
        await w.login("/app/x")
        w.backend.responder = answer(
            body=b"ok",
            headers=[
                (b"Set-Cookie", b"=gw_session=ATTACKERS_SEALED_SESSION; Path=/"),
                (b"Set-Cookie", b" =gw_session.0=ATTACKERS_CHUNK; Path=/"),
            ],
        )
        response = await w.browser.get(w.url("/open/page"))
        self.assertEqual(response.status, 200)
        relayed = response.headers.getRawHeaders(b"set-cookie") or []
        tossed = [
            line for line in relayed if effective_name(line) in (b"gw_session", b"gw_session.0")
        ]
        self.assertEqual(tossed, [], "a backend's nameless cookie would be sent as gw_session")
