"""
What a plugin sees of a request and a response: typed views that keep the gateway's
invariants.

A plugin changes a request or a response only through these views. They refuse (with
C{ValueError}, which answers 500 like any plugin failure) what would let a backend or a
browser read the message differently from the gateway: header names that are not
tokens, values with control characters, the framing headers (C{Content-Length},
C{Transfer-Encoding}, ...), the headers the gateway owns (identity, C{X-Forwarded-*},
C{X-Request-Id}, the security headers), and a path that is not clean.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from twisted.web.http import parse_qs
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from twisted.web.server import Request

from edgegw.identity.principal import Principal
from edgegw.routing.paths import clean_path, vet_path
from edgegw.stream.boundary import client_gone
from edgegw.stream.response_headers import add_response_field
from edgegw.terminal.answers import TEXT_PLAIN
from edgegw.terminal.exchange import Exchange

__all__ = [
    "REQUEST_FRAMING",
    "REQUEST_OWNED",
    "REQUEST_OWNED_PREFIXES",
    "RESPONSE_FRAMING",
    "RESPONSE_OWNED",
    "HeaderView",
    "PluginRequest",
    "PluginResponse",
    "Protected",
    "Reply",
    "check_header_name",
    "check_header_value",
    "write_reply",
]

_NO_BODY: Final = frozenset({204, 304})
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Field values (RFC 9110 section 5.5): visible characters, spaces and tabs, obs-text.
# No leading or trailing space or tab (RFC 9110 5.5; an HTTP/2 message with one is
# malformed, RFC 9113 8.2.1).
_VISIBLE = r"[\x21-\x7e\x80-\xff]"
_FIELD_VALUE: Final = re.compile(rf"(?:{_VISIBLE}(?:[\t\x20-\x7e\x80-\xff]*{_VISIBLE})?)?")
# Path and query characters a plugin may set: printable ASCII less space, "#" and, in a
# path, "?"; escapes are checked as the edge checks the client's path.
_PATH: Final = re.compile(r"/[!$%&'()*+,\-./0-9:;=@A-Z_a-z~]*")
_QUERY: Final = re.compile(r"[!$%&'()*+,\-./0-9:;=?@A-Z_a-z~]*")

REQUEST_FRAMING: Final = frozenset(
    {
        b"connection",
        b"content-length",
        b"expect",
        b"host",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Request headers that frame the message or the connection: no plugin sets them."""

RESPONSE_FRAMING: Final = frozenset(
    {
        b"connection",
        b"content-length",
        b"date",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Response headers the gateway frames the response with: no plugin sets them."""

REQUEST_OWNED: Final = frozenset(
    {b"x-request-id", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto"}
)
"""Request headers the gateway sets for backends, whatever the configuration."""

REQUEST_OWNED_PREFIXES: Final = (b"x-user-",)
"""Prefixes of the identity headers the projection sets (and strips from clients)."""

RESPONSE_OWNED: Final = frozenset(
    {
        b"content-security-policy",
        b"referrer-policy",
        b"server",
        b"strict-transport-security",
        b"x-content-type-options",
        b"x-frame-options",
        b"x-request-id",
    }
)
"""Response headers the gateway sets on every response (the security headers)."""


_SINGLE_RESPONSE_FIELDS: Final = frozenset(
    {
        b"content-encoding",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"last-modified",
        b"location",
    }
)
"""
Fields that describe the one answer the route gives (the gateway sets several of them
itself): a second one added beside the route's would contradict it.
"""


def check_header_name(name: str) -> bytes:
    """
    C{name} as bytes.

    @raise ValueError: It is not an RFC 9110 token.
    """
    if not isinstance(name, str) or _TOKEN.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a valid header name")
    return name.encode("ascii")


def check_header_value(value: str) -> bytes:
    """
    C{value} as bytes (Latin-1).

    @raise ValueError: It holds a control character (CR, LF, NUL, ...) or a character
        beyond Latin-1.
    """
    if not isinstance(value, str) or _FIELD_VALUE.fullmatch(value) is None:
        raise ValueError(f"{value!r} is not a valid header value")
    return value.encode("latin-1")


def client_after_proxies(
    peer: str, forwarded_for: Iterable[str], trusted: Callable[[str], bool]
) -> str:
    """
    The client of a request from C{peer} after C{trustedProxies}: from a trusted peer,
    the rightmost C{X-Forwarded-For} address that is not a trusted proxy (those left of
    it could have been written by the client itself), or the rightmost when all are;
    else the peer.
    """
    if not trusted(peer):
        return peer
    addresses = [part.strip() for value in forwarded_for for part in value.split(",")]
    for address in reversed(addresses):
        if address and not trusted(address):
            return address
    # Every entry a trusted proxy (trustedProxies "*"): the one the peer appended, never
    # the leftmost, which the client may have written itself.
    return addresses[-1] if addresses and addresses[-1] else peer


class Protected:
    """
    The header names plugins cannot change, computed once per gateway.

    @ivar request: Lowercased request header names: framing, those the gateway always
        sets (L{REQUEST_OWNED}), and the configuration's (projected identity headers
        outside C{X-User-*}, assertion headers).
    @ivar request_prefixes: Lowercased prefixes of request header names likewise
        (C{x-user-}).
    @ivar response: Lowercased response header names: framing and L{RESPONSE_OWNED}.
    @ivar is_trusted: Whether a peer is one of the Gateway's C{trustedProxies}: how
        L{PluginRequest.client_address} reads C{X-Forwarded-For}.
    """

    __slots__ = ("is_trusted", "request", "request_prefixes", "response")

    def __init__(
        self,
        request: Iterable[bytes] = (),
        request_prefixes: tuple[bytes, ...] = (),
        response: Iterable[bytes] = (),
        is_trusted: Callable[[str], bool] | None = None,
    ) -> None:
        self.is_trusted = is_trusted
        self.request = REQUEST_FRAMING | REQUEST_OWNED | {name.lower() for name in request}
        self.request_prefixes = REQUEST_OWNED_PREFIXES + tuple(
            prefix.lower() for prefix in request_prefixes
        )
        self.response = RESPONSE_FRAMING | RESPONSE_OWNED | {name.lower() for name in response}


class HeaderView:
    """
    A message's headers as plugins read and change them (names case-insensitive,
    values as C{str}).
    """

    __slots__ = ("_headers", "_prefixes", "_protected", "_written")

    def __init__(
        self,
        headers: Headers,
        protected: frozenset[bytes],
        prefixes: tuple[bytes, ...] = (),
        written: set[bytes] | None = None,
    ) -> None:
        """
        @param written: Receives the lowercased names set or added through this view.
        """
        self._headers = headers
        self._protected = protected
        self._prefixes = prefixes
        self._written = written

    def get(self, name: str) -> str | None:
        """
        The first value of C{name}, or L{None}.
        """
        values = self._headers.getRawHeaders(name.encode("latin-1"))
        return values[0].decode("latin-1") if values else None

    def get_all(self, name: str) -> list[str]:
        """
        Every value of C{name}, in order (none: an empty list).
        """
        values = self._headers.getRawHeaders(name.encode("latin-1")) or []
        return [value.decode("latin-1") for value in values]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._headers.hasHeader(name.encode("latin-1"))

    def items(self) -> list[tuple[str, str]]:
        """
        Every (name, value) pair.
        """
        return [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, values in self._headers.getAllRawHeaders()
            for value in values
        ]

    def set(self, name: str, value: str) -> None:
        """
        Replace every value of C{name} with C{value}.

        @raise ValueError: The name or value is invalid, or the gateway owns the header.
        """
        raw = self._writable(name)
        self._headers.setRawHeaders(raw, [check_header_value(value)])
        if self._written is not None:
            self._written.add(raw.lower())

    def add(self, name: str, value: str) -> None:
        """
        Add C{value} after the values C{name} has.

        @raise ValueError: As L{set}.
        """
        raw = self._writable(name)
        self._headers.addRawHeader(raw, check_header_value(value))
        if self._written is not None:
            self._written.add(raw.lower())

    def remove(self, name: str) -> None:
        """
        Remove every value of C{name}.

        @raise ValueError: The name is invalid, or the gateway owns the header.
        """
        self._headers.removeHeader(self._writable(name))

    def _writable(self, name: str) -> bytes:
        raw = check_header_name(name)
        lower = raw.lower()
        if lower in self._protected or lower.startswith(self._prefixes):
            raise ValueError(f"{name} is set by the gateway; a plugin cannot change it")
        return raw


class PluginRequest:
    """
    A request as a plugin sees it, after every gate (session, authentication,
    authorization, identity projection) has passed.
    """

    __slots__ = ("_exchange", "_protected", "headers")

    def __init__(self, exchange: Exchange, protected: Protected) -> None:
        self._exchange = exchange
        self._protected = protected
        written = exchange.plugin_headers
        if written is None:
            written = exchange.plugin_headers = set()
        self.headers = HeaderView(
            exchange.request.requestHeaders,
            protected.request,
            protected.request_prefixes,
            written,
        )

    @property
    def method(self) -> str:
        """The method, such as C{GET}."""
        return self._exchange.request.method.decode("ascii")

    @property
    def path(self) -> str:
        """
        The path as the terminal will use it, percent-escapes kept (the proxy forwards it
        after C{stripPrefix}). Setting it must give a clean path: C{/} first, no dot
        segments, empty segments or encoded slashes, dots or backslashes.
        """
        return self._exchange.request.uri.partition(b"?")[0].decode("latin-1")

    @path.setter
    def path(self, value: str) -> None:
        if (
            not isinstance(value, str)
            or _PATH.fullmatch(value) is None
            or vet_path(value, "reject") != value
            or clean_path(value) != value
        ):
            raise ValueError(f"{value!r} is not a clean request path")
        self._set_target(value.encode("ascii"), self.query.encode("ascii"))

    @property
    def query(self) -> str:
        """
        The query string without its C{?} (C{""} when there is none).
        """
        return self._exchange.request.uri.partition(b"?")[2].decode("latin-1")

    @query.setter
    def query(self, value: str) -> None:
        if not isinstance(value, str) or _QUERY.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not a valid query string")
        self._set_target(self.path.encode("latin-1"), value.encode("ascii"))

    def _set_target(self, path: bytes, query: bytes) -> None:
        request = self._exchange.request
        request.path = path
        request.uri = path + b"?" + query if query else path
        request.args = parse_qs(query, 1) if query else {}

    @property
    def body(self) -> IBodyProducer | None:
        """
        The request body as an C{IBodyProducer} the terminal will read (L{None} when
        there is none). Replace it with a producer that wraps it to watch or limit what
        reaches the backend.
        """
        body = self._exchange.body
        return body if body is not None and body.length != 0 else None

    @body.setter
    def body(self, value: IBodyProducer) -> None:
        if not IBodyProducer.providedBy(value):
            raise ValueError("a request body must provide IBodyProducer")
        self._exchange.body = value

    @property
    def route(self) -> str:
        """The route's pattern."""
        return self._exchange.route.pattern

    @property
    def route_type(self) -> str:
        """The route's type: C{"app"} or C{"service"}."""
        return self._exchange.route.type

    @property
    def route_name(self) -> str:
        """The Route's C{metadata.name}."""
        return self._exchange.route.name

    @property
    def labels(self) -> Mapping[str, str]:
        """The route's labels (read-only)."""
        return MappingProxyType(self._exchange.route.effective.spec.labels)

    @property
    def params(self) -> Mapping[str, str]:
        """The route's path wildcards, decoded (read-only: an api route's backend paths
        are built from them)."""
        return MappingProxyType(self._exchange.params)

    @property
    def principal(self) -> Principal | None:
        """The authenticated caller (subject, passport, groups), or L{None}."""
        return self._exchange.principal

    @property
    def request_id(self) -> str:
        """The request id (as in the access log and C{X-Request-Id})."""
        return self._exchange.request_id

    @property
    def client_address(self) -> str:
        """
        The client's IP address after C{trustedProxies} (L{client_after_proxies}): the
        peer's, or behind a trusted proxy the one it forwarded.
        """
        peer = str(getattr(self._exchange.request.getClientAddress(), "host", ""))
        trusted = self._protected.is_trusted
        if trusted is None or not trusted(peer):
            return peer
        return client_after_proxies(peer, self.headers.get_all("X-Forwarded-For"), trusted)

    @property
    def responded(self) -> bool:
        """Whether the response has started (or the client has gone)."""
        request = self._exchange.request
        return bool(request.startedWriting or request.finished or client_gone(request))

    def add_response_header(self, name: str, value: str) -> bool:
        """
        Add the field C{name: value} to the response this request gets, whatever answers
        it (the route, a later plugin's L{Reply}, the gateway's own error answer): written
        after the response's own fields, so a field of the same name from the backend is
        kept beside it, not replaced.

        @return: Whether it will be sent (not when the response has already started).
        @raise ValueError: C{name} or C{value} is not valid, or C{name} is a header the
            gateway frames the response with or sets itself.
        """
        raw = check_header_name(name)
        lower = raw.lower()
        if lower in self._protected.response or lower in _SINGLE_RESPONSE_FIELDS:
            raise ValueError(f"{name} is set by the gateway or the route; a plugin cannot add it")
        encoded = check_header_value(value)
        if self.responded:
            return False
        add_response_field(self._exchange.request.responseHeaders, raw, encoded)
        return True

    def respond(self, reply: Reply) -> bool:
        """
        Answer the request with C{reply} now, if its response has not started (for a
        plugin that decides later, such as on a body that grows too large).

        @return: Whether C{reply} was sent.
        @raise ValueError: C{reply} sets a header the gateway owns.
        """
        if self.responded:
            return False
        write_reply(self._exchange.request, reply, self._protected)
        return True


class PluginResponse:
    """
    A response as a response plugin sees it, on its way out.

    @ivar headers: The response headers (the gateway's fixed security headers are added
        as the head is written, and cannot be changed here).
    """

    __slots__ = ("_body", "_buffered", "_exchange", "_protected", "_request", "_view", "headers")

    def __init__(self, exchange: Exchange, protected: Protected, body: bytes | None) -> None:
        request = exchange.request
        self._exchange = exchange
        self._protected = protected
        self._request = request
        self._view: PluginRequest | None = None
        self.headers = HeaderView(request.responseHeaders, protected.response)
        self._body = body
        self._buffered = body is not None

    @property
    def request(self) -> PluginRequest:
        """
        The request it answers (read it; changing it now changes nothing).
        """
        view = self._view
        if view is None:
            view = self._view = PluginRequest(self._exchange, self._protected)
        return view

    @property
    def status(self) -> int:
        """The status code."""
        return int(self._request.code)

    @status.setter
    def status(self, value: int) -> None:
        current = self._request.code
        if value == current:
            return
        if current < 200:
            raise ValueError("an informational response (101 Switching Protocols) keeps its status")
        if not isinstance(value, int) or isinstance(value, bool) or not 200 <= value <= 599:
            raise ValueError(f"{value!r} is not a status a plugin can set (200-599)")
        self._request.setResponseCode(value)

    @property
    def body(self) -> bytes | None:
        """
        The whole body, when it was buffered (a plugin of the route wants the body, and
        the response has one: not a HEAD, 1xx, 204, 304 or event stream); else L{None}.
        Setting it replaces the body; the gateway sets C{Content-Length}.
        """
        return self._body

    @body.setter
    def body(self, value: bytes) -> None:
        if not self._buffered:
            raise ValueError("this response's body is not buffered: it cannot be replaced")
        if not isinstance(value, bytes):
            raise ValueError("a response body must be bytes")
        self._body = value


class Reply:
    """
    A plugin's own answer to a request: the terminal and the backend never see it.

    @ivar status: 200-599.
    @ivar body: The body (a C{str} is sent as UTF-8).
    @ivar headers: (name, value) pairs, checked as a plugin's header changes are.
    """

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes | str = b"",
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        content_type: str = TEXT_PLAIN.decode("ascii"),
    ) -> None:
        if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
            raise ValueError(f"{status!r} is not a status a reply can have (200-599)")
        self.status = status
        self.body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if status in _NO_BODY and self.body:
            raise ValueError(f"a {status} reply has no body")
        pairs: Iterable[tuple[str, str]] = (
            headers.items() if isinstance(headers, Mapping) else headers
        )
        checked: list[tuple[bytes, bytes]] = [(b"Content-Type", check_header_value(content_type))]
        for name, value in pairs:
            raw = check_header_name(name)
            if raw.lower() == b"content-type":
                checked[0] = (b"Content-Type", check_header_value(value))
            else:
                checked.append((raw, check_header_value(value)))
        self.headers = tuple(checked)


def write_reply(request: Request, reply: Reply, protected: Protected) -> None:
    """
    Answer C{request} with C{reply} and finish it.

    @raise ValueError: C{reply} sets a header in C{protected.response}; nothing is
        written then.
    """
    for name, _ in reply.headers:
        if name.lower() in protected.response:
            raise ValueError(f"{name.decode()} is set by the gateway; a reply cannot set it")
    request.setResponseCode(reply.status)
    headers = request.responseHeaders
    grouped: dict[bytes, list[bytes]] = {}
    for name, value in reply.headers:
        grouped.setdefault(name.lower(), []).append(value)
    for name, values in grouped.items():
        headers.setRawHeaders(name, values)
    if reply.status in _NO_BODY:
        headers.removeHeader(b"content-type")
    else:
        headers.setRawHeaders(b"content-length", [b"%d" % len(reply.body)])
        request.write(reply.body)
    request.finish()
