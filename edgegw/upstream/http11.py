"""
A lean HTTP/1.1 client protocol for the reverse proxy's upstream leg: the connection's
state machine and its response parser. What it hands out is in
L{edgegw.upstream.response}, how a request is encoded in L{edgegw.upstream.request_encoding}.

One L{UpstreamConnection} carries one exchange at a time (no pipelining). The response
head is parsed in one pass over the buffered bytes with C{bytes.find} and two compiled
patterns; the body is handed to the caller's L{BodySink} straight from C{dataReceived},
without re-buffering and without a L{Deferred} per chunk.

Framing follows RFC 9112: C{Transfer-Encoding: chunked} (extensions ignored, trailers
read and dropped), C{Content-Length}, or the end of the connection; no body for C{HEAD}
and for 1xx, 204 and 304 responses. Interim 1xx responses other than 101 are skipped.
Anything ambiguous (obs-fold, invalid names, differing C{Content-Length} values, both
C{Content-Length} and C{Transfer-Encoding}, a transfer coding other than C{chunked}) is
a L{UpstreamProtocolError}: a proxy that guesses at framing can be used for smuggling.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from typing import Final, Protocol, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionAborted, ConnectionDone
from twisted.internet.interfaces import IProducer, IProtocol, ITransport
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer

from edgegw.reactor import flush_now
from edgegw.upstream.request_encoding import RequestBodyError, RequestBodyWriter, encode_request
from edgegw.upstream.response import (
    BodySink,
    ResponseTruncatedError,
    UpstreamProtocolError,
    UpstreamResponse,
)

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_SIZE",
    "UpstreamConnection",
    "UpstreamTransport",
]

MAX_HEAD_SIZE: Final = 64 * 1024
"""The largest response head (status line and fields) accepted, in bytes."""

MAX_HEADERS: Final = 200
"""The most header fields accepted in one response head."""

_MAX_CHUNK_LINE: Final = 4096

_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?\r\n")
# One field line, anchored at a line start; a line it does not match (obs-fold, a space
# before the colon, a bare CR or LF, NUL) makes findall's count fall short of the line
# count, which is how the whole block is validated in two C calls.
_OK_LINE = b"HTTP/1.1 200 OK\r\n"
_FIELD_LINE = re.compile(rb"^(" + _TCHAR + rb"++):[ \t]*+([^\x00\r\n]*+)\r\n", re.MULTILINE)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*+(?:;[^\x00\r\n]*+)?\r\n")

# Connection states.
_IDLE: Final = 0  # no exchange: in the pool, or fresh
_HEAD: Final = 1  # request written, waiting for the response head
_BODY: Final = 2  # response head delivered, body in progress
_UPGRADED: Final = 3  # 101 received: the bytes belong to whoever detach()es the transport
_CLOSED: Final = 4  # gone, or going: carries nothing more

# Body framing.
_LENGTH: Final = 0
_CHUNKED: Final = 1
_EOF: Final = 2

# Where the chunked parser is.
_CHUNK_SIZE_LINE: Final = 0
_CHUNK_DATA: Final = 1
_CHUNK_DATA_END: Final = 2
_CHUNK_TRAILER: Final = 3


class UpstreamTransport(Protocol):
    """
    What an L{UpstreamConnection} and its L{RequestBodyWriter} need of a TCP or TLS
    transport (for the type checker).
    """

    def write(self, data: bytes) -> None: ...
    def writeSequence(self, data: Iterable[bytes]) -> None: ...
    def loseConnection(self) -> None: ...
    def abortConnection(self) -> None: ...
    def registerProducer(self, producer: IProducer, streaming: bool) -> None: ...
    def unregisterProducer(self) -> None: ...
    def pauseProducing(self) -> None: ...
    def resumeProducing(self) -> None: ...


class UpstreamConnection(TwistedProtocol):
    """
    One HTTP/1.1 connection to an upstream, carrying one exchange at a time.

    @ivar response_started: Whether any byte of a response arrived for the current
        request (a request that failed before that may be retried on another
        connection, when it is safe to repeat).
    @ivar idle_since: When the connection last became idle (kept by the pool).
    @ivar body_producer: The request body producer being sent, L{None} when there is none
        or once it is done or stopped (its L{RequestBodyWriter} writes only while it is).
    """

    _log = Logger()

    def __init__(
        self,
        on_idle: Callable[[UpstreamConnection], None],
        on_lost: Callable[[UpstreamConnection], None],
    ) -> None:
        """
        @param on_idle: Called when an exchange ended and the connection can carry
            another request.
        @param on_lost: Called when an idle connection closes or becomes unusable.
        """
        self._on_idle = on_idle
        self._on_lost = on_lost
        self._state: int = _IDLE
        self._buffer: bytes | bytearray = b""
        self._search_from = 0
        self._head_d: Deferred[UpstreamResponse] | None = None
        self._body_d: Deferred[None] | None = None
        self._sink_write: Callable[[bytes], None] | None = None
        self._response: UpstreamResponse | None = None
        self._failure: Failure | None = None
        self._lost: Failure | None = None
        self._is_head = False
        self._upgrade = False
        self._reusable = False
        self._mode: int = _LENGTH
        self._chunk_state: int = _CHUNK_SIZE_LINE
        self._remaining = 0
        self.body_producer: IBodyProducer | None = None
        self._request_sent = True
        self._paused = False
        self._transport_paused = False
        self._in_loop = False
        self._delegate: IProtocol | None = None
        self._close_waiters: list[Deferred[None]] = []
        self._connected = False
        self.response_started = False
        self.idle_since = 0.0

    # -- transport events --------------------------------------------------------------

    def connectionMade(self) -> None:
        self._transport = cast(UpstreamTransport, self.transport)
        self._connected = True
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            # Request bodies are written piece by piece over several reactor turns.
            with contextlib.suppress(OSError):
                set_no_delay(True)

    def dataReceived(self, data: bytes) -> None:
        if self._delegate is not None:
            self._delegate.dataReceived(data)
            return
        self.response_started = True
        buffered = self._buffer
        if buffered:
            if type(buffered) is bytearray:
                # An incomplete response head: append in place (a head that trickles in
                # must not cost a copy of everything so far per read).
                buffered += data
                if buffered.find(b"\r\n\r\n", self._search_from) < 0:
                    if len(buffered) > MAX_HEAD_SIZE:
                        self.fail_exchange(
                            Failure(UpstreamProtocolError("response head too large"))
                        )
                    else:
                        self._search_from = max(0, len(buffered) - 3)
                    return
                data = bytes(buffered)
            else:
                data = bytes(buffered) + data
            self._buffer = b""
        self._process(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._connected = False
        delegate = self._delegate
        if delegate is not None:
            delegate.connectionLost(reason)
            return
        # The transport has already stopped a request body producer it still held.
        self.body_producer = None
        self._transport_paused = False
        waiters, self._close_waiters = self._close_waiters, []
        state = self._state
        if state in (_BODY, _UPGRADED):
            self._lost = reason
            if state == _BODY:
                self._drain()
        else:
            self._state = _CLOSED
            if state == _IDLE:
                self._on_lost(self)
            elif state == _HEAD:
                d = self._head_d
                self._head_d = None
                if d is not None:
                    d.errback(reason)
        for waiter in waiters:
            waiter.callback(None)

    # -- requests ----------------------------------------------------------------------

    def request(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: IBodyProducer | None = None,
        *,
        upgrade: bool = False,
    ) -> Deferred[UpstreamResponse]:
        """
        Send one request; see L{edgegw.upstream.pool.UpstreamClient.request}.

        @raise RuntimeError: The connection is busy or closed.
        """
        try:
            head, length = encode_request(method, target, headers, body)
        except ValueError:
            return fail()
        return self.send(head, method == b"HEAD", body, length, upgrade)

    def send(
        self,
        head: bytes,
        head_request: bool,
        body: IBodyProducer | None,
        length: int | None,
        upgrade: bool,
    ) -> Deferred[UpstreamResponse]:
        """
        Send a request already encoded by L{encode_request}.

        @param head_request: The method is C{HEAD} (the response has no body).
        @param length: C{body.length}, or L{None} for a chunked body.

        @raise RuntimeError: The connection is busy or closed.
        """
        if self._state != _IDLE:
            raise RuntimeError("the connection is busy or closed")
        self._state = _HEAD
        self._is_head = head_request
        self._upgrade = upgrade
        self.response_started = False
        d: Deferred[UpstreamResponse] = Deferred(self._cancel_head)
        self._head_d = d
        self._transport.write(head)
        if body is None:
            self._request_sent = True
        else:
            self._start_request_body(body, length)
        return d

    def send_now(self) -> None:
        """
        Have the request written so far sent at once, on the daemon's reactor
        (L{edgegw.reactor.flush_now}), while the rest of this event's work runs; a
        connection found closed then fails the response at the end of the iteration.
        """
        flush_now(self.transport)

    def close(self) -> Deferred[None]:
        """
        Close an idle connection.

        @return: Fires once the connection is closed.
        """
        if not self._connected:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._close_waiters.append(d)
        self._state = _CLOSED
        self._transport.loseConnection()
        return d

    def _start_request_body(self, body: IBodyProducer, length: int | None) -> None:
        self._request_sent = False
        self.body_producer = body
        writer = RequestBodyWriter(self, body, self._transport, length)
        self._transport.registerProducer(body, True)
        try:
            producing = body.startProducing(writer)
        except Exception:
            self._request_body_failed(Failure(), body)
            return
        producing.addCallbacks(
            self._request_body_done,
            self._request_body_failed,
            callbackArgs=(body, writer),
            errbackArgs=(body,),
        )

    def _request_body_done(
        self, ignored: object, body: IBodyProducer, writer: RequestBodyWriter
    ) -> None:
        if self.body_producer is not body:
            return
        if writer.chunked:
            self._transport.write(b"0\r\n\r\n")
        elif writer.remaining:
            self._request_body_failed(
                Failure(RequestBodyError("request body shorter than its declared length")),
                body,
            )
            return
        self.body_producer = None
        self._transport.unregisterProducer()
        self._request_sent = True

    def _request_body_failed(self, reason: Failure, body: IBodyProducer) -> None:
        if self.body_producer is not body:
            return
        self.body_producer = None
        self._transport.unregisterProducer()
        self.fail_exchange(reason)

    def _stop_request_body(self) -> None:
        producer = self.body_producer
        if producer is None:
            return
        self.body_producer = None
        self._transport.unregisterProducer()
        try:
            producer.stopProducing()
        except Exception:
            self._log.failure("stopping a request body producer")

    # -- response parsing --------------------------------------------------------------

    def _process(self, data: bytes) -> None:
        """
        Parse C{data} (what was left over plus what just arrived) as far as the state
        allows; keep what cannot be used yet in C{_buffer}.
        """
        self._in_loop = True
        try:
            pos = 0
            end = len(data)
            while pos < end:
                state = self._state
                if state == _BODY:
                    write = self._sink_write
                    if write is None or self._paused:
                        break
                    mode = self._mode
                    if mode == _LENGTH:
                        remaining = self._remaining
                        available = end - pos
                        if available < remaining:
                            self._remaining = remaining - available
                            write(data[pos:] if pos else data)
                            pos = end
                        else:
                            self._remaining = 0
                            write(
                                data[pos : pos + remaining]
                                if pos or available > remaining
                                else data
                            )
                            if self._state == _BODY:
                                self._finish_body(available > remaining)
                            return
                    elif mode == _CHUNKED:
                        pos = self._parse_chunked(data, pos, end, write)
                        if pos < 0:
                            return
                    else:
                        write(data[pos:] if pos else data)
                        pos = end
                elif state == _HEAD:
                    pos = self._parse_head(data, pos, end)
                    if pos < 0:
                        return
                elif state == _UPGRADED:
                    delegate = self._delegate
                    if delegate is None:
                        break
                    delegate.dataReceived(data[pos:] if pos else data)
                    return
                elif state == _IDLE:
                    # Unsolicited bytes (often a 408 just before the server closes): the
                    # connection can no longer carry a request.
                    self._on_lost(self)
                    self.fail_exchange(None)
                    return
                else:
                    return
            if pos < end:
                self._buffer = data[pos:] if pos else data
            if self._transport_paused or pos < end:
                self._sync_reading()
        except Exception:
            self.fail_exchange(Failure())
        finally:
            self._in_loop = False
        if self._lost is not None:
            self._finish_lost()

    def _parse_head(self, data: bytes, pos: int, end: int) -> int:
        """
        Parse one response head at C{pos}.

        @return: Where the next unparsed byte is, or -1 when nothing more is to be
            parsed now (the head is incomplete, or the exchange ended).
        """
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            if end - pos > MAX_HEAD_SIZE:
                raise UpstreamProtocolError("response head too large")
            if data.count(b"\n", pos, end) != data.count(b"\r\n", pos, end):
                # Bare LF line endings: this head would never end with CRLF CRLF.
                raise UpstreamProtocolError("response head lines must end with CRLF")
            self._buffer = bytearray(data[pos:] if pos else data)
            self._search_from = max(0, end - pos - 3)
            return -1
        if head_end - pos > MAX_HEAD_SIZE:
            raise UpstreamProtocolError("response head too large")
        if data.startswith(_OK_LINE, pos):
            # Most responses: no regular expression for their status line (-0.3 µs).
            block_start = pos + len(_OK_LINE)
            code = 200
            http11 = True
            phrase = b"OK"
        else:
            status = _STATUS_LINE.match(data, pos, head_end + 2)
            if status is None:
                line = data[pos : data.find(b"\r\n", pos)]
                raise UpstreamProtocolError(f"invalid status line {line[:200]!r}")
            block_start = status.end()
            code = int(status[2])
            http11 = status[1] == b"1"
            phrase = status[3] or b""
        block_end = head_end + 2
        headers: list[tuple[bytes, bytes]]
        if block_start < block_end:
            headers = _FIELD_LINE.findall(data, block_start, block_end)
            if len(headers) != data.count(b"\n", block_start, block_end):
                raise UpstreamProtocolError("invalid header field line")
            if len(headers) > MAX_HEADERS:
                raise UpstreamProtocolError("too many header fields")
            if (
                data.find(b" \r\n", block_start, block_end) >= 0
                or data.find(b"\t\r\n", block_start, block_end) >= 0
            ):
                headers = [(name, value.rstrip(b" \t")) for name, value in headers]
        else:
            headers = []
        pos = head_end + 4
        reusable = http11 and not self._upgrade
        content_length: int | None = None
        chunked = False
        for name, value in headers:
            size = len(name)
            if size == 14:
                if name.lower() == b"content-length":
                    content_length = _content_length(value, content_length)
            elif size == 17:
                if name.lower() == b"transfer-encoding":
                    if chunked or value.lower() != b"chunked":
                        raise UpstreamProtocolError(
                            f"unsupported Transfer-Encoding {value[:100]!r}"
                        )
                    chunked = True
            elif size == 10 and reusable and name.lower() == b"connection":
                reusable = not _has_close(value)
        if chunked and content_length is not None:
            raise UpstreamProtocolError("both Content-Length and Transfer-Encoding")

        if code < 200:
            if code != 101:
                return pos
            if not self._upgrade:
                raise UpstreamProtocolError("101 Switching Protocols without an upgrade")
            self._state = _UPGRADED
            response = self._response = UpstreamResponse(
                self, b"HTTP/1.1" if http11 else b"HTTP/1.0", code, phrase, headers, None, False
            )
            self._fire_head(response)
            return pos

        version = b"HTTP/1.1" if http11 else b"HTTP/1.0"
        has_body = True
        if self._is_head or code == 204 or code == 304:
            has_body = False
        elif chunked:
            self._mode = _CHUNKED
            self._chunk_state = _CHUNK_SIZE_LINE
        elif content_length is not None:
            self._mode = _LENGTH
            self._remaining = content_length
            has_body = content_length > 0
        else:
            self._mode = _EOF
            reusable = False
        self._reusable = reusable

        if has_body and (content_length is None or end - pos < content_length):
            self._state = _BODY
            response = self._response = UpstreamResponse(
                self, version, code, phrase, headers, content_length, True
            )
            self._fire_head(response)
            return pos
        response = UpstreamResponse(None, version, code, phrase, headers, content_length, has_body)
        if has_body:
            # The whole body came with the head (most small responses): the exchange ends
            # here, and the head's reader gets the body with it, without a second
            # Deferred or a producer to relay it (~6 µs of a small proxied request's 87
            # in process; -9 % end to end with the lazy connection timer).
            assert content_length is not None
            body_end = pos + content_length
            response.body = data[pos:body_end]
            pos = body_end
        d = self._head_d
        self._head_d = None
        self._end_exchange(reusable and pos == end)
        if d is not None:
            d.callback(response)
        return -1

    def _fire_head(self, response: UpstreamResponse) -> None:
        d = self._head_d
        self._head_d = None
        if d is not None:
            d.callback(response)

    def _parse_chunked(
        self, data: bytes, pos: int, end: int, write: Callable[[bytes], None]
    ) -> int:
        """
        Parse chunked framing from C{pos}, writing chunk data to the sink.

        @return: C{end}, or -1 when the caller must stop: the rest is kept for later
            (incomplete framing, the sink paused) or the exchange ended.
        """
        while pos < end:
            chunk_state = self._chunk_state
            if chunk_state == _CHUNK_DATA:
                remaining = self._remaining
                available = end - pos
                if available <= remaining:
                    self._remaining = remaining - available
                    if available == remaining:
                        self._chunk_state = _CHUNK_DATA_END
                    write(data[pos:] if pos else data)
                    return end
                self._chunk_state = _CHUNK_DATA_END
                self._remaining = 0
                write(data[pos : pos + remaining])
                pos += remaining
                if self._paused or self._state != _BODY:
                    return self._keep(data, pos, end)
            elif chunk_state == _CHUNK_SIZE_LINE:
                match = _CHUNK_SIZE.match(data, pos)
                if match is None:
                    newline = data.find(b"\n", pos)
                    if newline >= 0 or end - pos > _MAX_CHUNK_LINE:
                        bad = data[pos : newline if newline >= 0 else pos + 40]
                        raise UpstreamProtocolError(f"invalid chunk size line {bad!r}")
                    return self._keep(data, pos, end)
                size = int(match[1], 16)
                pos = match.end()
                if size:
                    self._remaining = size
                    self._chunk_state = _CHUNK_DATA
                else:
                    self._chunk_state = _CHUNK_TRAILER
            elif chunk_state == _CHUNK_DATA_END:
                if data.startswith(b"\r\n", pos):
                    pos += 2
                    self._chunk_state = _CHUNK_SIZE_LINE
                elif end - pos == 1 and data[pos] == 13:
                    return self._keep(data, pos, end)
                else:
                    raise UpstreamProtocolError("chunk data not followed by CRLF")
            else:
                if data.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    trailer_end = data.find(b"\r\n\r\n", pos)
                    if trailer_end < 0:
                        if end - pos > MAX_HEAD_SIZE:
                            raise UpstreamProtocolError("trailer section too large")
                        return self._keep(data, pos, end)
                    lines = data.count(b"\n", pos, trailer_end + 2)
                    if len(_FIELD_LINE.findall(data, pos, trailer_end + 2)) != lines:
                        raise UpstreamProtocolError("invalid trailer field line")
                    pos = trailer_end + 4
                self._finish_body(pos < end)
                return -1
        return end

    def _keep(self, data: bytes, pos: int, end: int) -> int:
        """
        Keep C{data[pos:]} for later (and stop reading when the sink cannot take it).
        """
        if pos < end:
            self._buffer = data[pos:] if pos else data
            self._sync_reading()
        return -1

    # -- the exchange's end ------------------------------------------------------------

    def _finish_body(self, extra: bool) -> None:
        """
        The response body is complete: end the exchange, then fire the delivery.

        @param extra: Bytes followed the body (a server that does not know where its
            response ends cannot be trusted with another request).
        """
        d = self._body_d
        response = self._response
        self._body_d = None
        self._sink_write = None
        self._response = None
        if response is not None:
            response.connection = None
        self._end_exchange(self._reusable and not extra and self._lost is None)
        if d is not None:
            d.callback(None)

    def _end_exchange(self, reusable: bool) -> None:
        self._paused = False
        if self._transport_paused:
            self._transport_paused = False
            self._transport.resumeProducing()
        if self.body_producer is not None:
            # The response is complete before the request body was sent (an early 413,
            # say): stop uploading, and drop the connection rather than flush the rest.
            self._stop_request_body()
            self._state = _CLOSED
            self._transport.abortConnection()
            return
        if reusable and self._request_sent:
            self._state = _IDLE
            self._on_idle(self)
            return
        self._state = _CLOSED
        self._transport.loseConnection()

    def fail_exchange(self, reason: Failure | None) -> None:
        """
        Abort the connection and fail whatever waits on it with C{reason} (nothing when
        it is L{None}: a canceller fails its own L{Deferred}). Also how
        L{UpstreamResponse.abort} and a L{RequestBodyWriter} end an exchange.
        """
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        self._stop_request_body()
        self._sink_write = None
        self._response = None
        self._transport.abortConnection()
        if reason is None:
            return
        head_d = self._head_d
        body_d = self._body_d
        self._head_d = self._body_d = None
        if head_d is not None:
            head_d.errback(reason)
        elif body_d is not None:
            body_d.errback(reason)
        else:
            self._failure = reason

    def _cancel_head(self, d: Deferred[UpstreamResponse]) -> None:
        self._head_d = None
        self.fail_exchange(None)

    def _cancel_body(self, d: Deferred[None]) -> None:
        self._body_d = None
        self.fail_exchange(None)

    # -- the body, as driven by UpstreamResponse ---------------------------------------

    def deliver_body(self, sink: BodySink) -> Deferred[None]:
        """
        Stream a body still arriving into C{sink}; see L{UpstreamResponse.deliver}.
        """
        failure = self._failure
        if failure is not None:
            self._failure = None
            return fail(failure)
        if self._state != _BODY:
            return fail(ConnectionAborted("the response was aborted"))
        d: Deferred[None] = Deferred(self._cancel_body)
        self._body_d = d
        self._sink_write = sink.write
        if not self._in_loop:
            self._drain()
        return d

    def pause_body(self) -> None:
        """
        Stop reading the body until L{resume_body}; see L{UpstreamResponse.pause}.
        """
        if self._state == _BODY:
            self._paused = True
            self._sync_reading()

    def resume_body(self) -> None:
        """
        Undo L{pause_body}; see L{UpstreamResponse.resume}.
        """
        if self._paused:
            self._paused = False
            if not self._in_loop:
                self._drain()

    def _drain(self) -> None:
        """
        Use what was kept for later, now that the sink can take it; then finish a body
        whose connection has ended.
        """
        if self._in_loop:
            return
        buffered = self._buffer
        if buffered and self._sink_write is not None and not self._paused:
            self._buffer = b""
            self._process(bytes(buffered))
        elif self._lost is not None:
            self._finish_lost()
        else:
            self._sync_reading()

    def _finish_lost(self) -> None:
        """
        The connection ended during the body: once everything read has been written
        (or what is left can never be complete), end the delivery.
        """
        lost = self._lost
        if self._state != _BODY or lost is None or self._sink_write is None:
            return
        if not self._buffer or not self._paused:
            self._body_eof(lost)

    def _body_eof(self, reason: Failure) -> None:
        if self._mode == _EOF and reason.check(ConnectionDone):
            self._finish_body(False)
            return
        self.fail_exchange(
            Failure(ResponseTruncatedError(f"response body incomplete: {reason.value}"))
        )

    def _sync_reading(self) -> None:
        """
        Stop reading from the transport once bytes are held that nobody can take yet
        (at most one read of them), and read again when someone can.

        Only once bytes are held: a sink pauses (its client's send buffer full) mostly
        while the bytes it was given go out at the end of the same reactor iteration,
        and it resumes right after; stopping and starting the read for that is two
        C{epoll_ctl} calls a response (~9 µs on a 64 KiB proxied response).
        """
        state = self._state
        if state == _BODY:
            paused = (self._paused or self._sink_write is None) and bool(self._buffer)
        elif state == _UPGRADED:
            paused = self._delegate is None and bool(self._buffer)
        else:
            return
        if self._lost is None and paused != self._transport_paused:
            self._transport_paused = paused
            if paused:
                self._transport.pauseProducing()
            else:
                self._transport.resumeProducing()

    def detach(self, protocol: IProtocol) -> ITransport:
        """
        Hand the upgraded connection to C{protocol}; see L{UpstreamResponse.detach}.

        @raise RuntimeError: It was already detached, or it is closed.
        """
        if self._state != _UPGRADED or self._delegate is not None:
            raise RuntimeError("the connection was already detached or is closed")
        self._delegate = protocol
        self._response = None
        self._stop_request_body()
        transport = self.transport
        assert transport is not None
        buffered, self._buffer = self._buffer, b""
        lost = self._lost
        if self._transport_paused:
            self._transport_paused = False
            if lost is None:
                self._transport.resumeProducing()
        protocol.makeConnection(transport)
        if buffered:
            protocol.dataReceived(bytes(buffered))
        if lost is not None:
            protocol.connectionLost(lost)
        return transport


def _content_length(value: bytes, previous: int | None) -> int:
    """
    The value of one C{Content-Length} field, checked against an earlier one.
    """
    if value.isdigit() and len(value) <= 18:
        length = int(value)
    else:
        # RFC 9112 section 6.3: a list of identical values may be accepted as one.
        members = {member.strip(b" \t") for member in value.split(b",")}
        if len(members) != 1:
            raise UpstreamProtocolError(f"conflicting Content-Length {value[:100]!r}")
        (member,) = members
        if not member.isdigit() or len(member) > 18:
            raise UpstreamProtocolError(f"invalid Content-Length {value[:100]!r}")
        length = int(member)
    if previous is not None and previous != length:
        raise UpstreamProtocolError("conflicting Content-Length fields")
    return length


def _has_close(value: bytes) -> bool:
    lowered = value.lower()
    return b"close" in lowered and any(
        token.strip(b" \t") == b"close" for token in lowered.split(b",")
    )
