"""
Writing the gateway's own short responses (errors, redirects) to a request.

Bodies are a few plain words; they never carry policy names, tokens, stack traces or
upstream addresses.
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.stream.boundary import abort_client, client_gone, write_whole

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
