"""
Real OTLP metrics receivers on 127.0.0.1:0, for tests of the metrics the gateway
exports: OTLP/HTTP (C{http/protobuf}, at C{/v1/metrics}) and OTLP/gRPC, beside the trace
receivers of L{tests.support.otlp} (whose connection handling they share).

Both fill a L{MetricsCollector} with L{CollectedPoint}s (the protobuf flattened into
plain values) in the reactor thread, and stop at the test's cleanup.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from tests.support.otlp import (
    _attributes,
    _Channel,
    _decompress,
    _HTTPReceiver,
    _metadata,
)

reactor: Any = _global_reactor

METRICS_PATH = "/v1/metrics"

__all__ = ["CollectedPoint", "MetricsCollector", "start_grpc_metrics", "start_http_metrics"]


@attrs.frozen
class CollectedPoint:
    """
    One data point of one exported metric.

    @ivar kind: C{sum}, C{gauge} or C{histogram}.
    @ivar value: The number (sums and gauges) or the count (histograms).
    """

    resource: dict[str, Any]
    scope: str
    name: str
    unit: str
    kind: str
    monotonic: bool
    cumulative: bool
    attributes: dict[str, Any]
    value: float
    sum: float = 0.0
    bucket_counts: tuple[int, ...] = ()
    bounds: tuple[float, ...] = ()


def flatten(request: ExportMetricsServiceRequest) -> list[CollectedPoint]:
    """
    Every data point of an export request.
    """
    points = []
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope.name
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                common = {"resource": resource, "scope": scope, "name": metric.name}
                common["unit"] = metric.unit
                if kind == "histogram":
                    for h in metric.histogram.data_points:
                        points.append(
                            CollectedPoint(
                                **common,
                                kind="histogram",
                                monotonic=True,
                                cumulative=metric.histogram.aggregation_temporality == 2,
                                attributes=_attributes(h.attributes),
                                value=h.count,
                                sum=h.sum,
                                bucket_counts=tuple(h.bucket_counts),
                                bounds=tuple(h.explicit_bounds),
                            )
                        )
                elif kind in ("sum", "gauge"):
                    data = metric.sum if kind == "sum" else metric.gauge
                    for n in data.data_points:
                        number = n.as_double if n.WhichOneof("value") == "as_double" else n.as_int
                        points.append(
                            CollectedPoint(
                                **common,
                                kind=kind,
                                monotonic=kind == "sum" and metric.sum.is_monotonic,
                                cumulative=kind == "sum"
                                and metric.sum.aggregation_temporality == 2,
                                attributes=_attributes(n.attributes),
                                value=number,
                            )
                        )
    return points


class MetricsCollector:
    """
    What a receiver got: one list of points per export, and the headers of each.
    """

    def __init__(self) -> None:
        self.exports: list[list[CollectedPoint]] = []
        self.headers: list[dict[str, str]] = []
        self.errors: list[str] = []
        self._waiters: list[tuple[Callable[[], bool], Deferred[None]]] = []

    def received(self, headers: dict[str, str], points: list[CollectedPoint]) -> None:
        self.exports.append(points)
        self.headers.append(headers)
        waiters, self._waiters = self._waiters, []
        for condition, waiter in waiters:
            if condition():
                waiter.callback(None)
            else:
                self._waiters.append((condition, waiter))

    def wait_until(self, condition: Callable[[], bool], timeout: float = 10.0) -> Deferred[None]:
        """
        Fires once C{condition()} holds after an export (at once if it holds now).
        """
        waiter: Deferred[None] = Deferred()
        if condition():
            waiter.callback(None)
            return waiter
        self._waiters.append((condition, waiter))
        return waiter.addTimeout(timeout, reactor)

    def last(self, name: str) -> list[CollectedPoint]:
        """
        The points of metric C{name} in the latest export that has it.
        """
        for points in reversed(self.exports):
            found = [point for point in points if point.name == name]
            if found:
                return found
        return []


class _MetricsResource(Resource):
    isLeaf = True

    def __init__(self, collector: MetricsCollector) -> None:
        super().__init__()
        self._collector = collector

    def _refuse(self, request: Request, code: int, why: str) -> bytes:
        self._collector.errors.append(f"{request.method!r} {request.uri!r}: {code} {why}")
        request.setResponseCode(code)
        return why.encode()

    def render(self, request: Request) -> bytes | int:
        headers = {
            name.decode("latin-1").lower(): b", ".join(values).decode("latin-1")
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        if request.path != METRICS_PATH.encode() or request.method != b"POST":
            return self._refuse(request, 404, f"metrics are POSTed to {METRICS_PATH} only")
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/x-protobuf":
            return self._refuse(request, 415, f"unsupported content type {content_type!r}")
        raw = request.content.read() if request.content is not None else b""
        try:
            body = _decompress(raw, headers.get("content-encoding", "").strip().lower())
            message = ExportMetricsServiceRequest.FromString(body)
        except (ValueError, OSError, zlib.error, DecodeError) as error:
            return self._refuse(request, 400, f"undecodable body: {error}")
        request.setHeader(b"content-type", b"application/x-protobuf")
        request.write(bytes(ExportMetricsServiceResponse().SerializeToString()))
        request.finish()
        self._collector.received(headers, flatten(message))
        return NOT_DONE_YET


async def start_http_metrics(test: TestCase) -> tuple[str, MetricsCollector]:
    """
    An OTLP/HTTP metrics receiver on 127.0.0.1 until C{test} ends.

    @return: Its base URL C{http://127.0.0.1:PORT} (exporters add C{/v1/metrics}) and
        the collector.
    """
    collector = MetricsCollector()
    receiver = _HTTPReceiver()

    class Channel(_Channel):
        pass

    Channel.receiver = receiver
    site = Site(_MetricsResource(collector), timeout=None)
    site.protocol = Channel  # type: ignore[assignment]
    site.noisy = False
    site.log = lambda request: None  # type: ignore[method-assign]
    port = reactor.listenTCP(0, site, interface="127.0.0.1")

    async def stop() -> None:
        await port.stopListening()
        await receiver.drop_all()

    test.addCleanup(stop)
    return f"http://127.0.0.1:{port.getHost().port}", collector


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, collector: MetricsCollector) -> None:
        self._collector = collector

    def Export(
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> ExportMetricsServiceResponse:
        headers = _metadata(context.invocation_metadata())
        reactor.callFromThread(self._collector.received, headers, flatten(request))
        return ExportMetricsServiceResponse()


async def start_grpc_metrics(test: TestCase) -> tuple[str, MetricsCollector]:
    """
    An OTLP/gRPC metrics receiver (insecure) on 127.0.0.1 until C{test} ends.

    @return: C{http://127.0.0.1:PORT} and the collector.
    """
    collector = MetricsCollector()
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="otlp-metrics-receiver")
    server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
        _MetricsServicer(collector), server
    )
    port = int(server.add_insecure_port("127.0.0.1:0"))
    server.start()

    def stop() -> None:
        # Neither waits for the reactor: Export only queues calls with callFromThread.
        server.stop(0).wait(10)
        executor.shutdown(wait=True)

    test.addCleanup(stop)
    return f"http://127.0.0.1:{port}", collector
