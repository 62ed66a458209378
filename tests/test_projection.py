"""
The projection stage (L{edgegw.chain.projection}): inbound C{X-User-*} headers are
stripped and the principal's are set (through the fast path and through
C{Headers.setRawHeaders}, with or without a claims map); per-route projection does not
leak between routes or sessions, public routes with a session get the principal, authz
runs before projection; and routes with the same projection share one rendering of a
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
from collections.abc import Sequence
from typing import Any

from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.chain.projection import projection
from edgegw.identity.principal import Principal
from edgegw.terminal.exchange import Exchange, Handler
from tests.support.browser import Browser
from tests.test_login import world_with_routes
from tests.test_pipeline import Harness, ok_terminal

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


class ProjectionTests(SynchronousTestCase):
    def test_inbound_user_headers_stripped(self) -> None:
        seen: list[list[tuple[bytes, Sequence[bytes]]]] = []

        async def terminal(exchange: Exchange) -> None:
            seen.append(list(exchange.request.requestHeaders.getAllRawHeaders()))
            await ok_terminal(exchange)

        Harness(self, terminal).client.request(
            "GET", "/", [("X-User-Id", "admin"), ("x-user-groups", "root"), ("X-Usr", "kept")]
        )
        names = [name.lower() for name, _ in seen[0]]
        self.assertNotIn(b"x-user-id", names)
        self.assertNotIn(b"x-user-groups", names)
        self.assertIn(b"x-usr", names)

    def test_principal_projected(self) -> None:
        seen: dict[bytes, Sequence[bytes]] = {}

        async def set_principal(exchange: Exchange, next: Handler) -> None:
            exchange.principal = Principal(
                subject="user-1",
                passport={
                    "email": "a@example.com",
                    "given_name": "Ann",
                    "roles": ["a,b", "c"],
                    "verified": True,
                    "nothing": None,
                    "name": "Zoë\r\nX: y",
                },
                groups=("admins", "dev,ops"),
            )
            await next(exchange)

        async def terminal(exchange: Exchange) -> None:
            seen.update(dict(exchange.request.requestHeaders.getAllRawHeaders()))
            await ok_terminal(exchange)

        client = Harness(
            self, terminal, stages=[set_principal, projection(b"X-User-Teams", None)]
        ).client
        client.request("GET", "/", {"X-User-Id": "forged"})
        self.assertEqual(seen[b"X-User-Id"], [b"user-1"])
        self.assertEqual(seen[b"X-User-Teams"], [b"admins,dev%2Cops"])
        self.assertEqual(seen[b"X-User-Email"], [b"a@example.com"])
        self.assertEqual(seen[b"X-User-Given-Name"], [b"Ann"])
        self.assertEqual(seen[b"X-User-Roles"], [b"a%2Cb,c"])
        self.assertEqual(seen[b"X-User-Verified"], [b"true"])
        self.assertEqual(seen[b"X-User-Name"], [b"Zo%C3%AB%0D%0AX: y"])
        self.assertNotIn(b"X-User-Nothing", seen)

    def test_principal_projected_through_set_raw_headers(self) -> None:
        """
        On a Twisted whose Headers is not the plain dict the fast path writes into, the
        same headers are set through Headers.setRawHeaders.
        """
        from edgegw.chain import projection as module

        self.patch(module, "_DIRECT", False)
        self.test_principal_projected()

    def test_principal_projected_twice_from_the_memo(self) -> None:
        """
        A principal's second request gets the headers rendered for its first.
        """
        principal = Principal(subject="user-1", passport={"email": "a@example.com"})
        seen: list[dict[bytes, Sequence[bytes]]] = []

        async def set_principal(exchange: Exchange, next: Handler) -> None:
            exchange.principal = principal
            await next(exchange)

        async def terminal(exchange: Exchange) -> None:
            seen.append(dict(exchange.request.requestHeaders.getAllRawHeaders()))
            await ok_terminal(exchange)

        client = Harness(
            self, terminal, stages=[set_principal, projection(b"X-User-Groups", None)]
        ).client
        client.request("GET", "/", {"X-User-Email": "forged"})
        client.request("GET", "/", {"X-User-Email": "forged"})
        self.assertEqual(len(principal.memo), 1)
        for headers in seen:
            self.assertEqual(headers[b"X-User-Id"], [b"user-1"])
            self.assertEqual(headers[b"X-User-Email"], [b"a@example.com"])

    def test_explicit_claims_map(self) -> None:
        seen: list[dict[bytes, list[bytes]]] = []

        async def set_principal(exchange: Exchange, next: Handler) -> None:
            exchange.principal = Principal("s", {"email": "e@x", "name": "N"}, ())
            await next(exchange)

        async def terminal(exchange: Exchange) -> None:
            headers = exchange.request.requestHeaders
            seen.append({name: list(values) for name, values in headers.getAllRawHeaders()})
            await ok_terminal(exchange)

        stage = projection(b"X-User-Groups", {"email": "X-Mail"})
        client = Harness(self, terminal, stages=[set_principal, stage]).client
        response = client.request("GET", "/", {"X-User-Name": "forged"})
        self.assertEqual(response.status, 200)
        # Only the subject and the mapped claim: no header for the unmapped claim, none
        # for the empty groups, and the forged X-User-* header is gone.
        self.assertEqual(
            seen,
            [{b"Host": [b"gateway.test"], b"X-User-Id": [b"s"], b"X-Mail": [b"e@x"]}],
        )


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
