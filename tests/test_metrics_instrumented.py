"""
The gateway's components counted in its metrics (issue 18, point 2): upstream calls per
upstream with their error class, the edge's and the CSRF check's refusals, and series
that stay bounded whatever paths, methods and credentials clients send.
"""

from __future__ import annotations

import secrets
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from edgegw.config.parse import load_config
from edgegw.gateway import Gateway, build_gateway
from edgegw.metrics.gateway import GatewayMetrics
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.configs import write_tree
from tests.support.daemons import http_exchange
from tests.support.processes import listen_local, port_of, refused_port

reactor: Any = _reactor


class InstrumentedTests(TestCase):
    async def serve(self) -> tuple[Gateway, GatewayMetrics, int, str]:
        backend = SiteBackend(answer(body=b"ok")).start()
        self.addCleanup(backend.stop)
        dead = await refused_port()
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec: {{listen: "127.0.0.1:0"}}
---
kind: Telemetry
metadata: {{name: t}}
spec:
  service: {{name: edge}}
  metrics: {{prometheus: {{listen: "127.0.0.1:0"}}}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}
---
kind: Route
metadata: {{name: dead}}
spec:
  match: /dead/
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{dead}"}}
"""
        root = write_tree(self.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = listen_local(gateway.site)
        self.addCleanup(listening.stopListening)
        assert gateway.metrics is not None
        return gateway, gateway.metrics, port_of(listening), f"http://127.0.0.1:{backend.port}"

    async def test_upstream_calls_and_refusals(self) -> None:
        _, metrics, port, origin = await self.serve()
        for _ in range(3):
            self.assertEqual((await http_exchange(port, "GET", "/api/x")).status, 200)
        self.assertEqual((await http_exchange(port, "GET", "/dead/x")).status, 502)
        ok = metrics.client_duration.point((origin, "", "GET", "2xx", ""))
        assert ok is not None
        self.assertEqual(ok.count, 3)
        failed = [
            (values, point)
            for _, values, point in metrics.client_duration.points()
            if values[-1] not in ("",)
        ]
        self.assertEqual(len(failed), 1)
        self.assertEqual(failed[0][0][3], "none")  # no status: the connection was refused
        pool = {
            values: value
            for instrument in metrics.registry.instruments
            if instrument.name == "http.client.open_connections"
            for _, values, value in instrument.points()
        }
        self.assertEqual(pool[(origin, "idle")], 1)
        # The edge's own refusals, and the CSRF check's.
        self.assertEqual((await http_exchange(port, "GET", "/api/a;b")).status, 400)
        self.assertEqual(metrics.edge_refusals.value((400, "path_semicolon")), 1)
        posted = await http_exchange(
            port, "POST", "/api/x", {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil"}
        )
        self.assertEqual(posted.status, 403)
        self.assertEqual(metrics.csrf_refusals.value(("sec_fetch_site",)), 1)
        self.assertEqual((await http_exchange(port, "GET", "/" + "a" * 20000)).status, 414)
        self.assertEqual(metrics.edge_refusals.value((414, "uri_too_long")), 1)

    async def test_series_stay_bounded(self) -> None:
        _, metrics, port, _ = await self.serve()
        methods = ["GET", "POST", "BREW", "PATCH", "X" + secrets.token_hex(2).upper()]
        for n in range(1000):
            path = f"/{secrets.token_hex(4)}/{secrets.token_hex(3)}?q={secrets.token_hex(8)}"
            if n % 3 == 0:
                path = "/api" + path
            await http_exchange(
                port,
                methods[n % len(methods)],
                path,
                {"Authorization": f"Bearer {secrets.token_urlsafe(16)}"},
            )
        counted = sum(point.count for _, _, point in metrics.server_duration.points())  # type: ignore[attr-defined]
        self.assertEqual(counted, 1000)
        for instrument in metrics.registry.instruments:
            series = list(instrument.points())
            self.assertLess(len(series), 40, (instrument.name, series[:5]))
            for _, values, _ in series:
                for value in values:
                    self.assertNotIn("?", str(value))
