"""
An HTTP/2 client for tests, on the C{h2} library over a real TLS socket: ordinary
requests (L{H2Client.request}), and raw frames for the attacks (L{H2Client.send_raw},
L{H2Client.events}).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    InformationalResponseReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from OpenSSL import SSL
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from tests.support.certificates import make_certificate

reactor: Any = _reactor


@implementer(IOpenSSLContextFactory)
class TestContext:
    """
    A server TLS context for C{localhost} with ALPN (C{h2}, then C{http/1.1}), and the
    certificate a client trusts it by. (The gateway builds its own from
    C{Gateway.spec.tls}; this one serves a site in-process.)
    """

    def __init__(self, directory: str, protocols: tuple[bytes, ...] = (b"h2", b"http/1.1")):
        key_path, cert_path, self.certificate_pem = make_certificate(directory, "localhost")
        context = SSL.Context(SSL.TLS_SERVER_METHOD)
        context.use_privatekey_file(key_path)
        context.use_certificate_file(cert_path)

        def select(connection: Any, offered: list[bytes]) -> Any:
            for name in protocols:
                if name in offered:
                    return name
            return SSL.NO_OVERLAPPING_PROTOCOLS

        context.set_alpn_select_callback(select)
        self._context = context

    def getContext(self) -> SSL.Context:
        return self._context


def listen_tls(test: Any, site: Any, http2: bool = True) -> int:
    """
    Listen C{site} on 127.0.0.1 over TLS with ALPN (C{h2} when C{http2}); return the
    port. Undone when the test ends.
    """
    site.http2 = http2
    protocols = (b"h2", b"http/1.1") if http2 else (b"http/1.1",)
    directory = test.mktemp()
    os.makedirs(directory)
    context = TestContext(directory, protocols)
    test.tls_certificate = context.certificate_pem
    factory = TLSMemoryBIOFactory(context, False, site)
    # As the gateway's TLSServerEndpoint does.
    factory.protocol = TLSMemoryBIOProtocol
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    test.addCleanup(port.stopListening)
    return int(port.getHost().port)


class Response:
    """
    A response as the client got it.
    """

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.informational: list[int] = []
        self.body = b""
        self.reset: int | None = None
        self.done: Deferred[Response] = Deferred()

    def header(self, name: bytes) -> bytes | None:
        """
        The first value of C{name}.
        """
        for key, value in self.headers:
            if key == name:
                return value
        return None


class H2Client(Protocol):
    """
    One HTTP/2 connection to a server, driven by the test.

    @ivar events: Every h2 event received, in order.
    @ivar received: Every byte received (raw, after TLS).
    @ivar negotiated: The ALPN protocol.
    """

    def __init__(self, auto_window: bool = True) -> None:
        # Sends what it is given, malformed included: the gateway's checks are tested.
        self.h2 = H2Connection(
            H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self.events: list[Any] = []
        self.received = b""
        self.responses: dict[int, Response] = {}
        self.closed: Deferred[None] = Deferred()
        self.negotiated: bytes | None = None
        self.auto_window = auto_window
        self.terminated: ConnectionTerminated | None = None
        self._waiting: list[tuple[Callable[[], bool], Deferred[None]]] = []
        self._uploads: dict[int, tuple[bytes, bool]] = {}
        self._lost = False

    def connectionMade(self) -> None:
        self.h2.initiate_connection()
        self.negotiated = getattr(self.transport, "negotiatedProtocol", None)
        self._flush()

    def dataReceived(self, data: bytes) -> None:
        self.negotiated = getattr(self.transport, "negotiatedProtocol", None)
        self.received += data
        try:
            events = self.h2.receive_data(data)
        except Exception:
            events = []
        for event in events:
            self.events.append(event)
            self._event(event)
        self._flush()
        self._check()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._lost = True
        for response in self.responses.values():
            if not response.done.called:
                response.done.errback(ConnectionError("connection lost"))
        self._check(final=True)
        self.closed.callback(None)

    def _event(self, event: Any) -> None:
        response = self.responses.get(getattr(event, "stream_id", None) or 0)
        if isinstance(event, ResponseReceived) and response is not None:
            for name, value in event.headers:
                if name == b":status":
                    response.status = int(value)
                else:
                    response.headers.append((name, value))
        elif isinstance(event, InformationalResponseReceived) and response is not None:
            response.informational.append(int(dict(event.headers)[b":status"]))
        elif isinstance(event, DataReceived):
            if response is not None:
                response.body += event.data
            if self.auto_window and event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, StreamEnded) and response is not None:
            if not response.done.called:
                response.done.callback(response)
        elif isinstance(event, StreamReset) and response is not None:
            response.reset = event.error_code
            if not response.done.called:
                response.done.callback(response)
        elif isinstance(event, ConnectionTerminated):
            self.terminated = event
        elif isinstance(event, WindowUpdated) and self._uploads:
            self._send_uploads()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self._lost:
            self.transport.write(data)

    def _check(self, final: bool = False) -> None:
        still = []
        for condition, waiter in self._waiting:
            if condition():
                waiter.callback(None)
            elif final:
                waiter.errback(ConnectionError("connection lost before the condition held"))
            else:
                still.append((condition, waiter))
        self._waiting = still

    def until(self, condition: Callable[[], bool]) -> Deferred[None]:
        """
        Fire once C{condition()} holds (checked after every read).
        """
        waiter: Deferred[None] = Deferred()
        if condition():
            waiter.callback(None)
        elif self._lost:
            waiter.errback(ConnectionError("connection lost"))
        else:
            self._waiting.append((condition, waiter))
        return waiter

    def start(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes | None = None,
        authority: bytes = b"localhost",
        end: bool = True,
    ) -> tuple[int, Response]:
        """
        Open a stream with a request (its body when given; the stream left open for
        more when not C{end}); return its id and its response.
        """
        stream_id = self.h2.get_next_available_stream_id()
        fields = [
            (b":method", method),
            (b":scheme", b"https"),
            (b":authority", authority),
            (b":path", path),
            *list(headers or []),
        ]
        response = self.responses[stream_id] = Response()
        self.h2.send_headers(stream_id, fields, end_stream=end and not body)
        if body:
            self.send_body(stream_id, body, end)
        self._flush()
        return stream_id, response

    def send_body(self, stream_id: int, body: bytes, end: bool = True) -> None:
        """
        Send C{body} on C{stream_id} as the server's windows allow (the rest when they
        open), ending the stream after it when C{end}.
        """
        self._uploads[stream_id] = (body, end)
        self._send_uploads()

    def _send_uploads(self) -> None:
        for stream_id, (body, end) in list(self._uploads.items()):
            while body:
                room = min(
                    self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
                )
                if room <= 0:
                    break
                self.h2.send_data(stream_id, body[:room])
                body = body[room:]
            if body:
                self._uploads[stream_id] = (body, end)
                continue
            del self._uploads[stream_id]
            if end:
                self.h2.end_stream(stream_id)
        self._flush()

    def request(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes | None = None,
        authority: bytes = b"localhost",
    ) -> Deferred[Response]:
        """
        Send a whole request; fire with its whole response.
        """
        _, response = self.start(method, path, headers, body, authority)
        return response.done

    def send_raw(self, data: bytes) -> None:
        """
        Write bytes as they are (frames the h2 state machine would not send).
        """
        assert self.transport is not None
        self.transport.write(data)

    def flush(self) -> None:
        """
        Send what the h2 state machine has queued.
        """
        self._flush()

    def close(self) -> None:
        """
        Close the connection.
        """
        if self.transport is not None:
            self.transport.loseConnection()

    async def shut(self) -> None:
        """
        Drop the connection now and wait until it is gone (a test's cleanup: nothing of
        it is left for the next test).
        """
        transport: Any = self.transport
        if not self._lost and transport is not None:
            transport.abortConnection()
        await self.closed


async def connect_h2(
    test: Any, port: int, protocols: list[bytes] | None = None, auto_window: bool = True
) -> H2Client:
    """
    Connect an L{H2Client} over TLS (trusting the certificate L{listen_tls} made),
    offering C{protocols} (C{h2} by default) by ALPN. Dropped when the test ends.
    """
    options = optionsForClientTLS(
        "localhost",
        trustRoot=Certificate.loadPEM(test.tls_certificate),
        acceptableProtocols=protocols or [b"h2"],
    )
    endpoint = wrapClientTLS(options, TCP4ClientEndpoint(reactor, "127.0.0.1", port))
    client = H2Client(auto_window)
    await connectProtocol(endpoint, client)
    test.addCleanup(client.shut)
    return client
