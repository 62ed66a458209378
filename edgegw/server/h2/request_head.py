"""
Reading an HTTP/2 request's header list the way the gateway reads an HTTP/1.1 head.

The C{h2} library's own validation differs between its versions (4.1 lets CR, LF and
NUL through in values) and makes every fault a connection error. The gateway validates
the decoded list itself, the same on every version, and refuses a malformed request
with a stream error (RFC 9113 section 8.1.1): the other streams of the connection go on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = [
    "CONNECTION_SPECIFIC",
    "MAX_CONTENT_LENGTH_DIGITS",
    "HeaderListTooLargeError",
    "MalformedRequestError",
    "RequestHead",
    "read_request_head",
]

CONNECTION_SPECIFIC: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
"""
Fields that describe one HTTP/1.1 connection: malformed in an HTTP/2 request (RFC 9113
section 8.2.2), never sent in an HTTP/2 response.
"""

MAX_CONTENT_LENGTH_DIGITS: Final = 15
"""As on HTTP/1.1 (L{edgegw.server.channel}): a length every backend reads exactly."""

_FIELD_NAME: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
_METHOD: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_VALUE: Final = re.compile(rb"[\x00\r\n]|\A[ \t]|[ \t]\Z")
_PSEUDO: Final = frozenset({b":method", b":scheme", b":path", b":authority"})
_SCHEMES: Final = frozenset({b"https", b"http"})
# What RFC 9113 section 4.3.1 counts per field in a header list's size.
_FIELD_OVERHEAD: Final = 32


class MalformedRequestError(Exception):
    """
    The header list is malformed (RFC 9113 section 8.1.1): a stream error.
    """


class HeaderListTooLargeError(Exception):
    """
    The header list is larger than the gateway reads: answered 431.
    """


class RequestHead:
    """
    A request's head as the gateway reads it.

    @ivar method: C{:method}.
    @ivar target: The request target: C{:path} (C{:authority} for C{CONNECT}).
    @ivar fields: The regular fields, in order, with C{host} from C{:authority} when
        the request had no C{Host}, and its C{cookie} crumbs joined into one field.
    @ivar content_length: The declared body length, or L{None}.
    """

    __slots__ = ("content_length", "fields", "method", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        fields: list[tuple[bytes, bytes]],
        content_length: int | None,
    ) -> None:
        self.method = method
        self.target = target
        self.fields = fields
        self.content_length = content_length


def read_request_head(
    fields: Iterable[tuple[bytes, bytes]], max_size: int, max_fields: int
) -> RequestHead:
    """
    Read a decoded request header list.

    @param max_size: The largest header list read, counted as RFC 9113 counts it (each
        field's name and value and 32).
    @param max_fields: The most fields read.
    @raise MalformedRequestError: It is malformed.
    @raise HeaderListTooLargeError: It is too large.
    """
    pseudo: dict[bytes, bytes] = {}
    regular: list[tuple[bytes, bytes]] = []
    cookies: list[bytes] = []
    host: bytes | None = None
    content_length: bytes | None = None
    size = 0
    count = 0
    for name, value in fields:
        count += 1
        if name == b"cookie":
            # Crumbs count as the one line they are joined into (as on HTTP/1.1): a
            # browser splits a large Cookie into many.
            size += len(value) + 2
        else:
            size += len(name) + len(value) + _FIELD_OVERHEAD
        if size > max_size or count > max_fields:
            raise HeaderListTooLargeError()
        if _BAD_VALUE.search(value) is not None:
            raise MalformedRequestError("a field value with CR, LF, NUL or edge whitespace")
        if name[:1] == b":":
            if regular or cookies or host is not None:
                raise MalformedRequestError("a pseudo-header after a regular field")
            if name not in _PSEUDO:
                raise MalformedRequestError(f"pseudo-header {name!r}")
            if name in pseudo:
                raise MalformedRequestError(f"{name!r} repeated")
            pseudo[name] = value
            continue
        if _FIELD_NAME.match(name) is None:
            raise MalformedRequestError(f"field name {name!r}")
        if name in CONNECTION_SPECIFIC:
            raise MalformedRequestError(f"connection-specific field {name!r}")
        if name == b"te":
            if value.lower() != b"trailers":
                raise MalformedRequestError("te other than trailers")
        elif name == b"cookie":
            cookies.append(value)
            continue
        elif name == b"host":
            if host is not None:
                raise MalformedRequestError("host repeated")
            host = value
        elif name == b"content-length":
            if content_length is not None and value != content_length:
                raise MalformedRequestError("content-length repeated with another value")
            if not value.isdigit() or len(value) > MAX_CONTENT_LENGTH_DIGITS:
                raise MalformedRequestError("content-length")
            if content_length is not None:
                continue
            content_length = value
        regular.append((name, value))
    method = pseudo.get(b":method")
    if not method:
        raise MalformedRequestError(":method missing")
    if _METHOD.match(method) is None:
        # A backend's request line would read it otherwise (a tab, a space).
        raise MalformedRequestError(":method not a token")
    authority = pseudo.get(b":authority")
    if method == b"CONNECT":
        if authority is None or b":scheme" in pseudo or b":path" in pseudo:
            raise MalformedRequestError("CONNECT with :scheme or :path, or without :authority")
        target = authority
    else:
        scheme = pseudo.get(b":scheme")
        path = pseudo.get(b":path")
        if scheme is None or path is None:
            raise MalformedRequestError(":scheme or :path missing")
        if scheme not in _SCHEMES:
            raise MalformedRequestError(f":scheme {scheme!r}")
        if path[:1] != b"/" and not (path == b"*" and method == b"OPTIONS"):
            raise MalformedRequestError(":path neither absolute nor * (OPTIONS)")
        target = path
    if authority is not None:
        if host is None:
            regular.append((b"host", authority))
        elif host.lower() != authority.lower():
            # Host names compare without case; the edge normalises the one it reads.
            raise MalformedRequestError("host and :authority differ")
    if cookies:
        # RFC 9113 section 8.2.3: crumbs are joined before an HTTP/1.1 hop or a reader.
        regular.append((b"cookie", b"; ".join(cookies)))
    return RequestHead(
        method, target, regular, None if content_length is None else int(content_length)
    )
