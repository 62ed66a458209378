"""
Writing response heads cheaply: the gateway's fixed headers are encoded once.

Every response carries the same security headers and C{Server}, and a C{Date} that
changes once a second. Setting them one by one through L{Headers} re-validates and
re-encodes each on every request; instead they are pre-encoded into one block of header
lines that the channel writes along with the status line and the response's own headers,
in a single transport write.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from twisted.web.http import datetimeToString
from twisted.web.http_headers import Headers

from edgegw.header_names import RAW_DICT_WRITABLE
from edgegw.server.fast_headers import GatewayHeaders


class ResponseHeaders(GatewayHeaders):
    """
    A response's headers, plus the pre-encoded block of fixed header lines that is
    written first.

    @ivar fixed: C{b"Name: value\\r\\n"} lines, already validated; set by the edge.
    """

    fixed = b""


def encode_fixed(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """
    Pre-encode header lines (names and values validated at configuration load).
    """
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers)


_date_second = -1
_date_line = b""


def date_line() -> bytes:
    """
    The C{Date} header line, formatted at most once per second.
    """
    global _date_second, _date_line
    now = time.time()
    second = int(now)
    if second != _date_second:
        _date_line = b"Date: " + datetimeToString(now) + b"\r\n"
        _date_second = second
    return _date_line


def serialize_head(version: bytes, code: bytes, reason: bytes, headers: Headers) -> bytes:
    """
    The whole response head as one bytes object.
    """
    parts = [version, b" ", code, b" ", reason, b"\r\n", date_line()]
    fixed = getattr(headers, "fixed", b"")
    if fixed:
        parts.append(fixed)
    # Twisted's dict itself rather than its generator over it (-0.2 µs a response).
    fields = headers._rawHeaders.items() if RAW_DICT_WRITABLE else headers.getAllRawHeaders()
    for name, values in fields:
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
