"""
Tests for L{tests.support.otlp}: the real OpenTelemetry SDK and OTLP exporters (HTTP and
gRPC) export through real sockets to the receivers, which flatten what they receive.
"""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Sequence

import grpc  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GRPCSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HTTPCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HTTPSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.otlp import (
    CollectedSpan,
    SpanCollector,
    decode_any_value,
    start_grpc_receiver,
    start_http_receiver,
)


def _provider(
    test: TestCase, exporter: SpanExporter, schedule_delay_millis: float = 60_000
) -> TracerProvider:
    """
    A local (never global) provider exporting through C{exporter} from its own batch
    thread; shut down (blocking, so in a thread) when C{test} ends.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": "edgegw-test"}))
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_millis)
    )
    test.addCleanup(deferToThread, provider.shutdown)
    return provider


def _make_spans(provider: TracerProvider) -> None:
    """
    A SERVER span with a CLIENT child carrying attributes and an event.
    """
    tracer = provider.get_tracer("edgegw.test")
    with tracer.start_as_current_span("GET /items", kind=SpanKind.SERVER) as server:
        server.set_attribute("http.request.method", "GET")
        with tracer.start_as_current_span("upstream GET", kind=SpanKind.CLIENT) as client:
            client.set_attribute("server.port", 8080)
            client.set_attribute("edgegw.retried", True)
            client.set_attribute("edgegw.ratio", 0.5)
            client.set_attribute("edgegw.upstreams", ["a", "b"])
            client.add_event("retry", {"attempt": 2, "reason": "reset"})
            client.set_status(Status(StatusCode.ERROR, "upstream reset"))
        server.set_status(Status(StatusCode.OK))


async def _flush(provider: TracerProvider) -> None:
    """
    Export what is buffered. Blocking: never in the reactor thread, where the HTTP
    receiver must answer.
    """
    flushed = await deferToThread(provider.force_flush, 10_000)
    assert flushed


def _find(spans: Sequence[CollectedSpan], name: str) -> CollectedSpan:
    (found,) = [span for span in spans if span.name == name]
    return found


class RoundTripTests(TestCase):
    """
    The real exporters, through real sockets, to the receivers.
    """

    def check(self, spans: Sequence[CollectedSpan]) -> None:
        """
        C{spans} are the two made by L{_make_spans}, faithfully.
        """
        self.assertEqual(len(spans), 2)
        server = _find(spans, "GET /items")
        client = _find(spans, "upstream GET")

        self.assertEqual(server.kind, "SERVER")
        self.assertEqual(client.kind, "CLIENT")
        self.assertEqual(server.parent_span_id, "")
        self.assertEqual(client.parent_span_id, server.span_id)
        self.assertEqual(client.trace_id, server.trace_id)
        self.assertEqual(len(server.trace_id), 32)
        self.assertEqual(len(server.span_id), 16)
        self.assertNotEqual(int(server.trace_id, 16), 0)

        self.assertEqual(server.attributes, {"http.request.method": "GET"})
        self.assertEqual(
            client.attributes,
            {
                "server.port": 8080,
                "edgegw.retried": True,
                "edgegw.ratio": 0.5,
                "edgegw.upstreams": ["a", "b"],
            },
        )
        self.assertEqual(client.events, [("retry", {"attempt": 2, "reason": "reset"})])
        self.assertEqual(server.events, [])
        self.assertEqual((server.status_code, server.status_message), ("OK", ""))
        self.assertEqual((client.status_code, client.status_message), ("ERROR", "upstream reset"))
        for span in spans:
            self.assertEqual(span.resource["service.name"], "edgegw-test")
            self.assertEqual(span.resource["telemetry.sdk.language"], "python")
            self.assertEqual(span.scope_name, "edgegw.test")

    async def roundtrip_http(self, compression: HTTPCompression) -> SpanCollector:
        """
        Export with the HTTP exporter (and C{compression}) and check what arrived.
        """
        url, collector = await start_http_receiver(self)
        self.assertTrue(url.endswith("/v1/traces"))
        provider = _provider(
            self,
            HTTPSpanExporter(
                endpoint=url, headers={"X-Api-Key": "k"}, compression=compression, timeout=10
            ),
        )
        _make_spans(provider)
        await _flush(provider)
        self.check(await collector.wait_for(2))
        self.assertEqual(collector.errors, [])
        self.assertEqual(len(collector.requests), 1)
        (headers,) = collector.requests
        self.assertEqual(headers["x-api-key"], "k")
        self.assertEqual(headers["content-type"], "application/x-protobuf")
        return collector

    async def test_http(self) -> None:
        """
        OTLP/HTTP, uncompressed: spans, resource, scope and headers arrive.
        """
        collector = await self.roundtrip_http(HTTPCompression.NoCompression)
        self.assertNotIn("content-encoding", collector.requests[0])

    async def test_http_gzip(self) -> None:
        """
        OTLP/HTTP with gzip: the receiver decompresses.
        """
        collector = await self.roundtrip_http(HTTPCompression.Gzip)
        self.assertEqual(collector.requests[0]["content-encoding"], "gzip")

    async def test_http_deflate(self) -> None:
        """
        OTLP/HTTP with deflate: the receiver decompresses.
        """
        collector = await self.roundtrip_http(HTTPCompression.Deflate)
        self.assertEqual(collector.requests[0]["content-encoding"], "deflate")

    async def test_http_batch_without_flush(self) -> None:
        """
        As a gateway test would: spans ended in the reactor thread, exported by the
        batch thread on its own schedule, awaited with C{wait_for} only.
        """
        url, collector = await start_http_receiver(self)
        provider = _provider(self, HTTPSpanExporter(endpoint=url), schedule_delay_millis=50)
        _make_spans(provider)
        self.check(await collector.wait_for(2))

    async def test_grpc_batch_without_flush(self) -> None:
        """
        The same over gRPC.
        """
        url, collector = await start_grpc_receiver(self)
        provider = _provider(self, GRPCSpanExporter(endpoint=url), schedule_delay_millis=50)
        _make_spans(provider)
        self.check(await collector.wait_for(2))

    async def roundtrip_grpc(self, compression: grpc.Compression | None) -> SpanCollector:
        """
        Export with the gRPC exporter (and C{compression}) and check what arrived.
        """
        url, collector = await start_grpc_receiver(self)
        self.assertTrue(url.startswith("http://127.0.0.1:"))
        provider = _provider(
            self,
            GRPCSpanExporter(
                endpoint=url, headers={"x-api-key": "k"}, compression=compression, timeout=10
            ),
        )
        _make_spans(provider)
        await _flush(provider)
        self.check(await collector.wait_for(2))
        self.assertEqual(len(collector.requests), 1)
        self.assertEqual(collector.requests[0]["x-api-key"], "k")
        return collector

    async def test_grpc(self) -> None:
        """
        OTLP/gRPC, insecure: spans, resource, scope and metadata arrive.
        """
        collector = await self.roundtrip_grpc(None)
        self.assertIn("OTel-OTLP-Exporter-Python", collector.requests[0]["user-agent"])

    async def test_grpc_gzip(self) -> None:
        """
        OTLP/gRPC with gzip: grpcio decompresses (C{grpc-encoding} is not shown in the
        metadata).
        """
        await self.roundtrip_grpc(grpc.Compression.Gzip)

    async def test_http_base_url_is_refused(self) -> None:
        """
        An explicit endpoint is used as is: the base URL posts to C{/}, which is refused
        with 404 and noted, and the export fails (without retrying).
        """
        url, collector = await start_http_receiver(self)
        base = url.removesuffix("/v1/traces")
        exporter = HTTPSpanExporter(endpoint=base, timeout=10)
        self.addCleanup(exporter.shutdown)
        provider = TracerProvider()
        self.addCleanup(provider.shutdown)  # no processor: nothing blocks
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span("s") as span:
            pass
        with self.assertLogs(HTTPSpanExporter.__module__, "ERROR"):
            result = await deferToThread(exporter.export, [span])  # type: ignore[list-item]
        self.assertEqual(result, SpanExportResult.FAILURE)
        self.assertEqual(collector.spans, [])
        self.assertEqual(collector.requests, [])
        self.assertEqual(len(collector.errors), 1)
        self.assertIn("404", collector.errors[0])

    async def test_http_refuses_bad_bodies(self) -> None:
        """
        Wrong content types and undecodable bodies are answered 4xx and noted; a good
        request by hand is answered with an empty protobuf response.
        """
        url, collector = await start_http_receiver(self)

        def post(body: bytes, content_type: str, encoding: str = "") -> tuple[int, bytes]:
            request = urllib.request.Request(url, data=body, method="POST")
            request.add_header("Content-Type", content_type)
            if encoding:
                request.add_header("Content-Encoding", encoding)
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        async def post_in_thread(*args: str | bytes) -> tuple[int, bytes]:
            return await deferToThread(post, *args)  # type: ignore[arg-type]

        good = ExportTraceServiceRequest().SerializeToString()
        self.assertEqual((await post_in_thread(good, "application/json"))[0], 415)
        self.assertEqual((await post_in_thread(b"\xff\xff", "application/x-protobuf"))[0], 400)
        self.assertEqual(
            (await post_in_thread(b"not gzip", "application/x-protobuf", "gzip"))[0], 400
        )
        self.assertEqual(len(collector.errors), 3)
        code, body = await post_in_thread(gzip.compress(good), "application/x-protobuf", "gzip")
        self.assertEqual(code, 200)
        self.assertEqual(ExportTraceServiceResponse.FromString(body), ExportTraceServiceResponse())
        self.assertEqual(len(collector.requests), 1)
        self.assertEqual(collector.spans, [])


def _span(name: str) -> CollectedSpan:
    return CollectedSpan(name, "INTERNAL", "0" * 32, "1" * 16, "", {}, [], "UNSET", "", {}, "")


class SpanCollectorTests(SynchronousTestCase):
    """
    L{SpanCollector.wait_for} on a fake clock.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.collector = SpanCollector(self.clock)

    def test_already_there(self) -> None:
        """
        Enough spans already: fires at once, with no timer.
        """
        self.collector.received({}, [_span("a")])
        self.assertEqual(self.successResultOf(self.collector.wait_for(1)), [_span("a")])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_fires_when_enough(self) -> None:
        """
        Fires once the count is reached, with every span so far, and stops its timer.
        """
        waited = self.collector.wait_for(2, timeout=5)
        self.collector.received({"a": "1"}, [_span("a")])
        self.assertNoResult(waited)
        self.collector.received({"b": "2"}, [_span("b"), _span("c")])
        self.assertEqual([span.name for span in self.successResultOf(waited)], ["a", "b", "c"])
        self.assertEqual(self.collector.requests, [{"a": "1"}, {"b": "2"}])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_timeout(self) -> None:
        """
        Not enough spans within C{timeout}: fails with L{TimeoutError}.
        """
        waited = self.collector.wait_for(2, timeout=5)
        self.collector.received({}, [_span("a")])
        self.clock.advance(4.9)
        self.assertNoResult(waited)
        self.clock.advance(0.1)
        failure = self.failureResultOf(waited, TimeoutError)
        self.assertIn("1 of 2 spans", str(failure.value))
        self.collector.received({}, [_span("b")])  # too late: nothing to fire
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancel(self) -> None:
        """
        Cancelling the wait stops its timer.
        """
        waited = self.collector.wait_for(1)
        waited.cancel()
        self.failureResultOf(waited)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class DecodeTests(SynchronousTestCase):
    """
    L{decode_any_value}.
    """

    def test_values(self) -> None:
        """
        Every kind of C{AnyValue}, nested ones too.
        """
        cases: list[tuple[AnyValue, object]] = [
            (AnyValue(string_value="s"), "s"),
            (AnyValue(bool_value=False), False),
            (AnyValue(int_value=-3), -3),
            (AnyValue(double_value=1.5), 1.5),
            (AnyValue(bytes_value=b"\x00"), b"\x00"),
            (AnyValue(), None),
            (
                AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue()])),
                [1, None],
            ),
            (
                AnyValue(
                    kvlist_value=KeyValueList(
                        values=[KeyValue(key="k", value=AnyValue(string_value="v"))]
                    )
                ),
                {"k": "v"},
            ),
        ]
        for any_value, expected in cases:
            value = decode_any_value(any_value)
            self.assertEqual(value, expected)
            self.assertIs(type(value), type(expected))
