"""
The gateway's components counted in its metrics (issue 18, point 2): upstream calls per
upstream with their error class, the edge's and the CSRF check's refusals, and series
that stay bounded whatever paths, methods and credentials clients send.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.address import IPv4Address
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import InFlight
from edgegw.chain.resource_target import ResourceTarget
from edgegw.config.parse import load_config
from edgegw.handlers.api import MAX_BACKEND_BODY
from edgegw.metrics.gateway_metrics import GatewayMetrics
from edgegw.metrics.instruments import Registry
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.configs import write_tree
from tests.support.daemons import http_exchange, sleep
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of, raw_exchange, refused_port

reactor: Any = _reactor

METRICS = """\
---
kind: Telemetry
metadata: {name: t}
spec:
  service: {name: edge}
  metrics: {prometheus: {listen: "127.0.0.1:0"}}
"""


class InstrumentedTests(TestCase):
    async def serve(self, responder: Any = None) -> tuple[Gateway, GatewayMetrics, int, str]:
        backend = SiteBackend(responder or answer(body=b"ok")).start()
        self.addCleanup(backend.stop)
        dead = await refused_port()
        routes = f"""\
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
        gateway, port = self.listening(routes)
        assert gateway.metrics is not None
        return gateway, gateway.metrics, port, f"http://127.0.0.1:{backend.port}"

    def listening(self, routes: str) -> tuple[Gateway, int]:
        """
        A gateway with metrics and C{routes} (YAML documents), listening on a free port.
        """
        text = 'kind: Gateway\nmetadata: {name: gw}\nspec: {listen: "127.0.0.1:0"}\n'
        root = write_tree(self.mktemp(), {"a.yaml": text + METRICS + routes})
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = listen_local(gateway.site)
        self.addCleanup(listening.stopListening)
        return gateway, port_of(listening)

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

    async def test_api_backend_failures_by_class(self) -> None:
        """
        An api backend's unsuccessful status, a body that is not JSON and one too large
        each have their own error.type (the status code, the exception type).
        """

        def backend(request: Any) -> bytes:
            if request.path == b"/status":
                request.setResponseCode(503)
                return b"{}"
            if request.path == b"/text":
                return b"not json"
            return b"[" + b"0," * (MAX_BACKEND_BODY // 2) + b"0]"

        upstream = SiteBackend(backend).start()
        self.addCleanup(upstream.stop)
        origin = f"http://127.0.0.1:{upstream.port}"
        routes = f"""\
---
kind: Route
metadata: {{name: dash}}
spec:
  match: "GET /dash"
  access: {{auth: public}}
  handler:
    type: api
    backends:
      - {{group: status, upstream: "{origin}", path: /status, required: false}}
      - {{group: text, upstream: "{origin}", path: /text, required: false}}
      - {{group: big, upstream: "{origin}", path: /big, required: false}}
"""
        gateway, port = self.listening(routes)
        await http_exchange(port, "GET", "/dash")
        assert gateway.metrics is not None
        failed = {
            (values[1], values[4]) for _, values, _ in gateway.metrics.client_duration.points()
        }
        self.assertEqual(
            failed, {("status", "503"), ("text", "NotJSONError"), ("big", "BodyTooLargeError")}
        )

    async def test_a_key_set_failure_is_not_a_discovery_failure(self) -> None:
        idp = FakeIdP()
        await idp.start(self)
        dead = await refused_port()
        idp_doc = (
            "---\nkind: IdP\nmetadata: {name: idp}\nspec:\n  type: oidc\n"
            f'  issuer: "{idp.issuer}"\n  clientID: gw\n'
            f'  verificationOnly: true\n  bearer: {{jwksURL: "http://127.0.0.1:{dead}/jwks"}}\n'
        )
        gateway, _ = self.listening(idp_doc)
        provider, metrics = gateway.idp, gateway.metrics
        assert provider is not None and metrics is not None
        provider.startService()
        self.addCleanup(provider.stopService)
        await self._until(lambda: provider.last_error is not None)
        self.assertEqual(
            {values: value for _, values, value in metrics.idp_fetches.points()},
            {("discovery", "ok"): 1, ("keys", "ok"): 1, ("keys", "failed"): 1},
        )

    async def _until(self, test: Any) -> None:
        for _ in range(200):
            if test():
                return
            await sleep(0.02)
        self.fail("condition not reached")

    async def test_client_gone_counted_without_status(self) -> None:
        """
        A client that leaves before any response (the upstream hangs) is counted with
        status class C{none} and logged with no status, not with Twisted's default 200.
        """
        gateway, metrics, port, _ = await self.serve(lambda request: NOT_DONE_YET)
        lines: list[dict[str, Any]] = []
        gateway.access_log.emit = lines.append  # type: ignore[method-assign,assignment]
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n")
        await self._until(lambda: metrics.server_active.value(("GET",)) == 1)
        client.close()
        await self._until(lambda: lines)
        self.assertEqual(metrics.server_active.value(("GET",)), 0)
        counted = {values: point.count for _, values, point in metrics.server_duration.points()}  # type: ignore[attr-defined]
        self.assertEqual(counted, {("/api/", "GET", "none"): 1})
        self.assertIsNone(lines[0]["status"])
        self.assertTrue(lines[0]["client_gone"])

    async def test_client_gone_from_a_gateway_endpoint_counted_without_status(self) -> None:
        """
        The same for the gateway's own endpoints (login, callback, readiness: plain
        Resources on the mux): a client that leaves before the answer is no 200.
        """
        metrics = GatewayMetrics(Registry())
        access = AccessLog(metrics=metrics)
        lines: list[dict[str, Any]] = []
        access.emit = lines.append  # type: ignore[method-assign, assignment]
        inflight = InFlight()
        hanging = Resource()
        hanging.render = lambda request: NOT_DONE_YET  # type: ignore[method-assign]
        target = ResourceTarget("/auth/callback", hanging, access, inflight)

        class Mounted(Resource):
            isLeaf = True

            def render(self, request: Any) -> int:
                return target.serve(request, {})

        port = listen_local(Site(Mounted()))
        self.addCleanup(port.stopListening)
        client = socket.create_connection(("127.0.0.1", port_of(port)))
        client.sendall(b"GET /auth/callback?code=x HTTP/1.1\r\nHost: a\r\n\r\n")
        await self._until(lambda: inflight.count == 1)
        client.close()
        await self._until(lambda: lines)
        counted = {values: point.count for _, values, point in metrics.server_duration.points()}  # type: ignore[attr-defined]
        self.assertEqual(counted, {("/auth/callback", "GET", "none"): 1})
        self.assertIsNone(lines[0]["status"])
        self.assertTrue(lines[0]["client_gone"])

    async def test_abandoned_body_counted_with_its_status(self) -> None:
        """
        A 400 the channel writes itself for a malformed chunked body of a request
        already being proxied is counted and logged as that 400.
        """
        gateway, metrics, port, _ = await self.serve(lambda request: NOT_DONE_YET)
        lines: list[dict[str, Any]] = []
        gateway.access_log.emit = lines.append  # type: ignore[method-assign,assignment]
        got = await raw_exchange(
            port,
            b"POST /api/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\nZZ\r\n",
        )
        self.assertTrue(got.startswith(b"HTTP/1.1 400 "), got)
        await self._until(lambda: lines)
        counted = {values: point.count for _, values, point in metrics.server_duration.points()}  # type: ignore[attr-defined]
        self.assertEqual(counted, {("/api/", "POST", "4xx"): 1})
        self.assertEqual(lines[0]["status"], 400)
        self.assertEqual(metrics.edge_refusals.value((400, "bad_request")), 1)

    async def test_failing_log_line_still_ends_the_request_count(self) -> None:
        """
        An access-log line that cannot be written does not leave the in-flight gauge
        raised, and the request is still counted.
        """
        gateway, metrics, port, _ = await self.serve()

        def broken(record: dict[str, Any]) -> None:
            raise TypeError("cannot encode")

        gateway.access_log.emit = broken  # type: ignore[method-assign]
        await http_exchange(port, "GET", "/api/x")
        self.flushLoggedErrors(TypeError)
        self.assertEqual(metrics.server_active.value(("GET",)), 0)
        counted = sum(point.count for _, _, point in metrics.server_duration.points())  # type: ignore[attr-defined]
        self.assertEqual(counted, 1)


class ObservedTests(TestCase):
    def build(self, root: str, metrics_from: GatewayMetrics | None = None) -> Gateway:
        root = os.path.abspath(root)
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  accessLog: {{output: {os.path.join(root, "access.log")}}}
{METRICS}"""
        write_tree(root, {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        client.pool_state = lambda: [  # type: ignore[method-assign]
            ("https://api:8443", 1, 2, 0),
            ("https://api:8443", 0, 1, 3),  # the same origin, TLS verification skipped
        ]
        config = load_config(os.path.join(root, "a.yaml"), {})
        return build_gateway(config, reactor, client, metrics_from=metrics_from)

    def observed(self, gateway: Gateway, name: str) -> dict[Any, object]:
        assert gateway.metrics is not None
        [instrument] = [i for i in gateway.metrics.registry.instruments if i.name == name]
        values = [values for _, values, _ in instrument.points()]
        self.assertEqual(len(values), len(set(values)), f"{name}: one series twice")
        return {values: value for _, values, value in instrument.points()}

    def test_pools_to_one_origin_are_one_series(self) -> None:
        gateway = self.build(self.mktemp())
        self.assertEqual(
            self.observed(gateway, "http.client.open_connections"),
            {("https://api:8443", "idle"): 1, ("https://api:8443", "active"): 3},
        )
        self.assertEqual(
            self.observed(gateway, "edgegw.upstream.pool.waiting"), {("https://api:8443",): 3}
        )

    def test_dropped_lines_count_on_across_a_reload(self) -> None:
        """
        Lines the old writer drops after the new gateway is built (while it warms up,
        and while the old one drains) count on in the one series, as do the new
        writer's.
        """
        root = self.mktemp()
        old = self.build(root)
        old_writer = old.access_log.writer
        assert old_writer is not None
        self.addCleanup(old_writer.close)
        self.assertEqual(self.observed(old, "edgegw.access_log.dropped"), {(): 0})
        old_writer._drop(5, "the output is not keeping up")
        new = self.build(root, metrics_from=old.metrics)
        assert new.metrics is not None
        new.metrics.registry.adopt()
        old_writer._drop(3, "the output is not keeping up")
        assert new.access_log.writer is not None
        self.addCleanup(new.access_log.writer.close)
        new.access_log.writer._drop(2, "the output is not keeping up")
        self.assertEqual(self.observed(new, "edgegw.access_log.dropped"), {(): 10})

    def test_refused_connections_count_on_across_a_reload(self) -> None:
        """
        The connections the old site refuses count on after a reload, into the same
        series as the new site's.
        """
        root = self.mktemp()
        old = self.build(root)
        both = {("maxConnections",): 0, ("maxConnectionsPerAddress",): 0}
        self.assertEqual(self.observed(old, "edgegw.edge.connections_refused"), both)
        peer = IPv4Address("TCP", "192.0.2.1", 4000)
        old.site.connections.max_connections = 1
        self.assertIsNotNone(old.site.buildProtocol(peer))
        old.site.buildProtocol(peer)  # over the cap: refused
        new = self.build(root, metrics_from=old.metrics)
        old.site.buildProtocol(peer)  # a refusal while the new one warms up
        new.site.connections.max_per_address = 1
        new.site.buildProtocol(peer)
        new.site.buildProtocol(peer)
        self.assertEqual(
            self.observed(new, "edgegw.edge.connections_refused"),
            {("maxConnections",): 2, ("maxConnectionsPerAddress",): 1},
        )
