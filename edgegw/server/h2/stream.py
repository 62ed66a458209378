"""
One HTTP/2 stream as the request sees it: its channel, an L{IClientStream}.

The request writes its head and body here, as it would to the HTTP/1.1 channel; the
stream hands them to its L{H2ServerConnection<edgegw.server.h2.connection>}, which
frames them within the client's flow-control windows. A body that cannot be sent yet
waits here, and the request's producer (an upstream response, a file) is paused while
more than L{HIGH_WATER} bytes wait: a slow reader never makes the gateway hold a body
without bound. The request body's flow control is the stream's receive window: bytes
a paused consumer has not taken are not acknowledged, so the client stops sending.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IPullProducer,
    IPushProducer,
    ITransport,
)
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from edgegw.seam import client_gone
from edgegw.stream.boundary import IClientStream, UpgradeNotPossibleError

if TYPE_CHECKING:
    from edgegw.server.h2.connection import H2ServerConnection
    from edgegw.server.request import GatewayRequest

__all__ = ["HIGH_WATER", "LOW_WATER", "H2ClientStream"]

HIGH_WATER: Final = 64 * 1024
"""Response bytes waiting for the client's window beyond which the producer is paused."""

LOW_WATER: Final = 16 * 1024
"""Waiting bytes below which a paused producer is resumed."""


@implementer(IClientStream)
class H2ClientStream:
    """
    One stream of an HTTP/2 connection: the channel of its one request.

    @ivar stream_id: The stream's id.
    @ivar request: Its request.
    @ivar site: The site (Twisted's request reads C{channel.site}).
    @ivar pending: Response bytes waiting for the client's window.
    @ivar pending_bytes: How many.
    @ivar headers_sent: Whether the response head was sent.
    @ivar ended: Whether the response was ended (END_STREAM queued or sent).
    @ivar closed: Whether the stream is gone (reset, or the connection lost).
    @ivar body_complete: Whether the whole request body arrived.
    @ivar body_received: Request body bytes received (held ones included).
    @ivar unacknowledged: Flow-controlled bytes received and not yet acknowledged (held
        back while the body's consumer is paused).
    @ivar held: The last byte of a body of declared length, held until END_STREAM (an
        upstream never sees a complete request the client may yet make too long).
    @ivar dispatch_at_end: The method and target of a request declaring an empty body
        whose stream is still open: dispatched at END_STREAM, for the same reason.
    """

    protocolName = b"h2"
    persistent = False

    def __init__(self, connection: H2ServerConnection, stream_id: int, site: Any) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.site = site
        self.request: GatewayRequest | None = None
        self.pending: deque[bytes | memoryview] = deque()
        self.pending_bytes = 0
        self.end_after_pending = False
        self.headers_sent = False
        self.ended = False
        self.closed = False
        self.body_complete = True
        self.body_expected: int | None = None
        self.body_received = 0
        self.unacknowledged = 0
        self.held = b""
        self.dispatch_at_end: tuple[bytes, bytes] | None = None
        self.body_paused = False
        self._producer: Any = None
        self._producer_paused = False
        self._streaming = True
        self._pulling = False
        self._pull_again = False
        self.send_timer: IDelayedCall | None = None
        self.body_timer: IDelayedCall | None = None

    # What Twisted's request asks of its channel.

    @property
    def transport(self) -> H2ClientStream:
        """
        The stream itself (Twisted's request keeps C{channel.transport}): what a request
        does to its transport stays within its stream. (A property: an attribute would
        make every stream a reference cycle, freed only by the cycle collector.)
        """
        return self

    def getPeer(self) -> IAddress:
        """
        The client's address.
        """
        return self.connection.getPeer()

    def getHost(self) -> IAddress:
        """
        The address the client connected to.
        """
        return self.connection.getHost()

    def isSecure(self) -> bool:
        """
        Whether the connection is TLS (HTTP/2 is only offered over TLS).
        """
        return self.connection.isSecure()

    def writeHeaders(
        self, version: bytes, code: bytes, reason: bytes, headers: Headers, body: bytes = b""
    ) -> None:
        """
        Send the response head (C{:status} and the fields an HTTP/2 response may carry),
        and C{body} after it when given.
        """
        if self.closed or self.headers_sent:
            return
        self.headers_sent = True
        self.connection.send_head(self, code, headers)
        if body:
            self.write(body)

    def write(self, data: bytes) -> None:
        """
        Send response body bytes (as the client's windows allow).
        """
        if self.closed or self.ended or not data:
            return
        self.pending.append(data)
        self.pending_bytes += len(data)
        self.connection.send_pending(self, len(data))

    def writeSequence(self, data: list[bytes]) -> None:
        """
        Send several pieces of the response body.
        """
        self.write(b"".join(data))

    def requestDone(self, request: Any) -> None:
        """
        The response is complete: end the stream (after what still waits to be sent).
        If the request body has not all arrived, the client is told to stop sending it.
        """
        if self.closed or self.ended:
            return
        self.ended = True
        self.connection.end_stream(self)

    def writeWhole(
        self, request: Any, head: tuple[bytes, bytes, bytes, Headers], body: bytes
    ) -> None:
        """
        Send the head and the whole body, ending the stream with the body, and finish
        C{request}.
        """
        _version, code, _reason, headers = head
        if not self.closed and not self.headers_sent:
            self.headers_sent = True
            # One TLS record with the body that ends the stream.
            self.connection.send_head(self, code, headers, flush=False)
            if not self.closed:
                self.ended = True
                self.pending.append(body)
                self.pending_bytes += len(body)
                self.connection.end_stream(self, len(body))
        if not client_gone(request):
            # (Else the client reset the stream meanwhile: the request knows.)
            request.finish()

    def registerProducer(self, producer: IPushProducer | IPullProducer, streaming: bool) -> None:
        """
        Pause C{producer} (a push producer) while the response waits for the client's
        window; ask C{producer} (a pull producer) for more whenever little waits.
        """
        self._producer = producer
        self._producer_paused = False
        self._streaming = streaming
        if not streaming:
            self._pull()
        elif self.pending_bytes > HIGH_WATER or self.connection.output_full():
            self.pause_producer()
            self.connection.hold(self)

    def unregisterProducer(self) -> None:
        """
        Forget the producer.
        """
        self._producer = None
        self._producer_paused = False

    def loseConnection(self) -> None:
        """
        End this stream: the response as sent so far, if complete, else a reset (the
        other streams of the connection go on).
        """
        if not self.closed and not self.ended:
            self.abortClient()

    def abortConnection(self) -> None:
        """
        Reset this stream.
        """
        self.abortClient()

    # IClientStream

    def pauseBody(self) -> None:
        """
        Acknowledge no more of the request body: the client's window closes.
        """
        if not self.body_paused:
            self.body_paused = True
            self.connection.body_paused(self)

    def resumeBody(self) -> None:
        """
        Acknowledge what arrived meanwhile: the client sends again.
        """
        if self.body_paused:
            self.body_paused = False
            self.connection.body_resumed(self)

    def continueBody(self) -> None:
        """
        Tell a client waiting for C{100 Continue} to go ahead.
        """
        if not self.closed and not self.headers_sent:
            self.connection.send_continue(self)

    def clientGone(self, request: Any) -> bool:
        """
        Whether the stream is gone.
        """
        return self.closed

    def clientCloser(self) -> Callable[[], None] | None:
        """
        What resets this stream later.
        """
        return None if self.closed else self.abortClient

    def abortClient(self) -> None:
        """
        Reset the stream at once: a response that cannot be completed must look broken.
        """
        if not self.closed:
            self.connection.reset_stream(self)

    def closeAfterResponse(self) -> None:
        """
        Nothing to do: the stream ends with its response (a body still arriving is
        refused then), and the connection carries the other streams on.
        """

    def takeConnection(self, request: Any) -> tuple[ITransport, bytes]:
        """
        An HTTP/2 connection carries other streams: it cannot be handed over.

        @raise UpgradeNotPossibleError: Always.
        """
        raise UpgradeNotPossibleError("an HTTP/2 stream cannot hand its connection over")

    # Called by the connection.

    def data_received(self, data: bytes, flow_length: int) -> bool:
        """
        Pass request body bytes on; C{flow_length} more flow-controlled bytes await
        their acknowledgement (L{unacknowledged}). Whether the stream is still open
        (its consumer may reset it on the way).
        """
        self.unacknowledged += flow_length
        request = self.request
        if request is not None and data:
            request.handleContentChunk(data)
        return not self.closed

    def pause_producer(self) -> None:
        """
        Too much waits for the client's window: pause a push producer (a pull
        producer is simply not asked).
        """
        producer = self._producer
        if producer is not None and self._streaming and not self._producer_paused:
            self._producer_paused = True
            producer.pauseProducing()

    def resume_producer(self) -> None:
        """
        Little waits now: resume a paused push producer, or ask a pull producer for
        more.
        """
        producer = self._producer
        if producer is None:
            return
        if not self._streaming:
            self._pull()
        elif self._producer_paused:
            self._producer_paused = False
            producer.resumeProducing()

    def _pull(self) -> None:
        # A pull producer writes from its resumeProducing, which sends and may ask for
        # more at once: asked again from this loop, not from within itself.
        if self._pulling:
            self._pull_again = True
            return
        self._pulling = True
        try:
            while True:
                self._pull_again = False
                producer = self._producer
                if producer is None or self.closed or self.pending_bytes >= LOW_WATER:
                    return
                if self.connection.output_full():
                    # Asked again once the connection's output drains.
                    self.connection.hold(self)
                    return
                producer.resumeProducing()
                if not self._pull_again:
                    return
        finally:
            self._pulling = False

    def lost(self, why: str) -> None:
        """
        The stream is gone (reset by either side, or its connection lost): its
        request fails unless its response was complete.
        """
        if self.closed:
            return
        self.closed = True
        self._report_lost(why)

    def lost_later(self, why: str, reactor: Any) -> None:
        """
        As L{lost}, found while the request itself is writing (a send h2 refused): the
        stream stops now, its request hears of it at the reactor's next turn (Twisted's
        request drops its channel when told, under the write in progress).
        """
        if self.closed:
            return
        self.closed = True
        reactor.callLater(0, self._report_lost, why)

    def _report_lost(self, why: str) -> None:
        self.connection.output_dropped(self.pending_bytes)
        self.pending.clear()
        self.pending_bytes = 0
        for timer in (self.send_timer, self.body_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self.send_timer = self.body_timer = None
        producer = self._producer
        self._producer = None
        request = self.request
        self.request = None
        if request is not None and not request.finished:
            request.connectionLost(Failure(ConnectionLost(why)))
        elif producer is not None:
            producer.stopProducing()
