"""
Tracing: the Telemetry resource, SERVER and CLIENT spans, propagation, log correlation.

Span trees are checked with the SDK's in-memory exporter; export over OTLP (HTTP and
gRPC) is checked against real receivers in L{ExportTests}.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.telemetry import CorrelationTracer, traces_url
from edgegw.upstream.pool import UpstreamClient
from tests.support.configs import GATEWAY, load_text, problems_of, write_tree
from tests.support.log_capture import capture_log
from tests.support.memory import MemoryClient
from tests.support.processes import listen_local, port_of, refused_port
from tests.support.rawclient import connect, response_complete

TELEMETRY = """\
kind: Telemetry
metadata: {name: t}
spec:
  service: {name: edge-test, version: "1.2.3"}
  resource: {attributes: {deployment.environment.name: test}}
  accessLog: {level: info, requestHeaders: [User-Agent], fields: {env: test}}
---
"""
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Recorder(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.traceparents: list[str | None] = []

    def render(self, request: Request) -> bytes:
        value = request.getHeader(b"traceparent")
        self.traceparents.append(value.decode() if value else None)
        request.setHeader(b"content-type", b"application/json")
        return b'{"ok":true}'


class ConfigTests(SynchronousTestCase):
    def test_fields_and_defaults(self) -> None:
        config = load_text(
            self.mktemp(),
            """\
            kind: Telemetry
            metadata: {name: t}
            spec:
              service: {name: edge}
              otlp: {endpoint: "http://127.0.0.1:4318", headers: {x-api-key: k}, timeout: 2s}
              sampling: {ratio: 0.25}
            """,
        )
        spec = config.telemetry
        assert spec is not None
        self.assertEqual(
            (spec.otlp_protocol, spec.otlp_headers, spec.otlp_timeout, spec.sampling_ratio),
            ("http/protobuf", {"x-api-key": "k"}, 2.0, 0.25),
        )
        self.assertEqual(spec.access_log_level, "info")

    def test_errors(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                """\
                kind: Telemetry
                metadata: {name: t}
                spec:
                  service: {nam: x}
                  otlp: {endpoint: "ftp://x", protocol: thrift}
                  sampling: {ratio: 2}
                  accessLog: {level: loud, requestHeaders: ["bad header"]}
                """,
            ),
            [
                'document 2, Telemetry "t": spec.service.name: required field is missing',
                'document 2, Telemetry "t": spec.service.nam: unknown field; did you mean "name"?',
                'document 2, Telemetry "t": spec.otlp.endpoint: "ftp://x" is not a valid URL: '
                "expected http:// or https:// followed by a host",
                'document 2, Telemetry "t": spec.otlp.protocol: "thrift" is not one of '
                '"http/protobuf", "grpc"',
                'document 2, Telemetry "t": spec.sampling.ratio: must be between 0 and 1, got 2',
                'document 2, Telemetry "t": spec.accessLog.level: "loud" is not one of "debug", '
                '"info", "warn", "error"',
                'document 2, Telemetry "t": spec.accessLog.requestHeaders[0]: "bad header" is '
                "not a valid HTTP header name",
            ],
        )

    def test_traces_url(self) -> None:
        self.assertEqual(traces_url("http://c:4318"), "http://c:4318/v1/traces")
        self.assertEqual(traces_url("http://c:4318/"), "http://c:4318/v1/traces")
        self.assertEqual(traces_url("http://c/otlp/v1/traces"), "http://c/otlp/v1/traces")


class AuthorizationInAccessLog(SynchronousTestCase):
    """
    Credentials never reach the access log: C{accessLog.requestHeaders} refuses
    C{Authorization}, C{Cookie} and C{Proxy-Authorization}.
    """

    def test_request_headers_authorization_is_refused(self) -> None:
        for header in ("Authorization", "Cookie", "Proxy-Authorization"):
            problems = problems_of(
                self.mktemp(),
                f"""\
                kind: Telemetry
                metadata: {{name: t}}
                spec:
                  service: {{name: edge-test}}
                  accessLog: {{requestHeaders: [{header}]}}
                """,
            )
            self.assertTrue(problems, header)


class _SpanHarness(TestCase):
    def setUp(self) -> None:
        self.spans = InMemorySpanExporter()
        self.backend = Recorder()
        port = listen_local(Site(self.backend))
        self.addCleanup(port.stopListening)
        self.upstream = f"http://127.0.0.1:{port_of(port)}"

    def gateway(
        self, routes: str, telemetry: str = TELEMETRY, exported: bool = True
    ) -> tuple[int, Gateway]:
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY
                + "---\n"
                + telemetry
                + textwrap.dedent(routes).replace("UP", self.upstream)
            },
        )
        client = UpstreamClient(reactor)
        gateway = build_gateway(
            load_config(root, {}),
            reactor,
            client,
            SimpleSpanProcessor(self.spans) if exported else None,
        )
        listening = listen_local(gateway.site)
        self.addCleanup(listening.stopListening)
        self.addCleanup(client.close)
        return port_of(listening), gateway

    async def get(self, port: int, target: str, headers: str = "") -> bytes:
        client = await connect(port)
        client.send(
            f"GET {target} HTTP/1.1\r\nHost: gw.test\r\n{headers}Connection: close\r\n\r\n".encode()
        )
        data = await client.until(response_complete)
        await client.close()
        return data

    def finished_list(self) -> list[Any]:
        return list(self.spans.get_finished_spans())

    def finished(self) -> dict[str, Any]:
        return {span.name: span for span in self.finished_list()}


class SpanTests(_SpanHarness):
    async def test_proxied_request_span_tree(self) -> None:
        port, _ = self.gateway(
            """\
            kind: Route
            metadata: {name: p}
            spec: {match: "GET /api/{id}", access: {auth: public},
                   handler: {type: reverse-proxy, upstream: "UP"}}
            """
        )
        await self.get(port, "/api/7?secret=x", "User-Agent: tester/1\r\n")
        spans = self.finished()
        server = spans["GET GET /api/{id}"]
        client = spans["GET"]
        self.assertEqual(server.kind, SpanKind.SERVER)
        self.assertEqual(client.kind, SpanKind.CLIENT)
        self.assertEqual(client.context.trace_id, server.context.trace_id)
        self.assertEqual(client.parent.span_id, server.context.span_id)
        self.assertIsNone(server.parent)
        self.assertEqual(
            {
                k: server.attributes[k]
                for k in (
                    "http.request.method",
                    "url.path",
                    "url.scheme",
                    "http.route",
                    "http.response.status_code",
                    "client.address",
                    "user_agent.original",
                )
            },
            {
                "http.request.method": "GET",
                "url.path": "/api/7",
                "url.scheme": "http",
                "http.route": "GET /api/{id}",
                "http.response.status_code": 200,
                "client.address": "127.0.0.1",
                "user_agent.original": "tester/1",
            },
        )
        self.assertEqual(client.attributes["http.response.status_code"], 200)
        self.assertEqual(client.attributes["url.full"], self.upstream + "/api/7")
        self.assertEqual(server.resource.attributes["service.name"], "edge-test")
        self.assertEqual(server.resource.attributes["service.version"], "1.2.3")
        # The backend continues the trace from the CLIENT span.
        expected = f"00-{client.context.trace_id:032x}-{client.context.span_id:016x}"
        (received,) = self.backend.traceparents
        assert received is not None
        self.assertEqual(received.rsplit("-", 1)[0], expected)

    async def test_h2_request_span(self) -> None:
        """
        A request over HTTP/2 gets its server span as over HTTP/1.1, with the protocol
        version and the https scheme, and its upstream call a child span.
        """
        from tests.support.h2client import connect_h2, listen_tls

        _, gateway = self.gateway(
            """\
            kind: Route
            metadata: {name: p}
            spec: {match: "GET /api/{id}", access: {auth: public},
                   handler: {type: reverse-proxy, upstream: "UP"}}
            """
        )
        client = await connect_h2(self, listen_tls(self, gateway.site))
        self.assertEqual((await client.request(b"GET", b"/api/7")).status, 200)
        spans = self.finished()
        server = spans["GET GET /api/{id}"]
        self.assertEqual(server.attributes["network.protocol.version"], "2")
        self.assertEqual(server.attributes["url.scheme"], "https")
        self.assertEqual(spans["GET"].parent.span_id, server.context.span_id)

    async def test_inbound_traceparent_continued(self) -> None:
        port, _ = self.gateway(
            """\
            kind: Route
            metadata: {name: p}
            spec: {match: /, access: {auth: public}, handler: {type: reverse-proxy, upstream: "UP"}}
            """
        )
        await self.get(port, "/x", f"traceparent: {PARENT}\r\n")
        server = next(s for s in self.finished_list() if s.kind == SpanKind.SERVER)
        self.assertEqual(f"{server.context.trace_id:032x}", PARENT.split("-")[1])
        self.assertEqual(f"{server.parent.span_id:016x}", PARENT.split("-")[2])
        # The client's own traceparent is replaced by the gateway's.
        self.assertNotEqual(self.backend.traceparents[0], PARENT)
        received = self.backend.traceparents[0]
        assert received is not None
        self.assertEqual(received.split("-")[1], PARENT.split("-")[1])

    async def test_api_backends_each_get_a_client_span(self) -> None:
        port, _ = self.gateway(
            """\
            kind: Route
            metadata: {name: a}
            spec:
              match: GET /dash
              handler:
                type: api
                backends:
                  - {group: one, upstream: "UP", path: /one}
                  - {group: two, upstream: "UP", path: /two}
            """
        )
        await self.get(port, "/dash")
        spans = self.finished_list()
        server = next(s for s in spans if s.kind == SpanKind.SERVER)
        clients = [s for s in spans if s.kind == SpanKind.CLIENT]
        self.assertEqual(
            sorted(s.attributes["edgegw.upstream.name"] for s in clients), ["one", "two"]
        )
        for span in clients:
            self.assertEqual(span.parent.span_id, server.context.span_id)

    async def test_denial_recorded_on_span_and_5xx_is_error(self) -> None:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        port, _ = self.gateway(
            """\
            kind: Policy
            metadata: {name: admins}
            spec: {require: {groups: [admin]}}
            ---
            kind: Route
            metadata: {name: locked}
            spec: {match: /locked, handler: {type: health}, access: {authorize: [admins]}}
            ---
            kind: Route
            metadata: {name: broken}
            spec: {match: /broken, access: {auth: public},
                   handler: {type: reverse-proxy, upstream: "http://127.0.0.1:1"}}
            """
        )
        await self.get(port, "/locked")
        await self.get(port, "/broken")
        spans = self.finished()
        locked = spans["GET /locked"]
        self.assertEqual(
            [(event.name, dict(event.attributes)) for event in locked.events],
            [("authz.denied", {"reason": "policy admins: no authenticated principal"})],
        )
        self.assertEqual(locked.attributes["http.response.status_code"], 403)
        broken = spans["GET /broken"]
        self.assertEqual(broken.status.status_code.name, "ERROR")
        client = spans["GET"]
        self.assertEqual(client.status.status_code.name, "ERROR")
        self.assertIn("ConnectionRefusedError", client.attributes["error.type"])

    async def test_access_log_correlation(self) -> None:
        events = capture_log(self)
        port, _ = self.gateway(
            """\
            kind: Route
            metadata: {name: h}
            spec: {match: /h, handler: {type: health}}
            """
        )
        await self.get(port, "/h", "User-Agent: tester/2\r\n")
        await self.get(port, "/missing")
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        spans = {s.name: s for s in self.finished_list()}
        routed, edge = records
        self.assertEqual(routed["trace_id"], f"{spans['GET /h'].context.trace_id:032x}")
        self.assertEqual(routed["span_id"], f"{spans['GET /h'].context.span_id:016x}")
        self.assertEqual(routed["request_headers"], {"user-agent": "tester/2"})
        self.assertEqual(routed["env"], "test")
        self.assertEqual(edge["trace_id"], f"{spans['GET'].context.trace_id:032x}")


class CorrelationOnlyTests(_SpanHarness):
    """
    A Telemetry resource without an exporter: spans carry ids and the sampling decision
    only (L{CorrelationTracer}), for the access log and the traceparent sent upstream.
    """

    PROXY = """\
        kind: Route
        metadata: {name: p}
        spec: {match: /, access: {auth: public}, handler: {type: reverse-proxy, upstream: "UP"}}
        """

    def sampled(self, ratio: str) -> str:
        return TELEMETRY.replace("spec:\n", f"spec:\n  sampling: {{ratio: {ratio}}}\n", 1)

    async def test_ids_for_the_log_and_upstream_and_the_sampling_decision(self) -> None:
        events = capture_log(self)
        port, gateway = self.gateway(self.PROXY, exported=False)
        assert gateway.telemetry is not None
        self.assertIsInstance(gateway.telemetry.tracer, CorrelationTracer)
        await self.get(port, "/x")
        record = next(e["access"] for e in events if e.get("log_namespace") == "edgegw.access")
        sent = self.backend.traceparents[0]
        assert sent is not None
        version, trace_id, span_id, flags = sent.split("-")
        # The access log's trace is the one sent upstream (its span is the CLIENT span,
        # a child of the SERVER span the log names).
        self.assertEqual(record["trace_id"], trace_id)
        self.assertRegex(record["span_id"], "^[0-9a-f]{16}$")
        self.assertNotEqual(record["span_id"], span_id)
        self.assertEqual((version, flags), ("00", "01"))
        # Nothing recorded or exported.
        self.assertEqual(self.finished_list(), [])

    async def test_inbound_trace_continued_and_ratio_followed(self) -> None:
        port, _ = self.gateway(self.PROXY, telemetry=self.sampled("0"), exported=False)
        await self.get(port, "/x")
        await self.get(port, "/x", f"traceparent: {PARENT}\r\n")
        unsampled, continued = self.backend.traceparents
        assert unsampled is not None and continued is not None
        # Ratio 0: a new trace is not sampled; a sampled parent is followed.
        self.assertTrue(unsampled.endswith("-00"), unsampled)
        self.assertEqual(continued.split("-")[1], PARENT.split("-")[1])
        self.assertTrue(continued.endswith("-01"), continued)


class WithoutTelemetryTests(SynchronousTestCase):
    def test_no_tracing_layer_and_no_trace_fields(self) -> None:
        events = capture_log(self)
        config = load_text(
            self.mktemp(),
            "kind: Route\nmetadata: {name: h}\nspec: {match: /h, handler: {type: health}}\n",
        )
        gateway = build_gateway(config, Clock())
        self.assertIsNone(gateway.telemetry)
        self.assertEqual(type(gateway.site.resource.dispatcher).__name__, "MuxDispatcher")
        MemoryClient(gateway.site).request("GET", "/h", {"traceparent": PARENT})
        record = next(e["access"] for e in events if e.get("log_namespace") == "edgegw.access")
        self.assertNotIn("trace_id", record)


class ExportTests(TestCase):
    """
    Spans exported over OTLP to real receivers, through the batch processor.
    """

    async def export_roundtrip(self, protocol: str, endpoint: str, collector: Any) -> None:
        backend = Recorder()
        port = listen_local(Site(backend))
        self.addCleanup(port.stopListening)
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY
                + f"""---
kind: Telemetry
metadata: {{name: t}}
spec:
  service: {{name: edge-export}}
  otlp: {{endpoint: "{endpoint}", protocol: {protocol}, headers: {{X-Api-Key: k1}}, timeout: 5s}}
---
kind: Route
metadata: {{name: p}}
spec: {{match: /, access: {{auth: public}},
       handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{port_of(port)}"}}}}
"""
            },
        )
        client = UpstreamClient(reactor)
        gateway = build_gateway(load_config(root, {}), reactor, client)
        assert gateway.telemetry is not None
        self.addCleanup(gateway.telemetry.shutdown)
        listening = listen_local(gateway.site)
        self.addCleanup(listening.stopListening)
        self.addCleanup(client.close)
        raw = await connect(port_of(listening))
        raw.send(b"GET /x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        await raw.until(response_complete)
        await raw.close()
        await gateway.telemetry.force_flush()
        spans = await collector.wait_for(2)
        by_kind = {span.kind: span for span in spans}
        server, client_span = by_kind["SERVER"], by_kind["CLIENT"]
        self.assertEqual(server.name, "GET /")
        self.assertEqual(client_span.trace_id, server.trace_id)
        self.assertEqual(client_span.parent_span_id, server.span_id)
        self.assertEqual(server.resource["service.name"], "edge-export")
        self.assertEqual(server.attributes["http.response.status_code"], 200)
        self.assertEqual(collector.requests[0]["x-api-key"], "k1")
        received = backend.traceparents[0]
        assert received is not None
        self.assertEqual(received.split("-")[1:3], [client_span.trace_id, client_span.span_id])

    async def test_http_protobuf(self) -> None:
        from tests.support.otlp import start_http_receiver

        endpoint, collector = await start_http_receiver(self)
        # The collector's base URL: the gateway adds /v1/traces.
        await self.export_roundtrip("http/protobuf", endpoint.removesuffix("/v1/traces"), collector)

    async def test_grpc(self) -> None:
        from tests.support.otlp import start_grpc_receiver

        endpoint, collector = await start_grpc_receiver(self)
        await self.export_roundtrip("grpc", endpoint, collector)

    async def test_unreachable_collector_never_fails_requests(self) -> None:
        dead_port = await refused_port()
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY
                + f"""---
kind: Telemetry
metadata: {{name: t}}
spec:
  service: {{name: edge}}
  otlp: {{endpoint: "http://127.0.0.1:{dead_port}", timeout: 1s}}
---
kind: Route
metadata: {{name: h}}
spec: {{match: /h, handler: {{type: health}}}}
"""
            },
        )
        gateway = build_gateway(load_config(root, {}), reactor)
        assert gateway.telemetry is not None
        self.addCleanup(gateway.telemetry.shutdown)
        listening = listen_local(gateway.site)
        self.addCleanup(listening.stopListening)
        self.addCleanup(gateway.upstream_client.close)
        for _ in range(20):
            raw = await connect(port_of(listening))
            raw.send(b"GET /h HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            data = await raw.until(response_complete)
            await raw.close()
            self.assertTrue(data.startswith(b"HTTP/1.1 200 OK"), data)
        # Exporting fails in the processor's thread; requests were never held up by it.
        await gateway.telemetry.force_flush()


class RecoverCorrelationTests(SynchronousTestCase):
    def test_panic_logged_with_trace_and_span_ids(self) -> None:
        from edgegw.chain.pipeline import RouteRunner
        from edgegw.terminal.exchange import Exchange

        events = capture_log(self)
        spans = InMemorySpanExporter()
        config = load_text(
            self.mktemp(),
            TELEMETRY
            + "kind: Route\nmetadata: {name: h}\nspec: {match: /boom, handler: {type: health}}\n",
        )
        gateway = build_gateway(config, Clock(), None, SimpleSpanProcessor(spans))
        runner: RouteRunner = gateway.site.resource.dispatcher.inner.mux.route(
            "GET", "", "/boom"
        ).target

        async def broken(exchange: Exchange) -> None:
            raise RuntimeError("kaboom")

        from edgegw.chain.pipeline import compose
        from edgegw.chain.recover import recover

        runner._handler = compose([recover], broken)
        response = MemoryClient(gateway.site).request("GET", "/boom")
        self.assertEqual(response.status, 500)
        failure = next(e for e in events if e.get("log_namespace") == "edgegw.recover")
        server = next(s for s in spans.get_finished_spans())
        self.assertEqual(failure["trace_id"], f"{server.context.trace_id:032x}")
        self.assertEqual(failure["span_id"], f"{server.context.span_id:016x}")
        self.assertEqual(server.status.status_code.name, "ERROR")
        self.flushLoggedErrors(RuntimeError)


class ClientAddressTests(SynchronousTestCase):
    def test_rightmost_untrusted_hop(self) -> None:
        from edgegw.edge.forwarded import ForwardedFilter
        from edgegw.edge.tracing import client_from_chain

        trusted = ForwardedFilter(["10.0.0.0/8"])
        # The client wrote "6.6.6.6" itself; the trusted proxy appended the real peer.
        self.assertEqual(client_from_chain([b"6.6.6.6, 203.0.113.7"], trusted), "203.0.113.7")
        self.assertEqual(
            client_from_chain([b"203.0.113.7, 10.0.0.2", b"10.0.0.3"], trusted), "203.0.113.7"
        )
        self.assertEqual(client_from_chain([b"10.0.0.2"], trusted), "10.0.0.2")

    def test_reserved_access_log_fields(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                "kind: Telemetry\nmetadata: {name: t}\n"
                "spec: {service: {name: e}, accessLog: {fields: {status: '200', env: prod}}}\n",
            ),
            [
                'document 2, Telemetry "t": spec.accessLog.fields.status: "status" is a field '
                "the gateway writes itself"
            ],
        )


class ContextPropagationTests(SynchronousTestCase):
    def test_current_span_survives_awaits_in_the_chain(self) -> None:
        from opentelemetry import trace
        from twisted.internet.defer import Deferred

        from edgegw.chain.pipeline import RouteRunner, compose
        from edgegw.terminal.exchange import Exchange

        spans = InMemorySpanExporter()
        clock = Clock()
        config = load_text(
            self.mktemp(),
            TELEMETRY
            + "kind: Route\nmetadata: {name: h}\nspec: {match: /slow, handler: {type: health}}\n",
        )
        gateway = build_gateway(config, clock, None, SimpleSpanProcessor(spans))
        runner: RouteRunner = gateway.site.resource.dispatcher.inner.mux.route(
            "GET", "", "/slow"
        ).target
        seen: list[Any] = []

        async def later(exchange: Exchange) -> None:
            seen.append(trace.get_current_span())
            resume: Deferred[None] = Deferred()
            clock.callLater(1, resume.callback, None)
            await resume
            # Resumed from the clock, outside the request's dispatch: still its span.
            seen.append(trace.get_current_span())
            exchange.request.finish()

        runner._handler = compose([], later)
        client = MemoryClient(gateway.site)
        client.send(b"GET /slow HTTP/1.1\r\nHost: gw\r\n\r\n")
        self.assertEqual(trace.get_current_span(), trace.INVALID_SPAN)
        clock.advance(1)
        (server,) = spans.get_finished_spans()
        self.assertEqual(
            [span.get_span_context().span_id for span in seen], [server.context.span_id] * 2
        )
