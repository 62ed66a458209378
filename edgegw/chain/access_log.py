"""
Access logging: one structured JSON line per request.

Routed requests are logged by the access-log stage after the handler returns; requests
the edge answers itself (CSRF 403, mux 301/404/405, 400) are logged by the edge with the
same fields, so that every request leaves exactly one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import Any

from twisted.internet.defer import CancelledError
from twisted.logger import Logger, LogLevel
from twisted.web.server import Request

from edgegw.line_writer import LineWriter
from edgegw.metrics.gateway_metrics import IMetrics
from edgegw.stream.boundary import client_gone
from edgegw.telemetry import IRequestTrace
from edgegw.terminal.exchange import Exchange, Handler

LEVELS = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "error": LogLevel.error,
}

_log = Logger(namespace="edgegw.access")


def _json_encoder() -> Callable[[Any], str]:
    """
    The compact, ASCII-only JSON encoding of one access-log record.

    C{JSONEncoder.encode} builds its C encoder anew for every call; this builds it once
    (~0.9 µs a line). Without the circular-reference check, whose bookkeeping the C
    encoder leaves behind when an encoding fails: records are the gateway's own dicts
    (a cycle would raise RecursionError rather than ValueError).
    """
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    chunks = make(
        None,
        encoder.default,
        json.encoder.encode_basestring_ascii,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(record: Any) -> str:
        return "".join(chunks(record, 0))

    return encode


_encode = _json_encoder()


class AccessLog:
    """
    Writes one JSON line per request.

    Fields: method, path (no query: queries can carry secrets), status, duration_ms,
    bytes, request_id, route, and any notes the chain recorded.

    @param level: C{Telemetry.accessLog.level}: the log level of the events when the
        lines go through twisted.logger.
    @param writer: Where lines go (C{Gateway.spec.accessLog.output} C{"-"} or a path),
        or L{None} for twisted.logger: one event per request whose text is the JSON line
        and whose C{access} field holds the same data for structured observers.
    @param traced: Tracing is on: lines carry the request span's trace and span ids.
    @param metrics: Where each request's route, method, status, duration and body sizes
        are also counted (L{None}: metrics are off).
    """

    def __init__(
        self,
        level: str = "info",
        writer: LineWriter | None = None,
        request_headers: Sequence[str] = (),
        fields: Mapping[str, str] | None = None,
        traced: bool = False,
        metrics: IMetrics | None = None,
    ) -> None:
        self.level = LEVELS[level]
        self.writer = writer
        self.request_headers = tuple(
            (name.lower(), name.lower().encode("ascii")) for name in request_headers
        )
        self.fields = dict(fields or {})
        self.traced = traced
        self.metrics = metrics

    def _extend(self, record: dict[str, Any], request: Request) -> None:
        trace = request.getComponent(IRequestTrace) if self.traced else None
        if trace is not None:
            context = trace.span.get_span_context()
            if context.is_valid:
                record["trace_id"] = f"{context.trace_id:032x}"
                record["span_id"] = f"{context.span_id:016x}"
        if self.request_headers:
            headers = request.requestHeaders
            found = {}
            for name, raw in self.request_headers:
                values = headers.getRawHeaders(raw)
                if values:
                    found[name] = values[0].decode("latin-1")
            if found:
                record["request_headers"] = found
        if self.fields:
            record.update(self.fields)

    def emit(self, record: dict[str, Any]) -> None:
        """
        Log one request.
        """
        line = _encode(record)
        if self.writer is not None:
            self.writer.write(line.encode("ascii"))
        else:
            _log.emit(self.level, "{access_line}", access_line=line, access=record)

    def edge(self, request: Request, started: float, route: str | None = None) -> None:
        """
        Log a response answered without a route chain: by the edge itself, or by a plain
        Resource mounted on the mux under C{route}.
        """
        elapsed = monotonic() - started
        status = _status(request, False)
        if self.metrics is not None:
            self.metrics.request(
                route or "",
                request.method,
                status,
                elapsed,
                _received(request),
                request.sentLength,
            )
        record = _record(request, status, elapsed, "", route)
        if client_gone(request) and not request.finished:
            record["client_gone"] = True
        self._extend(record, request)
        self.emit(record)

    async def stage(self, exchange: Exchange, next: Handler) -> None:
        """
        The per-route stage: run the chain, then log what it answered.
        """
        failed = False
        metrics = self.metrics
        if metrics is not None:
            metrics.active(exchange.request.method, 1)
        try:
            await next(exchange)
        except CancelledError:
            raise
        except BaseException:
            # The recover stage (outside) answers 500 unless a response had started.
            failed = True
            raise
        finally:
            request = exchange.request
            status = _status(request, failed)
            elapsed = monotonic() - exchange.started
            pattern = exchange.route.pattern
            if metrics is not None:
                # Before the log line: a line that cannot be written must not leave the
                # in-flight gauge raised for ever.
                method = request.method
                metrics.active(method, -1)
                metrics.request(
                    pattern, method, status, elapsed, _received(request), request.sentLength
                )
            record = _record(request, status, elapsed, exchange.request_id, pattern)
            if client_gone(request) and not request.finished:
                record["client_gone"] = True
            if failed:
                record["error"] = "internal"
            if exchange.notes:
                record.update(exchange.notes)
            self._extend(record, request)
            self.emit(record)


def _status(request: Request, failed: bool) -> int | None:
    """
    The status a request is logged and counted with: what was sent, else 500 for a
    failed chain, else none when the client left before any response (Twisted's
    default 200 would count a hanging upstream or IdP as a success).
    """
    if request.startedWriting:
        return int(request.code)
    if failed:
        return 500
    if client_gone(request):
        return None
    return int(request.code)


def _received(request: Request) -> int:
    """
    The request body's bytes received from the client (streamed bodies count as they
    arrive; Twisted's own requests have theirs in C{content}).
    """
    body = getattr(request, "body", None)
    received = getattr(body, "received", None)
    if received is not None:
        return int(received)
    content = request.content
    if content is None:
        return 0
    # Its size without reading it: Twisted keeps bodies over 100 KB in a temporary file.
    try:
        here = content.tell()
        size = content.seek(0, 2)
        content.seek(here)
    except (OSError, ValueError):
        return 0
    return int(size)


def _record(
    request: Request, status: int | None, elapsed: float, request_id: str, route: str | None
) -> dict[str, Any]:
    return {
        "method": request.method.decode("latin-1"),
        "path": request.path.decode("latin-1"),
        "protocol": request.clientproto.decode("latin-1"),
        "status": status,
        "duration_ms": round(elapsed * 1000, 3),
        "bytes": request.sentLength,
        "request_id": request_id,
        "route": route,
    }
