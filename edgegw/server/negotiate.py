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
from typing import Protocol as TypingProtocol

from twisted.internet.interfaces import IAddress, IHandshakeListener
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.server.channel import FRESH_GRACE

__all__ = ["NegotiatingConnection", "ProtocolChooser"]


class ProtocolChooser(TypingProtocol):
    """
    What builds a TLS connection's protocol once ALPN has chosen one (the gateway's site).
    """

    def negotiated(
        self, addr: IAddress | None, name: bytes | None, negotiating: NegotiatingConnection
    ) -> Protocol:
        """
        The protocol for the negotiated ALPN C{name} (L{None}: the client offered none),
        taking C{negotiating}'s place in the site's count.
        """


@implementer(IHandshakeListener)
class NegotiatingConnection(Protocol):
    """
    A TLS connection whose protocol is not chosen yet.

    @ivar chosen: The protocol chosen at the handshake, or L{None} before it.
    """

    def __init__(
        self,
        site: ProtocolChooser,
        address: IAddress | None,
        handshake_timeout: float | None,
        reactor: Any,
    ) -> None:
        """
        @param site: Builds the protocol for the negotiated ALPN name.
        @param address: The client's address.
        @param handshake_timeout: How long the handshake may take.
        """
        self.chosen: Protocol | None = None
        self.site = site
        self._address = address
        self._timeout = handshake_timeout
        self._reactor = reactor
        self._timer: Any = None
        self._release: Callable[[Any], object] | None = None
        self._shutting_down = False
        self._grace: Any = None

    def connectionMade(self) -> None:
        if self._timeout:
            self._timer = self._reactor.callLater(self._timeout, self.abortClient)

    def handshakeCompleted(self) -> None:
        """
        Build the negotiated protocol and hand it the connection.
        """
        self._cancel_timer()
        transport: Any = self.transport
        name = getattr(transport, "negotiatedProtocol", None)
        chosen = self.chosen = self.site.negotiated(self._address, name, self)
        # The TLS layer delivers to its wrapped protocol: the chosen one from now on.
        transport.wrappedProtocol = chosen
        chosen.makeConnection(transport)
        if self._shutting_down:
            # Stopping: the chosen protocol closes as it does (a first request may still
            # come, answered with "Connection: close"; HTTP/2 is told GOAWAY).
            chosen.shutDown()  # type: ignore[attr-defined]

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
        The gateway is stopping: once the handshake is done, the chosen protocol is told
        so; a handshake not done within L{FRESH_GRACE} is cut.
        """
        self._shutting_down = True
        if self.chosen is None and self.transport is not None:
            # A handshake still under way gets the grace a connection without its
            # first request gets, at most: a silent client must not hold the stop.
            grace = self._reactor.callLater(FRESH_GRACE, self._grace_over)
            self._grace = grace

    def _grace_over(self) -> None:
        self._grace = None
        if self.chosen is None:
            self.abortClient()

    def serve_from(self, site: ProtocolChooser) -> None:
        """
        A reload: the protocol is chosen by C{site}.
        """
        self.site = site

    def cut_for(self, site: object) -> None:
        """
        Connections whose protocol is not chosen yet serve nothing for C{site}.
        """

    def abortClient(self) -> None:
        """
        Drop the connection at once.
        """
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def _cancel_timer(self) -> None:
        for timer in (self._timer, self._grace):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._grace = None
