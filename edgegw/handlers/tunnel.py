"""
WebSocket tunnels: after the upstream's 101, bytes flow both ways until either side closes.

The gateway does not parse WebSocket frames: it relays the upgrade handshake and then
splices the client's and the upstream's connections, each one's transport registered as
the streaming producer of the other, so that a slow reader pauses the fast writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import ITransport
from twisted.internet.protocol import Protocol
from twisted.protocols.policies import ProtocolWrapper
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.handlers.hop_by_hop import HOP_BY_HOP, connection_tokens
from edgegw.identity.cookies import set_cookie_name
from edgegw.stream.boundary import take_connection
from edgegw.upstream.response import UpstreamResponse


class _Side(Protocol):
    """
    One end of a tunnel: what it receives goes to the other end.
    """

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel
        self.peer: ITransport | None = None
        self.received = 0
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        if self.peer is not None:
            self.peer.write(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed = True
        self.tunnel.side_closed(self)


class Tunnel:
    """
    Splices a client connection whose request was upgraded with the upstream connection
    that answered 101.

    @ivar to_client: Bytes relayed from the upstream to the client.
    @ivar to_upstream: Bytes relayed from the client to the upstream.
    """

    def __init__(
        self,
        request: Request,
        response: UpstreamResponse,
        own_cookie: Callable[[bytes], bool] | None = None,
    ) -> None:
        """
        @param own_cookie: Says whether a cookie name is the gateway's own: a backend's
            C{Set-Cookie} for one is left out of the 101, as from any other response.
        """
        self.request = request
        self.response = response
        self.own_cookie = own_cookie
        self.client_side = _Side(self)
        self.upstream_side = _Side(self)
        self.done: Deferred[None] = Deferred()

    @property
    def to_client(self) -> int:
        """
        Bytes relayed from the upstream to the client.
        """
        return self.upstream_side.received

    @property
    def to_upstream(self) -> int:
        """
        Bytes relayed from the client to the upstream.
        """
        return self.client_side.received

    def start(self, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> Deferred[None]:
        """
        Send the 101 to the client, take both connections over, and fire when both are
        closed.
        """
        request = self.request
        # The HTTP channel no longer owns the connection: it lets go of the transport
        # and hands over anything it read ahead.
        taken, pending = take_connection(request)
        client: Any = taken
        client.write(self._head(extra_headers))
        if isinstance(client, ProtocolWrapper):
            client.wrappedProtocol = self.client_side
        else:
            client.protocol = self.client_side
        self.client_side.makeConnection(client)

        upstream: Any = self.response.detach(self.upstream_side)
        self.client_side.peer = upstream
        self.upstream_side.peer = client
        # Backpressure: when one side cannot write fast enough, stop reading the other.
        client.registerProducer(upstream, True)
        upstream.registerProducer(client, True)
        client.resumeProducing()
        if pending:
            self.client_side.dataReceived(pending)
        request.setResponseCode(101)
        return self.done

    def _head(self, extra: tuple[tuple[bytes, bytes], ...]) -> bytes:
        response = self.response
        tokens = connection_tokens(
            [value for name, value in response.headers if name.lower() == b"connection"]
        )
        lines = [b"HTTP/1.1 101 " + (response.phrase or b"Switching Protocols")]
        for name, value in response.headers:
            lower = name.lower()
            # A 101 has no body: a Content-Length on it could only mislead the client.
            if lower in HOP_BY_HOP or lower in tokens or lower == b"content-length":
                continue
            own = self.own_cookie
            if own is not None and lower == b"set-cookie" and own(set_cookie_name(value)):
                continue
            lines.append(name + b": " + value)
        lines.extend(name + b": " + value for name, value in extra)
        # What request plugins added (add_response_header), as on every other head.
        appended = getattr(self.request.responseHeaders, "appended", ())
        lines.extend(name + b": " + value for name, value in appended)
        lines.append(b"Connection: Upgrade")
        upgrade = [value for name, value in response.headers if name.lower() == b"upgrade"]
        lines.append(b"Upgrade: " + (upgrade[0] if upgrade else b"websocket"))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def side_closed(self, side: _Side) -> None:
        """
        One side closed: close the other, and finish once both are closed.
        """
        other = self.upstream_side if side is self.client_side else self.client_side
        if not other.closed and other.transport is not None:
            other.transport.loseConnection()
        if self.client_side.closed and self.upstream_side.closed and not self.done.called:
            self._finish_request()
            self.done.callback(None)

    def _finish_request(self) -> None:
        # The request's channel is gone, so Request.finish cannot run: record the outcome
        # for the access log and fire the finish notifications ourselves.
        request = self.request
        request.sentLength = self.to_client
        request.finished = True
        notifications, request.notifications = request.notifications, []
        for notification in notifications:
            notification.callback(None)
