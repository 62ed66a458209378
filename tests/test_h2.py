"""
HTTP/2 over TLS through the whole gateway: the same chain as HTTP/1.1, on real sockets.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET

from tests.support.backends import SiteBackend, answer
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls


class H2StreamInterfaceTests(TestCase):
    """
    An HTTP/2 stream is the request's IClientStream, as the HTTP/1.1 channel is.
    """

    def test_provides_client_stream(self) -> None:
        from zope.interface.verify import verifyClass

        from edgegw.server.h2.stream import H2ClientStream
        from edgegw.stream.boundary import IClientStream, UpgradeNotPossibleError

        self.assertTrue(verifyClass(IClientStream, H2ClientStream))
        stream = H2ClientStream(None, 1, None)  # type: ignore[arg-type]
        self.assertEqual(stream.protocolName, b"h2")
        self.assertRaises(UpgradeNotPossibleError, stream.takeConnection, None)


class H2ThroughTheGatewayTests(TestCase):
    """
    Requests over HTTP/2 reach the same routes, handlers and backends as over HTTP/1.1.
    """

    tls_certificate: bytes

    def gateway(self, responder: Any = None, **kwargs: Any) -> tuple[Any, SiteBackend, int]:
        backend = SiteBackend(responder).start()
        self.addCleanup(backend.stop)
        built, _ = start_gateway(self, f"http://127.0.0.1:{backend.port}", **kwargs)
        return built, backend, listen_tls(self, built.site)

    async def test_health_and_proxy(self) -> None:
        """
        A health route and a proxied GET answer over h2, the backend seeing an
        HTTP/1.1 request with the Host from :authority.
        """
        _, backend, port = self.gateway()
        client = await connect_h2(self, port)
        health = await client.request(b"GET", b"/healthz")
        self.assertEqual(client.negotiated, b"h2")
        self.assertEqual(health.status, 200)
        proxied = await client.request(b"GET", b"/some/path?q=1", [(b"accept", b"text/plain")])
        self.assertEqual((proxied.status, proxied.body), (200, b"hello"))
        seen = backend.requests[-1]
        self.assertEqual(seen.uri, b"/some/path?q=1")
        self.assertEqual(seen.header(b"x-forwarded-host"), b"localhost")
        self.assertIsNone(proxied.header(b"connection"))

    async def test_upload(self) -> None:
        """
        A request body over h2 reaches the backend whole, with its length.
        """

        def echo(request: Any) -> bytes:
            request.content.seek(0)
            return b"got %d" % len(request.content.read())

        _, backend, port = self.gateway(echo)
        client = await connect_h2(self, port)
        body = b"x" * 200_000
        response = await client.request(
            b"POST", b"/upload", [(b"content-length", b"%d" % len(body))], body
        )
        self.assertEqual((response.status, response.body), (200, b"got 200000"))
        self.assertEqual(backend.requests[-1].body, body)

    async def test_concurrent_streams(self) -> None:
        """
        Several streams on one connection are answered, each its own body.
        """

        def path_back(request: Any) -> bytes:
            return bytes(request.uri)

        _, _, port = self.gateway(path_back)
        client = await connect_h2(self, port)
        responses = [client.request(b"GET", b"/n/%d" % i) for i in range(20)]
        bodies = [(await r).body for r in responses]
        self.assertEqual(bodies, [b"/n/%d" % i for i in range(20)])

    async def test_http11_over_the_same_listener(self) -> None:
        """
        A client offering only http/1.1 gets HTTP/1.1 on the same listener.
        """
        from twisted.internet import reactor
        from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
        from twisted.internet.ssl import Certificate, optionsForClientTLS

        from tests.support.rawclient import RawClient

        _, _, port = self.gateway()
        options = optionsForClientTLS(
            "localhost",
            trustRoot=Certificate.loadPEM(self.tls_certificate),
            acceptableProtocols=[b"http/1.1"],
        )
        endpoint = wrapClientTLS(options, TCP4ClientEndpoint(reactor, "127.0.0.1", port))
        raw = await connectProtocol(endpoint, RawClient())
        raw.transport.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = await raw.until(b"\r\n\r\n")
        self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received)
        raw.transport.loseConnection()
        await raw.closed

    async def test_slow_backend_streams(self) -> None:
        """
        A body the backend sends in pieces reaches the client in pieces.
        """
        from twisted.internet import reactor

        pending: list[Any] = []

        def later(request: Any) -> int:
            request.setHeader(b"content-type", b"text/event-stream")
            request.write(b"data: one\n\n")
            pending.append(request)
            return NOT_DONE_YET

        _, _, port = self.gateway(later)
        client = await connect_h2(self, port)
        _stream_id, response = client.start(b"GET", b"/events")
        await client.until(lambda: b"data: one" in response.body)
        self.assertEqual(response.status, 200)
        pending[0].write(b"data: two\n\n")
        await client.until(lambda: b"data: two" in response.body)
        pending[0].finish()
        await response.done
        del reactor


class H2HandlersTests(TestCase):
    """
    The static, api and proxy handlers, cookies and the access log over HTTP/2.
    """

    tls_certificate: bytes

    def serve(self, routes: str) -> int:
        import json as _json  # noqa: F401
        import os

        from twisted.internet import reactor

        from edgegw.assembly.assemble import build_gateway
        from edgegw.config.parse import load_config
        from edgegw.upstream.pool import UpstreamClient
        from tests.support.configs import GATEWAY, write_tree

        self.root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(self.root, "site"))
        with open(os.path.join(self.root, "site", "index.html"), "wb") as f:
            f.write(b"<!doctype html><p>app</p>")
        with open(os.path.join(self.root, "site", "big.bin"), "wb") as f:
            f.write(bytes(range(256)) * 1024)
        tree = write_tree(self.mktemp(), {"a.yaml": GATEWAY + routes.replace("ROOT", self.root)})
        client = UpstreamClient(reactor)
        built = build_gateway(load_config(tree, {}), reactor, client)
        self.addCleanup(client.close)
        return listen_tls(self, built.site)

    STATIC = """\
---
kind: Route
metadata: {name: app}
spec:
  match: "/"
  handler: {type: static, dir: "ROOT/site", spaFallback: true}
"""

    async def test_static_range_and_conditional(self) -> None:
        """
        Static files over h2: whole, a Range (206), a conditional GET (304), HEAD.
        """
        port = self.serve(self.STATIC)
        client = await connect_h2(self, port)
        whole = await client.request(b"GET", b"/big.bin")
        self.assertEqual((whole.status, len(whole.body)), (200, 256 * 1024))
        self.assertEqual(whole.body, bytes(range(256)) * 1024)
        part = await client.request(b"GET", b"/big.bin", [(b"range", b"bytes=10-19")])
        self.assertEqual((part.status, part.body), (206, bytes(range(10, 20))))
        etag = whole.header(b"etag")
        modified = whole.header(b"last-modified")
        validator = [(b"if-none-match", etag)] if etag else [(b"if-modified-since", modified)]
        self.assertTrue(etag or modified)
        again = await client.request(b"GET", b"/big.bin", validator)  # type: ignore[arg-type]
        self.assertEqual((again.status, again.body), (304, b""))
        head = await client.request(b"HEAD", b"/big.bin")
        self.assertEqual((head.status, head.body), (200, b""))
        self.assertEqual(head.header(b"content-length"), b"%d" % (256 * 1024))
        fallback = await client.request(b"GET", b"/deep/link")
        self.assertEqual((fallback.status, fallback.body), (200, b"<!doctype html><p>app</p>"))

    async def test_api_fan_out(self) -> None:
        """
        An api route's concurrent calls are merged and answered over h2.
        """
        import json

        one = SiteBackend(
            answer(body=b'{"name":"ann"}', headers=[(b"content-type", b"application/json")])
        ).start()
        two = SiteBackend(
            answer(body=b"[1,2]", headers=[(b"content-type", b"application/json")])
        ).start()
        self.addCleanup(one.stop)
        self.addCleanup(two.stop)
        port = self.serve(
            f"""\
---
kind: Route
metadata: {{name: dash}}
spec:
  match: "GET /dash"
  access: {{auth: public}}
  handler:
    type: api
    backends:
      - {{group: user, upstream: "http://127.0.0.1:{one.port}", path: "/u"}}
      - {{group: orders, upstream: "http://127.0.0.1:{two.port}", path: "/o"}}
"""
        )
        client = await connect_h2(self, port)
        response = await client.request(b"GET", b"/dash")
        self.assertEqual(response.status, 200)
        self.assertEqual(json.loads(response.body), {"user": {"name": "ann"}, "orders": [1, 2]})

    async def test_cookies_both_ways_and_access_log(self) -> None:
        """
        Cookie crumbs reach the backend joined; several Set-Cookie fields reach the
        client; the access log says HTTP/2.
        """
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        backend = SiteBackend(
            answer(body=b"ok", headers=[(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")])
        ).start()
        self.addCleanup(backend.stop)
        port = self.serve(
            f"""\
---
kind: Route
metadata: {{name: p}}
spec:
  match: "/"
  handler:
    {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}", forwardCookies: true}}
"""
        )
        client = await connect_h2(self, port)
        response = await client.request(b"GET", b"/x", [(b"cookie", b"a=1"), (b"cookie", b"b=2")])
        self.assertEqual(response.status, 200)
        self.assertEqual(backend.requests[-1].header(b"cookie"), b"a=1; b=2")
        self.assertEqual([v for k, v in response.headers if k == b"set-cookie"], [b"a=1", b"b=2"])
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        self.assertEqual(records[-1]["protocol"], "HTTP/2")
        self.assertEqual(records[-1]["status"], 200)


class EventBudgetTests(TestCase):
    """
    The token bucket behind the flood limits.
    """

    def test_burst_then_rate(self) -> None:
        from twisted.internet.task import Clock

        from edgegw.server.h2.budget import EventBudget

        clock = Clock()
        budget = EventBudget(3, 2, clock)
        self.assertEqual([budget.spend() for _ in range(4)], [True, True, True, False])
        clock.advance(0.5)
        self.assertEqual([budget.spend(), budget.spend()], [True, False])
        clock.advance(100)
        self.assertEqual([budget.spend() for _ in range(4)], [True, True, True, False])
        budget.refund(10)
        self.assertEqual([budget.spend() for _ in range(4)], [True, True, True, False])


class ResponseFieldEncoderTests(TestCase):
    """
    The response HPACK encoder decodes as hpack decodes, indexes shared fields once,
    never indexes secrets, and follows the client's table size.
    """

    FIELDS = [
        (b":status", b"200"),
        (b"date", b"Sun, 29 Nov 2026 10:00:00 GMT"),
        (b"x-frame-options", b"DENY"),
        (b"server", b"edgegw"),
        (b"content-type", b"text/html"),
        (b"content-length", b"123"),
        (b"set-cookie", b"sid=secret"),
        (b"x-long", b"v" * 300),
    ]

    def test_round_trip_and_table_sizes(self) -> None:
        from hpack import Decoder

        from edgegw.server.h2.field_encoder import ResponseFieldEncoder

        encoder = ResponseFieldEncoder()
        decoder = Decoder()
        sizes = []
        for i in range(120):
            fields = [*self.FIELDS, (b"x-n", b"%d" % i)]
            block = encoder.encode(fields)
            sizes.append(len(block))
            self.assertEqual([tuple(f) for f in decoder.decode(block, raw=True)], fields)
            if i == 40:
                encoder.header_table_size = 64
            elif i == 60:
                encoder.header_table_size = 0
            elif i == 80:
                encoder.header_table_size = 4096
        # Shared fields are sent as indexes after the first response.
        self.assertLess(sizes[1], sizes[0] - 300)
        # With no table, everything is a literal again.
        self.assertGreater(sizes[61], sizes[1] + 300)

    def test_secrets_never_indexed(self) -> None:
        from edgegw.server.h2.field_encoder import ResponseFieldEncoder

        encoder = ResponseFieldEncoder()
        first = encoder.encode([(b"set-cookie", b"sid=secret")])
        second = encoder.encode([(b"set-cookie", b"sid=secret")])
        self.assertEqual(first, second)
        self.assertIn(b"sid=secret", second)
        # 0001xxxx: never indexed.
        self.assertEqual(first[0] & 0xF0, 0x10)


class H2TelemetryTests(TestCase):
    """
    Metrics and plugins see HTTP/2 requests as they see HTTP/1.1 ones.
    """

    tls_certificate: bytes

    async def test_metrics_count_h2_requests_and_refusals(self) -> None:
        from twisted.internet import reactor

        from edgegw.assembly.assemble import build_gateway
        from edgegw.config.parse import load_config
        from edgegw.upstream.pool import UpstreamClient
        from tests.support.configs import GATEWAY, write_tree

        backend = SiteBackend(answer(body=b"ok", headers=[(b"x-from-backend", b"1")])).start()
        self.addCleanup(backend.stop)
        routes = f"""\
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
apiVersion: edgegw.io/v1
kind: ResponsePlugin
metadata: {{name: marks}}
spec:
  plugin: headers
  config: {{set: {{X-Plugin: seen}}, remove: [X-From-Backend]}}
"""
        root = write_tree(self.mktemp(), {"a.yaml": GATEWAY + routes})
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        gateway = build_gateway(load_config(root, {}), reactor, client)
        metrics = gateway.metrics
        assert metrics is not None
        port = listen_tls(self, gateway.site)
        h2 = await connect_h2(self, port)
        for _ in range(3):
            response = await h2.request(b"GET", b"/api/x")
            self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"x-plugin"), b"seen")
        self.assertIsNone(response.header(b"x-from-backend"))
        counts = {v: p.count for _, v, p in metrics.server_duration.points()}  # type: ignore[attr-defined]
        self.assertEqual(counts, {("/api/", "GET", "2xx"): 3})
        bad = await h2.request(b"GET", b"/api/x", [(b"connection", b"close")])
        self.assertIsNotNone(bad.reset)
        self.assertEqual(metrics.edge_refusals.value((400, "malformed_h2_request")), 1)
        refused = await h2.request(b"GET", b"/api/a;b")
        self.assertEqual(refused.status, 400)
        self.assertEqual(metrics.edge_refusals.value((400, "path_semicolon")), 1)
