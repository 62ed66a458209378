"""
The edge: the gateway-wide layers in the reference's order, around the mux.

forwarded -> security -> tracing -> mux. Each layer is a plain object applied in one
straight-line C{render}, so the layers cost a few attribute lookups, not a resource
traversal each.
"""

from __future__ import annotations

import re
from time import monotonic
from typing import Protocol

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import RouteRunner
from edgegw.chain.respond import TEXT_PLAIN
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.mux import Matched, MethodNotAllowed, Mux, Redirect
from edgegw.edge.response_head import ResponseHeaders
from edgegw.edge.security import SecurityLayer


class Dispatcher(Protocol):
    """
    What the edge hands a request to once the outer layers have run: the mux, or a
    tracing layer wrapped around it.
    """

    def dispatch(
        self, request: Request, method: str, host: str, path: str, query: str
    ) -> bytes | int:
        """
        Serve C{request}; return a body, or C{NOT_DONE_YET} when answering later.
        """


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _plain(request: Request, status: int, body: bytes) -> bytes:
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [TEXT_PLAIN])
    return body


class MuxDispatcher:
    """
    Routes each request with the Go-style mux and starts the matched route's chain.
    """

    def __init__(self, mux: Mux[RouteRunner]) -> None:
        self.mux = mux

    def dispatch(
        self, request: Request, method: str, host: str, path: str, query: str
    ) -> bytes | int:
        result = self.mux.route(method, host, path, query)
        if isinstance(result, Matched):
            runner = result.target
            # For the tracing layer (http.route) and anyone else asking later.
            request.route_pattern = runner.route.pattern  # type: ignore[attr-defined]
            runner.serve(request, result.params)
            return NOT_DONE_YET
        if isinstance(result, Redirect):
            request.responseHeaders.setRawHeaders(b"location", [result.location.encode("latin-1")])
            return _plain(request, 301, b"moved permanently\n")
        if isinstance(result, MethodNotAllowed):
            request.responseHeaders.setRawHeaders(b"allow", [result.allow.encode("ascii")])
            return _plain(request, 405, b"method not allowed\n")
        return _plain(request, 404, b"not found\n")


class EdgeResource(Resource):
    """
    The one resource of the gateway's Site: every request goes through C{render}.
    """

    isLeaf = True

    def __init__(
        self,
        forwarded: ForwardedFilter,
        security: SecurityLayer,
        dispatcher: Dispatcher,
        access: AccessLog,
    ) -> None:
        super().__init__()
        self.forwarded = forwarded
        self.security = security
        self.dispatcher = dispatcher
        self.access = access

    def render(self, request: Request) -> bytes | int:
        started = monotonic()
        answer = self._render(request)
        if answer is not NOT_DONE_YET:
            # Answered here, before any route: log it like a routed request.
            request.notifyFinish().addBoth(lambda _: self.access.edge(request, started))
        return answer

    def _render(self, request: Request) -> bytes | int:
        self.forwarded.clean(request)
        headers = request.responseHeaders
        if isinstance(headers, ResponseHeaders):
            headers.fixed = self.security.fixed
        method = request.method.decode("latin-1")
        host_header = request.requestHeaders.getRawHeaders(b"host")
        host = host_header[0].decode("latin-1") if host_header else ""
        target = request.uri
        if target[:1] != b"/":
            target = _origin_form(target)
        # surrogateescape: invalid UTF-8 is matched byte for byte, as Go does, never raises.
        path, _, query = target.decode("utf-8", "surrogateescape").partition("?")
        if path[:1] != "/" or ("%" in path and _BAD_ESCAPE.search(path)):
            # A target that names no path, or a malformed percent-escape (Go's server
            # refuses these before routing too).
            return _plain(request, 400, b"bad request\n")
        denied = self.security.apply(request, method, host, path)
        if denied is not None:
            return _plain(request, 403, denied)
        return self.dispatcher.dispatch(request, method, host, path, query)


def _origin_form(target: bytes) -> bytes:
    """
    The path and query of an absolute-form target (C{http://host/p?q} -> C{/p?q}).
    """
    scheme, sep, rest = target.partition(b"://")
    if not sep or b"/" in scheme:
        return target
    slash = rest.find(b"/")
    question = rest.find(b"?")
    if slash == -1 or (question != -1 and question < slash):
        return b"/" + (rest[question:] if question != -1 else b"")
    return rest[slash:]
