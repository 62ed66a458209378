"""
OTLP export of a L{Registry} through the OpenTelemetry SDK: its series are converted to
the SDK's metric data model (cumulative sums, gauges and explicit-bucket histograms) in
the reactor thread — a consistent copy — and handed to the SDK's OTLP metric exporter
(http/protobuf or gRPC) on a pool thread, every export interval and once more when the
service stops. A slow or unreachable collector never holds up a request: an export
still running when the next is due makes that one skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from edgegw import __version__
from edgegw.metrics.instruments import Counter, Histogram, HistogramPoint, Observable, Registry

__all__ = ["MetricsExportService", "make_metric_exporter", "metrics_data", "metrics_url"]

_log = Logger(namespace="edgegw.metrics")
_SCOPE = InstrumentationScope("edgegw", __version__)
_CUMULATIVE = AggregationTemporality.CUMULATIVE


def metrics_url(endpoint: str) -> str:
    """
    The OTLP/HTTP metrics URL for a collector endpoint, by the traces' rule: a bare base
    URL gets C{/v1/metrics}; a traces URL (ending in C{/v1/traces}) becomes the metrics
    one beside it; any other path is used as it is.
    """
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    if parts.path.endswith("/v1/traces"):
        path = parts.path.removesuffix("/v1/traces") + "/v1/metrics"
        return urlunsplit(parts._replace(path=path))
    return endpoint


def make_metric_exporter(
    endpoint: str, protocol: str, headers: Mapping[str, str], timeout: float
) -> MetricExporter:
    """
    The SDK's OTLP metric exporter for C{endpoint} (cumulative temporality).
    """
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        parts = urlsplit(endpoint)
        return GrpcExporter(
            endpoint=parts.netloc,
            insecure=parts.scheme == "http",
            # gRPC metadata keys must be lowercase (grpcio refuses the call otherwise).
            headers={name.lower(): value for name, value in headers.items()},
            timeout=timeout,
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpExporter,
    )

    return HttpExporter(endpoint=metrics_url(endpoint), headers=dict(headers), timeout=timeout)


def metrics_data(registry: Registry, resource: Resource, now_ns: int | None = None) -> MetricsData:
    """
    The registry's series now, in the SDK's data model (values copied: the result may
    go to another thread while the reactor keeps recording).
    """
    now = time.time_ns() if now_ns is None else now_ns
    start = registry.start_time_ns
    metrics: list[Metric] = []
    for instrument in registry.instruments:
        numbers: list[NumberDataPoint] = []
        histograms: list[HistogramDataPoint] = []
        for names, values, value in instrument.points():
            attributes: dict[str, Any] = dict(zip(names, values, strict=True))
            if isinstance(value, HistogramPoint):
                histograms.append(
                    HistogramDataPoint(
                        attributes=attributes,
                        start_time_unix_nano=start,
                        time_unix_nano=now,
                        count=value.count,
                        sum=value.sum,
                        bucket_counts=list(value.counts),
                        explicit_bounds=list(value.bounds),
                        min=value.min,
                        max=value.max,
                    )
                )
            else:
                assert isinstance(value, int | float)
                numbers.append(NumberDataPoint(attributes, start, now, value))
        data: Sum | Gauge | HistogramData
        if isinstance(instrument, Histogram):
            data = HistogramData(histograms, _CUMULATIVE)
        elif isinstance(instrument, Counter):
            data = Sum(numbers, _CUMULATIVE, is_monotonic=instrument.monotonic)
        elif isinstance(instrument, Observable) and instrument.kind != "gauge":
            data = Sum(numbers, _CUMULATIVE, is_monotonic=instrument.kind == "counter")
        else:
            data = Gauge(numbers)
        metrics.append(Metric(instrument.name, instrument.description, instrument.unit, data))
    scope = ScopeMetrics(_SCOPE, metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


class MetricsExportService(Service):
    """
    Exports the registry every C{interval} seconds while running, and once more when
    stopped (then shuts the exporter down).

    @ivar lock: Held by each export, from reading the series to the collector's answer:
        the exports of one series by a reload's old and new services share it, so they
        never overlap and reach the collector in the order their values were read.
    """

    def __init__(
        self,
        registry: Registry,
        resource: Resource,
        exporter: MetricExporter,
        reactor: Any,
        interval: float,
        lock: DeferredLock | None = None,
    ) -> None:
        self.registry = registry
        self.resource = resource
        self.exporter = exporter
        self.reactor = reactor
        self.interval = interval
        self._loop = LoopingCall(self.export)
        self._loop.clock = reactor
        self._exporting: Deferred[None] | None = None
        self.lock = lock if lock is not None else DeferredLock()

    def startService(self) -> None:
        super().startService()
        self._loop.start(self.interval, now=False)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._loop.running:
            self._loop.stop()
        last = self._exporting or succeed(None)

        def final(_: object) -> Deferred[None]:
            exported = self.export()
            # Not while an export of this exporter may still run in its thread.
            exported.addCallback(
                lambda _: self._holding_lock(lambda: self._in_thread(self.exporter.shutdown))
            )
            return exported

        return last.addCallback(final)

    def export(self) -> Deferred[None]:
        """
        Export the series now (skipped while the previous export still runs).
        """
        if self._exporting is not None:
            return succeed(None)
        exporting = self._exporting = self._holding_lock(self._export_now)
        exporting.addCallbacks(self._exported, self._failed)
        return exporting

    def _holding_lock(self, start: Callable[[], Deferred[Any]]) -> Deferred[Any]:
        """
        Call C{start} once the lock is had, and release it only once what it started
        (a pool thread's call) has ended. Cancelling the Deferred returned abandons the
        wait for it (a stop past C{drainTimeout}), never the lock: a thread cannot be
        stopped, and another export must not run beside it.
        """

        def locked(_: object) -> Deferred[Any]:
            try:
                running = start()
            except BaseException:
                self.lock.release()
                raise
            running.addBoth(self._release)
            waited: Deferred[Any] = Deferred()
            running.chainDeferred(waited)
            return waited

        return self.lock.acquire().addCallback(locked)

    def _release(self, result: object) -> object:
        self.lock.release()
        return result

    def _export_now(self) -> Deferred[Any]:
        # The series are read once this export holds the lock: each export carries
        # values no lower than the one before it.
        data = metrics_data(self.registry, self.resource)
        return self._in_thread(self.exporter.export, data)

    def discard(self) -> None:
        """
        Shut the exporter down without exporting: the service never started (its
        configuration was refused).
        """
        shutting = self._in_thread(self.exporter.shutdown)
        shutting.addErrback(lambda failure: _log.failure("shutting a metrics exporter", failure))

    def _exported(self, result: object) -> None:
        self._exporting = None
        name = getattr(result, "name", str(result))
        if name != "SUCCESS":
            _log.warn("metrics export to the OTLP collector failed ({result})", result=name)

    def _failed(self, failure: Any) -> None:
        self._exporting = None
        # Older exporters raise on a network error where newer ones answer FAILURE.
        _log.warn(
            "metrics export to the OTLP collector failed ({result})",
            result=f"{failure.type.__name__}: {failure.getErrorMessage()}"[:300],
        )

    def _in_thread(self, function: Any, *args: Any) -> Deferred[Any]:
        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), function, *args)
