"""
OpenTelemetry for the gateway: the tracer, W3C propagation over Twisted headers, export.

Built only when a C{Telemetry} resource exists; without one no tracing layer is put in
front of the mux and upstream calls start no span, so tracing costs nothing. With one,
spans are recorded (for log correlation) even without an C{otlp.endpoint}; with an
endpoint they are exported by the SDK's batch processor, on its own thread, so that a
slow or unreachable collector never holds up a request (when its queue is full, spans are
dropped).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    get_current_span,
    use_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.web.http_headers import Headers
from zope.interface import Attribute, Interface, implementer

from edgegw import __version__
from edgegw.config.model import TelemetrySpec

_PROPAGATOR = TraceContextTextMapPropagator()


class IRequestTrace(Interface):
    """
    A request's tracing state, set as a component of the request by the tracing layer
    (C{request.getComponent(IRequestTrace)}; absent when tracing is off).
    """

    span = Attribute("The request's SERVER span.")
    tracer = Attribute("The tracer that started it (upstream calls start CLIENT spans).")
    route = Attribute("The matched route pattern (for the span's name), or None.")


@implementer(IRequestTrace)
class RequestTrace:
    """
    The plain L{IRequestTrace}.
    """

    __slots__ = ("route", "span", "tracer")

    def __init__(self, span: Any, tracer: Any) -> None:
        self.span = span
        self.tracer = tracer
        self.route: str | None = None


class _HeadersGetter(Getter[Headers]):
    """
    Reads W3C trace context from Twisted request headers.
    """

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = carrier.getRawHeaders(key.encode("ascii"))
        if not values:
            return None
        return [value.decode("latin-1") for value in values]

    def keys(self, carrier: Headers) -> list[str]:
        return [name.decode("latin-1").lower() for name, _ in carrier.getAllRawHeaders()]


class _ListSetter(Setter[list[tuple[bytes, bytes]]]):
    """
    Writes W3C trace context into an outgoing header list, replacing what was there.
    """

    def set(self, carrier: list[tuple[bytes, bytes]], key: str, value: str) -> None:
        name = key.encode("ascii")
        carrier[:] = [(n, v) for n, v in carrier if n.lower() != name]
        carrier.append((name, value.encode("latin-1")))


HEADERS_GETTER = _HeadersGetter()
LIST_SETTER = _ListSetter()


def extract_context(headers: Headers) -> Context:
    """
    The trace context a request carries (C{traceparent}, C{tracestate}).
    """
    return _PROPAGATOR.extract(headers, getter=HEADERS_GETTER)


def inject_context(headers: list[tuple[bytes, bytes]], context: Context | None = None) -> None:
    """
    Add C{traceparent} (and C{tracestate}) for the current span to outgoing headers.
    """
    _PROPAGATOR.inject(headers, context=context, setter=LIST_SETTER)


def traces_url(endpoint: str) -> str:
    """
    The OTLP/HTTP traces URL for a collector endpoint: C{/v1/traces} is appended to a
    bare base URL, a URL with a path is used as it is.
    """
    path = urlsplit(endpoint).path
    if path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def make_exporter(spec: TelemetrySpec) -> SpanExporter | None:
    """
    The OTLP exporter for C{spec}, or L{None} without an endpoint.
    """
    endpoint = spec.otlp_endpoint
    if endpoint is None:
        return None
    headers = dict(spec.otlp_headers)
    if spec.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        parts = urlsplit(endpoint)
        return GrpcExporter(
            endpoint=parts.netloc,
            insecure=parts.scheme == "http",
            # gRPC metadata keys must be lowercase (grpcio refuses the call otherwise).
            headers={name.lower(): value for name, value in headers.items()},
            timeout=spec.otlp_timeout,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=traces_url(endpoint), headers=headers, timeout=spec.otlp_timeout)


class CorrelationTracer(Tracer):
    """
    The tracer of a Telemetry resource that exports nothing: its spans only carry ids,
    for the access log's C{trace_id}/C{span_id} and the C{traceparent} sent upstream.

    It decides sampling as the SDK would (the same parent-based ratio sampler, so a
    backend sees the same sampled flag), but returns non-recording spans: recording
    spans nobody will read (attributes, events, status, end time) was most of the ~37 µs
    a Telemetry without export added to a request; with this tracer it adds ~13 µs
    (C{python -m bench suite}, policy-telemetry against policy).
    """

    def __init__(self, sampler: Sampler) -> None:
        self._sampler = sampler
        self._ids = RandomIdGenerator()

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        parent = get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else self._ids.generate_trace_id()
        result = self._sampler.should_sample(context, trace_id, name, kind)
        flags = TraceFlags(TraceFlags.SAMPLED if result.decision.is_sampled() else 0)
        span_context = SpanContext(
            trace_id,
            self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=result.trace_state,
        )
        return NonRecordingSpan(span_context)

    # The SDK's own tracer overrides this the same way (and ignores the same check).
    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> Iterator[Span]:
        end_on_exit = kwargs.pop("end_on_exit", True)
        span = self.start_span(*args, **kwargs)
        with use_span(span, end_on_exit=end_on_exit) as current:
            yield current


class Telemetry:
    """
    The gateway's tracer provider, built from the C{Telemetry} resource.

    Without an exporter (no C{otlp.endpoint}) nothing reads a span's contents: the
    tracer is then a L{CorrelationTracer}, whose spans carry ids and the sampled flag
    only.

    @param processor: Overrides the batch processor (tests use a synchronous one).
    """

    def __init__(
        self, spec: TelemetrySpec, reactor: Any, processor: SpanProcessor | None = None
    ) -> None:
        self.spec = spec
        self.reactor = reactor
        attributes: dict[str, Any] = {
            "service.name": spec.service_name,
            "telemetry.sdk.name": "opentelemetry",
            **spec.resource_attributes,
        }
        if spec.service_version:
            attributes["service.version"] = spec.service_version
        sampler = ParentBased(TraceIdRatioBased(spec.sampling_ratio))
        self.provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
        if processor is None:
            exporter = make_exporter(spec)
            if exporter is not None:
                processor = BatchSpanProcessor(exporter)
        self.tracer: Tracer
        if processor is not None:
            self.provider.add_span_processor(processor)
            self.tracer = self.provider.get_tracer("edgegw", __version__)
        else:
            self.tracer = CorrelationTracer(sampler)

    def force_flush(self) -> Deferred[bool]:
        """
        Export every finished span now (in a thread: exporting blocks).
        """
        return self._in_thread(self.provider.force_flush)

    def shutdown(self) -> Deferred[None]:
        """
        Flush and stop exporting (in a thread: exporting blocks).
        """
        return self._in_thread(self.provider.shutdown)

    def discard(self) -> None:
        """
        Stop exporting at once, for a Telemetry that never served (a gateway whose build
        or reload failed): there is nothing to flush, and its export thread must not
        outlive it.
        """
        self.provider.shutdown()

    def _in_thread(self, function: Any) -> Deferred[Any]:
        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), function)


def attributes_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """
    Span attributes without the L{None} values.
    """
    return {key: value for key, value in values.items() if value is not None}
