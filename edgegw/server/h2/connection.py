"""
An HTTP/2 server connection: the C{h2} library's state machine on a TLS transport, one
L{H2ClientStream} and one gateway request per stream.

What the connection adds to C{h2}:

  - Requests are read as the gateway reads HTTP/1.1 heads
    (L{edgegw.server.h2.request_head}); a malformed one is a stream error, one too large
    is answered 431.
  - Response bodies wait per stream for the client's windows, oldest stream first;
    the request's producer is paused while much waits, and a stream that cannot send
    for C{limits.sendTimeout} is reset. A request body is acknowledged (the client's
    window reopened) only as its consumer takes it.
  - Deadlines: the site's idle timeout while no stream is open (what a client sends
    without completing a request does not extend it), C{limits.bodyTimeout} between two
    pieces of a request body, C{limits.sendTimeout} for each response that cannot move.
  - Budgets (L{edgegw.server.h2.budget}) for cancelled streams and for frames that ask
    for nothing, charged per frame as L{edgegw.server.h2.frame_watch} sees them; a
    header block bounded in bytes and in time; GOAWAY with ENHANCE_YOUR_CALM when a
    bound is passed.
  - Draining: GOAWAY with the last stream id, streams in flight finish, then close.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame
from twisted.internet.interfaces import IAddress, IPushProducer, ISSLTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from edgegw.config.model import LimitsSpec
from edgegw.seam import raw_fields
from edgegw.server.h2.budget import EventBudget
from edgegw.server.h2.field_encoder import ResponseFieldEncoder
from edgegw.server.h2.frame_watch import HeaderBlockWatch
from edgegw.server.h2.request_head import (
    CONNECTION_SPECIFIC,
    HeaderListTooLargeError,
    MalformedRequestError,
    read_request_head,
)
from edgegw.server.h2.stream import HIGH_WATER, LOW_WATER, H2ClientStream
from edgegw.server.response_head import date_value

__all__ = [
    "CONNECTION_WINDOW",
    "MAX_HEADER_FIELDS",
    "MAX_HEADER_LIST_SIZE",
    "H2ServerConnection",
]

MAX_HEADER_LIST_SIZE: Final = 16384
"""
The largest request header list read (RFC 9113's size: names, values, 32 per field),
as HTTP/1.1's header section (Twisted's C{totalHeadersSize}); larger gets 431.
"""

MAX_HEADER_FIELDS: Final = 500
"""The most fields in a request's header list, as on HTTP/1.1; more gets 431."""

HPACK_LIST_BOUND: Final = 65536
"""
The most a header block may decode to at all (an HPACK bomb is cut here, with GOAWAY):
above L{MAX_HEADER_LIST_SIZE}, so that an honest large head gets its 431.
"""

CONNECTION_WINDOW: Final = 1024 * 1024
"""
The connection's receive window: room for several request bodies at once, each
stream's own window (65,535 bytes) bounding what one paused body holds.
"""

CONNECTION_HIGH_WATER: Final = 1024 * 1024
CONNECTION_LOW_WATER: Final = 256 * 1024
"""
Response bytes waiting on one connection, all streams together, beyond which every
producer that writes is paused (and below which they resume): what one client's
connection can make the gateway hold, whatever its number of streams.
"""

HEADER_BLOCK_BOUND: Final = HPACK_LIST_BOUND
"""
The most bytes a header block may take across its HEADERS and CONTINUATION frames
(CVE-2024-27316); beyond it, GOAWAY with ENHANCE_YOUR_CALM.
"""

STREAM_CEILING: Final = 2
"""
How many times C{limits.maxStreamsPerConnection} h2 itself enforces (a connection
error); between the limit and that, streams are refused one by one.
"""

REFUND_BYTES: Final = 8192
"""Response bytes sent that earn back one control-frame token."""

CONTROL_FRAMES_BURST: Final = 1000
CONTROL_FRAMES_PER_SECOND: Final = 500
"""
The budget for frames that ask for nothing (SETTINGS, PING, PRIORITY, WINDOW_UPDATE,
empty DATA, unknown types): a burst, and a rate; each DATA frame sent earns one back
(a client reading a large response acknowledges it with WINDOW_UPDATE frames) per
L{REFUND_BYTES} sent. Charged per frame (L{HeaderBlockWatch} counts them).
"""

_WINDOW_SETTINGS: Final = frozenset({SettingCodes.INITIAL_WINDOW_SIZE, SettingCodes.MAX_FRAME_SIZE})


_CONFIGURATION: Final = H2Configuration(
    client_side=False,
    header_encoding=None,
    # The gateway reads requests itself (request_head) and writes valid responses.
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)
"""One configuration, made at import, for every connection (h2 only reads it)."""


def _settings(max_streams: int) -> Settings:
    return Settings(
        client=False,
        initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: max_streams,
            SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
            SettingCodes.ENABLE_PUSH: 0,
        },
    )


@implementer(IPushProducer)
class H2ServerConnection(Protocol):
    """
    The server side of one HTTP/2 connection (after ALPN chose C{h2}).

    @ivar site: The site: its C{requestFactory} makes each stream's request, its
        C{metrics} count refusals.
    @ivar limits: C{Gateway.spec.limits}.
    @ivar streams: The open streams, by id.
    """

    log = Logger(namespace="edgegw.h2")

    def __init__(self, site: Any, limits: LimitsSpec, idle_timeout: float | None) -> None:
        self.site = site
        self.limits = limits
        self.idle_timeout = idle_timeout
        self.streams: dict[int, H2ClientStream] = {}
        self._reactor: Any = site.reactor
        self._h2 = H2Connection(_CONFIGURATION)
        self._h2.local_settings = _settings(limits.max_streams_per_connection)
        self._h2.encoder = ResponseFieldEncoder()  # type: ignore[assignment]  # duck-typed
        self._h2.decoder.max_header_list_size = HPACK_LIST_BOUND
        self._peer: IAddress | None = None
        self._host: IAddress | None = None
        self._secure: bool | None = None
        self._receiving = False
        self._send_paused = False
        self._draining = False
        self._gone = False
        self._waiting: dict[int, H2ClientStream] = {}
        self._idle_call: Any = None
        self._close_call: Any = None
        self._fixed: tuple[bytes, list[tuple[bytes, bytes]]] = (b"", [])
        self._watch = HeaderBlockWatch()
        self._header_call: Any = None
        self._stall_call: Any = None
        self._pending_total = 0
        self._held: set[H2ClientStream] = set()
        self._resuming = False
        self._resume_again = False
        streams = limits.max_streams_per_connection
        self._resets = EventBudget(2 * streams, streams, self._reactor)
        self._control = EventBudget(CONTROL_FRAMES_BURST, CONTROL_FRAMES_PER_SECOND, self._reactor)
        # Told when the connection is gone (the site counts it against its caps).
        self._release: Any = None

    # Protocol

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.registerProducer(self, True)
        h2 = self._h2
        h2.initiate_connection()
        # The limit is advertised, and the gateway refuses a stream beyond it with
        # REFUSED_STREAM (RFC 9113 section 5.1.2; a client may open streams before our
        # SETTINGS reach it); h2 would make any such stream a connection error, so it
        # enforces only twice the limit (a client that far past it is not honest).
        h2.local_settings = _settings(STREAM_CEILING * self.limits.max_streams_per_connection)
        h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._flush()
        self._idle()

    def dataReceived(self, data: bytes) -> None:
        if self._gone:
            return
        self._receiving = True
        watch = self._watch
        watch.feed(data)
        if watch.control or watch.resets:
            # Charged per frame, before h2 reads them: h2 says nothing of most frames on
            # streams already closed.
            control, resets = watch.control, watch.resets
            watch.control = watch.resets = 0
            if control and not self._control.spend(control):
                self._receiving = False
                self._calm("frames that ask for nothing (SETTINGS, PING, PRIORITY, ...)")
                return
            if resets and not self._resets.spend(resets):
                self._receiving = False
                self._calm("RST_STREAM")
                return
        try:
            try:
                events = self._h2.receive_data(data)
            except ProtocolError as e:
                self._protocol_error(e)
                return
            for event in events:
                if self._event(event):
                    return
        finally:
            self._receiving = False
        if (watch.open or self._header_call is not None) and self._watch_header_block():
            return
        self._flush()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._gone = True
        for call in (self._idle_call, self._close_call, self._header_call, self._stall_call):
            if call is not None and call.active():
                call.cancel()
        self._idle_call = self._close_call = self._header_call = self._stall_call = None
        self._held.clear()
        streams, self.streams = self.streams, {}
        self._waiting.clear()
        for stream in streams.values():
            stream.lost("the client connection is gone")
        release, self._release = self._release, None
        if release is not None:
            release(self)

    # The transport's producer: it pauses us while the client reads nothing.

    def pauseProducing(self) -> None:
        self._send_paused = True
        # Nor read more while the client reads nothing: what it sends would be answered
        # into a full buffer (PING and SETTINGS acknowledgements, refusals).
        transport: Any = self.transport
        transport.pauseProducing()
        for stream in self._waiting.values():
            self._arm_send_timer(stream)
        # Whatever is or is not waiting in the streams (an idle event stream, PING
        # acknowledgements): a client that reads nothing for this long is dropped.
        if self._stall_call is None:
            self._stall_call = self._reactor.callLater(self.limits.send_timeout, self.abortClient)

    def resumeProducing(self) -> None:
        self._send_paused = False
        call, self._stall_call = self._stall_call, None
        if call is not None and call.active():
            call.cancel()
        transport: Any = self.transport
        if not self._gone:
            transport.resumeProducing()
        self._send_waiting()
        self._flush()

    def stopProducing(self) -> None:
        pass

    # What the site and the streams ask.

    def getPeer(self) -> IAddress:
        """
        The client's address (asked of the transport once).
        """
        peer = self._peer
        if peer is None:
            transport: Any = self.transport
            peer = self._peer = transport.getPeer()
        return peer

    def getHost(self) -> IAddress:
        """
        The local address (asked of the transport once).
        """
        host = self._host
        if host is None:
            transport: Any = self.transport
            host = self._host = transport.getHost()
        return host

    def isSecure(self) -> bool:
        """
        Whether the transport is TLS.
        """
        secure = self._secure
        if secure is None:
            secure = self._secure = ISSLTransport(self.transport, None) is not None
        return secure

    def shutDown(self) -> None:
        """
        The gateway is draining: GOAWAY with the last stream id; the streams in flight
        finish, then the connection closes (at once when none is open).
        """
        if self._draining or self._gone:
            return
        self._draining = True
        self._flush()
        # Written past h2's state machine, which would refuse every frame after its own
        # GOAWAY: the streams in flight still send their responses.
        frame = GoAwayFrame(0)
        frame.last_stream_id = self._h2.highest_inbound_stream_id
        frame.error_code = ErrorCodes.NO_ERROR
        transport: Any = self.transport
        transport.write(frame.serialize())
        self._close_when_idle()

    def serve_from(self, site: Any) -> None:
        """
        A reload: streams opened from now on, and those whose request waits for
        END_STREAM to be dispatched, are served by C{site}, under its limits (the
        SETTINGS already sent stay: a lower stream cap refuses the streams over it); the
        streams dispatched finish where they are.
        """
        self.site = site
        self.limits = site.limits
        self.idle_timeout = site.timeOut
        for stream in self.streams.values():
            if stream.dispatch_at_end is not None:
                # Not dispatched yet (it waits for END_STREAM), so counted in no
                # configuration's requests in flight: the new one serves it.
                stream.site = site

    def cut_for(self, site: Any) -> None:
        """
        C{site}, replaced by a reload, has drained as long as it may: reset the streams
        it still serves (CANCEL), or drop the connection if it is still C{site}'s.
        """
        if self.site is site:
            self.abortClient()
            return
        for stream in list(self.streams.values()):
            if stream.site is site:
                self.reset_stream(stream, ErrorCodes.CANCEL)

    def abortClient(self) -> None:
        """
        Drop the connection at once (a drain's time is up).
        """
        transport: Any = self.transport
        if transport is not None and not self._gone:
            transport.abortConnection()

    def send_head(
        self, stream: H2ClientStream, code: bytes, headers: Headers, flush: bool = True
    ) -> None:
        """
        Send C{stream}'s response head (written to the transport now when C{flush}, else
        with what follows it).
        """
        fields: list[tuple[bytes, bytes]] = [(b":status", code), (b"date", date_value())]
        fixed = getattr(headers, "fixed", b"")
        if fixed:
            fields += self._fixed_fields(fixed)
        for name, values in raw_fields(headers).items():
            name = name.lower()
            if name in CONNECTION_SPECIFIC:
                continue
            fields += [(name, value) for value in values]
        appended = getattr(headers, "appended", ())
        if appended:
            fields += [(name.lower(), value) for name, value in appended]
        try:
            self._h2.send_headers(stream.stream_id, fields)
        except (StreamClosedError, ProtocolError):
            self._stream_gone(stream, sending=True)
            return
        if flush:
            self._flush_soon()

    def send_continue(self, stream: H2ClientStream) -> None:
        """
        Send C{100 Continue} on C{stream}.
        """
        try:
            self._h2.send_headers(stream.stream_id, [(b":status", b"100")])
        except (StreamClosedError, ProtocolError):
            self._stream_gone(stream, sending=True)
            return
        self._arm_body_timer(stream)
        self._flush_soon()

    def send_pending(self, stream: H2ClientStream, added: int) -> None:
        """
        Send what C{stream} has waiting (C{added} bytes more), as far as the windows
        allow; pause its producer while too much waits, on it or on the connection.
        """
        self._pending_total += added
        self._send(stream)
        if stream.pending_bytes > HIGH_WATER or self._pending_total > CONNECTION_HIGH_WATER:
            stream.pause_producer()
            self.hold(stream)
        else:
            self._resume_held()
        self._flush_soon()

    def end_stream(self, stream: H2ClientStream, added: int = 0) -> None:
        """
        C{stream}'s response is complete (its last C{added} bytes just queued): end it
        once its body is sent.
        """
        self._pending_total += added
        stream.end_after_pending = True
        self._send(stream)
        self._resume_held()
        self._flush_soon()

    def output_full(self) -> bool:
        """
        Whether the connection holds too many response bytes for producers to write
        more.
        """
        return self._pending_total > CONNECTION_HIGH_WATER

    def output_dropped(self, count: int) -> None:
        """
        C{count} waiting response bytes were dropped (their stream is gone).
        """
        self._pending_total -= count
        if count and not self._gone:
            self._resume_held()

    def reset_stream(self, stream: H2ClientStream, code: int = ErrorCodes.INTERNAL_ERROR) -> None:
        """
        Reset C{stream} (its request fails).
        """
        if stream.closed:
            return
        if not self._gone:
            with contextlib.suppress(ProtocolError, StreamClosedError):
                self._h2.reset_stream(stream.stream_id, code)
        self._settle_window(stream)
        self._forget(stream)
        stream.lost("the stream was reset")
        self._flush_soon()

    def body_paused(self, stream: H2ClientStream) -> None:
        """
        C{stream}'s body consumer paused: its body deadline stops.
        """
        timer = stream.body_timer
        if timer is not None and timer.active():
            timer.cancel()
        stream.body_timer = None

    def body_resumed(self, stream: H2ClientStream) -> None:
        """
        C{stream}'s body consumer resumed: acknowledge what it has taken.
        """
        if self._gone:
            return
        self._settle_window(stream)
        if not stream.body_complete and not stream.closed:
            self._arm_body_timer(stream)
        self._flush_soon()

    # Events.

    def _event(self, event: Any) -> bool:
        """
        Act on C{event}; whether the connection is gone now.
        """
        kind = type(event)
        if kind is RequestReceived:
            self._request(event.stream_id, event.headers, event.stream_ended is not None)
        elif kind is DataReceived:
            self._data(event)
        elif kind is StreamEnded:
            self._ended(event.stream_id)
        elif kind is StreamReset:
            self._reset(event.stream_id)
        elif kind is WindowUpdated:
            self._send_waiting()
        elif kind is ConnectionTerminated:
            # The client has gone away: h2 sends nothing more on this connection.
            self._close()
        elif kind is RemoteSettingsChanged and _WINDOW_SETTINGS & event.changed_settings.keys():
            # A larger initial window opens every stream's (RFC 9113 section 6.9.2).
            self._send_waiting()
        return self._gone

    def _request(self, stream_id: int, fields: Any, ended: bool) -> None:
        if self._draining or len(self.streams) >= self.limits.max_streams_per_connection:
            with contextlib.suppress(StreamClosedError, ProtocolError):
                self._h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            if not self._draining and not self._resets.spend():
                self._calm("streams over SETTINGS_MAX_CONCURRENT_STREAMS")
            return
        try:
            head = read_request_head(fields, MAX_HEADER_LIST_SIZE, MAX_HEADER_FIELDS)
            if ended and head.content_length:
                # No DATA to come: its content-length cannot hold (RFC 9113 8.1.1).
                raise MalformedRequestError("END_STREAM on HEADERS with a content-length")
        except MalformedRequestError as e:
            self._count_refusal(400, "malformed_h2_request")
            self.log.debug("stream {id} refused: {why}", id=stream_id, why=str(e))
            with contextlib.suppress(StreamClosedError, ProtocolError):
                self._h2.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            if not self._resets.spend():
                self._calm("malformed requests")
            return
        except HeaderListTooLargeError:
            self._count_refusal(431, "request_header_fields_too_large")
            self._answer_431(stream_id, ended)
            return
        self._not_idle()
        stream = H2ClientStream(self, stream_id, self.site)
        self.streams[stream_id] = stream
        request = self.site.requestFactory(stream, queued=False)
        stream.request = request
        headers = request.requestHeaders
        for name, value in head.fields:
            headers.addRawHeader(name, value)
        request.parseCookies()
        if ended:
            request.gotLength(0)
            request.requestReceived(head.method, head.target, b"HTTP/2")
            return
        stream.body_complete = False
        stream.body_expected = head.content_length
        if head.content_length == 0:
            # Complete, but for END_STREAM: dispatched at END_STREAM, so that DATA the
            # client may yet send finds no upstream request already complete.
            stream.dispatch_at_end = (head.method, head.target)
            self._arm_body_timer(stream)
            return
        request.gotLength(head.content_length)
        expect = headers.getRawHeaders(b"expect")
        if not (expect and expect[0].lower() == b"100-continue"):
            # Else from the 100 Continue, as on HTTP/1.1.
            self._arm_body_timer(stream)
        request.dispatchEarly(head.method, head.target, b"HTTP/2")

    def _data(self, event: DataReceived) -> None:
        length = event.flow_controlled_length
        data = event.data
        stream = self.streams.get(event.stream_id)
        if stream is None or stream.closed or stream.body_complete:
            # A stream refused or done with: its bytes count against the windows only.
            with contextlib.suppress(ProtocolError, StreamClosedError):
                self._h2.acknowledge_received_data(length, event.stream_id)
            return
        received = stream.body_received = stream.body_received + len(data)
        expected = stream.body_expected
        if expected is not None:
            if received > expected:
                # h2 raises for this as well; the gateway does not rely on it.
                stream.unacknowledged += length
                self.reset_stream(stream, ErrorCodes.PROTOCOL_ERROR)
                return
            if received == expected and event.stream_ended is None and data:
                # Complete but for END_STREAM: the last byte waits for it.
                stream.held = data[-1:]
                data = data[:-1]
        stream.data_received(data, length)
        if stream.closed or stream.body_complete or not stream.body_paused:
            self._settle_window(stream)
        if not (stream.body_complete or stream.closed or stream.body_paused):
            self._arm_body_timer(stream)

    def _ended(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.closed or stream.body_complete:
            return
        expected = stream.body_expected
        if expected is not None and stream.body_received != expected:
            self.reset_stream(stream, ErrorCodes.PROTOCOL_ERROR)
            return
        held, stream.held = stream.held, b""
        if held and not stream.data_received(held, 0):
            # Its consumer gave up on it on the way (the stream was reset).
            return
        stream.body_complete = True
        self._settle_window(stream)
        timer = stream.body_timer
        if timer is not None and timer.active():
            timer.cancel()
        stream.body_timer = None
        request = stream.request
        if request is not None:
            waiting = stream.dispatch_at_end
            if waiting is not None:
                stream.dispatch_at_end = None
                request.gotLength(0)
                request.requestReceived(waiting[0], waiting[1], b"HTTP/2")
            else:
                request.requestReceived(request.method, request.uri, b"HTTP/2")
        self._maybe_done(stream)

    def _reset(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._stream_gone(stream)

    def _stream_gone(self, stream: H2ClientStream, sending: bool = False) -> None:
        """
        The client reset C{stream}: its reset reported, or found by a send h2 refused
        (C{sending}: a RST_STREAM later in the same read closed it in h2 before its
        events were seen; the request may be writing, so it hears of it later).
        """
        self._settle_window(stream)
        self._forget(stream)
        if sending:
            stream.lost_later("the client reset the stream", self._reactor)
        else:
            stream.lost("the client reset the stream")

    # Sending.

    def _send(self, stream: H2ClientStream) -> None:
        if stream.closed or self._gone:
            return
        h2 = self._h2
        stream_id = stream.stream_id
        pending = stream.pending
        sent = False
        while pending and not self._send_paused:
            window = min(h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size)
            if window <= 0:
                break
            chunk = pending[0]
            if len(chunk) > window:
                # Sliced without copying the rest: a large single write (a cached
                # compressed file) sent a frame at a time, or a byte at a time to a client
                # granting tiny windows, would otherwise copy it once per frame.
                view = memoryview(chunk)
                pending[0] = view[window:]
                chunk = view[:window]
            else:
                pending.popleft()
            stream.pending_bytes -= len(chunk)
            self._pending_total -= len(chunk)
            last = not pending and stream.end_after_pending
            try:
                h2.send_data(stream_id, chunk, end_stream=last)
            except (StreamClosedError, ProtocolError):
                self._stream_gone(stream, sending=True)
                return
            self._control.refund(len(chunk) / REFUND_BYTES)
            sent = True
            if last:
                self._finished(stream)
                return
        if not pending and stream.end_after_pending:
            try:
                h2.end_stream(stream_id)
            except (StreamClosedError, ProtocolError):
                self._stream_gone(stream, sending=True)
                return
            self._finished(stream)
            return
        if pending:
            self._waiting[stream_id] = stream
            if sent or stream.send_timer is None:
                self._arm_send_timer(stream)
        else:
            self._waiting.pop(stream_id, None)
            timer = stream.send_timer
            if timer is not None and timer.active():
                timer.cancel()
            stream.send_timer = None
        if stream.pending_bytes < LOW_WATER:
            if self._pending_total < CONNECTION_LOW_WATER:
                self._held.discard(stream)
                stream.resume_producer()
            else:
                # Resumed once the connection's output drains (_resume_held).
                self._held.add(stream)

    def _send_waiting(self) -> None:
        for stream in sorted(self._waiting.values(), key=lambda s: s.stream_id):
            if self._send_paused:
                break
            self._send(stream)
        self._resume_held()

    def hold(self, stream: H2ClientStream) -> None:
        """
        C{stream}'s producer waits for the connection's output to drain.
        """
        if not stream.closed:
            self._held.add(stream)

    def _resume_held(self) -> None:
        """
        Resume the producers held for the connection's output, once it has drained
        (wherever output drops: after sends, when a stream's waiting bytes are dropped).
        """
        if self._resuming:
            self._resume_again = True
            return
        self._resuming = True
        try:
            while self._held and self._pending_total < CONNECTION_LOW_WATER:
                self._resume_again = False
                for stream in list(self._held):
                    if self._pending_total >= CONNECTION_LOW_WATER:
                        break
                    if stream.pending_bytes < LOW_WATER:
                        self._held.discard(stream)
                        stream.resume_producer()
                if not self._resume_again:
                    break
        finally:
            self._resuming = False

    def _finished(self, stream: H2ClientStream) -> None:
        """
        C{stream}'s response was sent whole.
        """
        self._waiting.pop(stream.stream_id, None)
        timer = stream.send_timer
        if timer is not None and timer.active():
            timer.cancel()
        stream.send_timer = None
        if not stream.body_complete:
            # Answered before its body arrived: the client may stop sending it.
            with contextlib.suppress(ProtocolError, StreamClosedError):
                self._h2.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)
            stream.body_complete = True
            stream.held = b""
            self._settle_window(stream)
            timer = stream.body_timer
            if timer is not None and timer.active():
                timer.cancel()
            stream.body_timer = None
            request = stream.request
            if request is not None and not request.body.complete:
                request.body.abandon()
        stream.closed = True
        self._maybe_done(stream)

    def _maybe_done(self, stream: H2ClientStream) -> None:
        if stream.closed and stream.body_complete:
            self._forget(stream)
            # Nothing more for it to do: no reference from the stream keeps it alive.
            stream.request = None

    def _forget(self, stream: H2ClientStream) -> None:
        self._held.discard(stream)
        stream_id = stream.stream_id
        if self.streams.pop(stream_id, None) is not None and not self.streams:
            if self._draining:
                self._close_when_idle()
            else:
                self._idle()
        self._waiting.pop(stream_id, None)

    def _settle_window(self, stream: H2ClientStream) -> None:
        """
        Acknowledge what C{stream} received and held unacknowledged: its consumer took
        it, or the stream is done with (the connection's window gets it back either way).
        """
        count, stream.unacknowledged = stream.unacknowledged, 0
        if count and not self._gone:
            with contextlib.suppress(ProtocolError, StreamClosedError):
                self._h2.acknowledge_received_data(count, stream.stream_id)

    def _flush_soon(self) -> None:
        if not self._receiving:
            self._flush()

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and not self._gone:
            transport: Any = self.transport
            transport.write(data)

    # Refusals and errors.

    def _answer_431(self, stream_id: int, ended: bool) -> None:
        # A head alone, needing no window.
        h2 = self._h2
        with contextlib.suppress(ProtocolError, StreamClosedError):
            h2.send_headers(
                stream_id, [(b":status", b"431"), (b"content-length", b"0")], end_stream=True
            )
            if not ended:
                h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)

    def _count_refusal(self, code: int, reason: str) -> None:
        metrics = getattr(self.site, "metrics", None)
        if metrics is not None:
            metrics.edge_refused(code, reason)

    def _calm(self, what: str) -> None:
        """
        The client spent a budget: GOAWAY ENHANCE_YOUR_CALM, every stream cancelled
        (their upstream requests with them), and the connection closed.
        """
        self.log.warn(
            "HTTP/2 client {peer} sent too many {what}: connection closed (ENHANCE_YOUR_CALM)",
            peer=str(self.getPeer()),
            what=what,
        )
        with contextlib.suppress(ProtocolError):
            self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
        self._flush()
        self._close()

    def _protocol_error(self, error: ProtocolError) -> None:
        self.log.debug(
            "HTTP/2 protocol error from {peer}: {error}", peer=str(self.getPeer()), error=error
        )
        self._flush()
        self._close()

    def _close(self) -> None:
        """
        Close: streams in flight fail now, the transport once what was written is out
        (or after the send timeout).
        """
        if self._gone:
            return
        self._gone = True
        streams, self.streams = self.streams, {}
        self._waiting.clear()
        for stream in streams.values():
            stream.lost("the connection closed")
        self._lose_transport()

    def _close_when_idle(self) -> None:
        if not self.streams and not self._gone:
            self._flush()
            self._gone = True
            self._lose_transport()

    def _lose_transport(self) -> None:
        transport: Any = self.transport
        # The TLS layer closes only once no producer is registered with it, and reads
        # the client's close_notify: reading held for a client that read nothing resumes.
        transport.unregisterProducer()
        if self._send_paused:
            transport.resumeProducing()
        transport.loseConnection()
        self._close_call = self._reactor.callLater(
            self.limits.send_timeout, transport.abortConnection
        )

    # Timers.

    def _idle(self) -> None:
        timeout = self.idle_timeout
        if timeout and self._idle_call is None and not self._gone:
            self._idle_call = self._reactor.callLater(timeout, self._idle_timed_out)

    def _not_idle(self) -> None:
        call = self._idle_call
        if call is not None:
            self._idle_call = None
            if call.active():
                call.cancel()

    def _idle_timed_out(self) -> None:
        self._idle_call = None
        if self.streams or self._gone:
            return
        with contextlib.suppress(ProtocolError):
            self._h2.close_connection(ErrorCodes.NO_ERROR)
        self._flush()
        self._close()

    def _watch_header_block(self) -> bool:
        """
        Bound a header block still arriving: in bytes (L{HEADER_BLOCK_BOUND}) and in
        time (C{limits.headerTimeout}, whatever streams are open). Whether the
        connection is gone now.
        """
        watch = self._watch
        if not watch.open:
            call, self._header_call = self._header_call, None
            if call is not None and call.active():
                call.cancel()
            return False
        if watch.block_bytes > HEADER_BLOCK_BOUND:
            self._calm("header block bytes (CONTINUATION)")
            return True
        if self._header_call is None:
            self._header_call = self._reactor.callLater(
                self.limits.header_timeout, self._header_timed_out
            )
        return False

    def _header_timed_out(self) -> None:
        self._header_call = None
        if self._watch.open and not self._gone:
            self.log.debug("HTTP/2 header block from {peer} overdue", peer=str(self.getPeer()))
            with contextlib.suppress(ProtocolError):
                self._h2.close_connection(ErrorCodes.PROTOCOL_ERROR)
            self._flush()
            self._close()

    def _arm_body_timer(self, stream: H2ClientStream) -> None:
        stream.body_timer = self._restart(
            stream.body_timer, self.limits.body_timeout, self._body_timed_out, stream
        )

    def _restart(self, timer: Any, timeout: float, expired: Any, stream: H2ClientStream) -> Any:
        """
        C{timer} moved to C{timeout} from now, or a new one calling C{expired(stream)}.
        """
        if timer is not None and timer.active():
            timer.reset(timeout)
            return timer
        return self._reactor.callLater(timeout, expired, stream)

    def _body_timed_out(self, stream: H2ClientStream) -> None:
        stream.body_timer = None
        if stream.closed or stream.body_complete:
            return
        self.log.debug("stream {id}: request body overdue", id=stream.stream_id)
        request = stream.request
        if request is not None and not request.startedWriting:
            self._count_refusal(408, "request_timeout")
        self.reset_stream(stream, ErrorCodes.CANCEL)

    def _arm_send_timer(self, stream: H2ClientStream) -> None:
        stream.send_timer = self._restart(
            stream.send_timer, self.limits.send_timeout, self._send_timed_out, stream
        )

    def _send_timed_out(self, stream: H2ClientStream) -> None:
        # A client that opens no window for this long would otherwise hold the stream,
        # and the upstream exchange paused behind it, for ever.
        stream.send_timer = None
        if self._send_paused:
            # Nothing moves on the whole connection: the client reads nothing at all.
            self.abortClient()
            return
        self.reset_stream(stream, ErrorCodes.CANCEL)

    def _fixed_fields(self, fixed: bytes) -> list[tuple[bytes, bytes]]:
        known, fields = self._fixed
        if fixed is not known:
            fields = []
            for line in fixed.split(b"\r\n"):
                if line:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name not in CONNECTION_SPECIFIC:
                        fields.append((name, value.strip()))
            self._fixed = (fixed, fields)
        return fields
