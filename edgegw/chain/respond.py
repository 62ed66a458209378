"""
Writing the gateway's own short responses (errors, redirects) to a request.

Bodies are a few plain words; they never carry policy names, tokens, stack traces or
upstream addresses.
"""

from __future__ import annotations

from twisted.web.server import Request

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
    if request.startedWriting or request.finished or request._disconnected:
        return
    request.setResponseCode(status)
    set_header = request.responseHeaders.setRawHeaders
    for name, value in headers:
        set_header(name, [value])
    set_header(b"content-type", [TEXT_PLAIN])
    set_header(b"content-length", [b"%d" % len(body)])
    write_whole(request, body)


def write_whole(request: Request, body: bytes) -> None:
    """
    Write C{body} as the whole response body and finish the request: in one write with
    the head where the request can (the gateway's own requests).
    """
    whole = getattr(request, "write_whole", None)
    if whole is not None:
        whole(body)
    else:
        request.write(body)
        request.finish()


def abort(request: Request) -> None:
    """
    Drop the client connection at once: used when a response has started and cannot be
    completed, so that the client sees a broken transfer rather than a short body.
    """
    channel = request.channel
    transport = channel.transport if channel is not None else None
    if transport is not None:
        getattr(transport, "abortConnection", transport.loseConnection)()


def redirect(request: Request, status: int, location: bytes) -> None:
    """
    Answer a redirect to C{location} (already a safe, encoded target) and finish.
    """
    write_text(request, status, b"redirecting\n", ((b"location", location),))
