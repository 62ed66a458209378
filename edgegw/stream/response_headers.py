"""
A response's headers, with the gateway's fixed header lines encoded once.

Every response carries the same security headers and C{Server}. Setting them one by one
through L{Headers} re-validates and re-encodes each on every request; instead the edge
pre-encodes them into one block of header lines (L{encode_fixed}), which the server
writes along with the status line and the response's own headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.web.http_headers import Headers

from edgegw.seam import GatewayHeaders

__all__ = ["GatewayHeaders", "ResponseHeaders", "add_response_field", "encode_fixed"]


class ResponseHeaders(GatewayHeaders):
    """
    A response's headers, plus the pre-encoded block of fixed header lines that is
    written first.

    @ivar fixed: C{b"Name: value\\r\\n"} lines, already validated; set by the edge.
    @ivar appended: (name, value) fields, already validated, written after the
        response's own fields whatever answers the request (the terminal, a plugin's
        reply, an error answer): a request plugin's (L{add_response_field}).
    """

    fixed = b""
    appended: list[tuple[bytes, bytes]] | tuple[()] = ()


def add_response_field(headers: Headers, name: bytes, value: bytes) -> None:
    """
    Have C{name: value} (validated) written after the response's own fields: kept apart
    from them, so that a terminal relaying an upstream's fields of that name, or
    answering an error, neither replaces nor drops it.
    """
    if not isinstance(headers, ResponseHeaders):
        headers.addRawHeader(name, value)
    elif headers.appended:
        headers.appended.append((name, value))
    else:
        headers.appended = [(name, value)]


def encode_fixed(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """
    Pre-encode header lines (names and values validated at configuration load).
    """
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers)
