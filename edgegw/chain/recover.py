"""
The recover stage: an error anywhere later in the chain becomes a logged 500.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.chain.answers import abort, write_text
from edgegw.chain.exchange import Exchange
from edgegw.chain.pipeline import Handler

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
        report_failure(Failure(), exchange.request, exchange)


def report_failure(failure: Failure, request: Request, exchange: Exchange | None) -> None:
    """
    Log C{failure} (with the route, request id and trace ids when C{exchange} is known)
    and answer 500, or abort the connection if the response has already started.
    """
    route = request_id = trace_id = span_id = None
    if exchange is not None:
        route = exchange.route.pattern
        request_id = exchange.request_id
        span = exchange.span
        if span is not None:
            context = span.get_span_context()
            trace_id = f"{context.trace_id:032x}"
            span_id = f"{context.span_id:016x}"
        exchange.note("error", "internal")
    _log.failure(
        "request failed in route {route} (request id {request_id})",
        failure=failure,
        route=route,
        request_id=request_id,
        trace_id=trace_id,
        span_id=span_id,
    )
    if request.startedWriting:
        if not request.finished:
            abort(request)
        return
    write_text(request, 500, b"internal server error\n")
