"""
What an upstream answered: L{UpstreamResponse}, a response head and the handle on its
body; the L{BodySink} the body is written to; the errors a response that breaks the
protocol fails with.

L{UpstreamResponse} is the handle on an L{edgegw.upstream.http11.UpstreamConnection}'s
exchange: it drives the connection's body (C{deliver_body}, C{pause_body},
C{resume_body}, C{fail_exchange}, C{detach}) until the connection lets go of it
(C{connection} set to L{None}) once the exchange is over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionAborted
from twisted.internet.interfaces import IProtocol, ITransport
from twisted.python.failure import Failure

if TYPE_CHECKING:
    from edgegw.upstream.http11 import UpstreamConnection

__all__ = ["BodySink", "ResponseTruncatedError", "UpstreamProtocolError", "UpstreamResponse"]


class UpstreamProtocolError(Exception):
    """
    The upstream's bytes are not an HTTP/1.1 response we accept: a bad status line or
    field line, a head over the limits, ambiguous or unsupported framing, bad chunking.
    """


class ResponseTruncatedError(UpstreamProtocolError):
    """
    The connection ended before the response body was complete.
    """


class BodySink(Protocol):
    """
    Where L{UpstreamResponse.deliver} writes the response body.
    """

    def write(self, data: bytes) -> None:
        """
        Receive the next piece of the body, as it arrived.
        """


class UpstreamResponse:
    """
    A response head from an upstream, and the handle on its body.

    @ivar version: C{b"HTTP/1.1"} or C{b"HTTP/1.0"}.
    @ivar code: The status code.
    @ivar phrase: The reason phrase (may be empty).
    @ivar headers: The header fields in wire order, names as received, repeated fields
        kept; C{Content-Length}, C{Transfer-Encoding} and C{Connection} included.
    @ivar length: The declared C{Content-Length} (for C{HEAD} and 304 too), or L{None}
        when none was declared (chunked and close-delimited bodies, most bodiless ones).
    @ivar has_body: Whether a body follows: L{False} for C{HEAD} requests, 1xx, 204,
        304 and C{Content-Length: 0}.
    @ivar body: The whole body when it was read with the head (a C{Content-Length} body
        that arrived in the same read), else L{None}: the exchange is already over, the
        connection back in the pool, and L{deliver} writes it at once (and drops it). An
        L{abort} before or during that write fails the delivery, as for a body still
        arriving, but the connection stays pooled.
    @ivar connection: The connection still carrying this exchange, which the methods
        above drive; L{None} once the exchange is over (or the connection detached).
        The connection's to set, not the caller's.
    """

    __slots__ = (
        "_aborted",
        "_delivered",
        "body",
        "code",
        "connection",
        "has_body",
        "headers",
        "length",
        "phrase",
        "version",
    )

    def __init__(
        self,
        connection: UpstreamConnection | None,
        version: bytes,
        code: int,
        phrase: bytes,
        headers: list[tuple[bytes, bytes]],
        length: int | None,
        has_body: bool,
    ) -> None:
        self.connection = connection
        self._delivered = False
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = length
        self.has_body = has_body
        self.body: bytes | None = None
        self._aborted = False

    def __repr__(self) -> str:
        return f"<UpstreamResponse {self.code} {self.phrase!r} length={self.length}>"

    def deliver(self, sink: BodySink) -> Deferred[None]:
        """
        Stream the body into C{sink}: C{sink.write} is called with each piece as it
        arrives. Call at most once.

        @return: Fires when the body is complete (a reusable connection is back in the
            pool by then); fails with L{ResponseTruncatedError} or L{UpstreamProtocolError}
            when the upstream breaks mid-body, with an exception C{sink.write} raised,
            or with L{ConnectionAborted} after L{abort}. Cancelling it aborts the
            connection. Fires at once when there is no body.
        """
        if self._delivered:
            raise RuntimeError("deliver() was already called for this response")
        self._delivered = True
        body = self.body
        if body is not None:
            # As a body still arriving would: an abort before or during the write fails
            # the delivery (the connection, whose exchange is over, stays pooled).
            if not self._aborted:
                try:
                    sink.write(body)
                except Exception:
                    return fail()
            self.body = None
            if self._aborted:
                return fail(ConnectionAborted("response aborted"))
            return succeed(None)
        connection = self.connection
        if connection is None or not self.has_body:
            return succeed(None)
        return connection.deliver_body(sink)

    def pause(self) -> None:
        """
        Stop reading from the upstream until L{resume}: no more C{sink.write} calls.
        """
        connection = self.connection
        if connection is not None:
            connection.pause_body()

    def resume(self) -> None:
        """
        Undo L{pause}: anything read meanwhile is written to the sink first.
        """
        connection = self.connection
        if connection is not None:
            connection.resume_body()

    def abort(self) -> None:
        """
        Drop the connection now (the client went away); it is never reused. Does nothing
        once the body is complete. For a body read with the head (L{body}), the
        connection is already back in the pool: the delivery fails instead.
        """
        connection = self.connection
        if connection is not None:
            connection.fail_exchange(Failure(ConnectionAborted("response aborted")))
        elif self.body is not None:
            # Read with the head and not yet delivered.
            self._aborted = True

    def detach(self, protocol: IProtocol) -> ITransport:
        """
        Hand the connection of a 101 response to C{protocol}: C{protocol.makeConnection}
        is called with the transport, then C{protocol.dataReceived} with any bytes that
        followed the response head, and from then on the connection's bytes and its end
        go to C{protocol} alone.

        @raise RuntimeError: This is not a 101 response to an upgrade request, or it was
            already detached (or aborted).
        """
        connection = self.connection
        if self.code != 101 or connection is None:
            raise RuntimeError("only the 101 response to an upgrade request can be detached")
        self.connection = None
        return connection.detach(protocol)
