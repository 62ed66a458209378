"""
The recover stage: an error anywhere later in the chain becomes a logged 500.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.logger import Logger

from edgegw.chain.exchange import Exchange
from edgegw.chain.pipeline import Handler
from edgegw.chain.respond import abort, write_text

_log = Logger(namespace="edgegw.recover")


async def recover(exchange: Exchange, next: Handler) -> None:
    """
    Run the rest of the chain; turn an unexpected exception into a 500.

    The traceback goes to the log with the request id (and the trace and span ids when a
    span is recording), never to the client. When the response had already started, the
    connection is aborted instead, so the client cannot mistake a truncated body for a
    complete one. A cancellation (the client went away) is not an error.
    """
    try:
        await next(exchange)
    except CancelledError:
        raise
    except Exception:
        request = exchange.request
        span = exchange.span
        context = span.get_span_context() if span is not None else None
        _log.failure(
            "request failed in route {route} (request id {request_id})",
            route=exchange.route.pattern,
            request_id=exchange.request_id,
            trace_id=f"{context.trace_id:032x}" if context is not None else None,
            span_id=f"{context.span_id:016x}" if context is not None else None,
        )
        exchange.note("error", "internal")
        if request.startedWriting:
            if not request.finished:
                abort(request)
            return
        write_text(request, 500, b"internal server error\n")
