"""
The common ground of the browser-login endpoints: one allowed method (and C{HEAD} with
C{GET}), short answers that are never cached.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request

from edgegw.stream.boundary import client_gone
from edgegw.terminal.answers import write_text

__all__ = [
    "NO_STORE",
    "AuthEndpoint",
    "answer_failures",
    "answer_json",
    "answer_redirect",
    "answer_text",
]

_log = Logger(namespace="edgegw.auth")

NO_STORE = (b"Cache-Control", b"no-store")


class AuthEndpoint(Resource):
    """
    A leaf Resource answering one method; any other gets 405 with C{Allow}.

    An endpoint answering C{GET} answers C{HEAD} exactly as it answers C{GET} (RFC 9110
    section 9.3.2), effects included: the same status and header fields, C{Set-Cookie}
    and C{Content-Length} among them, and no body (the request drops a C{HEAD}'s body).
    """

    isLeaf = True
    method = b"GET"

    def render(self, request: Request) -> bytes | int:
        """
        Dispatch to L{render_allowed} for the allowed method (C{HEAD} too when that is
        C{GET}), else answer 405.
        """
        method = request.method
        if method != self.method and not (method == b"HEAD" and self.method == b"GET"):
            allow = b"GET, HEAD" if self.method == b"GET" else self.method
            answer_text(request, 405, b"method not allowed\n", ((b"Allow", allow),))
            return b""
        return self.render_allowed(request)

    def render_allowed(self, request: Request) -> bytes | int:
        """
        Answer the allowed method: return C{b""} once finished, or C{NOT_DONE_YET}.
        """
        raise NotImplementedError


def answer_text(
    request: Request, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """
    A short C{text/plain} answer that no cache keeps.
    """
    write_text(request, status, body, (NO_STORE, *headers))


def answer_redirect(request: Request, location: bytes) -> None:
    """
    A 302 to C{location} (already encoded) that no cache keeps.
    """
    answer_text(request, 302, b"redirecting\n", ((b"Location", location),))


def answer_json(request: Request, status: int, document: Any) -> None:
    """
    A JSON answer that no cache keeps.
    """
    if request.finished or client_gone(request):
        return
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    request.setResponseCode(status)
    headers = request.responseHeaders
    headers.setRawHeaders(b"content-type", [b"application/json"])
    headers.setRawHeaders(b"cache-control", [b"no-store"])
    headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
    request.write(body)
    request.finish()


def answer_failures(request: Request, answering: Deferred[Any]) -> None:
    """
    Answer 500 (and log it) should C{answering}, which was to answer C{request}, fail
    instead: an endpoint's bug never leaves its client waiting.
    """

    def failed(failure: Failure) -> None:
        _log.failure("{path} failed", failure=failure, path=request.path)
        if not request.finished and not client_gone(request):
            answer_text(request, 500, b"internal server error\n")

    answering.addErrback(failed)
