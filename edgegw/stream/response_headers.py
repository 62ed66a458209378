"""
A response's headers, with the gateway's fixed header lines encoded once.

Every response carries the same security headers and C{Server}. Setting them one by one
through L{Headers} re-validates and re-encodes each on every request; instead the edge
pre-encodes them into one block of header lines (L{encode_fixed}), which the server
writes along with the status line and the response's own headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgegw.seam import GatewayHeaders

__all__ = ["GatewayHeaders", "ResponseHeaders", "encode_fixed"]


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
