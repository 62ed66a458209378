"""
Real OTLP trace receivers on 127.0.0.1:0, for tests of the spans the gateway exports.

  - L{start_http_receiver}: OTLP/HTTP (C{http/protobuf}), a Twisted L{Site} running in
    the reactor thread; returns the B{full} traces URL C{http://127.0.0.1:PORT/v1/traces}.
  - L{start_grpc_receiver}: OTLP/gRPC, a C{grpcio} server on its own threads; returns
    C{http://127.0.0.1:PORT} (C{http} means an insecure channel to the exporter).

Both fill a L{SpanCollector} with L{CollectedSpan}s (the protobuf flattened into plain
Python values), always in the reactor thread, and register cleanups on the test that
stop them and leave a clean reactor.

Pitfalls for tests using them:

  - C{opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter(endpoint=)}
    uses an explicit C{endpoint} B{as is}: pass the full URL returned here (with
    C{/v1/traces}). Only the C{OTEL_EXPORTER_OTLP_ENDPOINT} environment variable gets
    C{/v1/traces} appended. A POST to any other path is answered 404 and noted in
    L{SpanCollector.errors}.
  - The gRPC exporter takes C{http://host:port} (insecure) or C{https://host:port}; a
    bare C{host:port} makes it use a B{secure} channel. Its header (metadata) names
    must be lowercase, or grpcio refuses the call.
  - Exporting is blocking network I/O and the HTTP receiver answers in the reactor
    thread: never export or C{force_flush} in the reactor thread (no
    C{SimpleSpanProcessor} ending spans in the reactor thread with the HTTP receiver,
    either); use a C{BatchSpanProcessor} and C{deferToThread(provider.force_flush)}.
  - Start the receiver before the tracer provider, so that the provider's shutdown
    (a cleanup, via C{deferToThread}) runs while the receiver still listens.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import attrs
import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITCPTransport
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

reactor: Any = _global_reactor

__all__ = [
    "TRACES_PATH",
    "CollectedSpan",
    "SpanCollector",
    "decode_any_value",
    "flatten_request",
    "start_grpc_receiver",
    "start_http_receiver",
]

TRACES_PATH = "/v1/traces"
"""The path OTLP/HTTP exporters post traces to."""


# -- what the receivers collect --------------------------------------------------------


@attrs.frozen
class CollectedSpan:
    """
    One exported span, flattened from the OTLP protobuf.

    @ivar kind: C{"SERVER"}, C{"CLIENT"}, C{"INTERNAL"}, C{"PRODUCER"}, C{"CONSUMER"} or
        C{"UNSPECIFIED"}.
    @ivar trace_id: 32 lowercase hex digits.
    @ivar span_id: 16 lowercase hex digits.
    @ivar parent_span_id: 16 lowercase hex digits, or C{""} for a root span.
    @ivar attributes: The span's attributes, decoded by L{decode_any_value}.
    @ivar events: C{(name, attributes)} for each event, in order.
    @ivar status_code: C{"UNSET"}, C{"OK"} or C{"ERROR"}.
    @ivar status_message: The status description (C{""} when none).
    @ivar resource: The attributes of the resource the span was exported with.
    @ivar scope_name: The name of the instrumentation scope (the tracer's name).
    """

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: str
    status_message: str
    resource: dict[str, Any]
    scope_name: str


def decode_any_value(value: AnyValue) -> Any:
    """
    An OTLP C{AnyValue} as Python: C{str}, C{bool}, C{int}, C{float}, C{bytes}, a list
    (array), a dict (key-value list), or L{None} when empty.
    """
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bytes_value":
        return value.bytes_value
    if which == "array_value":
        return [decode_any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: decode_any_value(pair.value) for pair in pairs}


def _enum_name(name: str, prefix: str) -> str:
    return name.removeprefix(prefix)


def flatten_request(request: ExportTraceServiceRequest) -> list[CollectedSpan]:
    """
    Every span of an export request, in the order it holds them.
    """
    spans: list[CollectedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    CollectedSpan(
                        name=span.name,
                        kind=_enum_name(Span.SpanKind.Name(span.kind), "SPAN_KIND_"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        events=[
                            (event.name, _attributes(event.attributes)) for event in span.events
                        ],
                        status_code=_enum_name(
                            Status.StatusCode.Name(span.status.code), "STATUS_CODE_"
                        ),
                        status_message=span.status.message,
                        resource=resource,
                        scope_name=scope_spans.scope.name,
                    )
                )
    return spans


@attrs.define
class _Waiter:
    count: int
    deferred: Deferred[list[CollectedSpan]]
    timer: IDelayedCall | None = None


class SpanCollector:
    """
    What a receiver collected. Only touched in the reactor thread.

    @ivar spans: Every span received, in arrival order.
    @ivar requests: For each export request accepted, its headers (HTTP) or metadata
        (gRPC): lowercase names; repeated HTTP headers joined with C{", "}, binary
        gRPC metadata (C{-bin}) as hex.
    @ivar errors: A line for each request refused (wrong path, method or content
        type, undecodable body), to tell why an expected export never arrived.
    """

    def __init__(self, clock: IReactorTime | None = None) -> None:
        self.spans: list[CollectedSpan] = []
        self.requests: list[dict[str, str]] = []
        self.errors: list[str] = []
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._waiters: list[_Waiter] = []

    def received(self, headers: dict[str, str], spans: Sequence[CollectedSpan]) -> None:
        """
        Record one export request, and fire the waiters it satisfies.
        """
        self.requests.append(headers)
        self.spans.extend(spans)
        satisfied = [waiter for waiter in self._waiters if len(self.spans) >= waiter.count]
        for waiter in satisfied:
            self._waiters.remove(waiter)
            if waiter.timer is not None and waiter.timer.active():
                waiter.timer.cancel()
            waiter.deferred.callback(list(self.spans))

    def wait_for(self, count: int, timeout: float = 10.0) -> Deferred[list[CollectedSpan]]:
        """
        Fires with (a copy of) L{spans} once at least C{count} spans have arrived, or
        fails with L{TimeoutError} after C{timeout} seconds (on the collector's clock).
        Cancelling it stops its timer.
        """
        if len(self.spans) >= count:
            return succeed(list(self.spans))

        def cancel(deferred: Deferred[list[CollectedSpan]]) -> None:
            self._forget(waiter)

        waiter = _Waiter(count, Deferred(cancel))
        self._waiters.append(waiter)

        def expire() -> None:
            waiter.timer = None
            self._forget(waiter)
            detail = f"; refused: {self.errors}" if self.errors else ""
            waiter.deferred.errback(
                TimeoutError(
                    f"{len(self.spans)} of {count} spans after {timeout}s "
                    f"({len(self.requests)} export requests{detail})"
                )
            )

        waiter.timer = self._clock.callLater(timeout, expire)
        return waiter.deferred

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None


# -- OTLP/HTTP ---------------------------------------------------------------------------


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class _TraceResource(Resource):
    isLeaf = True

    def __init__(self, collector: SpanCollector, path: str) -> None:
        super().__init__()
        self._collector = collector
        self._path = path.encode("ascii")

    def _refuse(self, request: Request, code: int, why: str) -> bytes:
        self._collector.errors.append(f"{request.method!r} {request.uri!r}: {code} {why}")
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"text/plain")
        return why.encode("utf-8")

    def render(self, request: Request) -> bytes | int:
        headers = {
            name.decode("latin-1").lower(): b", ".join(values).decode("latin-1")
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        if request.path != self._path:
            return self._refuse(request, 404, f"traces are accepted at {self._path!r} only")
        if request.method != b"POST":
            return self._refuse(request, 405, "POST only")
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/x-protobuf":
            return self._refuse(request, 415, f"unsupported content type {content_type!r}")
        raw = request.content.read() if request.content is not None else b""
        try:
            body = _decompress(raw, headers.get("content-encoding", "").strip().lower())
            message = ExportTraceServiceRequest.FromString(body)
        except (ValueError, OSError, zlib.error, DecodeError) as error:
            return self._refuse(request, 400, f"undecodable body: {error}")
        # Answer first, then record: waiters (test code) run in received(), and must
        # not run before the exporter's request is answered.
        request.setHeader(b"content-type", b"application/x-protobuf")
        request.write(bytes(ExportTraceServiceResponse().SerializeToString()))
        request.finish()
        self._collector.received(headers, flatten_request(message))
        return NOT_DONE_YET


class _Channel(HTTPChannel):
    receiver: _HTTPReceiver

    def connectionMade(self) -> None:
        super().connectionMade()
        self.receiver.channels.add(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.receiver.lost(self)


class _HTTPReceiver:
    def __init__(self) -> None:
        self.channels: set[_Channel] = set()
        self._waiters: list[Deferred[None]] = []

    def lost(self, channel: _Channel) -> None:
        self.channels.discard(channel)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    async def drop_all(self) -> None:
        while self.channels:
            channel = next(iter(self.channels))
            if channel.transport is None:
                self.channels.discard(channel)
                continue
            lost: Deferred[None] = Deferred()
            self._waiters.append(lost)
            cast(ITCPTransport, channel.transport).abortConnection()
            await lost


async def start_http_receiver(test: TestCase, path: str = TRACES_PATH) -> tuple[str, SpanCollector]:
    """
    Start an OTLP/HTTP (C{http/protobuf}) trace receiver on 127.0.0.1, on a free port,
    until C{test} ends.

    It accepts C{POST path} with C{Content-Type: application/x-protobuf} (body
    optionally C{gzip} or C{deflate} encoded), holding an C{ExportTraceServiceRequest},
    and answers 200 with an empty C{ExportTraceServiceResponse}; anything else is
    answered 4xx and noted in L{SpanCollector.errors}.

    @return: The B{full} traces URL C{http://127.0.0.1:PORT/v1/traces} -- what
        C{OTLPSpanExporter(endpoint=...)} of C{opentelemetry-exporter-otlp-proto-http}
        needs, since it uses an explicit endpoint as is (the base URL, for
        C{OTEL_EXPORTER_OTLP_ENDPOINT}, is C{url.removesuffix("/v1/traces")}) -- and the
        collector.
    """
    collector = SpanCollector()
    receiver = _HTTPReceiver()

    class Channel(_Channel):
        pass

    Channel.receiver = receiver
    site = Site(_TraceResource(collector, path), timeout=None)
    site.protocol = Channel  # type: ignore[assignment]
    site.noisy = False
    site.log = lambda request: None  # type: ignore[method-assign]
    port = reactor.listenTCP(0, site, interface="127.0.0.1")

    async def stop() -> None:
        await port.stopListening()
        await receiver.drop_all()

    test.addCleanup(stop)
    return f"http://127.0.0.1:{port.getHost().port}{path}", collector


# -- OTLP/gRPC ---------------------------------------------------------------------------


def _metadata(pairs: Iterable[Any]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for key, value in pairs:
        text = value.hex() if isinstance(value, bytes) else str(value)
        name = str(key).lower()
        headers[name] = f"{headers[name]}, {text}" if name in headers else text
    return headers


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    """
    Runs in grpcio's worker threads; hands what it receives to the reactor thread.
    """

    def __init__(self, collector: SpanCollector) -> None:
        self._collector = collector

    def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        headers = _metadata(context.invocation_metadata())
        reactor.callFromThread(self._collector.received, headers, flatten_request(request))
        return ExportTraceServiceResponse()


async def start_grpc_receiver(test: TestCase) -> tuple[str, SpanCollector]:
    """
    Start an OTLP/gRPC trace receiver (insecure, C{grpcio} on its own threads) on
    127.0.0.1, on a free port, until C{test} ends. Gzip-compressed calls are accepted
    (grpcio decompresses them).

    @return: C{http://127.0.0.1:PORT} -- what the gRPC C{OTLPSpanExporter(endpoint=...)}
        needs: the C{http} scheme makes it use an insecure channel (a bare
        C{127.0.0.1:PORT} would make it try TLS) -- and the collector, which gets the
        spans in the reactor thread (via C{callFromThread}), so an C{Export} call
        returns slightly before they appear: wait with L{SpanCollector.wait_for}.
    """
    collector = SpanCollector()
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc-receiver")
    server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(collector), server)
    port = int(server.add_insecure_port("127.0.0.1:0"))
    if port == 0:
        executor.shutdown(wait=False)
        raise RuntimeError("grpcio could not listen on 127.0.0.1")
    server.start()

    def stop() -> None:
        # Neither waits for the reactor: Export only queues calls with callFromThread.
        server.stop(0).wait(10)
        executor.shutdown(wait=True)

    test.addCleanup(stop)
    return f"http://127.0.0.1:{port}", collector
