"""
Principal.memo is keyed by projection *stage* (key = object() per route), although the
comment says "rendered once per route shape": N routes with the same projection (the
default: no claims map, the same groups header) keep N identical copies of the rendered
headers on every cached principal. With SessionCookie caching up to MAX_OPENED = 4096
records, the real bound is 4096 x routes x rendered size: measured (exp/memo_size.py), a
largest (3-chunk) session costs ~20 KB cached plus ~11 KB per route that projected it:
~81 MiB with no routes, ~970 MiB with 20 routes, ~2.3 GiB with 50. One IdP account whose
own claims fill the cookie, logged in 4096 times and sent to each route, gets there.
"""

from __future__ import annotations

import contextlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.chain.projection import projection
from edgegw.identity.principal import Principal


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
