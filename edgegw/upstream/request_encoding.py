"""
A request put into bytes for an upstream: its head (L{encode_request}) and its body's
framing (L{RequestBodyWriter}: chunked, or counted against the declared length).

L{RequestBodyWriter} is the consumer side of an
L{edgegw.upstream.http11.UpstreamConnection}'s upload: it writes only while the connection
still sends its producer (C{body_producer}), and fails the exchange (C{fail_exchange}) on a
body longer than declared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet.interfaces import IConsumer, IProducer
from twisted.python.failure import Failure
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

if TYPE_CHECKING:
    from edgegw.upstream.http11 import UpstreamConnection, UpstreamTransport

__all__ = ["RequestBodyError", "RequestBodyWriter", "encode_request"]

_FIELD_FORMAT: Callable[[tuple[bytes, bytes]], bytes] = b"%s: %s\r\n".__mod__


class RequestBodyError(Exception):
    """
    The request body producer wrote a different number of bytes than its C{length}.
    """


def encode_request(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: IBodyProducer | None,
) -> tuple[bytes, int | None]:
    """
    The request line and header section, with the body's framing field added.

    @return: The bytes, and the body's length (L{None} when it is chunked or absent).

    @raise ValueError: A CR or LF inside the request line or a header field, or a
        space inside the method or the target; or a body length that is neither an
        integer nor C{UNKNOWN_LENGTH}.
    """
    lines = [b"%s %s HTTP/1.1\r\n" % (method, target)]
    lines += map(_FIELD_FORMAT, headers)
    length: int | None = None
    if body is not None:
        declared = body.length
        if declared is UNKNOWN_LENGTH:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        elif isinstance(declared, int) and declared >= 0:
            length = declared
            lines.append(b"Content-Length: %d\r\n" % length)
        else:
            raise ValueError(f"invalid request body length {declared!r}")
    lines.append(b"\r\n")
    head = b"".join(lines)
    count = len(lines)
    # Every line ends in exactly one CRLF: no CR or LF smuggled inside a value, and no
    # space inside the method or the target.
    if head.count(b"\n") != count or head.count(b"\r") != count or lines[0].count(b" ") != 2:
        raise ValueError("CR, LF or space inside the request line or a header field")
    return head, length


@implementer(IConsumer)
class RequestBodyWriter:
    """
    The consumer a request body producer writes to: frames each piece (chunked), or
    counts it against the declared length.

    @ivar chunked: The body has no declared length, and goes chunked.
    @ivar remaining: How many bytes the declared length still expects.
    """

    __slots__ = ("_connection", "_producer", "_transport", "chunked", "remaining")

    def __init__(
        self,
        connection: UpstreamConnection,
        producer: IBodyProducer,
        transport: UpstreamTransport,
        length: int | None,
    ) -> None:
        self._connection = connection
        self._producer = producer
        self._transport = transport
        self.chunked = length is None
        self.remaining = 0 if length is None else length

    def write(self, data: bytes) -> None:
        """
        Send C{data} upstream (dropped once the exchange no longer wants the body).
        """
        if self._connection.body_producer is not self._producer:
            return
        if self.chunked:
            if data:
                self._transport.writeSequence((b"%x\r\n" % len(data), data, b"\r\n"))
            return
        self.remaining -= len(data)
        if self.remaining < 0:
            self._connection.fail_exchange(
                Failure(RequestBodyError("request body longer than its declared length"))
            )
            return
        self._transport.write(data)

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        """
        Nothing to do: the body producer is already the transport's producer, paused
        when the socket's send buffer is full.
        """

    def unregisterProducer(self) -> None:
        """
        Nothing to do (see L{registerProducer}).
        """
