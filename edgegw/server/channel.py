"""
The gateway's HTTP/1.1 channel: an L{IClientStream} over Twisted's HTTP/1.1 parser.

L{GatewayChannel} dispatches a request with a body as soon as its head is parsed (the
body streams through L{edgegw.server.body.RequestBody}, whose flow control pauses
reading), parses a plain bodiless head in one pass (L{edgegw.server.head}), and
refuses what a backend could read differently:

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
  - A response finished before the whole body has arrived goes out at once. Then, if
    at most L{DISCARD_LIMIT} bytes of the body remain (or, for a chunked body, until
    that many have been read), the rest is read and thrown away and only then is the
    request done with. Otherwise the connection closes after the response (announced
    with C{Connection: close} when the response head has not been sent yet).

Twisted's parser state and private hooks are reached through L{ChannelSeam}
(L{edgegw.seam}); the immediate send of a whole response through the daemon's reactor
(L{edgegw.reactor.eager_sends}).

Use with L{edgegw.server.request.GatewayRequest}: C{Site(resource,
requestFactory=GatewayRequest)} with C{site.protocol = GatewayChannel}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from twisted.internet.abstract import FileDescriptor
from twisted.internet.error import ConnectionLost
from twisted.internet.error import TimeoutError as ConnectionTimedOut
from twisted.internet.interfaces import IAddress, IDelayedCall, ITransport
from twisted.internet.protocol import connectionDone
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.http import Request as HTTPRequest
from twisted.web.http_headers import Headers
from twisted.web.iweb import INonQueuedRequestFactory
from zope.interface import implementer

from edgegw.config.model import LimitsSpec
from edgegw.reactor import eager_sends
from edgegw.seam import ChannelSeam, client_gone
from edgegw.server.body import DISCARD_LIMIT
from edgegw.server.head import parse_simple_head
from edgegw.server.read_gate import ReadGate
from edgegw.server.request import GatewayRequest
from edgegw.server.response_head import serialize_head
from edgegw.server.timers import LazyTimeout
from edgegw.stream.boundary import IClientStream

__all__ = [
    "DISCARD_LIMIT",
    "FRESH_GRACE",
    "LINGER_SECONDS",
    "MAX_CONTENT_LENGTH_DIGITS",
    "GatewayChannel",
]

FRESH_GRACE: Final = 1.0
"""
Seconds a connection that has not sent its first request is kept open when the gateway
stops: a client connects to send a request, and closing before it arrives would lose it
(an idle keep-alive connection closes at once: RFC 9112 section 9.3.1 lets its client
retry). A request that arrives is answered, with C{Connection: close}.
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


@implementer(IClientStream)
class GatewayChannel(LazyTimeout, ChannelSeam):
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

    The connection's timeout is kept lazily (L{LazyTimeout}): one timer pending while
    the deadline moves.
    """

    protocolName = b"http/1.1"

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
    _gate: ReadGate | None = None
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
    # No request has begun on the connection yet.
    _fresh = True
    _graceCall: IDelayedCall | None = None
    # A reload's Site, which serves the request after the one in progress.
    _nextSite: Any = None
    # The transport handed to a tunnel (takeConnection), until the tunnel ends.
    _handedTransport: Any = None

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
                self.parserIdle()
                and not self.paused
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

    def limit(self, limits: LimitsSpec) -> None:
        """
        Apply C{limits}' deadlines to the requests to come.
        """
        self.headerTimeout = limits.header_timeout
        self.bodyTimeout = limits.body_timeout
        self.sendTimeout = limits.send_timeout

    def serve_from(self, site: Any) -> None:
        """
        A reload: serve the next request from C{site} (a Site of L{GatewayChannel}s) — at
        once when no request has been dispatched (one whose head is still arriving is
        served there too), else once the response in progress is done. The idle period
        running keeps its deadline.
        """
        phase = self._phase
        if phase == _HEAD or (phase == _AWAITING and not self.requests):
            self._bind(site)
        else:
            self._nextSite = site

    def cut_for(self, site: Any) -> None:
        """
        C{site}, replaced by a reload, has drained as long as it may: drop the connection
        if it still serves a request for it.
        """
        if self.site is site:
            self.abortClient()

    def _bind(self, site: Any) -> None:
        self._nextSite = None
        self.site = self.factory = site
        self.requestFactory = site.requestFactory
        self._nonQueued = INonQueuedRequestFactory.providedBy(self.requestFactory)
        self.limit(site.limits)
        self._idleTimeout = site.timeOut

    def _startHead(self) -> None:
        """
        A request head begins: its deadline starts.
        """
        self._phase = _HEAD
        self._fresh = False
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
        factory = self.requestFactory
        request = factory(self) if self._nonQueued else factory(self, len(self.requests))
        self.headParsed(request, method, target, version, fields)

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
            self.badRequest()
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
        if self.readingRequestLine():
            self._refuse(b"414 URI Too Long")
        else:
            self._refuse(b"431 Request Header Fields Too Large")

    def allHeadersReceived(self) -> None:
        request = self.requests[-1]
        codings = request.requestHeaders.getRawHeaders(b"transfer-encoding")
        if codings is not None and (
            self.requestVersion() != b"HTTP/1.1"
            or len(codings) != 1
            or codings[0].lower() != b"chunked"
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
        command, path, version = self.requestLine()
        expect = request.requestHeaders.getRawHeaders(b"expect")
        if version == b"HTTP/1.1" and expect and expect[0].lower() == b"100-continue":
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
            self._gate = self.replaceReadProducer(ReadGate)
        request.parseCookies()
        self.persistent = self.checkPersistence(request, version)
        request.gotLength(self.length)
        # No "100 Continue" here: the body's consumer asks for it when it starts.
        request.dispatchEarly(command, path, version)

    def _startBodyTimer(self) -> None:
        timeout = self.bodyTimeout
        self.setTimeout(self._idleTimeout if timeout is None else timeout)

    def continueBody(self) -> None:
        """
        The body's consumer has started: a client that waits for C{100 Continue} is told
        to go ahead, and the body's gaps are timed from now.
        """
        transport = self.transport
        if transport is None:
            return
        transport.write(_CONTINUE)
        if self._phase == _BODY:
            self._startBodyTimer()

    def allContentReceived(self) -> None:
        if self._streaming is not None:
            self._streaming = None
            # Before Twisted saves the timeout for the time the request is handled.
            self.resumeBody()
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
            if self._nextSite is not None:
                self._bind(self._nextSite)
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
        so that an idle keep-alive connection cannot start one (a connection that has not
        sent its first request gets L{FRESH_GRACE} to send it); otherwise close once the
        response in progress is done, and answer a request whose head is still arriving
        (within L{FRESH_GRACE} at most, else 408) with C{Connection: close}.
        """
        self._shuttingDown = True
        phase = self._phase
        if phase == _AWAITING and not self.requests:
            if self._fresh:
                self._graceCall = self.callLater(FRESH_GRACE, self._graceOver)
            else:
                self.loseConnection()
        elif phase == _HEAD:
            # A head still arriving gets the same grace at most (then 408): a client
            # sending it a byte at a time must not hold the stop for headerTimeout.
            self.limitTimeout(FRESH_GRACE)

    def _graceOver(self) -> None:
        self._graceCall = None
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

    def writeWhole(
        self, request: Any, head: tuple[bytes, bytes, bytes, Headers], body: bytes
    ) -> None:
        """
        Write C{request}'s whole response in one write and finish it. On the daemon's
        reactor the bytes are sent at once, before C{finish()} and the rest of this
        event's work (-14 µs p50 at one connection), unless the connection closes after
        it (one write at the end of the iteration then sends it and closes) or a
        pipelined request was read behind it (their responses, or their upstream
        requests, go with it at the end of the iteration). The rule for what an eager
        send may overtake is the reactor's (L{edgegw.reactor}).
        """
        version, code, reason, headers = head
        self.writeHeaders(version, code, reason, headers, body)
        transport = self.transport
        sends = eager_sends(transport)
        if sends is None:
            request.finish()
            return
        if self.persistent and self.nothingReadAhead():
            sends.flushWriter(transport)
        # A pipelined request that finish() starts sends nothing upstream before this
        # response is out, where it could not go yet (and its client is found still
        # there).
        sends.holdFlushes()
        try:
            request.finish()
        finally:
            sends.releaseFlushes()

    def clientGone(self, request: Any) -> bool:
        """
        Whether C{request} can no longer be answered.
        """
        return client_gone(request)

    def clientCloser(self) -> Callable[[], None] | None:
        """
        The transport's abort: it drops the connection whoever owns it then (this
        channel, or a tunnel it was handed to).
        """
        transport: Any = self.transport or self._handedTransport
        if transport is None:
            return None
        closer: Callable[[], None] = getattr(transport, "abortConnection", transport.loseConnection)
        return closer

    def abortClient(self) -> None:
        """
        Drop the connection at once.
        """
        close = self.clientCloser()
        if close is not None:
            close()

    def closeAfterResponse(self) -> None:
        """
        Close the connection once the response in progress is complete.
        """
        self.persistent = False

    def takeConnection(self, request: Any) -> tuple[ITransport, bytes]:
        """
        Let go of the connection for an upgrade: no timer, no producer, no transport;
        the connection is released (counted out of the site's caps) when C{request}
        finishes, which its new owner reports.

        @return: The transport, and the bytes read ahead of the parser.
        """
        transport: Any = self.transport
        if transport is None:
            raise ConnectionLost("the client connection is gone")
        self.stopTimer()
        if self._release is not None:
            request.notifyFinish().addBoth(lambda ignored: self._released())
        transport.unregisterProducer()
        self.transport = None
        # Its configuration's drain may still have to cut it (abortClient).
        self._handedTransport = transport
        request.notifyFinish().addBoth(self._tunnelEnded)
        return transport, self.takeReadAhead()

    def _tunnelEnded(self, result: object) -> None:
        self._handedTransport = None

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

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.stopTimer()
        if self._lingerCall is not None:
            self._lingerCall.cancel()
            self._lingerCall = None
        if self._sendCall is not None:
            self._sendCall.cancel()
            self._sendCall = None
        if self._graceCall is not None:
            self._graceCall.cancel()
            self._graceCall = None
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

    def badRequest(self) -> None:
        """
        A request is malformed: answer 400 (431 for a header section too large) and
        close; a request already being answered fails instead.
        """
        if self._draining:
            self.loseConnection()
            return
        if self.headerSectionTooLarge():
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

    def pauseBody(self) -> None:
        """
        Read no more until L{resumeBody}: the request body's consumer is slower than
        the client.
        """
        gate = self._gate
        if gate is not None and not gate.bodyHeld:
            gate.holdForBody()
            # Not the client's fault: no idle timeout while we are the ones not reading.
            self._heldTimeOut = self.setTimeout(None)

    def resumeBody(self) -> None:
        """
        Read the request body again.
        """
        gate = self._gate
        if gate is not None and gate.bodyHeld:
            gate.releaseForBody()
            self.setTimeout(self._heldTimeOut)

    def _drain(self) -> None:
        self._draining = True
        self.takeReadAhead()
        self.setRawMode()
        self.resumeBody()
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
