"""
Real test backends on 127.0.0.1:0, for tests of anything that talks to upstreams.

  - L{SiteBackend}: a Twisted L{Site} whose answer is configurable per test and which
    records the requests it received and the connections it accepted;
  - L{RawBackend}: a plain TCP server that answers each request with scripted bytes
    (malformed responses, early answers, closes at chosen moments);
  - L{tls_site_backend}: a L{SiteBackend} behind TLS with a generated self-signed
    certificate, and the trust root a client needs to verify it.

Every backend's C{stop} closes its listening port and every connection it accepted, and
waits until they are gone, so that tests leave a clean reactor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.ssl import Certificate, PrivateCertificate
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Request, Site
from zope.interface import implementer

from edgegw.upstream.upstreams import Upstream

reactor: Any = _global_reactor

__all__ = [
    "RawBackend",
    "RawConnection",
    "RawRequest",
    "RecordedRequest",
    "SiteBackend",
    "answer",
    "scripted",
    "tls_site_backend",
]


# -- a Twisted Site --------------------------------------------------------------------


@attrs.define
class RecordedRequest:
    """
    A request as a L{SiteBackend} saw it.
    """

    method: bytes
    uri: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    channel: HTTPChannel

    def header(self, name: bytes) -> bytes | None:
        """
        The first value of header C{name} (case-insensitive), or L{None}.
        """
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


def answer(
    code: int = 200, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> Callable[[Request], bytes | int]:
    """
    A responder that answers every request with C{code}, C{headers} (added in order,
    repeated names kept) and C{body}.
    """

    def respond(request: Request) -> bytes:
        request.setResponseCode(code)
        for name, value in headers or ():
            request.responseHeaders.addRawHeader(name, value)
        return body

    return respond


class _Recorder(Resource):
    isLeaf = True

    def __init__(self, backend: SiteBackend) -> None:
        super().__init__()
        self._backend = backend

    def render(self, request: Request) -> bytes | int:
        backend = self._backend
        assert request.method is not None and request.uri is not None
        backend.requests.append(
            RecordedRequest(
                request.method,
                request.uri,
                [
                    (name, value)
                    for name, values in request.requestHeaders.getAllRawHeaders()
                    for value in values
                ],
                request.content.read() if request.content is not None else b"",
                request.channel,
            )
        )
        return backend.responder(request)


class _TrackedChannel(HTTPChannel):
    backend: SiteBackend

    def connectionMade(self) -> None:
        super().connectionMade()
        self.backend.channels.append(self)
        self.backend.connections += 1

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.backend._channel_lost(self)


class _ConnectionTracking:
    """
    What both backends share: their port, and waiting for accepted connections to close.
    """

    _port: Any
    _lost_waiters: list[Deferred[None]]

    def _open_connections(self) -> list[Any]:
        raise NotImplementedError

    @property
    def port(self) -> int:
        """
        The TCP port listened on.
        """
        return int(self._port.getHost().port)

    def next_lost(self) -> Deferred[None]:
        """
        Fires when the next accepted connection closes.
        """
        d: Deferred[None] = Deferred()
        self._lost_waiters.append(d)
        return d

    async def all_lost(self) -> None:
        """
        Wait until every connection accepted so far has closed.
        """
        while self._open_connections():
            await self.next_lost()

    def _forget(self, connection: Any) -> None:
        connections = self._open_connections()
        if connection in connections:
            connections.remove(connection)
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)


class SiteBackend(_ConnectionTracking):
    """
    A Twisted web server answering with C{responder(request)} (bytes, or
    C{NOT_DONE_YET} to answer later), by default C{200 "hello"}.

    @ivar requests: Every request received, in order.
    @ivar connections: How many connections were accepted.
    @ivar channels: The connections still open.
    @ivar lost: Deferreds fired by L{next_lost}.
    """

    def __init__(
        self,
        responder: Callable[[Request], bytes | int] | None = None,
        interface: str = "127.0.0.1",
    ) -> None:
        self.interface = interface
        self.responder: Callable[[Request], bytes | int] = responder or answer(body=b"hello")
        self.requests: list[RecordedRequest] = []
        self.connections = 0
        self.channels: list[_TrackedChannel] = []
        self.closed = 0
        self._lost_waiters: list[Deferred[None]] = []
        self._port: Any = None
        self._tls: PrivateCertificate | None = None

    def start(self) -> SiteBackend:
        """
        Listen on C{interface} (127.0.0.1 by default), on a free port.
        """
        backend = self

        class Channel(_TrackedChannel):
            pass

        Channel.backend = backend
        site = Site(_Recorder(self), timeout=None)
        site.protocol = Channel  # type: ignore[assignment]
        site.noisy = False
        site.log = lambda request: None  # type: ignore[method-assign]
        if self._tls is None:
            self._port = reactor.listenTCP(0, site, interface=self.interface)
        else:
            self._port = reactor.listenSSL(0, site, self._tls.options(), interface="127.0.0.1")
        return self

    def _open_connections(self) -> list[Any]:
        return self.channels

    def upstream(self, host: str = "127.0.0.1", verify_tls: bool = True) -> Upstream:
        """
        This backend as an L{Upstream}.
        """
        return Upstream("https" if self._tls else "http", host, self.port, verify_tls)

    def _channel_lost(self, channel: _TrackedChannel) -> None:
        self.closed += 1
        self._forget(channel)

    async def stop(self) -> None:
        """
        Stop listening and drop every open connection.
        """
        if self._port is not None:
            await self._port.stopListening()
            self._port = None
        await _drop_all(self.channels, lambda channel: channel.transport, self.next_lost)


async def _drop_all(
    connections: list[Any], transport_of: Callable[[Any], Any], next_lost: Callable[[], Any]
) -> None:
    while connections:
        lost = next_lost()
        transport = transport_of(connections[0])
        if transport is not None:
            transport.abortConnection()
        await lost


def tls_site_backend(
    directory: str,
    hostname: str = "localhost",
    responder: Callable[[Request], bytes | int] | None = None,
) -> tuple[SiteBackend, Certificate]:
    """
    A started L{SiteBackend} over TLS with a fresh self-signed certificate for
    C{hostname}; returns it and the certificate (the trust root clients need).
    """
    from tests.support.certificates import make_certificate

    os.makedirs(directory, exist_ok=True)
    key_path, _, cert_pem = make_certificate(directory, hostname)
    with open(key_path, "rb") as stream:
        key_pem = stream.read()
    backend = SiteBackend(responder)
    backend._tls = PrivateCertificate.loadPEM(key_pem + cert_pem)
    backend.start()
    return backend, Certificate.loadPEM(cert_pem)


# -- scripted bytes over plain TCP -----------------------------------------------------


@attrs.define
class RawRequest:
    """
    One request a L{RawBackend} read: its head (up to the blank line) and its body
    (C{Content-Length} or chunked, decoded), or only the head so far when the
    backend answers on heads (then C{respond} sees each request twice).
    """

    head: bytes
    body: bytes
    index: int  # on its connection, from 0
    complete: bool = True  # False: only the head has arrived (RawBackend.on_head)

    @property
    def request_line(self) -> bytes:
        """
        The first line of the head.
        """
        return self.head.split(b"\r\n", 1)[0]


class RawConnection(Protocol):
    """
    One connection accepted by a L{RawBackend}.

    @ivar received: Every byte received.
    @ivar requests: The requests parsed so far.
    @ivar takeover: When set, receives every further byte instead of the request
        parser (a protocol the connection was upgraded to).
    """

    def __init__(self, backend: RawBackend) -> None:
        self.backend = backend
        self.received = bytearray()
        self._unparsed = b""
        self.requests: list[RawRequest] = []
        self.answered: set[int] = set()
        self.closed = False
        self._head: bytes | None = None
        self._chunked = False
        self._needed = 0
        self._parts: list[bytes] = []
        self.takeover: Callable[[bytes], None] | None = None

    def connectionMade(self) -> None:
        self.backend.connections.append(self)

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.takeover is not None:
            self.takeover(data)
            return
        self._unparsed += data
        backend = self.backend
        while not self.closed:
            index = len(self.requests)
            if self._head is None:
                head_end = self._unparsed.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                self._head = head = self._unparsed[: head_end + 4]
                self._unparsed = self._unparsed[head_end + 4 :]
                fields = _fields(head)
                self._chunked = fields.get(b"transfer-encoding", b"").lower() == b"chunked"
                self._needed = 0 if self._chunked else int(fields.get(b"content-length", b"0"))
                self._parts = []
                if backend.on_head:
                    backend.respond(RawRequest(head, b"", index, complete=False), self)
                    if self._taken_over():
                        return
            if self._chunked:
                body, rest = _dechunk(self._unparsed)
                if body is None:
                    return
                self._unparsed = rest
            else:
                # Collected piece by piece: big uploads must not be re-scanned per read.
                take = self._unparsed[: self._needed]
                self._parts.append(take)
                self._needed -= len(take)
                self._unparsed = self._unparsed[len(take) :]
                if self._needed:
                    return
                body = b"".join(self._parts)
            request = RawRequest(self._head, body, index)
            self._head = None
            self.requests.append(request)
            backend.respond(request, self)

    def _taken_over(self) -> bool:
        return self.closed or self.takeover is not None

    def write(self, data: bytes) -> None:
        """
        Send C{data} to the client.
        """
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        """
        Close the connection (after sending what was written).
        """
        assert self.transport is not None
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True
        self.backend._lost(self)


def _fields(head: bytes) -> dict[bytes, bytes]:
    return {
        line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if b":" in line
    }


def _dechunk(data: bytes) -> tuple[bytes | None, bytes]:
    """
    A complete chunked body at the start of C{data} (decoded) and what follows it, or
    L{None} while it is incomplete.
    """
    body = b""
    rest = data
    while True:
        line_end = rest.find(b"\r\n")
        if line_end < 0:
            return None, data
        size = int(rest[:line_end].split(b";")[0], 16)
        if size == 0:
            if rest[line_end : line_end + 4] == b"\r\n\r\n":
                return body, rest[line_end + 4 :]
            trailer_end = rest.find(b"\r\n\r\n", line_end)
            if trailer_end < 0:
                return None, data
            return body, rest[trailer_end + 4 :]
        if len(rest) < line_end + 2 + size + 2:
            return None, data
        body += rest[line_end + 2 : line_end + 2 + size]
        rest = rest[line_end + 2 + size + 2 :]


def scripted(
    *responses: bytes | Callable[[RawRequest, RawConnection], None], close: bool = False
) -> Callable[[RawRequest, RawConnection], None]:
    """
    A responder that answers the I{n}th request on each connection with
    C{responses[n]} (once: on its head when the backend answers on heads): bytes to
    write, or a callable that acts itself. A connection
    that has used up the script is closed, as is every connection after its last
    answer when C{close} is true.
    """

    def respond(request: RawRequest, connection: RawConnection) -> None:
        if request.index in connection.answered:
            return
        connection.answered.add(request.index)
        if request.index >= len(responses):
            connection.close()
            return
        step = responses[request.index]
        if callable(step):
            step(request, connection)
        else:
            connection.write(step)
        if close and request.index == len(responses) - 1:
            connection.close()

    return respond


class RawBackend(_ConnectionTracking):
    """
    A TCP server that hands each request it reads to C{respond(request, connection)}.

    @param on_head: Also call C{respond} as soon as a request head is complete, before
        its body (for answers that do not wait for an upload), with an incomplete
        L{RawRequest}.
    @ivar connections: Every connection accepted, in order.
    """

    def __init__(
        self,
        respond: Callable[[RawRequest, RawConnection], None],
        *,
        on_head: bool = False,
    ) -> None:
        self.respond = respond
        self.on_head = on_head
        self.connections: list[RawConnection] = []
        self._open: list[RawConnection] = []
        self._lost_waiters: list[Deferred[None]] = []
        self._port: Any = None

    def start(self) -> RawBackend:
        """
        Listen on 127.0.0.1, on a free port.
        """
        backend = self

        class _Factory(Factory):
            noisy = False

            def buildProtocol(self, addr: Any) -> RawConnection:
                connection = RawConnection(backend)
                backend._open.append(connection)
                return connection

        self._port = reactor.listenTCP(0, _Factory(), interface="127.0.0.1")
        return self

    def _open_connections(self) -> list[Any]:
        return self._open

    def upstream(self) -> Upstream:
        """
        This backend as an L{Upstream}.
        """
        return Upstream("http", "127.0.0.1", self.port)

    def _lost(self, connection: RawConnection) -> None:
        self._forget(connection)

    async def stop(self) -> None:
        """
        Stop listening and drop every open connection.
        """
        if self._port is not None:
            await self._port.stopListening()
            self._port = None
        await _drop_all(self._open, lambda connection: connection.transport, self.next_lost)


@implementer(IPushProducer)
class EndlessBody:
    """
    A backend response body written as fast as whoever reads it allows, counting how often
    the backend was told to pause (which only happens when the gateway stops reading).
    """

    def __init__(self, request: Request, total: int) -> None:
        self.request = request
        self.remaining = total
        self.sent = 0
        self.pauses = 0
        self.paused = False
        self.chunk = b"z" * 65536

    def start(self) -> None:
        self.request.registerProducer(self, True)
        self.resumeProducing()

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        while not self.paused and self.remaining:
            data = self.chunk[: min(len(self.chunk), self.remaining)]
            self.remaining -= len(data)
            self.sent += len(data)
            self.request.write(data)
        if not self.remaining:
            self.request.unregisterProducer()
            self.request.finish()

    def stopProducing(self) -> None:
        self.remaining = 0
