"""
The edge: the gateway-wide layers in the reference's order, around the mux.

forwarded -> security -> tracing -> mux. Each layer is a plain object applied in one
straight-line C{render}, so the layers cost a few attribute lookups, not a resource
traversal each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from time import monotonic
from typing import Protocol

from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import IRouteTarget
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.security import SecurityLayer
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.routing.hosts import MAX_REMEMBERED_HOST, normalise_host
from edgegw.routing.mux import Matched, MethodNotAllowed, Mux, Redirect
from edgegw.routing.paths import to_bytes, vet_path
from edgegw.seam import RAW_DICT_WRITABLE, raw_fields
from edgegw.stream.boundary import close_after_response
from edgegw.stream.response_headers import ResponseHeaders
from edgegw.telemetry import IRequestTrace
from edgegw.terminal.answers import TEXT_PLAIN


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


# The standard methods, spelled as registered (RFC 9110 section 18.2). Methods are
# case-sensitive, but backends that upper-case them would serve "get" as GET after the mux
# routed it past every "GET ..." pattern (and its policies).
_STANDARD_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")
)
# Hosts seen, normalised: most requests name one of a few hosts, so this replaces the
# syntax check with one lookup. Bounded; a host beyond the bound is checked every time.
_HOST_CACHE_SIZE = 256


# A request-target byte that is not visible ASCII (Twisted's own check lets DEL and
# 0x80-0xB0 through, and Python's http.server splits the line on \x85 and \xa0), or a
# "#": origin form has no fragment, and backends drop what follows it, so "/secret#x"
# would be routed as one path and served as another.
_REFUSED_TARGET = re.compile(rb"[^\x21-\x7e]|#")


def _plain(request: Request, status: int, body: bytes) -> bytes:
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [TEXT_PLAIN])
    if status == 400:
        # Whatever follows a request the edge could not read as it was meant is not
        # read either.
        close_after_response(request)
    return body


class MuxDispatcher:
    """
    Routes each request with the Go-style mux and hands it to the matched target: a
    route's chain, or a plain Resource.

    @param traced: Tracing is on: record the matched pattern in the request's
        L{IRequestTrace} (the span's name and C{http.route}).
    """

    def __init__(
        self,
        mux: Mux[IRouteTarget],
        traced: bool = False,
        reserved: Mapping[str, IRouteTarget] | None = None,
    ) -> None:
        """
        @param reserved: Targets answered before the mux for their exact path, whatever
            the host and method (the gateway's auth endpoints: a route such as C{GET /}
            must not take C{/auth/logout} from them).
        """
        self.mux = mux
        self.traced = traced
        self.reserved: dict[str, IRouteTarget] = dict(reserved or {})

    def dispatch(
        self, request: Request, method: str, host: str, path: str, query: str
    ) -> bytes | int:
        reserved = self.reserved
        if reserved:
            target = reserved.get(path)
            if target is not None:
                if self.traced:
                    IRequestTrace(request).route = target.pattern
                answer: bytes | int = target.serve(request, {})
                return answer
        result = self.mux.route(method, host, path, query)
        if isinstance(result, Matched):
            target = result.target
            if self.traced:
                IRequestTrace(request).route = target.pattern
            return target.serve(request, result.params)
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
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.forwarded = forwarded
        self.security = security
        self.dispatcher = dispatcher
        self.access = access
        self.encoded_slashes = security.encoded_slashes
        # raw Host value -> (the host to route by, the value to rewrite Host to or None)
        self._hosts: dict[bytes, tuple[str, bytes | None]] = {}

    def render(self, request: Request) -> bytes | int:
        started = monotonic()
        answer = self._render(request)
        if answer is not NOT_DONE_YET:
            # Answered here, before any route: log it like a routed request.
            request.notifyFinish().addBoth(lambda _: self.access.edge(request, started))
        return answer

    def _render(self, request: Request) -> bytes | int:
        request_headers = request.requestHeaders
        drop_underscored_headers(request_headers)
        self.forwarded.clean(request)
        headers = request.responseHeaders
        if isinstance(headers, ResponseHeaders):
            headers.fixed = self.security.fixed
        method = request.method.decode("latin-1")
        if method not in _STANDARD_METHODS and method.upper() in _STANDARD_METHODS:
            return self._refuse(request, "method_case")
        target = request.uri
        if _REFUSED_TARGET.search(target) is not None:
            return self._refuse(request, "target_characters")
        if target[:1] != b"/":
            split = split_absolute_form(target)
            if split is None:
                # "OPTIONS *" reaches here only if Twisted did not answer it, and any
                # other target that names no path.
                return self._refuse(request, "target_form")
            # RFC 9112 section 3.2.2: the target's authority replaces Host, and from here
            # on every layer sees the origin form.
            authority, target = split
            request_headers.setRawHeaders(b"host", [authority])
            request.uri = target
            request.path = target.split(b"?", 1)[0]
        host_header = request_headers.getRawHeaders(b"host")
        if host_header is None or host_header == [b""]:
            # RFC 9110 section 4.2.1: an http URI has a non-empty host (HTTP/2: from
            # :authority or Host).
            if request.clientproto != b"HTTP/1.0":
                return self._refuse(request, "host_missing")
            host = ""
        elif len(host_header) != 1:
            return self._refuse(request, "host_repeated")
        else:
            known = self._hosts.get(host_header[0])
            if known is None:
                known = self._host(host_header[0])
                if known is None:
                    return self._refuse(request, "host_invalid")
            host, rewrite = known
            if rewrite is not None:
                # Forwarded (preserveHost, X-Forwarded-Host) as it was routed.
                request_headers.setRawHeaders(b"host", [rewrite])
        # surrogateescape: invalid UTF-8 is matched byte for byte, as Go does, never raises.
        path, _, query = target.decode("utf-8", "surrogateescape").partition("?")
        if ";" in path:
            # Servlet containers (Tomcat, Jetty) drop ";params" from each segment and
            # read "..;" as "..": "/admin;x/users" and "/public/..;/admin" would be
            # routed past the policy on /admin/ and served under it. Encoded, as %3B, it
            # is data to every backend.
            return self._refuse(request, "path_semicolon")
        if "%" in path or "\\" in path:
            vetted = vet_path(path, self.encoded_slashes)
            if vetted is None:
                return self._refuse(request, "path_encoding")
            if vetted is not path:
                # Decoded slashes: every later layer and the backend read this path.
                path = vetted
                _, question, raw_query = target.partition(b"?")
                request.path = to_bytes(path)
                request.uri = request.path + question + raw_query
        denied = self.security.apply(request, method, host, path)
        if denied is not None:
            self.metrics.csrf_refused("sec_fetch_site" if b"Sec-Fetch-Site" in denied else "origin")
            return _plain(request, 403, denied)
        return self.dispatcher.dispatch(request, method, host, path, query)

    def _refuse(self, request: Request, reason: str) -> bytes:
        """
        Answer 400 for C{reason} (one word of a fixed set), counted in the metrics.
        """
        self.metrics.edge_refused(400, reason)
        return _plain(request, 400, b"bad request\n")

    def _host(self, value: bytes) -> tuple[str, bytes | None] | None:
        """
        The host to route by and the C{Host} value to forward when it differs from
        C{value}, remembered; L{None} when C{value} is not a valid host.
        """
        normal = normalise_host(value)
        if normal is None:
            return None
        known = (normal.decode("ascii"), None if normal == value else normal)
        if len(value) > MAX_REMEMBERED_HOST:
            return known
        if len(self._hosts) >= _HOST_CACHE_SIZE:
            # Start over rather than stop learning: a client cannot fill it for good.
            self._hosts.clear()
        self._hosts[value] = known
        return known


def split_absolute_form(target: bytes) -> tuple[bytes, bytes] | None:
    """
    Split an absolute-form request-target (C{http://host:port/p?q}) into its authority
    and the origin form (C{/p?q}; C{/?q} when the path is empty); L{None} if it is not an
    http or https URL with an authority.
    """
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return None
    end = len(rest)
    for delimiter in (b"/", b"?", b"#"):
        found = rest.find(delimiter)
        if found != -1 and found < end:
            end = found
    authority = rest[:end]
    if not authority or b"@" in authority:
        return None
    remainder = rest[end:].split(b"#", 1)[0]
    if not remainder.startswith(b"/"):
        remainder = b"/" + remainder
    return authority, remainder


def drop_underscored_headers(headers: Headers) -> None:
    """
    Remove every request header whose name contains C{_}.

    CGI, WSGI, PHP and Rack backends map C{X_User_Id} and C{X-User-Id} to the same
    variable, so an underscored name would get a forged identity or forwarding header
    past the layers that strip the hyphenated one (nginx drops them by default too).
    """
    # 95 is "_": an int's membership is a byte scan (~12 ns), a bytes object's a
    # substring search (~100 ns), for every header of every request.
    if RAW_DICT_WRITABLE:
        # Twisted's dict of canonical names itself, not its generator (-0.2 µs).
        raw = raw_fields(headers)
        doomed = [name for name in raw if 95 in name]
        for name in doomed:
            del raw[name]
        return
    doomed = [name for name, _ in headers.getAllRawHeaders() if 95 in name]
    for name in doomed:
        headers.removeHeader(name)
