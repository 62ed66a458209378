"""
A whole HTTP/1.1 response read off a raw connection (the server closed it after), split
into status, headers and body.
"""

from __future__ import annotations

import attrs

__all__ = ["RawResponse", "dechunk", "parse_response"]


@attrs.frozen
class RawResponse:
    """
    One response as it came off the wire.

    @ivar status: The status code.
    @ivar headers: Header names (lower case) to their values, in order.
    @ivar body: The body: everything after the header block, de-chunked when it was
        sent chunked (a C{HEAD}'s never is).
    """

    status: int
    headers: dict[bytes, list[bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        """
        The single value of a header, or L{None}; fails if it is repeated.
        """
        values = self.headers.get(name.lower())
        if values is None:
            return None
        assert len(values) == 1, (name, values)
        return values[0]


def dechunk(data: bytes) -> bytes:
    """
    The body of a complete chunked transfer coding.
    """
    out: list[bytes] = []
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[:size])
        data = data[size + 2 :]


def parse_response(data: bytes, method: bytes = b"GET") -> RawResponse:
    """
    Split a complete HTTP/1.1 response to a C{method} request.
    """
    head, separator, body = data.partition(b"\r\n\r\n")
    assert separator, data[:300]
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if method != b"HEAD" and headers.get(b"transfer-encoding") == [b"chunked"]:
        body = dechunk(body)
    return RawResponse(status, headers, body)
