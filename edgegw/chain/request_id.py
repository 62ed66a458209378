"""
The request-id stage: keep a sane inbound X-Request-Id or make one; echo it.
"""

from __future__ import annotations

import os
import re

from edgegw.terminal.exchange import Exchange, Handler

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID_LENGTH = 128
_SANE = re.compile(rb"[\x21-\x7e]{1,%d}\Z" % MAX_REQUEST_ID_LENGTH)


_BATCH = 16 * 256
"""Random bytes read from the kernel at a time: 256 request ids."""


class _RandomIds:
    """
    128-bit random ids from the kernel's random source, read in batches: an id costs
    0.14 µs instead of 0.54 µs with a C{getrandom} system call each (microbenchmark).
    """

    def __init__(self) -> None:
        self._bytes = b""
        self._offset = _BATCH
        # A forked child must not hand out the ids its parent already holds.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._bytes = b""
        self._offset = _BATCH

    def next(self) -> str:
        offset = self._offset
        if offset >= _BATCH:
            self._bytes = os.urandom(_BATCH)
            offset = 0
        self._offset = offset + 16
        return self._bytes[offset : offset + 16].hex()


new_request_id = _RandomIds().next
"""A fresh 128-bit random id, as 32 hex digits."""


def sane_request_id(value: bytes | None) -> str | None:
    """
    C{value} as a request id if it is printable ASCII without spaces and at most
    L{MAX_REQUEST_ID_LENGTH} bytes, else L{None}.
    """
    if value is not None and _SANE.match(value):
        return value.decode("ascii")
    return None


async def request_id(exchange: Exchange, next: Handler) -> None:
    """
    Set C{exchange.request_id} and the X-Request-Id response header, then continue.

    A client-supplied id is kept when sane so that a caller can follow its request through
    the logs; anything else (too long, control characters, spaces) is replaced rather than
    logged, so it cannot forge log lines.
    """
    request = exchange.request
    headers = request.requestHeaders.getRawHeaders(REQUEST_ID_HEADER)
    found = sane_request_id(headers[0]) if headers and len(headers) == 1 else None
    if found is None:
        found = new_request_id()
        request.requestHeaders.setRawHeaders(REQUEST_ID_HEADER, [found.encode("ascii")])
    exchange.request_id = found
    request.responseHeaders.setRawHeaders(REQUEST_ID_HEADER, [found.encode("ascii")])
    await next(exchange)
