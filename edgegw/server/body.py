"""
A request body as it arrives from the client: streamed to one consumer at its pace.

L{RequestBody} is protocol-neutral: it asks its L{IClientStream} to pause and resume
reading (L{IClientStream.pauseBody}, L{IClientStream.resumeBody}) and to let a client
waiting for C{100 Continue} go ahead (L{IClientStream.continueBody}, through its
request).
"""

from __future__ import annotations

from typing import Final, Protocol

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IConsumer
from twisted.python.failure import Failure
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from edgegw.stream.boundary import IClientStream

BUFFER_LIMIT: Final = 64 * 1024
"""
Body bytes held for a consumer that has not attached yet before reading from the client
stops. What was already read from the socket is still kept, so the buffer can exceed
this by one read (64 KiB on Twisted's TCP transports); so can a paused consumer's.
"""

DISCARD_LIMIT: Final = 1024 * 1024
"""
Body bytes the gateway reads and throws away, per request, to keep a connection usable
after a response that did not need the body. Beyond it the connection is closed.
"""


class BodyOwner(Protocol):
    """
    What a body tells the request it belongs to.
    """

    def bodyDemanded(self) -> None:
        """
        The body's consumer has started.
        """

    def discardLimitReached(self) -> None:
        """
        More than L{DISCARD_LIMIT} bytes of an abandoned body have been thrown away.
        """


class BodyDiscardedError(Exception):
    """
    The response was finished before the request body had all arrived: the rest of the
    body is thrown away and never reaches a consumer.
    """


@implementer(IBodyProducer)
class RequestBody:
    """
    The body of one request, as it arrives from the client.

    Bytes received before a consumer attaches are kept (up to about L{BUFFER_LIMIT};
    then reading from the client pauses) and are written to the consumer first. While a
    consumer is attached its C{pauseProducing}/C{resumeProducing} pause and resume
    reading from the client.

    @ivar length: The body's length from C{Content-Length}, or L{UNKNOWN_LENGTH} for a
        chunked body.
    @ivar complete: Whether the whole body has been received.
    @ivar received: Body bytes received from the client so far.
    """

    length: int | str
    complete: bool
    received: int

    def __init__(
        self,
        length: int | None,
        request: BodyOwner | None = None,
        stream: IClientStream | None = None,
    ) -> None:
        """
        @param length: The declared length, or L{None} for a chunked body.
        @param request: The request this is the body of.
        @param stream: The stream it arrives on.
        """
        self.length = UNKNOWN_LENGTH if length is None else length
        self.complete = length == 0
        self.received = 0
        self._request = request
        self._stream = stream
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._consumer: IConsumer | None = None
        self._done: Deferred[None] | None = None
        self._started = False
        self._paused = False
        self._discarding = False
        self._discarded = 0
        self._overLimit = False
        self._lost: Failure | None = None

    @property
    def buffered(self) -> int:
        """
        Bytes received and held for the consumer, not yet written to it.
        """
        return self._buffered

    # IBodyProducer

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        """
        Write every body byte received so far, and then each as it arrives, to
        C{consumer}.

        If the client sent C{Expect: 100-continue} and nothing of the body has arrived
        yet, this is when it is told to go ahead (C{100 Continue}).

        @return: Fires with L{None} once the whole body has been written; fails with the
            reason if the client disconnects before that, with L{BodyDiscardedError} if the
            response was finished first; never fires after L{stopProducing}.
            Cancelling it stops producing, like L{stopProducing}.
        @raise RuntimeError: A consumer was already given.
        """
        if self._started:
            raise RuntimeError("a request body can be produced only once")
        self._started = True
        if self._lost is not None:
            return fail(self._lost)
        if self._discarding:
            return fail(BodyDiscardedError())
        self._consumer = consumer
        done: Deferred[None] = Deferred(self._cancel)
        self._done = done
        if self._request is not None and not self.complete:
            self._request.bodyDemanded()
        self._flush()
        return done

    def pauseProducing(self) -> None:
        """
        Write nothing more to the consumer, and stop reading from the client, until
        L{resumeProducing} (also before L{startProducing}: a consumer may register us
        with a transport of its own first).
        """
        self._paused = True
        self._updateReading()

    def resumeProducing(self) -> None:
        """
        Write what arrived meanwhile, and read from the client again.
        """
        self._paused = False
        if self._consumer is None:
            self._updateReading()
        else:
            self._flush()

    def stopProducing(self) -> None:
        """
        The consumer wants no more: the rest of the body is read from the client and
        thrown away (so that the connection can carry the next request), and the
        L{Deferred} from L{startProducing} never fires.
        """
        self._started = True
        self._consumer = None
        self._done = None
        self._discard()

    @property
    def overLimit(self) -> bool:
        """
        Whether more than L{DISCARD_LIMIT} bytes of it were thrown away.
        """
        return self._overLimit

    @property
    def consuming(self) -> bool:
        """
        Whether a consumer is attached.
        """
        return self._consumer is not None

    # Called by the request.

    def dataArrived(self, data: bytes) -> None:
        """
        Body bytes have arrived from the client.
        """
        self.received += len(data)
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_LIMIT and not self._overLimit:
                self._overLimit = True
                if self._request is not None:
                    self._request.discardLimitReached()
            return
        consumer = self._consumer
        if consumer is not None and not self._paused and not self._buffer:
            consumer.write(data)
            return
        self._buffer.append(data)
        self._buffered += len(data)
        if consumer is None:
            self._updateReading()

    def allArrived(self) -> None:
        """
        The last body byte has arrived.
        """
        self.complete = True
        self._flush()

    def abandon(self) -> None:
        """
        The response is finished but the body is not: discard the rest.
        """
        done = self._done
        self._consumer = None
        self._done = None
        self._discard()
        if done is not None:
            done.errback(BodyDiscardedError())

    def clientLost(self, reason: Failure) -> None:
        """
        The client went away before the whole body arrived: the consumer's
        L{Deferred} fails with C{reason}.
        """
        if self.complete or self._lost is not None:
            return
        self._lost = reason
        self._buffer = []
        self._buffered = 0
        done = self._done
        self._consumer = None
        self._done = None
        if done is not None:
            done.errback(reason)

    # Internals.

    def _flush(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        if self._buffer:
            if self._paused:
                return
            data = b"".join(self._buffer)
            self._buffer = []
            self._buffered = 0
            # May pause, or stop, us synchronously.
            consumer.write(data)
            if self._consumer is None:
                return
        if self.complete:
            done = self._done
            self._consumer = None
            self._done = None
            if done is not None:
                done.callback(None)
        else:
            self._updateReading()

    def _updateReading(self) -> None:
        stream = self._stream
        if stream is None or self.complete or self._discarding or self._lost is not None:
            return
        if self._paused or (self._consumer is None and self._buffered >= BUFFER_LIMIT):
            stream.pauseBody()
        else:
            stream.resumeBody()

    def _discard(self) -> None:
        if self._discarding:
            return
        self._discarding = True
        self._paused = False
        self._buffer = []
        self._buffered = 0
        stream = self._stream
        if stream is not None and not self.complete and self._lost is None:
            stream.resumeBody()

    def _cancel(self, done: Deferred[None]) -> None:
        self._consumer = None
        self._done = None
        self._discard()


@implementer(IBodyProducer)
class _EmptyBody(RequestBody):
    """
    The body of every request that has none: complete, and stateless so that one
    instance serves them all.
    """

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


EMPTY_BODY: Final[RequestBody] = _EmptyBody(0)
"""
The C{body} of a request without one (shared: it holds no state).
"""
