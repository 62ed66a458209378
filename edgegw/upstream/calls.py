"""
One record per upstream call: an entry in the access-log line and, when tracing is on, a
CLIENT span whose context goes to the upstream in C{traceparent}.

Every handler that calls an upstream (the reverse proxy, each api backend) goes through
L{start_call} and L{UpstreamCall.end}, so that what is recorded about upstream calls is
the same everywhere; the IdP and Redis clients will use the same two calls.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

import attrs
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from edgegw.chain.exchange import Exchange
from edgegw.telemetry import inject_context
from edgegw.upstream.pool import Upstream


@attrs.define
class UpstreamCall:
    """
    An upstream call in progress.

    @ivar name: What was called: the api backend's group, or C{"upstream"} for the proxy.
    @ivar upstream: The upstream's authority (host:port).
    """

    exchange: Exchange
    name: str
    upstream: str
    started: float
    span: Any = None
    ended: bool = False

    def end(self, status: int | None = None, error: str | None = None) -> None:
        """
        Record the outcome: the status received (if any) and the failure reason (if any).
        Later calls do nothing.
        """
        if self.ended:
            return
        self.ended = True
        record: dict[str, Any] = {
            "name": self.name,
            "upstream": self.upstream,
            "status": status,
            "ms": round((monotonic() - self.started) * 1000, 3),
        }
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
        exchange = self.exchange
        notes = exchange.notes
        calls = notes.get("upstream_calls") if notes is not None else None
        if calls is None:
            exchange.note("upstream_calls", [record])
        else:
            calls.append(record)


def start_call(
    exchange: Exchange,
    name: str,
    upstream: Upstream,
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
) -> UpstreamCall:
    """
    Begin recording an upstream call; with tracing on, start its CLIENT span and put its
    context in C{headers} (replacing any the client sent).
    """
    authority = upstream.authority.decode("ascii", "replace")
    span = None
    tracer = exchange.tracer
    if tracer is not None:
        parent = set_span_in_context(exchange.span) if exchange.span is not None else None
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
    return UpstreamCall(exchange, name, authority, monotonic(), span)


def describe_error(error: BaseException) -> str:
    """
    A short reason for logs: the exception type and message, never sent to the client.
    """
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
