"""
Choosing a TLS connection's protocol by what ALPN negotiated: HTTP/2 (C{h2}) or
HTTP/1.1.

L{NegotiatingConnection} is the protocol a TLS listener with HTTP/2 on gives each new
connection. It waits for the handshake (no longer than C{limits.headerTimeout}: a
client that never finishes one holds nothing for long), then puts the chosen protocol in
its place below the TLS layer and steps out: nothing of it stays on the path of the
bytes that follow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IHandshakeListener
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

__all__ = ["NegotiatingConnection"]


@implementer(IHandshakeListener)
class NegotiatingConnection(Protocol):
    """
    A TLS connection whose protocol is not chosen yet.

    @ivar chosen: The protocol chosen at the handshake, or L{None} before it.
    """

    def __init__(
        self,
        choose: Callable[[bytes | None, NegotiatingConnection], Protocol],
        handshake_timeout: float | None,
        reactor: Any,
    ) -> None:
        """
        @param choose: Builds the protocol for the negotiated ALPN name (L{None}: the
            client offered none), taking this connection's place in the site's count.
        @param handshake_timeout: How long the handshake may take.
        """
        self.chosen: Protocol | None = None
        self._choose = choose
        self._timeout = handshake_timeout
        self._reactor = reactor
        self._timer: Any = None
        self._release: Callable[[Any], object] | None = None
        self._shutting_down = False

    def connectionMade(self) -> None:
        if self._timeout:
            self._timer = self._reactor.callLater(self._timeout, self.abortClient)

    def handshakeCompleted(self) -> None:
        """
        Build the negotiated protocol and hand it the connection.
        """
        self._cancel_timer()
        transport: Any = self.transport
        if self._shutting_down:
            transport.loseConnection()
            return
        chosen = self.chosen = self._choose(getattr(transport, "negotiatedProtocol", None), self)
        # The TLS layer delivers to its wrapped protocol: the chosen one from now on.
        transport.wrappedProtocol = chosen
        chosen.makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        chosen = self.chosen
        if chosen is not None:
            chosen.dataReceived(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_timer()
        chosen = self.chosen
        if chosen is not None:
            chosen.connectionLost(reason)
            return
        release, self._release = self._release, None
        if release is not None:
            release(self)

    def shutDown(self) -> None:
        """
        The gateway is draining: no request will be read from this connection.
        """
        self._shutting_down = True
        if self.chosen is None and self.transport is not None:
            self.transport.loseConnection()

    def abortClient(self) -> None:
        """
        Drop the connection at once.
        """
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
