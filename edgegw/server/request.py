"""
The gateway's request: rendered as soon as its head is in, its body streaming in C{body}.

Twisted's L{twisted.web.server.Request} collects the whole request body in
C{request.content} and renders only once the last byte has arrived. A reverse proxy
must instead start on a request as soon as its head is in, and pass the body on as it
arrives, at the pace of whoever consumes it. L{GatewayRequest} does, on any channel that
is an L{IClientStream} (the HTTP/1.1 channel, L{edgegw.server.channel}):

  - A request without a body (no C{Content-Length}, or C{Content-Length: 0}, and not
    chunked) takes Twisted's path unchanged; its C{body} is L{EMPTY_BODY}.
  - A request with a body is rendered as soon as its head is parsed. Its C{body} is a
    L{RequestBody}, an L{IBodyProducer} that hands the bytes to one consumer and reads
    from the client only as fast as that consumer takes them. C{request.content} is an
    empty file: it never accumulates the body. C{Expect: 100-continue} is answered
    when the consumer starts, not when the head arrives (as a proxy should: a request
    refused outright never has its body sent).
  - A response finished before the whole body has arrived goes out at once. Then, if
    at most L{DISCARD_LIMIT} bytes of the body remain (or, for a chunked body, until
    that many have been read), the rest is read and thrown away and only then is the
    request done with: C{notifyFinish} fires, the next request on the connection is
    read. Otherwise the connection closes after the response.

Twisted's private hooks are reached through L{RequestSeam} (L{edgegw.seam}).
"""

from __future__ import annotations

from io import BytesIO
from typing import Any
from urllib.parse import unquote_to_bytes as unquote

from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, RESPONSES, HTTPChannel, parse_qs
from twisted.web.server import Request

from edgegw.compression.response_coding import ResponseCoding
from edgegw.seam import GatewayHeaders, RequestSeam, client_gone, mark_client_gone
from edgegw.server.body import DISCARD_LIMIT, EMPTY_BODY, BodyDiscardedError, RequestBody
from edgegw.stream.boundary import IClientStream
from edgegw.stream.response_filter import IResponseFilter
from edgegw.stream.response_headers import ResponseHeaders

__all__ = ["EMPTY_BODY", "REASON_PHRASES", "BodyDiscardedError", "GatewayRequest", "RequestBody"]

REASON_PHRASES: dict[int, bytes] = {
    code: phrase
    for code, phrase in {
        421: b"Misdirected Request",
        422: b"Unprocessable Content",
        423: b"Locked",
        424: b"Failed Dependency",
        425: b"Too Early",
        426: b"Upgrade Required",
        428: b"Precondition Required",
        429: b"Too Many Requests",
        431: b"Request Header Fields Too Large",
        451: b"Unavailable For Legal Reasons",
        506: b"Variant Also Negotiates",
        508: b"Loop Detected",
        511: b"Network Authentication Required",
    }.items()
    if code not in RESPONSES
}
"""
Reason phrases (RFC 9110 and the registry) of status codes Twisted's C{RESPONSES} lacks,
for status lines the gateway writes without one (its own 429, a plugin's reply): never
C{Unknown Status}.
"""


class GatewayRequest(RequestSeam):
    """
    A request rendered as soon as its head is in, its body streaming in C{body}.

    Requests without a body are handled exactly as by L{Request}. For one with a body,
    C{method}, C{uri}, C{path}, C{args} (from the query only: a form body is not parsed),
    C{clientproto}, C{prepath} and C{postpath} are set as Twisted sets them, and the
    resource renders, before the body arrives; C{content} stays an empty file.

    If the response is finished before the body is complete, a consumer still attached
    to the body gets L{BodyDiscardedError}, and C{notifyFinish} fires once the rest of
    the body has been read and dropped (or the connection has closed: the response was
    whole, so it fires with L{None} then too). If the client disconnects before the
    response is finished, the body and C{notifyFinish} fail with the reason, as in
    Twisted; so they do, at once, if the body's chunked framing turns out malformed.

    While a L{response_filter<IResponseFilter>} is installed (the response-plugin
    stage), the output calls go to it instead (L{edgegw.stream.response_filter}). Past
    it, a L{response_coding<ResponseCoding>} (set by a route that compresses) compresses
    the body on its way out (L{edgegw.compression.response_coding}).

    @ivar body: The request body.
    @ivar response_filter: Receives the output calls while set.
    @ivar response_coding: Compresses the body, when set.
    """

    body: RequestBody = EMPTY_BODY
    response_filter: IResponseFilter | None = None
    response_coding: ResponseCoding | None = None
    _dispatched = False
    _cleanupPending = False
    _expectContinue = False
    _stream: IClientStream | None = None

    def __init__(self, channel: HTTPChannel, queued: object = None) -> None:
        super().__init__(channel, queued)
        self.requestHeaders = GatewayHeaders()
        self.responseHeaders = ResponseHeaders()
        if IClientStream.providedBy(channel):
            self._stream = channel

    def process(self) -> None:
        """
        Find the resource and render it, as L{Request.process} does, except that no
        C{Server} or C{Date} header is set per request: the channel writes the gateway's
        fixed headers and a date formatted once a second with the head.
        """
        self.site = self.channel.site  # type: ignore[attr-defined]
        self.prepath = []
        self.postpath = list(map(unquote, self.path[1:].split(b"/")))
        try:
            self.render(self.site.getResourceFor(self))
        except BaseException:
            self.processingFailed(Failure())

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        """
        Set the status, with the registered reason phrase when Twisted knows none
        (L{REASON_PHRASES}).
        """
        if message is None:
            message = REASON_PHRASES.get(code)
        Request.setResponseCode(self, code, message)

    def write(self, data: bytes) -> None:
        """
        Write C{data} to the client, or hand it to the response filter.
        """
        response_filter = self.response_filter
        if response_filter is not None:
            response_filter.write(data)
        elif self.response_coding is not None:
            self.response_coding.write(self, data)
        else:
            Request.write(self, data)

    def write_whole(self, body: bytes) -> None:
        """
        Write C{body} as the whole response body and finish: as C{write(body)} then
        C{finish()}, with the head and the body in one write when nothing else has to
        happen on the way (-1.5 µs a small proxied response), which the stream sends as
        early as it can (L{IClientStream.writeWhole}).

        That is when no response filter takes the body, nothing was written yet, the
        response has a C{Content-Length} field and a body (not C{HEAD}, 204 or 304),
        Twisted would add no field of its own (no default C{Content-Type},
        C{Last-Modified}, C{ETag} or cookies to set) and would not change the body (no
        encoder, no HEAD answered by rendering a GET). A response coding compresses the
        whole body at once first, when it compresses it.
        """
        coding = self.response_coding
        if coding is not None and self.response_filter is None and not self.startedWriting:
            body = coding.whole(self, body)
        stream = self._stream
        if (
            stream is None
            or self.response_filter is not None
            or self.startedWriting
            or self.finished
            or client_gone(self)
            or self.method == b"HEAD"
            or self.code in NO_BODY_CODES
            or self.defaultContentType is not None
            or self.lastModified is not None
            or self.etag is not None
            or self.cookies
            or self.rewritesBody()
            # As Twisted decides whether to frame the body itself (an empty list of
            # values would have it chunk the body).
            or not self.responseHeaders.getRawHeaders(b"content-length")
        ):
            self.write(body)
            self.finish()
            return
        # What HTTPRequest.write does on its first call, for a response it would send
        # with its Content-Length (never chunked).
        self.startedWriting = 1
        self.sentLength += len(body)
        stream.writeWhole(
            self,
            (self.clientproto, b"%d" % self.code, self.code_message, self.responseHeaders),
            body,
        )

    def finish(self) -> None:
        """
        Finish the response, or tell the response filter the terminal has.
        """
        response_filter = self.response_filter
        if response_filter is not None:
            response_filter.finish()
        elif self.response_coding is not None:
            self.response_coding.finish(self)
        else:
            Request.finish(self)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """
        Attach C{producer} to the client connection, or hand it to the response filter.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.registerProducer(self, producer, streaming)
        else:
            response_filter.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        """
        Detach the producer, or tell the response filter.
        """
        response_filter = self.response_filter
        if response_filter is None:
            Request.unregisterProducer(self)
        else:
            response_filter.unregisterProducer()

    def gotLength(self, length: int | None) -> None:
        """
        Set up for a body of C{length} bytes (L{None}: chunked).

        @raise TypeError: The request has a body, but its channel is not an
            L{IClientStream}.
        """
        if length == 0:
            # What Twisted's gotLength does, without its try/except: it looks for the
            # site's getContentFile, which sites rarely have, and catches the
            # AttributeError (~1 µs a request).
            site = getattr(self.channel, "site", None)
            get_content_file = getattr(site, "getContentFile", None)
            self.content = get_content_file(0) if get_content_file is not None else BytesIO()
            return
        stream = self._stream
        if stream is None:
            raise TypeError("GatewayRequest needs a channel that is an IClientStream")
        self.content = BytesIO()
        self.body = RequestBody(length, self, stream)

    def handleContentChunk(self, data: bytes) -> None:
        """
        Pass a piece of the body on (not intended for users).
        """
        self.body.dataArrived(data)

    def dispatchEarly(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        Render now, with the body yet to come (the channel calls this once the head of a
        request with a body is parsed).
        """
        self._dispatched = True
        if version == b"HTTP/1.1" or version == b"HTTP/2":
            expect = self.requestHeaders.getRawHeaders(b"expect")
            if expect and expect[0].lower() == b"100-continue":
                self._expectContinue = True
        self.method = command
        self.uri = path
        self.clientproto = version
        target, question, query = path.partition(b"?")
        self.path = target
        self.args = parse_qs(query, 1) if question else {}
        self.process()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        The whole request is in: render it (no body), or complete the body of one that
        is already being answered.
        """
        if not self._dispatched:
            Request.requestReceived(self, command, path, version)
            return
        self.body.allArrived()
        if self._cleanupPending:
            self._cleanupPending = False
            RequestSeam.endRequest(self)

    def _closeAfterResponse(self, finishing: bool) -> bool:
        """
        Whether the connection should close after this response rather than read the
        rest of the body, which is incomplete.

        @param finishing: The response is being finished (otherwise it is starting, and
            an attached consumer may yet read the whole body).
        """
        body = self.body
        if body.overLimit:
            return True
        if self._expectContinue and body.received == 0:
            # The client may be holding the body back until told to go ahead.
            return True
        return (
            (finishing or not body.consuming)
            and isinstance(body.length, int)
            and body.length - body.received > DISCARD_LIMIT
        )

    def endRequest(self) -> None:
        """
        End the finished request, unless part of its body is still to be read and
        dropped first (then once it is, or the connection closes).
        """
        body = self.body
        if body.complete:
            RequestSeam.endRequest(self)
            return
        channel = self.channel
        if channel.persistent and self._closeAfterResponse(finishing=True):
            channel.persistent = False
        body.abandon()
        if channel.persistent:
            # Done once the rest of the body has been read (requestReceived).
            self._cleanupPending = True
        else:
            RequestSeam.endRequest(self)

    def discardLimitReached(self) -> None:
        """
        Too much of an abandoned body was read and dropped: close after the response.
        """
        if self._cleanupPending:
            self._cleanupPending = False
            if self._stream is not None:
                self._stream.closeAfterResponse()
            RequestSeam.endRequest(self)
        elif self._stream is not None:
            # Still answering: read no more, close once the response is finished.
            self._stream.pauseBody()

    def bodyDemanded(self) -> None:
        """
        The body's consumer has started: a client that waits for C{100 Continue} is
        told to go ahead, if nothing of the body or the response was sent yet.
        """
        if self._expectContinue:
            self._expectContinue = False
            stream = self._stream
            if not self.startedWriting and self.body.received == 0 and stream is not None:
                stream.continueBody()

    def connectionLost(self, reason: Failure) -> None:
        """
        The connection is gone: the body, if incomplete, fails with C{reason}, and so
        does C{notifyFinish} unless the response had been finished (and only the rest of
        the body was still being read).
        """
        # Disconnected before the body hears of it: whatever the body's failure makes the
        # handler do next (answer 502, say) must see a request it can no longer answer.
        mark_client_gone(self)
        if not self.body.complete:
            self.body.clientLost(reason)
        if self._cleanupPending:
            self._cleanupPending = False
            notifications, self.notifications = self.notifications, []
            super().connectionLost(reason)
            for notification in notifications:
                notification.callback(None)
            return
        super().connectionLost(reason)
