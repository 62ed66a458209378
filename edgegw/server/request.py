"""
Streaming request bodies: the gateway's Site request and channel classes.

Uses private Twisted names (C{_cleanup}, C{_respondToBadRequestAndDisconnect},
C{_networkProducer}, ...): each one, why, and what breaks if Twisted changes it is listed
in docs/architecture.md, "Twisted private names we rely on".

Twisted's L{twisted.web.server.Request} collects the whole request body in
C{request.content} and renders only once the last byte has arrived. A reverse proxy
must instead start on a request as soon as its head is in, and pass the body on as it
arrives, at the pace of whoever consumes it. With L{GatewayRequest} and
L{GatewayChannel}:

  - A request without a body (no C{Content-Length}, or C{Content-Length: 0}, and not
    chunked) takes Twisted's path unchanged; its C{body} is L{EMPTY_BODY}.
  - A request with a body is rendered as soon as its head is parsed. Its C{body} is a
    L{RequestBody}, an L{IBodyProducer} that hands the bytes to one consumer and reads
    from the client only as fast as that consumer takes them. C{request.content} is an
    empty file: it never accumulates the body. C{Expect: 100-continue} is answered
    when the consumer starts, not when the head arrives (as a proxy should: a request
    refused outright never has its body sent).
  - A response finished before the whole body has arrived goes out at once. Then, if
    at most L{DISCARD_LIMIT} bytes of the body remain (or, for a chunked body, until
    that many have been read), the rest is read and thrown away and only then is the
    request done with: C{notifyFinish} fires, the next request on the connection is
    read. Otherwise the connection closes after the response (announced with
    C{Connection: close} when the response head has not been sent yet).
  - Timers are per connection, never per byte: between requests the idle timeout
    (the site's); from the first byte of a request head, a fixed deadline for the whole
    head (C{headerTimeout}: a client trickling one byte at a time is cut at it, with a
    408); while a body is read, the longest gap between two reads (C{bodyTimeout});
    none while a request is being answered or its body is held for a slow consumer.
  - Over-long request lines get a 414, over-long header lines and header sections a
    431, where Twisted closes silently or answers 400; folded header lines (obs-fold)
    get a 400 where Twisted unfolds them. Twisted's other 400s are kept.
  - Framing Twisted would read differently from a backend is refused with 400 and the
    connection closed, before anything is dispatched: a C{Content-Length} of more than
    L{MAX_CONTENT_LENGTH_DIGITS} digits, and any C{Transfer-Encoding} other than exactly
    one C{chunked} on an HTTP/1.1 request. C{Connection} is read as a comma-separated
    token list (Twisted splits it on spaces).

Use both classes together: C{Site(resource, requestFactory=GatewayRequest)} with
C{site.protocol = GatewayChannel}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from io import BytesIO
from typing import Any, Final, Protocol, cast
from urllib.parse import unquote_to_bytes as unquote

from twisted.internet.abstract import FileDescriptor
from twisted.internet.base import DelayedCall
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionLost
from twisted.internet.error import TimeoutError as ConnectionTimedOut
from twisted.internet.interfaces import IAddress, IConsumer, IDelayedCall, IPushProducer
from twisted.internet.protocol import connectionDone
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, HTTPChannel, parse_qs
from twisted.web.http import Request as HTTPRequest
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer, INonQueuedRequestFactory
from twisted.web.server import Request
from zope.interface import implementer

from edgegw.chain.response_filter import IResponseFilter
from edgegw.server.fast_headers import GatewayHeaders
from edgegw.server.head import parse_simple_head
from edgegw.server.response_head import ResponseHeaders, serialize_head

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

LINGER_SECONDS: Final = 2.0
"""
How long a connection closed with part of a request body unread keeps reading (and
dropping) what the client still sends after the response, before closing for good.
"""

MAX_CONTENT_LENGTH_DIGITS: Final = 15
"""
The most digits a request's C{Content-Length} may have (leading zeros included): up to
10^15 - 1 bytes (about 888 TiB), a value every integer type a backend may parse it into
(64-bit, signed or not, and IEEE doubles such as JavaScript's numbers) holds exactly.
A longer one is refused with 400, so that no backend can read a wrapped-around length.
"""

_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_LINE_RECEIVED: Final = HTTPChannel.lineReceived
_FOLD_START: Final = (b" ", b"\t")
_CONTENT_LENGTH: Final = b"content-length:"
_CONTENT_LENGTH_START: Final = (b"C", b"c")
# A header line no longer than this cannot hold a Content-Length with too many digits.
_CONTENT_LENGTH_LONGEST: Final = len(_CONTENT_LENGTH) + MAX_CONTENT_LENGTH_DIGITS
_BAD_REQUEST: Final = b"400 Bad Request"
_REQUEST_TIMEOUT: Final = b"408 Request Timeout"

# Where a connection is, for its timer: waiting for a request (the idle timeout), reading
# a request head (its deadline), reading a body (the gap between reads), answering (none).
_AWAITING: Final = 0
_HEAD: Final = 1
_BODY: Final = 2
_ANSWERING: Final = 3


class BodyDiscardedError(Exception):
    """
    The response was finished before the request body had all arrived: the rest of the
    body is thrown away and never reaches a consumer.
    """


class _Transport(Protocol):
    """
    What the channel's network producer is: a transport, which both produces (reads)
    and consumes (has the channel registered as its producer).
    """

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None: ...

    def registerProducer(self, producer: object, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...


@implementer(IPushProducer)
class _ReadGate:
    """
    Stands in for the transport as the channel's network producer, so that Twisted's own
    pausing (a client that sends while its previous response is pending, a full send
    buffer) and the request body's flow control can both hold reading without one
    resuming what the other paused: the transport reads only while neither holds it.

    @ivar bodyHeld: Whether the request body holds reading.
    """

    __slots__ = ("_channelHeld", "_registered", "_transport", "bodyHeld")

    def __init__(self, transport: _Transport, channelHeld: bool) -> None:
        """
        @param transport: The network producer replaced.
        @param channelHeld: Whether the channel may have paused it.
        """
        self._transport = transport
        self._channelHeld = channelHeld
        self._registered = True
        self.bodyHeld = False

    def pauseProducing(self) -> None:
        self._channelHeld = True
        self._transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._channelHeld = False
        if not self.bodyHeld:
            self._transport.resumeProducing()

    def stopProducing(self) -> None:
        self._transport.stopProducing()

    def registerProducer(self, producer: object, streaming: bool) -> None:
        self._registered = True
        self._transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        if self._registered:
            self._registered = False
            self._transport.unregisterProducer()

    def holdForBody(self) -> None:
        self.bodyHeld = True
        self._transport.pauseProducing()

    def releaseForBody(self) -> None:
        self.bodyHeld = False
        if not self._channelHeld:
            self._transport.resumeProducing()

    def releaseAll(self) -> None:
        """
        Unhook the channel from the transport and read, whatever held reading.
        """
        self.unregisterProducer()
        self.bodyHeld = self._channelHeld = False
        self._transport.resumeProducing()


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
        request: GatewayRequest | None = None,
        channel: GatewayChannel | None = None,
    ) -> None:
        """
        @param length: The declared length, or L{None} for a chunked body.
        @param request: The request this is the body of.
        @param channel: The channel it arrives on.
        """
        self.length = UNKNOWN_LENGTH if length is None else length
        self.complete = length == 0
        self.received = 0
        self._request = request
        self._channel = channel
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
            self._request._bodyDemanded()
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

    # Called by the request and the channel.

    def _dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_LIMIT and not self._overLimit:
                self._overLimit = True
                if self._request is not None:
                    self._request._discardLimitReached()
            return
        consumer = self._consumer
        if consumer is not None and not self._paused and not self._buffer:
            consumer.write(data)
            return
        self._buffer.append(data)
        self._buffered += len(data)
        if consumer is None:
            self._updateReading()

    def _finish(self) -> None:
        """
        The last body byte has arrived.
        """
        self.complete = True
        self._flush()

    def _abandon(self) -> None:
        """
        The response is finished but the body is not: discard the rest.
        """
        done = self._done
        self._consumer = None
        self._done = None
        self._discard()
        if done is not None:
            done.errback(BodyDiscardedError())

    def _connectionLost(self, reason: Failure) -> None:
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
        channel = self._channel
        if channel is None or self.complete or self._discarding or self._lost is not None:
            return
        if self._paused or (self._consumer is None and self._buffered >= BUFFER_LIMIT):
            channel._holdReading()
        else:
            channel._releaseReading()

    def _discard(self) -> None:
        if self._discarding:
            return
        self._discarding = True
        self._paused = False
        self._buffer = []
        self._buffered = 0
        channel = self._channel
        if channel is not None and not self.complete and self._lost is None:
            channel._releaseReading()

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


class GatewayRequest(Request):
    """
    A request rendered as soon as its head is in, its body streaming in C{body}.

    Requests without a body are handled exactly as by L{Request}. For one with a body,
    C{method}, C{uri}, C{path}, C{args} (from the query only: a form body is not parsed),
    C{clientproto}, C{prepath} and C{postpath} are set as Twisted sets them, and the
    resource renders, before the body arrives; C{content} stays an empty file.

    If the response is finished before the body is complete, a consumer still attached
    to the body gets L{BodyDiscardedError}, and C{notifyFinish} fires once the rest of
    the body has been read and dropped (or the connection has closed: the response was
    whole, so it fires with L{None} then too). If the client disconnects before the
    response is finished, the body and C{notifyFinish} fail with the reason, as in
    Twisted; so they do, at once, if the body's chunked framing turns out malformed.

    While a L{response_filter<IResponseFilter>} is installed (the response-plugin
    stage), the output calls go to it instead (L{edgegw.chain.response_filter}).

    @ivar body: The request body.
    @ivar response_filter: Receives the output calls while set.
    """

    body: RequestBody = EMPTY_BODY
    response_filter: IResponseFilter | None = None
    _dispatched = False
    _cleanupPending = False
    _expectContinue = False

    def __init__(self, channel: HTTPChannel, queued: object = None) -> None:
        super().__init__(channel, queued)
        self.requestHeaders = GatewayHeaders()
        self.responseHeaders = ResponseHeaders()

    def process(self) -> None:
        """
        Find the resource and render it, as L{Request.process} does, except that no
        C{Server} or C{Date} header is set per request: the channel writes the gateway's
        fixed headers and a date formatted once a second with the head.
        """
        self.site = self.channel.site  # type: ignore[attr-defined]
        self.prepath = []
        self.postpath = list(map(unquote, self.path[1:].split(b"/")))
        try:
            self.render(self.site.getResourceFor(self))
        except BaseException:
            self.processingFailed(Failure())

    def write(self, data: bytes) -> None:
        """
        Write C{data} to the client, or hand it to the response filter.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.write(self, data)
        else:
            response_filter.write(data)

    def write_whole(self, body: bytes) -> None:
        """
        Write C{body} as the whole response body and finish: as C{write(body)} then
        C{finish()}, with the head and the body in one transport write when nothing
        else has to happen on the way (-1.5 µs a small proxied response), sent at once,
        before C{finish()}, on the daemon's reactor (L{edgegw.reactor}, C{flushWriter})
        unless the connection closes after it or pipelined requests were read behind
        it.

        That is when no response filter takes the body, nothing was written yet, the
        response has a C{Content-Length} field and a body (not C{HEAD}, 204 or 304),
        Twisted would add no field of its own (no default C{Content-Type},
        C{Last-Modified}, C{ETag} or cookies to set) and would not change the body (no
        encoder, no HEAD answered by rendering a GET).
        """
        channel = self.channel
        if (
            self.response_filter is not None
            or self.startedWriting
            or self.finished
            or self._disconnected
            or self.method == b"HEAD"
            or self.code in NO_BODY_CODES
            or self.defaultContentType is not None
            or self.lastModified is not None
            or self.etag is not None
            or self.cookies
            or self._inFakeHead
            or self._encoder is not None
            or not isinstance(channel, GatewayChannel)
            # As Twisted decides whether to frame the body itself (an empty list of
            # values would have it chunk the body).
            or not self.responseHeaders.getRawHeaders(b"content-length")
        ):
            self.write(body)
            self.finish()
            return
        # What HTTPRequest.write does on its first call, for a response it would send
        # with its Content-Length (never chunked).
        self.startedWriting = 1
        channel.writeHeaders(
            self.clientproto, b"%d" % self.code, self.code_message, self.responseHeaders, body
        )
        self.sentLength += len(body)
        transport = channel.transport
        reactor: Any = getattr(transport, "reactor", None)
        flush = getattr(reactor, "flushWriter", None)
        if flush is None:
            self.finish()
            return
        if (
            channel.persistent
            # Nothing pipelined read behind it: otherwise their responses, or their
            # upstream requests, go with it at the end of the iteration. (Twisted leaves
            # an empty b"" there after each request body.)
            and not any(channel._dataBuffer)
            and not channel._buffer
        ):
            # The whole response is written: out now, before finish() and the rest of
            # this event's work (-14 µs p50 at one connection; flushWriter calls nothing
            # back). A connection closing after it is left to the end of the iteration,
            # where one write sends it and closes.
            flush(transport)
        # A pipelined request that finish() starts sends nothing upstream before this
        # response is out, where it could not go yet (and its client is found still
        # there).
        reactor.holdFlushes()
        try:
            self.finish()
        finally:
            reactor.releaseFlushes()

    def finish(self) -> None:
        """
        Finish the response, or tell the response filter the terminal has.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.finish(self)
        else:
            response_filter.finish()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """
        Attach C{producer} to the client connection, or hand it to the response filter.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.registerProducer(self, producer, streaming)
        else:
            response_filter.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        """
        Detach the producer, or tell the response filter.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.unregisterProducer(self)
        else:
            response_filter.unregisterProducer()

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        """
        Set the status, as L{Request.setResponseCode} does. A 101 means the connection
        now belongs to a tunnel (the channel never hears of its end): it is released
        when the request finishes, which the tunnel reports once both sides are closed.
        """
        if code == 101:
            channel = self.channel
            if isinstance(channel, GatewayChannel):
                # The channel will not hear of the connection again.
                channel._stopTimer()
                if channel._release is not None:
                    self.notifyFinish().addBoth(lambda ignored: channel._released())
        Request.setResponseCode(self, code, message)

    def gotLength(self, length: int | None) -> None:
        """
        Set up for a body of C{length} bytes (L{None}: chunked).

        @raise TypeError: The request has a body, but its channel is not a
            L{GatewayChannel}.
        """
        if length == 0:
            # What Twisted's gotLength does, without its try/except: it looks for the
            # site's getContentFile, which sites rarely have, and catches the
            # AttributeError (~1 µs a request).
            site = getattr(self.channel, "site", None)
            get_content_file = getattr(site, "getContentFile", None)
            self.content = get_content_file(0) if get_content_file is not None else BytesIO()
            return
        channel = self.channel
        if not isinstance(channel, GatewayChannel):
            raise TypeError("GatewayRequest needs GatewayChannel as the Site's protocol")
        self.content = BytesIO()
        self.body = RequestBody(length, self, channel)

    def handleContentChunk(self, data: bytes) -> None:
        """
        Pass a piece of the body on (not intended for users).
        """
        self.body._dataReceived(data)

    def _dispatch(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        Render now, with the body yet to come (the channel calls this once the head of a
        request with a body is parsed).
        """
        self._dispatched = True
        if version == b"HTTP/1.1":
            expect = self.requestHeaders.getRawHeaders(b"expect")
            if expect and expect[0].lower() == b"100-continue":
                self._expectContinue = True
        self.method = command
        self.uri = path
        self.clientproto = version
        target, question, query = path.partition(b"?")
        self.path = target
        self.args = parse_qs(query, 1) if question else {}
        self.process()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        The whole request is in: render it (no body), or complete the body of one that
        is already being answered.
        """
        if not self._dispatched:
            Request.requestReceived(self, command, path, version)
            return
        self.body._finish()
        if self._cleanupPending:
            self._cleanupPending = False
            HTTPRequest._cleanup(self)

    def _closeAfterResponse(self, finishing: bool) -> bool:
        """
        Whether the connection should close after this response rather than read the
        rest of the body, which is incomplete.

        @param finishing: The response is being finished (otherwise it is starting, and
            an attached consumer may yet read the whole body).
        """
        body = self.body
        if body._overLimit:
            return True
        if self._expectContinue and body.received == 0:
            # The client may be holding the body back until told to go ahead.
            return True
        return (
            (finishing or body._consumer is None)
            and isinstance(body.length, int)
            and body.length - body.received > DISCARD_LIMIT
        )

    def _cleanup(self) -> None:
        body = self.body
        if body.complete:
            HTTPRequest._cleanup(self)
            return
        channel = self.channel
        if channel.persistent and self._closeAfterResponse(finishing=True):
            channel.persistent = False
        body._abandon()
        if channel.persistent:
            # Done once the rest of the body has been read (requestReceived).
            self._cleanupPending = True
        else:
            HTTPRequest._cleanup(self)

    def _discardLimitReached(self) -> None:
        if self._cleanupPending:
            self._cleanupPending = False
            self.channel.persistent = False
            HTTPRequest._cleanup(self)
        else:
            # Still answering: read no more, close once the response is finished.
            channel = self.channel
            if isinstance(channel, GatewayChannel):
                channel._holdReading()

    def _bodyDemanded(self) -> None:
        if self._expectContinue:
            self._expectContinue = False
            transport = self.channel.transport
            if not self.startedWriting and self.body.received == 0 and transport is not None:
                transport.write(_CONTINUE)
                channel = self.channel
                if isinstance(channel, GatewayChannel):
                    channel._continueSent()

    def connectionLost(self, reason: Failure) -> None:
        """
        The connection is gone: the body, if incomplete, fails with C{reason}, and so
        does C{notifyFinish} unless the response had been finished (and only the rest of
        the body was still being read).
        """
        # Disconnected before the body hears of it: whatever the body's failure makes the
        # handler do next (answer 502, say) must see a request it can no longer answer.
        self._disconnected = True
        if not self.body.complete:
            self.body._connectionLost(reason)
        if self._cleanupPending:
            self._cleanupPending = False
            notifications, self.notifications = self.notifications, []
            super().connectionLost(reason)
            for notification in notifications:
                notification.callback(None)
            return
        super().connectionLost(reason)


def _closing_answer(status: bytes) -> bytes:
    """
    A whole bodiless response with C{status}, announcing that the connection closes.
    """
    return b"HTTP/1.1 " + status + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def _asks_close(values: Sequence[bytes]) -> bool:
    """
    Whether C{Connection} field values hold the C{close} token.
    """
    for value in values:
        lowered = value.lower()
        if b"close" in lowered:
            for token in lowered.split(b","):
                if token.strip(b" \t") == b"close":
                    return True
    return False


class GatewayChannel(HTTPChannel):
    """
    An L{HTTPChannel} that dispatches L{GatewayRequest}s with a body as soon as their
    head is parsed, lets their body's flow control pause reading, and refuses over-long
    or folded header lines with a status.

    A connection whose last response left part of a request body unread is closed in
    stages (RFC 9112 section 9.6): the write side is shut down, so that the client reads
    the response and then end of file, while whatever the client still sends is read
    and dropped for up to L{LINGER_SECONDS}; closing at once, with unread data, would
    reset the connection, and the client could lose the response. (Under TLS the write
    side cannot be shut down alone: there the connection just lingers, then closes.)
    """

    headerTimeout: float | None = None
    """
    Seconds from the first byte of a request head to its last (the gateway's site sets
    it per connection); L{None}: the idle timeout's period.
    """
    bodyTimeout: float | None = None
    """
    Seconds a request body may go without a byte while the gateway reads it; L{None}: the
    idle timeout's period.
    """
    sendTimeout: float | None = None
    """
    Seconds the client may keep the gateway from writing (its receive window full, the
    transport's buffer with it) before the connection is dropped; L{None}: no bound.
    """
    _sendCall: IDelayedCall | None = None
    _host: IAddress | None = None
    _peer: IAddress | None = None
    _nonQueued = False
    _secureTransport: object = None
    _secure = False
    # The connection's timeout (TimeoutMixin's, kept lazily): when it is due, and the one
    # timer that fires at or before then.
    _deadline: float | None = None
    _timerCall: DelayedCall | None = None

    _gate: _ReadGate | None = None
    _streaming: GatewayRequest | None = None
    # Closing: nothing more the client sends is parsed.
    _draining = False
    _lingerCall: IDelayedCall | None = None
    _heldTimeOut: float | None = None
    _phase = _AWAITING
    _idleTimeout: float | None = None
    # Told when the connection is gone (the site counts it against its caps).
    _release: Callable[[GatewayChannel], object] | None = None
    # The gateway is shutting down: no request after the one in progress.
    _shuttingDown = False

    def getHost(self) -> IAddress:
        """
        The connection's local address, asked of the socket once: Twisted's Request asks
        for it with every request, a C{getsockname} system call and a new address each
        time (~1 µs). Every request of the connection gets the same address object,
        which nothing changes.
        """
        host = self._host
        if host is None:
            host = self._host = HTTPChannel.getHost(self)
        return host

    def getPeer(self) -> IAddress:
        """
        The client's address, made once: Twisted's Request asks for it with every
        request, and the transport makes a new address object each time (~0.5 µs).
        """
        peer = self._peer
        if peer is None:
            peer = self._peer = HTTPChannel.getPeer(self)
        return peer

    def isSecure(self) -> bool:
        """
        Whether the connection is TLS, asked of its transport once: Twisted adapts the
        transport to C{ISSLTransport} each time (~0.7 µs), and the proxy asks with every
        request that has no C{X-Forwarded-Proto}.
        """
        transport = self.transport
        if transport is not self._secureTransport:
            self._secureTransport = transport
            self._secure = HTTPChannel.isSecure(self)
        return self._secure

    def connectionMade(self) -> None:
        # The site's idle timeout: the period between requests.
        self._idleTimeout = self.timeOut
        # How Twisted's parser calls the request factory, asked once (~0.35 µs).
        self._nonQueued = INonQueuedRequestFactory.providedBy(self.requestFactory)
        HTTPChannel.connectionMade(self)

    def setTimeout(self, period: float | None) -> float | None:
        """
        Change the timeout period, as L{TimeoutMixin.setTimeout} does (L{None}: no
        timeout), and return the previous one.

        Kept lazily: each request stops the timer while it is answered and starts it
        again after, which with a timer per period is two C{callLater}s and two
        cancellations a request (~2 µs). Here one timer stays pending while the deadline
        moves: stopping only forgets the deadline, a later deadline only records it, and
        when the timer fires early it waits for the rest. Only a deadline sooner than
        the pending timer replaces it.
        """
        previous = self.timeOut
        self.timeOut = period  # type: ignore[assignment]  # TimeoutMixin says int
        if period is None:
            self._deadline = None
        else:
            self._arm(period)
        return previous

    def resetTimeout(self) -> None:
        """
        Restart the timeout's period from now, if one is running.
        """
        period = self.timeOut
        if self._deadline is not None and period is not None:
            self._arm(period)

    def _arm(self, period: float) -> None:
        call = self._timerCall
        if call is not None:
            deadline = call.seconds() + period
            if deadline >= call.getTime():
                self._deadline = deadline
                return
            # Sooner than the pending timer: a new one (moving a timer sooner is a
            # linear search of the reactor's timers; cancelling is constant time).
            call.cancel()
        call = self._timerCall = cast(DelayedCall, self.callLater(period, self._timerFired))
        self._deadline = call.getTime()

    def _timerFired(self) -> None:
        fired = self._timerCall
        self._timerCall = None
        deadline = self._deadline
        if deadline is None or fired is None:
            return
        remaining = deadline - fired.seconds()
        if remaining > 0:
            self._timerCall = cast(DelayedCall, self.callLater(remaining, self._timerFired))
            return
        self._deadline = None
        self.timeoutConnection()

    def dataReceived(self, data: bytes) -> None:
        """
        Twisted renews the idle timeout with every read; here a request head's first byte
        starts a deadline for the whole head, which later reads do not move (one byte
        every few seconds would hold the connection for ever), and only a body's reads
        renew its timer.
        """
        phase = self._phase
        if phase == _AWAITING:
            if data == b"\r\n":
                # RFC 9112 section 2.2: an empty line before a request line is ignored
                # (Twisted eats one): still idle, no head deadline.
                LineReceiver.dataReceived(self, data)
                return
            self._startHead()
            transport = self.transport
            if (
                # Twisted's parser holds nothing: no request (not even a head cut short
                # after a pipelined one was answered), no bytes, no line of a head.
                not self.requests
                and self.line_mode
                and not self._buffer
                and not self._busyReceiving
                and getattr(self, "_HTTPChannel__first_line", 0)
                and not getattr(self, "_HTTPChannel__header", b"")
                and not self.paused
                and not self._handlingRequest
                and self.persistent
                and not self._draining
                # Closing (TLS still delivers until the client's close_notify): Twisted
                # would parse one line and stop.
                and transport is not None
                and not transport.disconnecting  # type: ignore[attr-defined]
                and len(data) <= self.totalHeadersSize
                and len(data) <= self.MAX_LENGTH
            ):
                head = parse_simple_head(data, self.maxHeaders)
                if head is not None:
                    self._simpleHeadReceived(*head)
                    return
        elif phase == _BODY:
            self.resetTimeout()
        LineReceiver.dataReceived(self, data)

    def _startHead(self) -> None:
        """
        A request head begins: its deadline starts.
        """
        self._phase = _HEAD
        timeout = self.headerTimeout
        # A new timer rather than the idle one moved sooner: Twisted finds a timer it
        # moves sooner by a linear search of all of them (~5 % of a proxied request's
        # CPU at 50 connections); cancelling is constant time.
        self.setTimeout(None)
        self.setTimeout(self._idleTimeout if timeout is None else timeout)

    def _simpleHeadReceived(
        self, method: bytes, target: bytes, version: bytes, fields: list[tuple[bytes, bytes]]
    ) -> None:
        """
        A whole head without a body, parsed in one pass (L{parse_simple_head}): what
        Twisted's C{lineReceived} does for each of its lines, then for its end (-2.3 µs
        a request with wrk's two-line head, -12 µs with a browser's eleven fields).
        """
        # As LineReceiver does while it delivers lines: bytes arriving meanwhile wait.
        self._busyReceiving = True
        try:
            factory = self.requestFactory
            request = factory(self) if self._nonQueued else factory(self, len(self.requests))
            self.requests.append(request)
            self._command = method
            self._path = target
            self._version = version
            add = request.requestHeaders.addRawHeader
            for name, value in fields:
                add(name, value)
            self.allHeadersReceived()
            if self.length == 0:
                self.allContentReceived()
        finally:
            self._busyReceiving = False
        if self._buffer:
            LineReceiver.dataReceived(self, b"")

    def lineReceived(self, line: bytes) -> None:
        if self._phase == _AWAITING and line:
            # A pipelined head read along with a request answered meanwhile (inside the
            # same read): its deadline starts now, not with the next read. An empty line
            # there is ignored (RFC 9112 section 2.2): still idle.
            self._startHead()
        first = line[:1]
        if first in _FOLD_START:
            # obs-fold (RFC 9112 section 5.2): rejected rather than unfolded, so that
            # no two parsers can disagree about it.
            self._respondToBadRequestAndDisconnect()
        elif (
            first in _CONTENT_LENGTH_START
            and len(line) > _CONTENT_LENGTH_LONGEST
            and line[:15].lower() == _CONTENT_LENGTH
            and len(line[15:].strip(b" \t")) > MAX_CONTENT_LENGTH_DIGITS
        ):
            # Checked on the raw line: Twisted would parse any number of digits (past
            # 4300 its int() raises, and the connection drops without an answer).
            self._refuse(_BAD_REQUEST)
        else:
            _LINE_RECEIVED(self, line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if getattr(self, "_HTTPChannel__first_line", 1):
            self._refuse(b"414 URI Too Long")
        else:
            self._refuse(b"431 Request Header Fields Too Large")

    def allHeadersReceived(self) -> None:
        request = self.requests[-1]
        codings = request.requestHeaders.getRawHeaders(b"transfer-encoding")
        if codings is not None and (
            self._version != b"HTTP/1.1" or len(codings) != 1 or codings[0].lower() != b"chunked"
        ):
            # RFC 9112 section 6.1: chunked is the only coding the gateway decodes, and it
            # must be the only one (Twisted ignores "identity", and decodes chunked
            # HTTP/1.0 requests); an HTTP/1.0 message with Transfer-Encoding is faulty.
            self._refuse(_BAD_REQUEST)
            return
        if self.length == 0 or not isinstance(request, GatewayRequest):
            HTTPChannel.allHeadersReceived(self)
            return
        self._streaming = request
        self._phase = _BODY
        expect = request.requestHeaders.getRawHeaders(b"expect")
        if self._version == b"HTTP/1.1" and expect and expect[0].lower() == b"100-continue":
            # The client waits for the gateway's 100 Continue, sent when the body's
            # consumer starts (an upstream connection may first have to be had): no body
            # timer until then; the handler's own deadlines bound that wait.
            self.setTimeout(None)
        else:
            self._startBodyTimer()
        if self._gate is None:
            # Installed with the first body, so that a connection without one pays
            # nothing. Twisted leaves reading paused at this point only while it waits
            # for the transport (and, if it did not pause, resumes it when the transport
            # drains anyway).
            gate = _ReadGate(cast(_Transport, self._networkProducer), self._waitingForTransport)
            self._gate = self._networkProducer = gate
        request.parseCookies()
        self.persistent = self.checkPersistence(request, self._version)
        request.gotLength(self.length)
        # No "100 Continue" here: the body's consumer asks for it when it starts.
        request._dispatch(self._command, self._path, self._version)

    def _startBodyTimer(self) -> None:
        timeout = self.bodyTimeout
        self.setTimeout(self._idleTimeout if timeout is None else timeout)

    def _continueSent(self) -> None:
        """
        The gateway has asked for the body (100 Continue): its gaps are timed from now.
        """
        if self._phase == _BODY:
            self._startBodyTimer()

    def allContentReceived(self) -> None:
        if self._streaming is not None:
            self._streaming = None
            # Before Twisted saves the timeout for the time the request is handled.
            self._releaseReading()
        elif self._draining:
            return
        self._phase = _ANSWERING
        # Twisted stops the timer while the request is answered, saving the period to
        # restore afterwards: the idle timeout's, not the head's or the body's.
        idle = self._idleTimeout
        if idle:
            self.timeOut = idle  # type: ignore[assignment]  # a float, as the site sets it
        else:
            self.setTimeout(None)
        HTTPChannel.allContentReceived(self)

    def rawDataReceived(self, data: bytes) -> None:
        if self._draining:
            return
        HTTPChannel.rawDataReceived(self, data)

    def requestDone(self, request: HTTPRequest) -> None:
        if request is not self._streaming:
            if self._shuttingDown:
                self.persistent = False
            # Idle until the next request's first byte (perhaps one already read ahead).
            self._phase = _AWAITING
            HTTPChannel.requestDone(self, request)
            return
        # Answered, not persistent, the body not all read: close (never while persistent).
        if request is not self.requests[0]:
            raise TypeError(request)
        del self.requests[0]
        self._streaming = None
        self._drain()

    def checkPersistence(self, request: HTTPRequest, version: bytes) -> bool:
        """
        Whether the connection stays open after C{request}'s response: HTTP/1.1 without a
        C{close} token in C{Connection}, whose values are comma-separated token lists
        with optional whitespace (RFC 9110 section 7.6.1).
        """
        if version != b"HTTP/1.1":
            return False
        values = request.requestHeaders.getRawHeaders(b"connection")
        if (values is not None and _asks_close(values)) or self._shuttingDown:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return True

    def shutDown(self) -> None:
        """
        The gateway is shutting down (draining): close now if no request is in progress,
        so that an idle keep-alive connection cannot start one; otherwise close once the
        response in progress is done, and answer a request whose head is still arriving
        with C{Connection: close}.
        """
        self._shuttingDown = True
        if self._phase == _AWAITING and not self.requests:
            self.loseConnection()

    def writeHeaders(
        self, version: bytes, code: bytes, reason: bytes, headers: Headers, body: bytes = b""
    ) -> None:
        """
        Write a response head, and with it C{body} when the whole response is known
        (L{GatewayRequest.write_whole}).
        """
        request = self._streaming
        if request is not None and self.persistent and request._closeAfterResponse(finishing=False):
            # A response starting before the body is all in, which will close.
            self.persistent = False
            headers.setRawHeaders(b"connection", [b"close"])
        # One write of the whole head, the gateway's fixed headers included.
        transport = self.transport
        assert transport is not None
        head = serialize_head(version, code, reason, headers)
        transport.write(head + body if body else head)

    def timeoutConnection(self) -> None:
        """
        Close on a timeout, telling a client whose request head or body is overdue so
        (408) when no response has started; a request being answered learns at once.
        """
        phase = self._phase
        if phase == _HEAD:
            self._draining = True
            self._write(_closing_answer(_REQUEST_TIMEOUT))
        elif phase == _BODY and self._streaming is not None:
            self._abandonStreaming(self._streaming, _REQUEST_TIMEOUT, ConnectionTimedOut)
        HTTPChannel.timeoutConnection(self)

    def _stopTimer(self) -> None:
        """
        Cancel the pending timer, rather than leave it to lapse: it would keep a
        connection that is closed, or no longer this channel's, for a whole period.
        """
        self._deadline = None
        timer = self._timerCall
        if timer is not None:
            self._timerCall = None
            timer.cancel()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stopTimer()
        if self._lingerCall is not None:
            self._lingerCall.cancel()
            self._lingerCall = None
        if self._sendCall is not None:
            self._sendCall.cancel()
            self._sendCall = None
        self._released()
        HTTPChannel.connectionLost(self, reason)

    def pauseProducing(self) -> None:
        """
        The transport's buffer is full: the client is not reading. Time how long.
        """
        HTTPChannel.pauseProducing(self)
        timeout = self.sendTimeout
        if timeout and self._sendCall is None:
            self._sendCall = self.callLater(timeout, self._sendTimedOut)

    def resumeProducing(self) -> None:
        """
        The client has read: writing goes on.
        """
        call = self._sendCall
        if call is not None:
            self._sendCall = None
            call.cancel()
        HTTPChannel.resumeProducing(self)

    def _sendTimedOut(self) -> None:
        # A client that reads nothing for this long (a "slow read") would otherwise hold
        # its connection, and the upstream connection paused behind it, for ever.
        self._sendCall = None
        transport = self.transport
        if transport is not None:
            getattr(transport, "abortConnection", transport.loseConnection)()

    def _released(self) -> None:
        release = self._release
        if release is not None:
            self._release = None
            release(self)

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._draining:
            self.loseConnection()
            return
        if self._receivedHeaderSize > self.totalHeadersSize:
            # What Twisted refuses with a 400 when the header section is too large.
            self._refuse(b"431 Request Header Fields Too Large")
            return
        request = self._streaming
        if request is not None:
            # Malformed body framing, with the request already being answered.
            self._abandonStreaming(request, _BAD_REQUEST, ConnectionLost)
            self.loseConnection()
            return
        # Twisted's own answer, with the framing headers every other refusal has.
        self._refuse(_BAD_REQUEST)

    def _refuse(self, status: bytes) -> None:
        """
        Answer C{status} and close; nothing else the client sent is read.
        """
        _count_refusal(self, status)
        self._draining = True
        self._write(_closing_answer(status))
        self.loseConnection()

    def _abandonStreaming(
        self, request: GatewayRequest, status: bytes, error: type[Exception]
    ) -> None:
        """
        Give up on the body of C{request}, already dispatched: answer C{status} if its
        response has not started, and fail it at once (its body and C{notifyFinish}),
        rather than when the connection is gone. The caller closes the connection.
        """
        self._streaming = None
        self._draining = True
        _count_refusal(self, status)
        if not request.startedWriting:
            self._write(_closing_answer(status))
            request.startedWriting = True
            # What the client got, for the access log and the metrics.
            request.code = int(status[:3])
            request.code_message = status[4:]
        self.requests.remove(request)
        why = status.decode("ascii").partition(" ")[2].lower()
        request.connectionLost(Failure(error(why)))

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _holdReading(self) -> None:
        gate = self._gate
        if gate is not None and not gate.bodyHeld:
            gate.holdForBody()
            # Not the client's fault: no idle timeout while we are the ones not reading.
            self._heldTimeOut = self.setTimeout(None)

    def _releaseReading(self) -> None:
        gate = self._gate
        if gate is not None and gate.bodyHeld:
            gate.releaseForBody()
            self.setTimeout(self._heldTimeOut)

    def _drain(self) -> None:
        self._draining = True
        self._dataBuffer = []
        self.setRawMode()
        self._releaseReading()
        if self._gate is not None:
            self._gate.releaseAll()
        # Plain sockets only: under TLS, shutting the socket down would cut the TLS stream.
        transport: object = self.transport
        if isinstance(transport, FileDescriptor):
            transport.loseWriteConnection()
        self._lingerCall = self.callLater(LINGER_SECONDS, self._lingerDone)

    def _lingerDone(self) -> None:
        self._lingerCall = None
        if self.transport is not None:
            self.transport.loseConnection()


def _count_refusal(channel: Any, status: bytes) -> None:
    """
    Count a refusal the channel answers itself in its site's metrics (C{400 Bad
    Request} -> 400, C{bad_request}).
    """
    metrics = getattr(channel.site, "metrics", None) if channel.site is not None else None
    if metrics is None:
        return
    code, _, phrase = status.partition(b" ")
    metrics.edge_refused(int(code), phrase.decode("ascii").lower().replace(" ", "_"))
