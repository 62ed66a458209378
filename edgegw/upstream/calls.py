"""
One record per upstream call: an entry in the access-log line and, when tracing is on, a
CLIENT span whose context goes to the upstream in C{traceparent}.

Every handler that calls an upstream (the reverse proxy, each api backend through the
treq agent) goes through L{start_call} and L{UpstreamCall.end}, so that what is recorded
about upstream calls is the same everywhere. A call made outside any request (the IdP
client's discovery and key-set fetches) has no L{CallContext}: it still gets its span, and
no access-log record.
"""

from __future__ import annotations

import re
from time import monotonic
from typing import Any, Protocol

import attrs
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.telemetry import inject_context
from edgegw.upstream.upstreams import Upstream


class CallContext(Protocol):
    """
    The request an upstream call is made for (the per-route exchange is one): where the
    call's record goes, and the span its CLIENT span is a child of.
    """

    @property
    def span(self) -> Any:
        """
        The request's SERVER span, or L{None} when tracing is off.
        """

    @property
    def tracer(self) -> Any:
        """
        The tracer, or L{None} when tracing is off.
        """

    def add_call(self, record: dict[str, Any]) -> None:
        """
        Keep one finished call's record (for the access-log line).
        """


@attrs.define
class UpstreamCall:
    """
    An upstream call in progress.

    @ivar name: What was called: the api backend's group, or C{"upstream"} for the proxy.
    @ivar upstream: The upstream's authority (host:port).
    @ivar origin: The upstream's origin (scheme://host:port), its metrics label.
    """

    context: CallContext | None
    name: str
    upstream: str
    started: float
    span: Any = None
    ended: bool = False
    method: bytes = b"GET"
    origin: str = ""
    metrics: IMetrics = NO_METRICS

    def end(
        self, status: int | None = None, error: str | None = None, error_class: str | None = None
    ) -> None:
        """
        Record the outcome: the status received (if any) and the failure reason (if any).
        Later calls do nothing.

        @param error_class: The failure's C{error.type} in the metrics, when the caller
            knows it better than L{error_type} can tell from C{error}.
        """
        if self.ended:
            return
        self.ended = True
        elapsed = monotonic() - self.started
        record: dict[str, Any] = {
            "name": self.name,
            "upstream": self.upstream,
            "status": status,
            "ms": round(elapsed * 1000, 3),
        }
        metrics = self.metrics
        if metrics is not NO_METRICS:
            metrics.upstream(
                self.origin,
                self.method,
                status,
                elapsed,
                error_class or (error_type(error) if error is not None else None),
                "" if self.name == "upstream" else self.name,
            )
        if error is not None:
            record["error"] = error
        span = self.span
        if span is not None:
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if error is not None or (status is not None and status >= 500):
                span.set_attribute("error.type", error or str(status))
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
        if self.context is not None:
            self.context.add_call(record)


def start_call(
    context: CallContext | None,
    name: str,
    upstream: Upstream,
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    tracer: Any = None,
    metrics: IMetrics = NO_METRICS,
) -> UpstreamCall:
    """
    Begin recording an upstream call; with tracing on, start its CLIENT span and put its
    context in C{headers} (replacing any the client sent).

    @param context: The request the call is for; L{None} outside any request.
    @param tracer: The tracer for a call outside any request (a context brings its own).
    @param metrics: Counts the call when it ends.
    """
    authority = upstream.name
    span = None
    parent_span = None
    if context is not None:
        tracer = context.tracer
        parent_span = context.span
    if tracer is not None:
        parent = set_span_in_context(parent_span) if parent_span is not None else None
        verb = method.decode("ascii", "replace")
        span = tracer.start_span(
            verb,
            context=parent,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": verb,
                "server.address": upstream.host,
                "server.port": upstream.port,
                "url.full": f"{upstream.scheme}://{authority}"
                + target.split(b"?", 1)[0].decode("ascii", "replace"),
                "edgegw.upstream.name": name,
            },
        )
        inject_context(headers, set_span_in_context(span))
    return UpstreamCall(
        context, name, authority, monotonic(), span, False, method, upstream.origin, metrics
    )


_ERROR_TYPES = {
    "cancelled": "cancelled",
    "cancelled mid-body": "cancelled",
    "timeout": "timeout",
    "aborted": "aborted",
    "no upstream connection available": "pool_exhausted",
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


def error_type(error: str) -> str:
    """
    A failed call's error as a bounded class (the C{error.type} of its metrics): a known
    reason, or the exception type L{describe_error} put first (C{body_} for one that
    happened while the body was relayed); never the message.
    """
    known = _ERROR_TYPES.get(error)
    if known is not None:
        return known
    prefix = ""
    if error.startswith("body: "):
        prefix, error = "body_", error[6:]
    found = _IDENTIFIER.match(error)
    # "Type: message" or a bare "Type" (describe_error's forms); anything else is other.
    if found is None or error[found.end() : found.end() + 1] not in ("", ":"):
        return prefix + "other"
    return prefix + found.group(0)


def describe_error(error: BaseException | None) -> str:
    """
    A short reason for logs: the exception type and message, never sent to the client.
    """
    if error is None:
        return "error"
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
