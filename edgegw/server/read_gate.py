"""
The HTTP/1.1 channel's reading, held by two parties without one resuming the other.
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer


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
class ReadGate:
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
