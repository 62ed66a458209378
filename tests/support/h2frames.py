"""
Raw HTTP/2 for attack tests: frames built one by one with C{hyperframe} and C{hpack}, and
L{RawH2Client}, a client over a real TLS socket that sends exactly the bytes a test
writes and parses every frame the server sends (no state machine of its own that could
answer, refuse or close on the test's behalf).

Time never decides anything here: L{RawH2Client.sync} sends a PING and waits for its
acknowledgement, which a server sends only after it has read every frame before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from hpack import Decoder, Encoder
from hpack.hpack import encode_integer
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.python.failure import Failure

reactor: Any = _reactor

__all__ = [
    "PREFACE",
    "RawH2Client",
    "RawResponse",
    "connect_raw",
    "continuation",
    "data",
    "goaway",
    "header_frames",
    "headers",
    "literal",
    "ping",
    "priority",
    "rst",
    "settings",
    "unknown",
    "window_update",
]

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# RFC 9113 section 7.
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

# RFC 9113 section 6.5.2.
HEADER_TABLE_SIZE: Final = 0x1
ENABLE_PUSH: Final = 0x2
MAX_CONCURRENT_STREAMS: Final = 0x3
INITIAL_WINDOW_SIZE: Final = 0x4
MAX_FRAME_SIZE: Final = 0x5
MAX_HEADER_LIST_SIZE: Final = 0x6

DEFAULT_FRAME_SIZE: Final = 16384


# -- frames ----------------------------------------------------------------------------


def headers(
    stream_id: int, block: bytes, end_stream: bool = False, end_headers: bool = True
) -> bytes:
    """
    A HEADERS frame carrying C{block} (an HPACK header block, or a piece of one).
    """
    flags = []
    if end_stream:
        flags.append("END_STREAM")
    if end_headers:
        flags.append("END_HEADERS")
    return HeadersFrame(stream_id, block, flags=flags).serialize()


def continuation(stream_id: int, block: bytes, end_headers: bool = False) -> bytes:
    """
    A CONTINUATION frame.
    """
    flags = ["END_HEADERS"] if end_headers else []
    return ContinuationFrame(stream_id, block, flags=flags).serialize()


def header_frames(
    stream_id: int, block: bytes, end_stream: bool = False, size: int = DEFAULT_FRAME_SIZE
) -> bytes:
    """
    C{block} as one HEADERS frame and as many CONTINUATION frames as frames of C{size}
    bytes need.
    """
    pieces = [block[i : i + size] for i in range(0, len(block), size)] or [b""]
    out = [headers(stream_id, pieces[0], end_stream, end_headers=len(pieces) == 1)]
    for index, piece in enumerate(pieces[1:], 2):
        out.append(continuation(stream_id, piece, end_headers=index == len(pieces)))
    return b"".join(out)


def data(stream_id: int, payload: bytes = b"", end_stream: bool = False) -> bytes:
    """
    A DATA frame.
    """
    flags = ["END_STREAM"] if end_stream else []
    return DataFrame(stream_id, payload, flags=flags).serialize()


def rst(stream_id: int, code: int = CANCEL) -> bytes:
    """
    An RST_STREAM frame.
    """
    return RstStreamFrame(stream_id, code).serialize()


def settings(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    """
    A SETTINGS frame (or its acknowledgement).
    """
    if ack:
        return SettingsFrame(0, flags=["ACK"]).serialize()
    return SettingsFrame(0, dict(values or {})).serialize()


def ping(opaque: bytes = b"\0" * 8, ack: bool = False) -> bytes:
    """
    A PING frame.
    """
    return PingFrame(0, opaque, flags=["ACK"] if ack else []).serialize()


def window_update(stream_id: int, increment: int) -> bytes:
    """
    A WINDOW_UPDATE frame.
    """
    return WindowUpdateFrame(stream_id, increment).serialize()


def priority(stream_id: int, depends_on: int = 0, weight: int = 15) -> bytes:
    """
    A PRIORITY frame.
    """
    return PriorityFrame(stream_id, depends_on=depends_on, stream_weight=weight).serialize()


def goaway(last_stream_id: int = 0, code: int = NO_ERROR) -> bytes:
    """
    A GOAWAY frame.
    """
    return GoAwayFrame(0, last_stream_id, code).serialize()


def unknown(kind: int, stream_id: int = 0, payload: bytes = b"") -> bytes:
    """
    A frame of a type RFC 9113 does not define (to be ignored by the receiver).
    """
    # Built by hand: hyperframe's ExtensionFrame.serialize writes a length of 0.
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream_id.to_bytes(4, "big") + payload
    )


def literal(name: bytes, value: bytes) -> bytes:
    """
    One field as an HPACK literal without indexing, its name and value not Huffman-coded:
    the decoder's table stays as it was, whatever the field says.
    """
    return (
        b"\x00"
        + bytes(encode_integer(len(name), 7))
        + name
        + bytes(encode_integer(len(value), 7))
        + value
    )


def literal_indexed(name: bytes, value: bytes) -> bytes:
    """
    One field as an HPACK literal with incremental indexing (new name, no Huffman): the
    decoder adds it to its dynamic table.
    """
    return (
        b"\x40"
        + bytes(encode_integer(len(name), 7))
        + name
        + bytes(encode_integer(len(value), 7))
        + value
    )


def indexed(index: int) -> bytes:
    """
    One field as an HPACK index (62 is the newest entry of the dynamic table).
    """
    encoded = encode_integer(index, 7)
    encoded[0] |= 0x80
    return bytes(encoded)


def table_size_update(size: int) -> bytes:
    """
    An HPACK dynamic table size update.
    """
    encoded = encode_integer(size, 5)
    encoded[0] |= 0x20
    return bytes(encoded)


# -- the client ------------------------------------------------------------------------


class RawResponse:
    """
    What came back on one stream.

    @ivar heads: Each header block decoded (informational, final, trailers), in order.
    @ivar body: The DATA received.
    @ivar ended: Whether END_STREAM arrived.
    @ivar reset: The RST_STREAM error code, or L{None}.
    """

    def __init__(self) -> None:
        self.heads: list[list[tuple[bytes, bytes]]] = []
        self.body = b""
        self.ended = False
        self.reset: int | None = None

    @property
    def final(self) -> list[tuple[bytes, bytes]] | None:
        """
        The final head (not informational), or L{None} before it.
        """
        for head in self.heads:
            status = dict(head).get(b":status")
            if status is not None and not status.startswith(b"1"):
                return head
        return None

    @property
    def status(self) -> int | None:
        """
        The final status, or L{None} before it.
        """
        head = self.final
        return None if head is None else int(dict(head)[b":status"])

    def header(self, name: bytes) -> bytes | None:
        """
        The first value of C{name} in the final head.
        """
        for key, value in self.final or ():
            if key == name:
                return value
        return None

    @property
    def done(self) -> bool:
        """
        Whether the stream is over (ended or reset).
        """
        return self.ended or self.reset is not None


class RawH2Client(Protocol):
    """
    An HTTP/2 client that sends what the test writes and records every frame it gets.

    @ivar frames: Every frame received, in order.
    @ivar server_settings: The values of the server's first SETTINGS frame.
    @ivar goaway: The GOAWAY frame received, or L{None}.
    @ivar responses: What came back, by stream id.
    @ivar lost: Whether the connection is gone.
    @ivar received_bytes: How many bytes came (after TLS).
    @ivar uploaded: DATA bytes sent so far by L{upload}, by stream id.
    @ivar granted: The sum of the server's WINDOW_UPDATE increments, by stream id (0:
        the connection's).
    """

    def __init__(
        self,
        client_settings: dict[int, int] | None = None,
        ack_settings: bool = True,
        open_windows: bool = False,
        after_preface: bytes = b"",
    ) -> None:
        """
        @param client_settings: Sent in the connection preface's SETTINGS frame.
        @param after_preface: Sent in the same write as the preface (one TLS record,
            read by the server at once: its acknowledgement of the preface's SETTINGS
            tells that it has read these too).
        @param ack_settings: Acknowledge the server's SETTINGS (as every real client
            does).
        @param open_windows: Reopen the server's windows for every DATA received (a
            client that reads); otherwise the server may send only the initial windows.
        """
        self.client_settings = client_settings or {}
        self.ack_settings = ack_settings
        self.open_windows = open_windows
        self.after_preface = after_preface
        self.encoder = Encoder()
        self.decoder = Decoder(max_header_list_size=1 << 30)
        self.frames: list[Frame] = []
        self.server_settings: dict[int, int] | None = None
        self.goaway: GoAwayFrame | None = None
        self.responses: dict[int, RawResponse] = {}
        self.lost = False
        self.closed: Deferred[None] = Deferred()
        self.received_bytes = 0
        self.uploaded: dict[int, int] = {}
        self.granted: dict[int, int] = {}
        self.next_stream_id = 1
        self.connection_window = 65535
        self.stream_windows: dict[int, int] = {}
        self._uploads: dict[int, tuple[int, bool]] = {}
        self._buffer = b""
        self._block: tuple[int, bytes] | None = None
        self._pings = 0
        self._waiting: list[tuple[Callable[[], bool], Deferred[None]]] = []

    # Protocol

    def connectionMade(self) -> None:
        self.write(PREFACE + settings(self.client_settings) + self.after_preface)

    def dataReceived(self, received: bytes) -> None:
        self.received_bytes += len(received)
        self._buffer += received
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= 9:
            length = int.from_bytes(buffer[offset : offset + 3], "big")
            if len(buffer) - offset - 9 < length:
                break
            frame, _ = Frame.parse_frame_header(memoryview(buffer[offset : offset + 9]))
            frame.parse_body(memoryview(buffer[offset + 9 : offset + 9 + length]))
            offset += 9 + length
            self._frame(frame)
        self._buffer = buffer[offset:]
        self._pump()
        self._check()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost = True
        waiting, self._waiting = self._waiting, []
        for condition, waiter in waiting:
            if condition():
                waiter.callback(None)
            else:
                waiter.errback(ConnectionError(f"connection lost; goaway {self.goaway!r}"))
        self.closed.callback(None)

    def _frame(self, frame: Frame) -> None:
        self.frames.append(frame)
        if isinstance(frame, SettingsFrame):
            if "ACK" not in frame.flags:
                if self.server_settings is None:
                    self.server_settings = dict(frame.settings)
                    if INITIAL_WINDOW_SIZE in frame.settings:
                        initial = frame.settings[INITIAL_WINDOW_SIZE]
                        for stream_id in self.stream_windows:
                            self.stream_windows[stream_id] += initial - 65535
                if self.ack_settings:
                    self.write(settings(ack=True))
        elif isinstance(frame, GoAwayFrame):
            self.goaway = frame
        elif isinstance(frame, HeadersFrame):
            self._block = (frame.stream_id, frame.data)
            if "END_HEADERS" in frame.flags:
                self._head_done()
            if "END_STREAM" in frame.flags:
                self.response(frame.stream_id).ended = True
        elif isinstance(frame, ContinuationFrame):
            assert self._block is not None
            self._block = (self._block[0], self._block[1] + frame.data)
            if "END_HEADERS" in frame.flags:
                self._head_done()
        elif isinstance(frame, DataFrame):
            response = self.response(frame.stream_id)
            response.body += frame.data
            if "END_STREAM" in frame.flags:
                response.ended = True
            length = frame.flow_controlled_length
            if self.open_windows and length:
                self.write(window_update(0, length) + window_update(frame.stream_id, length))
        elif isinstance(frame, RstStreamFrame):
            self.response(frame.stream_id).reset = frame.error_code
        elif isinstance(frame, WindowUpdateFrame):
            self.granted[frame.stream_id] = (
                self.granted.get(frame.stream_id, 0) + frame.window_increment
            )
            if frame.stream_id == 0:
                self.connection_window += frame.window_increment
            else:
                self.stream_windows[frame.stream_id] = (
                    self.stream_windows.get(frame.stream_id, self._initial_window())
                    + frame.window_increment
                )

    def _head_done(self) -> None:
        assert self._block is not None
        stream_id, block = self._block
        self._block = None
        fields = [(bytes(n), bytes(v)) for n, v in self.decoder.decode(block, raw=True)]
        self.response(stream_id).heads.append(fields)

    def _initial_window(self) -> int:
        return (self.server_settings or {}).get(INITIAL_WINDOW_SIZE, 65535)

    def _check(self) -> None:
        still = []
        for condition, waiter in self._waiting:
            if condition():
                waiter.callback(None)
            else:
                still.append((condition, waiter))
        self._waiting = still

    # What tests do.

    def response(self, stream_id: int) -> RawResponse:
        """
        What came back on C{stream_id} so far.
        """
        response = self.responses.get(stream_id)
        if response is None:
            response = self.responses[stream_id] = RawResponse()
        return response

    def write(self, raw: bytes) -> None:
        """
        Send C{raw} as it is.
        """
        if not self.lost and self.transport is not None:
            self.transport.write(raw)

    def send(self, *frames: bytes) -> None:
        """
        Send C{frames} in one write.
        """
        self.write(b"".join(frames))

    def block(self, fields: Iterable[tuple[bytes, bytes]]) -> bytes:
        """
        C{fields} HPACK-encoded with this connection's encoder (in order, names as given).
        """
        return bytes(self.encoder.encode(list(fields), huffman=True))

    def request_frames(
        self,
        method: bytes = b"GET",
        path: bytes = b"/",
        fields: Iterable[tuple[bytes, bytes]] = (),
        authority: bytes | None = b"localhost",
        end_stream: bool = True,
        stream_id: int | None = None,
    ) -> tuple[int, bytes]:
        """
        The frames of a request head (a new stream unless C{stream_id}), not sent.
        """
        if stream_id is None:
            stream_id = self.next_stream_id
        self.next_stream_id = max(self.next_stream_id, stream_id + 2)
        pseudo = [(b":method", method), (b":scheme", b"https")]
        if authority is not None:
            pseudo.append((b":authority", authority))
        pseudo.append((b":path", path))
        self.response(stream_id)
        self.stream_windows.setdefault(stream_id, self._initial_window())
        return stream_id, header_frames(stream_id, self.block(pseudo + list(fields)), end_stream)

    def request(
        self,
        method: bytes = b"GET",
        path: bytes = b"/",
        fields: Iterable[tuple[bytes, bytes]] = (),
        authority: bytes | None = b"localhost",
        end_stream: bool = True,
        stream_id: int | None = None,
    ) -> int:
        """
        Send a request head; return its stream id.
        """
        stream_id, frames = self.request_frames(
            method, path, fields, authority, end_stream, stream_id
        )
        self.write(frames)
        return stream_id

    def upload(self, stream_id: int, total: int, end: bool = True) -> None:
        """
        Send C{total} bytes of DATA on C{stream_id} as the server's windows allow (the
        rest as they open), ending the stream after them when C{end}.
        """
        self._uploads[stream_id] = (total, end)
        self.uploaded.setdefault(stream_id, 0)
        self._pump()

    def upload_left(self, stream_id: int) -> int:
        """
        How many bytes L{upload} still has to send on C{stream_id}.
        """
        return self._uploads.get(stream_id, (0, False))[0]

    def _pump(self) -> None:
        out = []
        for stream_id, (left, end) in list(self._uploads.items()):
            if self.lost or self.response(stream_id).reset is not None:
                del self._uploads[stream_id]
                continue
            while left:
                room = min(
                    self.connection_window,
                    self.stream_windows.get(stream_id, self._initial_window()),
                    DEFAULT_FRAME_SIZE,
                    left,
                )
                if room <= 0:
                    break
                left -= room
                self.connection_window -= room
                self.stream_windows[stream_id] = (
                    self.stream_windows.get(stream_id, self._initial_window()) - room
                )
                self.uploaded[stream_id] += room
                out.append(data(stream_id, b"u" * room, end_stream=end and not left))
            if left:
                self._uploads[stream_id] = (left, end)
            else:
                del self._uploads[stream_id]
        if out:
            self.write(b"".join(out))

    def until(self, condition: Callable[[], bool]) -> Deferred[None]:
        """
        Fire once C{condition()} holds (checked after every read); fail if the
        connection is lost first.
        """
        waiter: Deferred[None] = Deferred()
        if condition():
            waiter.callback(None)
        elif self.lost:
            waiter.errback(ConnectionError(f"connection lost; goaway {self.goaway!r}"))
        else:
            self._waiting.append((condition, waiter))
        return waiter

    def sync(self, before: bytes = b"") -> Deferred[None]:
        """
        Send C{before} and a PING; fire once the server acknowledges the PING (it has
        then read and acted on every frame sent before it), or once it sends GOAWAY
        (after which it may read nothing more).
        """
        self._pings += 1
        opaque = self._pings.to_bytes(8, "big")
        self.write(before + ping(opaque))

        def acked() -> bool:
            return self.goaway is not None or any(
                isinstance(f, PingFrame) and "ACK" in f.flags and f.opaque_data == opaque
                for f in self.frames
            )

        return self.until(acked)

    def settings_acked(self) -> bool:
        """
        Whether the server has acknowledged the preface's SETTINGS.
        """
        return any(isinstance(f, SettingsFrame) and "ACK" in f.flags for f in self.frames)

    def ended_by_server(self) -> bool:
        """
        Whether the server has sent GOAWAY or closed the connection.
        """
        return self.goaway is not None or self.lost

    def abort(self) -> None:
        """
        Drop the connection now.
        """
        transport: Any = self.transport
        if not self.lost and transport is not None:
            transport.abortConnection()

    async def shut(self) -> None:
        """
        Drop the connection now and wait until it is gone (a test's cleanup).
        """
        self.abort()
        await self.closed


async def connect_raw(
    test: Any,
    port: int,
    client_settings: dict[int, int] | None = None,
    ack_settings: bool = True,
    open_windows: bool = False,
    after_preface: bytes = b"",
) -> RawH2Client:
    """
    Connect a L{RawH2Client} over TLS with ALPN C{h2} (trusting the certificate
    L{listen_tls<tests.support.h2client.listen_tls>} made), and wait for the server's
    SETTINGS. Dropped when the test ends.
    """
    options = optionsForClientTLS(
        "localhost",
        trustRoot=Certificate.loadPEM(test.tls_certificate),
        acceptableProtocols=[b"h2"],
    )
    endpoint = wrapClientTLS(options, TCP4ClientEndpoint(reactor, "127.0.0.1", port))
    client = RawH2Client(client_settings, ack_settings, open_windows, after_preface)
    await connectProtocol(endpoint, client)
    test.addCleanup(client.shut)
    await client.until(lambda: client.server_settings is not None)
    return client
