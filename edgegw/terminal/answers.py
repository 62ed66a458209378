"""
Writing the gateway's own short responses (errors, redirects) to a request.

Bodies are a few plain words; they never carry policy names, tokens, stack traces or
upstream addresses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.stream.boundary import abort_client, client_gone, write_whole

if TYPE_CHECKING:
    from edgegw.terminal.exchange import Exchange

# The namespace report_failure logged under in the recover stage: kept, so that the
# daemon log's JSON lines stay the same.
_log = Logger(namespace="edgegw.recover")

TEXT_PLAIN = b"text/plain; charset=utf-8"


def write_text(
    request: Request,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """
    Answer C{status} with a short C{text/plain} body and finish the request.

    Does nothing when the response has already started or the request is finished (a
    stage that fails late cannot change what the client has already seen).
    """
    if request.startedWriting or request.finished or client_gone(request):
        return
    request.setResponseCode(status)
    set_header = request.responseHeaders.setRawHeaders
    for name, value in headers:
        set_header(name, [value])
    set_header(b"content-type", [TEXT_PLAIN])
    set_header(b"content-length", [b"%d" % len(body)])
    write_whole(request, body)


def abort(request: Request) -> None:
    """
    Drop the client connection at once: used when a response has started and cannot be
    completed, so that the client sees a broken transfer rather than a short body.
    """
    abort_client(request)


def redirect(request: Request, status: int, location: bytes) -> None:
    """
    Answer a redirect to C{location} (already a safe, encoded target) and finish.
    """
    write_text(request, status, b"redirecting\n", ((b"location", location),))


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
