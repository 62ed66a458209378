"""
Writing HTTP/1.1 response heads cheaply: one bytes object per head.

The status line, a C{Date} line formatted once a second, the edge's pre-encoded fixed
header lines (L{edgegw.stream.response_headers.ResponseHeaders}) and the response's own fields
are joined once, and the channel writes them (with the body, for a whole small response)
in a single transport write.
"""

from __future__ import annotations

import time

from twisted.web.http import datetimeToString
from twisted.web.http_headers import Headers

from edgegw.seam import RAW_DICT_WRITABLE, raw_fields

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


def date_value() -> bytes:
    """
    The C{Date} field's value (HTTP/2 sends fields, not lines), formatted at most once
    per second.
    """
    return date_line()[6:-2]


def serialize_head(version: bytes, code: bytes, reason: bytes, headers: Headers) -> bytes:
    """
    The whole response head as one bytes object.
    """
    parts = [version, b" ", code, b" ", reason, b"\r\n", date_line()]
    fixed = getattr(headers, "fixed", b"")
    if fixed:
        parts.append(fixed)
    # Twisted's dict itself rather than its generator over it (-0.2 µs a response).
    fields = raw_fields(headers).items() if RAW_DICT_WRITABLE else headers.getAllRawHeaders()
    for name, values in fields:
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    for name, value in getattr(headers, "appended", ()):
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
