"""
Checks (expected to pass): per-route projection memo does not leak between routes or
sessions; public routes with a session get the principal; authz runs before projection.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.login_attacks.world import rworld

ROUTES = """\
kind: Route
metadata: {name: mapped}
spec:
  match: /mapped/
  type: app
  access:
    auth: required
    projection: {session: {claims: {email: X-Mail}, groups: {header: X-Teams}}}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: plain}
spec:
  match: /plain/
  type: app
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
"""


class ProjectionAcrossRoutes(TestCase):
    async def test_no_cross_route_leak(self) -> None:
        w = await rworld(self, ROUTES)
        await w.login("/mapped/x")
        for _ in range(2):
            await w.browser.get(w.url("/mapped/x"))
            mapped = w.backend.requests[-1]
            await w.browser.get(w.url("/plain/x"), headers={"X-Mail": "forged", "X-Teams": "x"})
            plain = w.backend.requests[-1]
            self.assertEqual(mapped.header(b"X-User-Id"), b"alice")
            self.assertEqual(mapped.header(b"X-Mail"), b"alice@example.com")
            self.assertEqual(mapped.header(b"X-Teams"), b"admins")
            self.assertIsNone(mapped.header(b"X-User-Email"))
            self.assertIsNone(mapped.header(b"X-User-Groups"))
            self.assertEqual(plain.header(b"X-User-Id"), b"alice")  # public route, session
            self.assertEqual(plain.header(b"X-User-Email"), b"alice@example.com")
            self.assertIsNone(plain.header(b"X-Mail"))
            self.assertIsNone(plain.header(b"X-Teams"))
        # Another browser, anonymous, on the public route: nothing of alice's.
        from tests.support.browser import Browser

        other = Browser()
        await other.get(w.url("/plain/x"))
        self.assertIsNone(w.backend.requests[-1].header(b"X-User-Id"))
