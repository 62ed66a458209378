"""
The metrics core (issue 18): instruments and their cardinality bound, the Prometheus
text format, the conversion to the OpenTelemetry SDK's data model, the export service,
the C{Telemetry.metrics} block, and the server metrics the access-log stage records.
"""

from __future__ import annotations

import io
import re
import tempfile
from typing import Any, cast

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.metrics.gateway_metrics import (
    NO_METRICS,
    GatewayMetrics,
    IMetrics,
    NullMetrics,
    method_name,
    status_class,
)
from edgegw.metrics.instruments import Registry
from edgegw.metrics.otlp import (
    MetricsExportService,
    make_metric_exporter,
    metrics_data,
    metrics_url,
)
from edgegw.metrics.prometheus import label_name, metric_name, render, target_labels
from tests.support.configs import load_text, problems_of
from tests.support.otlp_metrics import (
    MetricsCollector,
    start_grpc_metrics,
    start_http_metrics,
)

TELEMETRY = """\
kind: Telemetry
metadata: {name: t}
spec:
  service: {name: edge}
"""


class InstrumentTests(SynchronousTestCase):
    def test_counter_sums_per_series(self) -> None:
        counter = Registry().counter("c", "{x}", "d", ("a",))
        counter.add(1, ("x",))
        counter.add(2, ("x",))
        counter.add(5, ("y",))
        self.assertEqual((counter.value(("x",)), counter.value(("y",))), (3, 5))
        self.assertEqual(counter.value(("z",)), 0)

    def test_series_past_the_limit_fold_into_the_overflow_series(self) -> None:
        registry = Registry(limit=3)
        counter = registry.counter("c", "{x}", "d", ("path",))
        histogram = registry.histogram("h", "s", "d", ("path",), (1.0,))
        for n in range(10):
            counter.add(1, (f"/p{n}",))
            histogram.record(0.5, (f"/p{n}",))
        points = list(counter.points())
        self.assertEqual(len(points), 4)
        self.assertIn(((("otel.metric.overflow",), (True,), 7)), points)
        overflow = [p for p in histogram.points() if p[0] == ("otel.metric.overflow",)]
        self.assertEqual(len(overflow), 1)
        self.assertEqual(overflow[0][2].count, 7)  # type: ignore[attr-defined]
        self.assertEqual(len(list(histogram.points())), 4)

    def test_histogram_buckets_are_upper_inclusive(self) -> None:
        histogram = Registry().histogram("h", "s", "d", (), (0.1, 1.0))
        for value in (0.05, 0.1, 0.5, 1.0, 3.0):
            histogram.record(value)
        point = histogram.point()
        assert point is not None
        self.assertEqual(point.counts, [2, 2, 1])
        self.assertEqual((point.count, point.min, point.max), (5, 0.05, 3.0))
        self.assertAlmostEqual(point.sum, 4.65)

    def test_a_declared_series_never_overflows(self) -> None:
        """
        A series started at 0 ahead of any count takes a place only while the limit has
        room: it never puts a zero into the overflow series.
        """
        counter = Registry(limit=1).counter("c", "{x}", "d", ("a",))
        counter.declare(("x",))
        counter.declare(("y",))
        self.assertEqual([(values, value) for _, values, value in counter.points()], [(("x",), 0)])
        counter.add(2, ("x",))
        counter.declare(("x",))
        self.assertEqual(counter.value(("x",)), 2)

    def test_names_are_unique(self) -> None:
        registry = Registry()
        registry.counter("c", "1", "d")
        self.assertRaises(ValueError, registry.counter, "c", "1", "d")

    def test_a_reload_carries_the_same_instruments(self) -> None:
        """
        A registry built over another takes its counters and histograms (same name,
        kind, unit, attributes and boundaries) with its start time, and the new limit
        once it is adopted (a reload refused before that leaves the running gateway's
        limit); observables and changed instruments are new.
        """
        old = Registry(limit=10)
        counter = old.counter("c", "{x}", "d", ("a",))
        counter.add(3, ("x",))
        histogram = old.histogram("h", "s", "d", (), (1.0,))
        changed = old.histogram("changed", "s", "d", (), (1.0,))
        old.observable("o", "1", "d", (), lambda: [((), 1.0)])
        new = Registry(limit=20, carry=old)
        self.assertEqual(new.start_time_ns, old.start_time_ns)
        carried = new.counter("c", "{x}", "d", ("a",))
        self.assertIs(carried, counter)
        self.assertEqual(carried.limit, 10)
        self.assertIs(new.histogram("h", "s", "d", (), (1.0,)), histogram)
        self.assertIsNot(new.histogram("changed", "s", "d", (), (2.0,)), changed)
        self.assertIsNot(new.counter("o", "1", "d"), old.instruments[-1])
        self.assertEqual(len(new.instruments), 4)
        self.assertEqual((counter.limit, histogram.limit), (10, 10))
        new.adopt()
        self.assertEqual((counter.limit, histogram.limit), (20, 20))
        counter.add(1, ("x",))  # the old gateway's request in flight
        self.assertEqual(carried.value(("x",)), 4)

    def test_request_series_past_the_limit_and_after_a_raise(self) -> None:
        """
        The request histograms' series are found again for each request, one per
        route, method and status class; past the limit a request goes to the overflow
        series, and once a reload raises the limit it gets a series of its own.
        """
        old = Registry(limit=2)
        metrics = GatewayMetrics(old)
        for route in ("/a", "/b", "/a", "/c", "/c"):
            metrics.request(route, b"GET", 200, 0.5, 1, 2)
        duration = metrics.server_duration
        counts = {values: point.count for _, values, point in duration.points()}  # type: ignore[attr-defined]
        self.assertEqual(
            counts,
            {("/a", "GET", "2xx"): 2, ("/b", "GET", "2xx"): 1, (True,): 2},
        )
        new = Registry(limit=10, carry=old)
        raised = GatewayMetrics(new)
        raised.request("/c", b"GET", 200, 0.5, 1, 2)  # before the reload is adopted
        new.adopt()
        raised.request("/c", b"GET", 200, 0.5, 1, 2)
        point = duration.point(("/c", "GET", "2xx"))
        assert point is not None
        self.assertEqual(point.count, 1)
        for histogram in (raised.request_size, raised.response_size):
            size = histogram.point(("/c", "GET", "2xx"))
            assert size is not None
            self.assertEqual(size.count, 1)

    def test_bounded_values(self) -> None:
        self.assertEqual(method_name(b"GET"), "GET")
        self.assertEqual(method_name(b"get"), "_OTHER")
        self.assertEqual(method_name(b"BREW"), "_OTHER")
        self.assertEqual(
            [status_class(c) for c in (101, 204, 302, 404, 503)],
            ["1xx", "2xx", "3xx", "4xx", "5xx"],
        )
        self.assertEqual((status_class(None), status_class(999)), ("none", "other"))

    def test_null_metrics_has_every_method(self) -> None:
        from zope.interface.verify import verifyObject

        self.assertTrue(verifyObject(IMetrics, NO_METRICS))
        self.assertIsInstance(NO_METRICS, NullMetrics)
        self.assertTrue(verifyObject(IMetrics, GatewayMetrics(Registry())))


class BodySizeTests(SynchronousTestCase):
    def test_request_body_sizes_in_memory_and_in_a_file(self) -> None:
        """
        The body size recorded for a request Twisted buffered itself: in memory, or in
        a temporary file past 100 KB (counted as 0 before), its position left alone.
        """
        from twisted.web.test.requesthelper import DummyRequest

        from edgegw.chain.access_log import _received

        def received(content: Any) -> int:
            request: Any = DummyRequest([b""])
            request.content = content
            return _received(request)

        self.assertEqual(received(io.BytesIO(b"x" * 10)), 10)
        with tempfile.TemporaryFile() as large:
            large.write(b"y" * 300_000)
            large.seek(5)
            self.assertEqual(received(large), 300_000)
            self.assertEqual(large.tell(), 5)
        closed = io.BytesIO(b"z")
        closed.close()
        self.assertEqual(received(closed), 0)
        self.assertEqual(received(None), 0)


class PrometheusTests(SynchronousTestCase):
    def test_names(self) -> None:
        self.assertEqual(
            metric_name("http.server.request.duration", "s", "histogram"),
            "http_server_request_duration_seconds",
        )
        self.assertEqual(
            metric_name("http.server.request.body.size", "By", "histogram"),
            "http_server_request_body_size_bytes",
        )
        self.assertEqual(
            metric_name("edgegw.auth.outcomes", "{authentication}", "counter"),
            "edgegw_auth_outcomes_total",
        )
        self.assertEqual(metric_name("x.ready", "1", "gauge"), "x_ready_ratio")
        self.assertEqual(label_name("http.route"), "http_route")
        self.assertEqual(label_name("1st"), "_1st")

    def test_target_info_labels_are_never_twice(self) -> None:
        attributes = {
            "service.name": "edge",
            "deployment.environment": "prod",
            "deployment_environment": "other",
        }
        text = render(Registry(), attributes).decode()
        self.assertIn('target_info{service_name="edge",deployment_environment="prod"} 1', text)
        self.assertEqual(target_labels({"1a": 1, "_1a": 2}), {"_1a": 1})

    def test_text_format(self) -> None:
        registry = Registry()
        histogram = registry.histogram("rq.duration", "s", "Took.", ("route",), (0.1, 1.0))
        histogram.record(0.1, ("/a/{id}",))
        histogram.record(2.0, ("/a/{id}",))
        counter = registry.counter("hits", "{hit}", 'Hits "now"\\\nand later.', ("why",))
        counter.add(3, ('say "hi"\\\n',))
        active = registry.counter("active", "{request}", "Now.", (), monotonic=False)
        active.add(2)
        registry.observable("dropped", "{line}", "Lost.", (), lambda: [((), 4)], kind="counter")
        text = render(registry, {"service.name": "edge"}).decode()
        self.assertEqual(
            text,
            "# HELP target_info Target metadata\n"
            "# TYPE target_info gauge\n"
            'target_info{service_name="edge"} 1\n'
            "# HELP rq_duration_seconds Took.\n"
            "# TYPE rq_duration_seconds histogram\n"
            'rq_duration_seconds_bucket{route="/a/{id}",le="0.1"} 1\n'
            'rq_duration_seconds_bucket{route="/a/{id}",le="1"} 1\n'
            'rq_duration_seconds_bucket{route="/a/{id}",le="+Inf"} 2\n'
            'rq_duration_seconds_sum{route="/a/{id}"} 2.1\n'
            'rq_duration_seconds_count{route="/a/{id}"} 2\n'
            '# HELP hits_total Hits "now"\\\\\\nand later.\n'
            "# TYPE hits_total counter\n"
            'hits_total{why="say \\"hi\\"\\\\\\n"} 3\n'
            "# HELP active Now.\n"
            "# TYPE active gauge\n"
            "active 2\n"
            "# HELP dropped_total Lost.\n"
            "# TYPE dropped_total counter\n"
            "dropped_total 4\n",
        )


class _Exporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []
        self.shut = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut = True


class OtlpTests(TestCase):
    def test_urls(self) -> None:
        self.assertEqual(metrics_url("http://c:4318"), "http://c:4318/v1/metrics")
        self.assertEqual(metrics_url("http://c:4318/"), "http://c:4318/v1/metrics")
        self.assertEqual(metrics_url("http://c/otlp/v1/traces"), "http://c/otlp/v1/metrics")
        self.assertEqual(metrics_url("http://c/ingest"), "http://c/ingest")

    def test_data_model(self) -> None:
        registry = Registry()
        metrics = GatewayMetrics(registry)
        metrics.request("/a/", b"GET", 200, 0.02, 0, 5)
        metrics.active(b"GET", 1)
        metrics.observe("edgegw.idp.ready", "1", "Ready.", (), lambda: [((), 1)])
        data = metrics_data(registry, Resource.create({"service.name": "edge"}), now_ns=7)
        [resource] = data.resource_metrics
        self.assertEqual(resource.resource.attributes["service.name"], "edge")
        [scope] = resource.scope_metrics
        self.assertEqual(scope.scope.name, "edgegw")
        found = {metric.name: metric for metric in scope.metrics}
        duration = found["http.server.request.duration"]
        self.assertEqual(duration.unit, "s")
        assert isinstance(duration.data, Histogram)
        [point] = duration.data.data_points
        self.assertEqual(
            dict(point.attributes or {}),
            {
                "http.route": "/a/",
                "http.request.method": "GET",
                "http.response.status_class": "2xx",
            },
        )
        self.assertEqual((point.count, point.time_unix_nano), (1, 7))
        self.assertEqual(point.start_time_unix_nano, registry.start_time_ns)
        self.assertEqual(sum(point.bucket_counts), 1)
        active = found["http.server.active_requests"].data
        assert isinstance(active, Sum)
        self.assertFalse(active.is_monotonic)
        self.assertEqual(active.data_points[0].value, 1)
        assert isinstance(found["edgegw.idp.ready"].data, Gauge)
        # Nothing recorded yet: the metric is there, with no point.
        auth = found["edgegw.auth.outcomes"].data
        assert isinstance(auth, Sum)
        self.assertEqual((auth.is_monotonic, list(auth.data_points)), (True, []))

    async def test_export_service(self) -> None:
        from twisted.internet import reactor

        registry = Registry()
        counter = registry.counter("hits", "{hit}", "Hits.")
        exporter = _Exporter()
        service = MetricsExportService(
            registry, Resource.create({}), exporter, reactor, interval=3600
        )
        service.startService()
        counter.add(2)
        await service.export()
        counter.add(1)
        await service.stopService()
        self.assertTrue(exporter.shut)
        values = []
        for data in exporter.exported:
            point = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
            assert isinstance(point, NumberDataPoint)
            values.append(point.value)
        # The periodic one, then the last one at stop.
        self.assertEqual(values, [2, 3])


class ConfigTests(SynchronousTestCase):
    def test_without_a_metrics_block(self) -> None:
        config = load_text(self.mktemp(), TELEMETRY)
        assert config.telemetry is not None
        self.assertIsNone(config.telemetry.metrics)

    def test_prometheus_and_otlp(self) -> None:
        config = load_text(
            self.mktemp(),
            TELEMETRY.replace(
                "  service: {name: edge}\n",
                "  service: {name: edge}\n"
                '  otlp: {endpoint: "http://127.0.0.1:4318"}\n'
                "  metrics:\n"
                '    prometheus: {listen: "127.0.0.1:9464"}\n'
                "    otlp: {interval: 15s}\n"
                "    cardinalityLimit: 500\n",
            ),
        )
        assert config.telemetry is not None
        metrics = config.telemetry.metrics
        assert metrics is not None
        self.assertEqual(metrics.prometheus_listen, "127.0.0.1:9464")
        self.assertEqual(metrics.prometheus_path, "/metrics")
        self.assertEqual(metrics.otlp_endpoint, "http://127.0.0.1:4318")
        self.assertEqual((metrics.otlp_interval, metrics.cardinality_limit), (15.0, 500))

    def test_errors(self) -> None:
        def errors(block: str) -> list[str]:
            text = TELEMETRY.replace(
                "  service: {name: edge}\n", "  service: {name: edge}\n  metrics:\n" + block
            )
            return [re.sub(r"^.*?spec\.", "spec.", p) for p in problems_of(self.mktemp(), text)]

        self.assertEqual(
            errors("    cardinalityLimit: 10\n"),
            [
                "spec.metrics.prometheus: metrics go nowhere: add prometheus (a scrape "
                "listener) and/or otlp (export)"
            ],
        )
        self.assertEqual(
            errors("    otlp: {interval: 10s}\n"),
            [
                "spec.metrics.otlp.endpoint: no collector to export to: set it here or in "
                "the Telemetry's otlp.endpoint (or set enabled: false)"
            ],
        )
        self.assertEqual(
            errors('    prometheus: {listen: "nowhere", path: metrics}\n'),
            [
                'spec.metrics.prometheus.listen: invalid listen address "nowhere": use '
                '":8080", "127.0.0.1:8080", "[::1]:8080" or a Twisted endpoint such as '
                '"tcp:8080" or "ssl:8443:..."',
                'spec.metrics.prometheus.path: "metrics" is not an absolute path (such as '
                "/metrics)",
            ],
        )
        self.assertEqual(
            errors('    prometheus: {listen: ":9464", lisen: x}\n'),
            ['spec.metrics.prometheus.lisen: unknown field; did you mean "listen"?'],
        )


class OtlpReceiverTests(TestCase):
    """
    The SDK's OTLP exporters, as the export service drives them, reaching real OTLP
    receivers on 127.0.0.1.
    """

    async def export_to(self, endpoint: str, protocol: str) -> None:
        from twisted.internet import reactor

        registry = Registry()
        metrics = GatewayMetrics(registry)
        metrics.request("/api/{id}", b"GET", 200, 0.02, 10, 300)
        metrics.request("/api/{id}", b"GET", 503, 0.2, 0, 20)
        metrics.auth("bearer", "rejected", "expired")
        exporter = make_metric_exporter(endpoint, protocol, {"X-Api-Key": "k"}, 5.0)
        service = MetricsExportService(
            registry, Resource.create({"service.name": "edge"}), exporter, reactor, 3600
        )
        service.startService()
        await service.export()
        metrics.auth("bearer", "rejected", "expired")
        await service.stopService()

    def check(self, collector: MetricsCollector) -> None:
        self.assertEqual(collector.errors, [])
        self.assertEqual(len(collector.exports), 2)  # the periodic one and the last
        self.assertEqual(collector.headers[0].get("x-api-key"), "k")
        durations = collector.last("http.server.request.duration")
        by_status = {p.attributes["http.response.status_class"]: p for p in durations}
        self.assertEqual(set(by_status), {"2xx", "5xx"})
        ok = by_status["2xx"]
        self.assertEqual((ok.kind, ok.unit, ok.value, ok.cumulative), ("histogram", "s", 1, True))
        self.assertEqual(ok.attributes["http.route"], "/api/{id}")
        self.assertEqual(ok.resource["service.name"], "edge")
        self.assertEqual(ok.scope, "edgegw")
        self.assertEqual(sum(ok.bucket_counts), 1)
        [auth] = collector.last("edgegw.auth.outcomes")
        self.assertEqual((auth.kind, auth.monotonic, auth.value), ("sum", True, 2))
        [first] = [p for p in collector.exports[0] if p.name == "edgegw.auth.outcomes"]
        self.assertEqual(first.value, 1)

    async def test_http_protobuf(self) -> None:
        endpoint, collector = await start_http_metrics(self)
        await self.export_to(endpoint, "http/protobuf")
        self.check(collector)

    async def test_grpc(self) -> None:
        endpoint, collector = await start_grpc_metrics(self)
        await self.export_to(endpoint, "grpc")
        await collector.wait_until(lambda: len(collector.exports) == 2)
        self.check(collector)

    async def test_unreachable_collector_is_logged_not_raised(self) -> None:
        from twisted.internet import reactor

        from tests.support.processes import refused_port

        port = await refused_port()
        registry = Registry()
        registry.counter("hits", "{hit}", "Hits.").add(1)
        exporter = make_metric_exporter(f"http://127.0.0.1:{port}", "http/protobuf", {}, 1.0)
        service = MetricsExportService(registry, Resource.create({}), exporter, reactor, 3600)
        events: list[dict[str, Any]] = []
        observer = cast(ILogObserver, events.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        service.startService()
        await service.export()
        await service.stopService()
        warnings = [e for e in events if e.get("log_namespace") == "edgegw.metrics"]
        self.assertEqual(len(warnings), 2)  # the export, and the last one at stop
        # FAILURE (newer exporters) or the network error (older ones raise it).
        self.assertIn(warnings[0]["result"].split(":")[0], ("FAILURE", "ConnectionError"))
