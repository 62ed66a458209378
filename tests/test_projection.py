"""
The projection stage (L{edgegw.chain.projection}): per-route projection does not leak
between routes or sessions, public routes with a session get the principal, authz runs
before projection; and routes with the same projection share one rendering of a
principal's headers.

C{Principal.memo} is kept per route I{shape}, not per projection stage: were it keyed by
stage, N routes with the same projection (the default: no claims map, the same groups
header) would keep N identical copies of the rendered headers on every cached
principal, and with C{SessionCookie} caching up to C{MAX_OPENED} = 4096 records the
bound would be 4096 x routes x rendered size (a largest, 3-chunk session costs ~20 KB
cached plus ~11 KB per route that projected it: ~970 MiB with 20 routes).
"""

from __future__ import annotations

import contextlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.chain.projection import projection
from edgegw.identity.principal import Principal
from tests.support.browser import Browser
from tests.test_login import world_with_routes

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
        w = await world_with_routes(self, ROUTES)
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
        other = Browser()
        await other.get(w.url("/plain/x"))
        self.assertIsNone(w.backend.requests[-1].header(b"X-User-Id"))


class _Exchange:
    def __init__(self, request: Request, principal: Principal) -> None:
        self.request = request
        self.principal = principal


async def _next(exchange: Any) -> None:
    return None


def _run(stage: Any, exchange: Any) -> None:
    coroutine = stage(exchange, _next)
    with contextlib.suppress(StopIteration):
        coroutine.send(None)


class MemoPerShape(SynchronousTestCase):
    def test_routes_with_the_same_projection_share_one_rendering(self) -> None:
        principal = Principal("alice", {"email": "a@example.com"}, ("admins",))
        stages = [projection(b"X-User-Groups", None) for _ in range(20)]
        for stage in stages:
            _run(stage, _Exchange(Request(DummyChannel()), principal))
        self.assertLessEqual(
            len(principal.memo), 1, f"{len(principal.memo)} identical renderings kept"
        )
