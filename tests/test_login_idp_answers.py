"""
What a login does with IdP answers it cannot use as they are: the session it sets is
usable, or there is none; it never logs a user in differently (the shared
ARCHITECTURE.md, section 7: an error in token handling leaves the request
unauthenticated, never authenticated differently).

  - An access token that could never be sent as C{Authorization: Bearer <token>} (RFC
    6750 b64token): one with CR/LF would be refused by the upstream head writer (502),
    a non-ASCII one would fail to encode (500), on every C{forwardAccessToken} request
    of the session for its whole ttl.
  - An id_token claim holding a lone UTF-16 surrogate escape (C{"\\ud800"}, which plain
    C{json.loads} accepts): kept in the passport and sealed into the session, it would
    break everything that encodes it as UTF-8 (the session view, the projected
    C{X-User-<Claim>} header).
  - A userinfo failure under C{userInfo: auto} when C{subjectClaim} names a claim only
    userinfo carries: the user must not be logged in under the id_token's C{sub}
    instead (another identifier namespace for C{X-User-Id}, what backends key accounts
    on), for the session's whole ttl. Claims used in deny-style Rego rules (C{deny if
    input.claims.suspended}) would fail open the same way.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase

from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP, _OAuthError
from tests.test_login import LoginWorld, world


class OddTokenIdP(FakeIdP):
    odd_token = "tok\r\nX-Injected: yes"

    def _render_token(self, request: Any) -> Any:
        result = super()._render_token(request)
        if isinstance(result, dict) and "access_token" in result:
            result["access_token"] = self.odd_token
        return result


async def odd_world(test: TestCase, token: str) -> LoginWorld:
    idp = OddTokenIdP()
    idp.odd_token = token
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = LoginWorld(test, idp, backend)
    await w.start()
    return w


class AccessTokenValidation(TestCase):
    async def test_crlf_access_token_does_not_leave_a_broken_session(self) -> None:
        w = await odd_world(self, "tok\r\nX-Injected: yes")
        await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            again = await w.browser.get(w.url("/app/y"))
            self.assertEqual(again.status, 200, "session set with a token that cannot be sent")
            self.assertIsNone(w.backend.requests[-1].header(b"X-Injected"))

    async def test_non_ascii_access_token_does_not_leave_a_broken_session(self) -> None:
        w = await odd_world(self, "tok\u00e9")
        await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            again = await w.browser.get(w.url("/app/y"))
            self.assertEqual(again.status, 200, "session set with a token that cannot be sent")


class LoneSurrogateClaim(TestCase):
    async def test_session_usable_or_login_refused(self) -> None:
        w = await world(self)
        w.idp.user["name"] = "Al\ud800ice"
        w.idp.user["given_name"] = "x"
        w.idp.user["family_name"] = "y"
        final = await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            self.assertEqual(final.status, 200, "proxied request of the new session failed")
            view = await w.browser.get(w.url("/auth/session"))
            self.assertEqual(view.status, 200, "session view failed")


ROUTES = """\
kind: Route
metadata: {name: app}
spec:
  match: /app/
  type: app
  access: {auth: required}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
"""


class DownUserinfoIdP(FakeIdP):
    def _render_userinfo(self, request: Any) -> Any:
        self.userinfo_requests += 1
        raise _OAuthError(503, "temporarily_unavailable", "userinfo down")


class UserinfoFailureUnderAuto(TestCase):
    async def test_subject_never_switches_namespace_on_a_userinfo_error(self) -> None:
        idp = DownUserinfoIdP()
        idp.user["sub"] = "00u1a2b3c4"
        idp.user["preferred_username"] = "alice"
        idp.userinfo_only = {"preferred_username"}
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start_routes(
            ROUTES,
            gateway_extra="    subjectClaim: preferred_username",
        )
        final = await w.login("/app/x")
        self.assertEqual(idp.userinfo_requests, 1)
        if final.status == 200:
            self.assertEqual(
                backend.requests[-1].header(b"X-User-Id"),
                b"alice",
                "logged in under the id_token's sub after userinfo failed",
            )
