"""
The protocol boundary: what a request's client connection offers the layers above.

Everything above the server layer (edge, routing, chain, handlers, plugins, auth, the
upstream hand-offs such as the WebSocket tunnel) holds a L{twisted.web.iweb.IRequest}
and reaches its client connection only through the functions here, which ask the
request's stream, an L{IClientStream} (all but L{client_gone}, which reads the request's
own state: a request whose client is gone has no stream left). The HTTP/1.1 channel
(L{edgegw.server.channel.GatewayChannel}) is one; HTTP/2 plugs in as another. A request
on a channel that is none (Twisted's own, a test's) gets what Twisted's public
interfaces give.

The request's own interface (C{setResponseCode}, C{setHeader}, C{write}, C{finish},
C{registerProducer}, C{notifyFinish}, C{getClientAddress}, C{isSecure}) stays Twisted's:
the request writes the head and the body, and ends, through its stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IAddress, ITransport
from twisted.web.http_headers import Headers
from zope.interface import Attribute, Interface

from edgegw.seam import client_gone

__all__ = [
    "IClientStream",
    "UpgradeNotPossibleError",
    "abort_client",
    "client_closer",
    "client_gone",
    "close_after_response",
    "stream_of",
    "take_connection",
    "write_whole",
]


class UpgradeNotPossibleError(Exception):
    """
    The request's protocol cannot hand its connection over (HTTP/2: the connection
    carries other streams).
    """


class IClientStream(Interface):
    """
    The client side of the requests one connection (HTTP/1.1) or stream (HTTP/2)
    carries: what a request writes its response through, and what the layers above ask
    of the client.

    The request calls L{writeHeaders}, L{write} and L{requestDone} (Twisted's names, so
    that Twisted's L{twisted.web.http.Request} writes through it unchanged), and its body
    calls L{pauseBody}, L{resumeBody} and L{continueBody}.
    """

    protocolName = Attribute(
        "The protocol as ALPN names it (C{b'http/1.1'}, C{b'h2'}), for logs and metrics."
    )

    def getPeer() -> IAddress:
        """
        The client's address.
        """

    def getHost() -> IAddress:
        """
        The local address the client connected to.
        """

    def isSecure() -> bool:
        """
        Whether the client connection is TLS.
        """

    def writeHeaders(
        version: bytes, code: bytes, reason: bytes, headers: Headers, body: bytes = b""
    ) -> None:
        """
        Write a response head: the status line (or its HTTP/2 form) and C{headers}, and
        with them C{body} when it is the whole response body.
        """

    def write(data: bytes) -> None:
        """
        Write response body bytes.
        """

    def requestDone(request: Any) -> None:
        """
        C{request}'s response is complete.
        """

    def writeWhole(request: Any, head: tuple[bytes, bytes, bytes, Headers], body: bytes) -> None:
        """
        Write C{request}'s whole response (the head's version, status code, reason and
        headers, then C{body}) and finish C{request}: sent as early as the protocol
        allows.
        """

    def pauseBody() -> None:
        """
        Read no more of the request body until L{resumeBody} (flow control: its consumer
        is slower than the client).
        """

    def resumeBody() -> None:
        """
        Read the request body again.
        """

    def continueBody() -> None:
        """
        The request body's consumer has started: a client waiting for
        C{100 Continue} is told to go ahead, and the body's deadline runs from now.
        """

    def clientGone(request: Any) -> bool:
        """
        Whether C{request} can no longer be answered: its client connection or stream
        is gone. (The layers above ask L{client_gone}, which reads the request's own
        state: Twisted drops a request's channel when its client goes, so such a request
        has no stream left to ask.)
        """

    def clientCloser() -> Callable[[], None] | None:
        """
        What drops this client connection (HTTP/2: resets this stream) later, whoever
        owns the connection then (the channel, or a tunnel it was handed to); L{None}
        when the stream holds no connection.
        """

    def abortClient() -> None:
        """
        Drop the client connection (or reset the stream) at once: a response that has
        started and cannot be completed must look broken, not short.
        """

    def closeAfterResponse() -> None:
        """
        Close the connection once the response in progress is complete.
        """

    def takeConnection(request: Any) -> tuple[ITransport, bytes]:
        """
        Hand the raw connection over for an upgrade (a WebSocket tunnel after a 101): the
        stream lets go of the transport, and gives what it read ahead of the protocol.
        C{request} finishes when its new owner says so (by firing its finish
        notifications); only then is the connection released.

        @return: The transport and the bytes the client sent after C{request}'s head.
        @raise UpgradeNotPossibleError: The protocol cannot (HTTP/2).
        """


def stream_of(request: Any) -> IClientStream | None:
    """
    C{request}'s stream, when its channel is an L{IClientStream}.
    """
    channel = getattr(request, "channel", None)
    return channel if IClientStream.providedBy(channel) else None


def abort_client(request: Any) -> None:
    """
    Drop C{request}'s client connection at once.
    """
    stream = stream_of(request)
    if stream is not None:
        stream.abortClient()
        return
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    if transport is not None:
        getattr(transport, "abortConnection", transport.loseConnection)()


def client_closer(request: Any) -> Callable[[], None] | None:
    """
    What drops C{request}'s client connection later, whoever then owns it (the HTTP
    channel, or a tunnel it was handed to); L{None} when there is no connection.
    """
    stream = stream_of(request)
    if stream is not None:
        return stream.clientCloser()
    transport = getattr(request, "transport", None)
    if transport is None:
        return None
    closer: Callable[[], None] = getattr(transport, "abortConnection", transport.loseConnection)
    return closer


def close_after_response(request: Any) -> None:
    """
    Make C{request}'s connection close once its response is complete.
    """
    if not request.startedWriting:
        request.responseHeaders.setRawHeaders(b"connection", [b"close"])
    stream = stream_of(request)
    if stream is not None:
        stream.closeAfterResponse()
        return
    channel = getattr(request, "channel", None)
    if channel is not None and hasattr(channel, "persistent"):
        channel.persistent = False


def write_whole(request: Any, body: bytes) -> None:
    """
    Write C{body} as the whole response body and finish C{request}: in one write with
    the head, sent at once, where the request can (the gateway's own requests).
    """
    whole = getattr(request, "write_whole", None)
    if whole is not None:
        whole(body)
    else:
        request.write(body)
        request.finish()


def take_connection(request: Any) -> tuple[ITransport, bytes]:
    """
    Take C{request}'s connection over for an upgrade (L{IClientStream.takeConnection}).

    @raise ConnectionLost: The client is gone.
    @raise UpgradeNotPossibleError: The request's protocol cannot hand it over, or its
        channel is not an L{IClientStream}.
    """
    if client_gone(request):
        raise ConnectionLost("the client is gone")
    stream = stream_of(request)
    if stream is None:
        raise UpgradeNotPossibleError("the request's channel cannot hand its connection over")
    return stream.takeConnection(request)
