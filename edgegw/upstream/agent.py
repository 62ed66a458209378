"""
The gateway's upstream client behind Twisted's L{IAgent}, so that treq runs over it.

L{UpstreamAgent} sends every request on the gateway's own connection pool (the one the
reverse proxy uses: the same TLS verification, connect timeout and idle policy); it is
what C{treq.HTTPClient} is given for the api fan-out and for every call to the IdP.
Cancelling a request's Deferred, or the transport a body protocol is given losing its
connection, aborts the upstream connection: it is never reused.

Policy the agent applies to every call, below treq's own wrappers:

  - C{Accept-Encoding: identity} replaces whatever was offered (treq always offers
    gzip), and a response with any other content coding fails the call: a body is never
    decompressed behind the caller's back, where a size cap could not see it.
  - The body framing (C{Content-Length} or chunked) and C{Host} are the pool's, from
    the body producer and the URL; hop-by-hop fields given by the caller are dropped.
  - Each call is an L{UpstreamCall} (a CLIENT span when tracing is on, and a record in
    the request's access-log line when the call is made for a request). L{UpstreamAgent.call}
    binds a call to its request and name and leaves its verdict to the caller; a plain
    C{request} ends its record by itself when the body is complete or the call fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from http.cookiejar import CookieJar
from typing import Any, Final

from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.interfaces import IProtocol, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgent, IBodyProducer, IClientRequest, IResponse
from zope.interface import implementer

from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.seam import PreparedURL
from edgegw.upstream.calls import CallContext, UpstreamCall, describe_error, start_call
from edgegw.upstream.pool import UpstreamClient
from edgegw.upstream.response import UpstreamProtocolError, UpstreamResponse
from edgegw.upstream.upstreams import Upstream

__all__ = [
    "ContentCodingError",
    "NullCookieJar",
    "PreparedURL",
    "UpstreamAgent",
    "UpstreamCallAgent",
]

# Fields the pool writes itself (Host, framing) or that only make sense hop by hop.
_NOT_FORWARDED: Final = frozenset(
    {
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
        b"accept-encoding",
    }
)
_IDENTITY: Final = (b"Accept-Encoding", b"identity")
# Upstream URLs come from the configuration (and the IdP's discovery document), so a
# few distinct origins; the bound only keeps a hostile document from growing the map.
_MAX_ORIGINS: Final = 256


# One failure object for every completed body: building a Failure captures a traceback
# and costs microseconds per call, and body protocols only check its type.
_BODY_DONE: Final = Failure(ResponseDone())


class ContentCodingError(UpstreamProtocolError):
    """
    The upstream sent a content coding that was not asked for.
    """


class NullCookieJar(CookieJar):
    """
    A cookie jar that stores nothing and sends nothing.

    treq keeps one jar per C{HTTPClient} and replays what it holds on later calls: with
    one client shared by every request, one user's upstream C{Set-Cookie} would ride
    along on another user's call.
    """

    def set_cookie(self, cookie: Any) -> None:
        """
        Keep nothing.
        """

    def extract_cookies(self, response: Any, request: Any) -> None:
        """
        Read nothing from responses.
        """

    def add_cookie_header(self, request: Any) -> None:
        """
        Add nothing to requests.
        """


@implementer(IClientRequest)
class _SentRequest:
    """
    What was sent, as L{IResponse.request} describes it.
    """

    def __init__(self, method: bytes, absoluteURI: bytes, headers: Headers) -> None:
        self.method = method
        self.absoluteURI = absoluteURI
        self.headers = headers


@implementer(IPushProducer)
class _BodyTransport:
    """
    The transport a body protocol is given: flow control and abort, nothing else.
    """

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def pauseProducing(self) -> None:
        self._response.pause()

    def resumeProducing(self) -> None:
        self._response.resume()

    def stopProducing(self) -> None:
        self._response.abort()

    def loseConnection(self) -> None:
        self._response.abort()

    def abortConnection(self) -> None:
        self._response.abort()


class _ProtocolSink:
    """
    Feeds body bytes to a protocol's C{dataReceived}, and its end to C{connectionLost}
    exactly once, never from inside C{dataReceived}: a protocol that drops the
    connection while handling data (treq's collector past a size cap) finishes that
    call before it hears of the end, as with Twisted's own responses.
    """

    __slots__ = ("_busy", "_lost", "protocol")

    def __init__(self, protocol: IProtocol) -> None:
        self.protocol = protocol
        self._busy = False
        self._lost: Failure | None = None

    def write(self, data: bytes) -> None:
        self._busy = True
        try:
            self.protocol.dataReceived(data)
        finally:
            self._busy = False
            lost, self._lost = self._lost, None
            if lost is not None:
                self.protocol.connectionLost(lost)

    def lose(self, reason: Failure) -> None:
        if self._busy:
            self._lost = reason
        else:
            self.protocol.connectionLost(reason)


@implementer(IResponse)
class AgentResponse:
    """
    An L{UpstreamResponse} as an L{IResponse}.
    """

    previousResponse: IResponse | None = None

    def __init__(
        self,
        response: UpstreamResponse,
        request: _SentRequest,
        record: UpstreamCall | None,
    ) -> None:
        self._response = response
        self._record = record
        self.request = request
        major, _, minor = response.version[5:].partition(b".")
        self.version = (b"HTTP", int(major), int(minor or 0))
        self.code = response.code
        self.phrase = response.phrase
        headers = Headers()
        add = headers.addRawHeader
        for name, value in response.headers:
            add(name, value)
        self.headers = headers
        if not response.has_body:
            self.length: int | object = 0
        elif response.length is not None:
            self.length = response.length
        else:
            self.length = UNKNOWN_LENGTH

    def deliverBody(self, protocol: IProtocol) -> None:
        """
        Stream the body into C{protocol}: C{makeConnection} with a transport that can
        pause, resume and abort, C{dataReceived} per piece, then C{connectionLost} with
        L{ResponseDone} or L{ResponseFailed}.
        """
        response = self._response
        protocol.makeConnection(_BodyTransport(response))  # type: ignore[arg-type]
        sink = _ProtocolSink(protocol)
        delivered = response.deliver(sink)
        delivered.addCallbacks(self._done, self._failed, callbackArgs=(sink,), errbackArgs=(sink,))

    def _done(self, result: None, sink: _ProtocolSink) -> None:
        if self._record is not None:
            self._record.end(self.code)
        sink.lose(_BODY_DONE)

    def _failed(self, reason: Failure, sink: _ProtocolSink) -> None:
        if self._record is not None:
            self._record.end(self.code, "body: " + describe_error(reason.value))
        sink.lose(Failure(ResponseFailed([reason])))

    def setPreviousResponse(self, response: IResponse) -> None:
        """
        Record the response this one follows (redirects; never used by the gateway).
        """
        self.previousResponse = response

    def abort(self) -> None:
        """
        Drop the upstream connection now (a record this response ends is ended as
        aborted, unless the body already ended it).
        """
        self._response.abort()
        if self._record is not None:
            self._record.end(self.code, "aborted")


@implementer(IAgent)
class UpstreamAgent:
    """
    L{IAgent} over an L{UpstreamClient}.

    @param client: The gateway's connection pool.
    @param reactor: For C{timeout}.
    @param verify_tls: Check https upstreams' certificates (always, but for tests and
        C{insecureSkipVerify}-style setups).
    @param timeout: Seconds for connecting, sending and receiving the response head;
        L{None} leaves it to the caller (the api fan-out has its own deadline).
    @param tracer: The tracer for calls made outside any request (a request's own
        tracer is used for the calls bound to it).
    """

    def __init__(
        self,
        client: UpstreamClient,
        reactor: IReactorTime,
        *,
        verify_tls: bool = True,
        timeout: float | None = None,
        tracer: Any = None,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        self._client = client
        self._reactor = reactor
        self._verify_tls = verify_tls
        self._timeout = timeout
        self._tracer = tracer
        self._metrics = metrics
        self._origins: dict[bytes, Upstream] = {}

    def call(
        self,
        context: CallContext | None,
        name: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        fresh: tuple[bytes, Callable[[], bytes]] | None = None,
    ) -> UpstreamCallAgent:
        """
        An agent for one call made for C{context} (a request), recorded under C{name}.

        @param fresh: A header whose value must be made anew for a retry (name, maker):
            an identity assertion, whose token id a peer accepts once.

        @param headers: Header fields the caller has already computed as byte pairs
            (sent before any given to C{request}): a per-request header set needs no
            Twisted C{Headers} object, which treq would copy and the agent flatten again.
            Framing, C{Host} and hop-by-hop fields among them are dropped, as from
            C{request}'s.
        """
        if headers:
            headers = [
                (field, value) for field, value in headers if field.lower() not in _NOT_FORWARDED
            ]
        return UpstreamCallAgent(self, context, name, headers, fresh)

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        """
        Send one request; its record ends with the response body (or the failure).
        """
        return self.send(None, "upstream", method, uri, headers, bodyProducer, True, ())[0]

    def send(
        self,
        context: CallContext | None,
        name: str,
        method: bytes,
        uri: bytes,
        headers: Headers | None,
        body: IBodyProducer | None,
        auto_end: bool,
        prepared: Sequence[tuple[bytes, bytes]],
        holder: UpstreamCallAgent | None = None,
        fresh: tuple[bytes, Callable[[], bytes]] | None = None,
    ) -> tuple[Deferred[IResponse], UpstreamCall | None]:
        """
        Send one request on the pool.

        @param auto_end: End the call's record with the body or failure; otherwise the
            caller ends it with its own verdict.
        @param prepared: Header fields to send before C{headers}' (see L{call}).
        @param holder: The call agent to give the response to (so that it can abort it).
        @return: The response Deferred, and the call's record (L{None} when the request
            could not even be started: a URL that is not http(s) with a host).
        """
        scheme_end = uri.find(b"://")
        if scheme_end == -1:
            return fail(ValueError(f"not an absolute http(s) URL: {uri[:200]!r}")), None
        authority_start = scheme_end + 3
        path_start = len(uri)
        for delimiter in (b"/", b"?", b"#"):
            found = uri.find(delimiter, authority_start)
            if found != -1 and found < path_start:
                path_start = found
        origin = uri[:path_start]
        upstream = self._origins.get(origin)
        if upstream is None:
            try:
                upstream = Upstream.from_url(origin.decode("ascii"), self._verify_tls)
            except (ValueError, UnicodeDecodeError) as e:
                return fail(e), None
            if len(self._origins) >= _MAX_ORIGINS:
                self._origins.clear()
            self._origins[origin] = upstream
        target = uri[path_start:].partition(b"#")[0]
        if target[:1] != b"/":
            target = b"/" + target
        outgoing = [(b"Host", upstream.authority), _IDENTITY, *prepared]
        if headers is not None:
            append = outgoing.append
            for field, values in headers.getAllRawHeaders():
                if field.lower() not in _NOT_FORWARDED:
                    for value in values:
                        append((field, value))
        record = start_call(
            context, name, upstream, method, target, outgoing, self._tracer, self._metrics
        )
        refresh = None
        if fresh is not None:
            fresh_name, make = fresh

            def refresh() -> list[tuple[bytes, bytes]]:
                return [
                    (field, make() if field == fresh_name else value) for field, value in outgoing
                ]

        pending = self._client.request(upstream, method, target, outgoing, body, refresh=refresh)
        if self._timeout is not None:
            pending.addTimeout(self._timeout, self._reactor)
        sent = _SentRequest(method, uri, headers if headers is not None else Headers())
        response: Deferred[IResponse] = pending.addCallbacks(
            _received,
            _not_received,
            callbackArgs=(sent, record, auto_end, holder),
            errbackArgs=(record, auto_end),
        )
        return response, record


def _received(
    response: UpstreamResponse,
    sent: _SentRequest,
    record: UpstreamCall,
    auto_end: bool,
    holder: UpstreamCallAgent | None,
) -> IResponse:
    codings = [value for name, value in response.headers if name.lower() == b"content-encoding"]
    if codings and any(
        coding.strip(b" \t").lower() not in (b"", b"identity")
        for value in codings
        for coding in value.split(b",")
    ):
        response.abort()
        error = ContentCodingError(f"content coding {b', '.join(codings)[:100]!r} not asked for")
        # The agent's own verdict: the record says so, with the status that came.
        record.end(response.code, describe_error(error))
        raise error
    if auto_end and not response.has_body:
        # Nothing to deliver (HEAD, 204, 304, Content-Length: 0): treq never asks for
        # the body of such a response, so the call ends here.
        record.end(response.code)
        auto_end = False
    received = AgentResponse(response, sent, record if auto_end else None)
    if holder is not None:
        holder._received = received
    return received


def _not_received(reason: Failure, record: UpstreamCall, auto_end: bool) -> Failure:
    if auto_end:
        record.end(
            error="cancelled" if reason.check(CancelledError) else describe_error(reason.value)
        )
    return reason


@implementer(IAgent)
class UpstreamCallAgent:
    """
    An agent for one upstream call made for a request: the call's record is named and
    goes to the request's access-log line, and the caller ends it with its verdict.

    @ivar record: The call's record once the request was sent (L{None} before).
    """

    def __init__(
        self,
        agent: UpstreamAgent,
        context: CallContext | None,
        name: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        fresh: tuple[bytes, Callable[[], bytes]] | None = None,
    ) -> None:
        self._agent = agent
        self._fresh = fresh
        self._context = context
        self._name = name
        self._headers = headers or ()
        self._sent = False
        self._received: AgentResponse | None = None
        self.record: UpstreamCall | None = None

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        """
        Send the call's request (once).
        """
        if self._sent:
            raise RuntimeError("an UpstreamCallAgent sends one request")
        self._sent = True
        response, self.record = self._agent.send(
            self._context,
            self._name,
            method,
            uri,
            headers,
            bodyProducer,
            False,
            self._headers,
            self,
            self._fresh,
        )
        return response

    def abort(self) -> None:
        """
        Drop the upstream connection of the response received, if any (a cancelled
        body read).
        """
        if self._received is not None:
            self._received.abort()

    def end(
        self, status: int | None = None, error: str | None = None, error_class: str | None = None
    ) -> None:
        """
        Record the call's outcome (later calls do nothing); see L{UpstreamCall.end}.
        """
        if self.record is not None:
            self.record.end(status, error, error_class)
