"""
The Telemetry kind: service identity, OTLP export, sampling and the access log's level and
fields.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.addresses import endpoint_description
from edgegw.config.fields import Node
from edgegw.config.header_syntax import check_header_name, check_header_value
from edgegw.config.model import MetricsSpec, TelemetrySpec
from edgegw.config.urls import check_url

__all__ = ["RESERVED_ACCESS_LOG_FIELDS", "read_telemetry"]

RESERVED_ACCESS_LOG_FIELDS = frozenset(
    {
        "method",
        "path",
        "status",
        "duration_ms",
        "bytes",
        "request_id",
        "route",
        "trace_id",
        "span_id",
        "request_headers",
        "upstream_calls",
        "authz_denied",
        "error",
        "client_gone",
        "tunnel_bytes_up",
        "api_error",
    }
)
"""Fields of an access-log line that constant C{accessLog.fields} may not overwrite."""

# Request headers that carry credentials: never written to the access log.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-gw-identity"})


def read_telemetry(spec: Node) -> TelemetrySpec:
    """
    The Telemetry resource's spec.
    """
    service = spec.mapping("service", required=True)
    service_name = ""
    service_version = None
    if service is not None:
        service_name = service.required_string("name")
        service_version = service.string("version", nonempty=True)
        service.finish()
    resource_attributes: dict[str, str] = {}
    resource = spec.mapping("resource")
    if resource is not None:
        resource_attributes = resource.string_map("attributes") or {}
        resource.finish()
    endpoint = None
    protocol = "http/protobuf"
    headers: dict[str, str] = {}
    timeout = 10.0
    otlp = spec.mapping("otlp")
    if otlp is not None:
        endpoint = otlp.string("endpoint")
        check_url(otlp, "endpoint", endpoint, ("http", "https"))
        protocol = (
            otlp.string("protocol", "http/protobuf", choices=("http/protobuf", "grpc")) or protocol
        )
        headers = otlp.string_map("headers") or {}
        for name, value in headers.items():
            check_header_name(otlp, f"headers.{name}", name)
            check_header_value(otlp, f"headers.{name}", value)
        timeout = otlp.duration("timeout", 10.0, positive=True) or 10.0
        otlp.finish()
    ratio = 1.0
    sampling = spec.mapping("sampling")
    if sampling is not None:
        ratio = sampling.number("ratio", 1.0, minimum=0.0, maximum=1.0)
        sampling.finish()
    level = "info"
    log_headers: tuple[str, ...] = ()
    log_fields: dict[str, str] = {}
    access_log = spec.mapping("accessLog")
    if access_log is not None:
        level = (
            access_log.string("level", "info", choices=("debug", "info", "warn", "error")) or level
        )
        log_headers = access_log.strings("requestHeaders")
        for index, name in enumerate(log_headers):
            check_header_name(access_log, f"requestHeaders[{index}]", name)
            if name.lower() in _SECRET_HEADERS:
                access_log.error(
                    f"requestHeaders[{index}]",
                    f"{name} carries credentials, which are never logged",
                )
        log_fields = access_log.string_map("fields") or {}
        for name in log_fields:
            if name in RESERVED_ACCESS_LOG_FIELDS:
                access_log.error(f"fields.{name}", f'"{name}" is a field the gateway writes itself')
        access_log.finish()
    metrics = None
    metrics_node = spec.mapping("metrics")
    if metrics_node is not None:
        metrics = read_metrics(metrics_node, endpoint)
    return TelemetrySpec(
        service_name=service_name,
        service_version=service_version,
        resource_attributes=resource_attributes,
        otlp_endpoint=endpoint,
        otlp_protocol=cast(Any, protocol),
        otlp_headers=headers,
        otlp_timeout=timeout,
        sampling_ratio=ratio,
        access_log_level=cast(Any, level),
        access_log_headers=log_headers,
        access_log_fields=log_fields,
        metrics=metrics,
    )


def read_metrics(spec: Node, telemetry_endpoint: str | None) -> MetricsSpec:
    """
    The C{metrics} block: a Prometheus scrape listener and/or OTLP export.
    """
    listen = None
    path = "/metrics"
    prometheus = spec.mapping("prometheus")
    if prometheus is not None:
        listen = prometheus.required_string("listen")
        if listen:
            try:
                endpoint_description(listen)
            except ValueError as e:
                prometheus.error("listen", str(e))
        path = prometheus.string("path", "/metrics") or "/metrics"
        if not path.startswith("/") or "?" in path or "#" in path:
            prometheus.error("path", f'"{path}" is not an absolute path (such as /metrics)')
        prometheus.finish()
    export_endpoint = None
    interval = 60.0
    otlp = spec.mapping("otlp")
    if otlp is not None:
        enabled = otlp.boolean("enabled", True)
        own = otlp.string("endpoint")
        check_url(otlp, "endpoint", own, ("http", "https"))
        interval = otlp.duration("interval", 60.0, positive=True) or 60.0
        if enabled:
            export_endpoint = own or telemetry_endpoint
            if export_endpoint is None:
                otlp.error(
                    "endpoint",
                    "no collector to export to: set it here or in the Telemetry's "
                    "otlp.endpoint (or set enabled: false)",
                )
        otlp.finish()
    limit = spec.integer("cardinalityLimit", 2000, minimum=1)
    if prometheus is None and otlp is None:
        spec.error(
            "prometheus",
            "metrics go nowhere: add prometheus (a scrape listener) and/or otlp (export)",
        )
    spec.finish()
    return MetricsSpec(
        prometheus_listen=listen,
        prometheus_path=path,
        otlp_endpoint=export_endpoint,
        otlp_interval=interval,
        cardinality_limit=limit,
    )
