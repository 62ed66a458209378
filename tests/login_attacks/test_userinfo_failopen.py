"""
Finding (low, design): since 9d1a74e a userinfo failure under userInfo: auto is ignored
and the id_token's claims "stand alone", on the argument that a missing claim only takes
rights away. That is not so for the subject: when subjectClaim names a claim that only
userinfo carries, a userinfo outage logs the user in under the id_token's `sub` instead --
another identifier namespace for X-User-Id, what backends key accounts on -- and the
session keeps that subject for its whole ttl. Claims used in deny-style Rego rules
(`deny if input.claims.suspended`) fail open the same way. ARCHITECTURE §7: an error in
token handling leaves the request unauthenticated, never authenticated differently.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase

from tests.login_attacks.world import RWorld
from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP, _OAuthError

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
        w = RWorld(self, idp, backend)
        await w.start_custom(
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
