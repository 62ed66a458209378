"""
A minimal cookie-keeping HTTP "browser" for tests, over L{twisted.web.client.Agent} on
the real reactor.

  - every connection closes after its response (C{Connection: close}), and each request
    waits until its connection has gone, so tests leave no connection behind;
  - redirects are never followed automatically: L{Browser.follow} follows them on
    request, recording the URLs visited;
  - one cookie jar keyed by cookie name only (tests run everything on 127.0.0.1):
    C{Domain} and C{Path} are ignored, C{Max-Age<=0} or a past C{Expires} deletes, and
    the raw C{Set-Cookie} lines of the last response stay visible for assertions on
    C{HttpOnly}, C{Secure}, C{SameSite} and the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from io import BytesIO
from typing import Any
from urllib.parse import urldefrag, urlencode, urljoin

from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    BrowserLikePolicyForHTTPS,
    FileBodyProducer,
    HTTPConnectionPool,
    readBody,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

reactor: Any = _global_reactor

__all__ = ["Browser", "BrowserResponse", "TooManyRedirectsError", "parse_set_cookie"]

#: The statuses L{Browser.follow} follows (when a C{Location} comes with them).
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

#: The C{User-Agent} every request carries unless the caller sends its own.
USER_AGENT = "edgegw-tests"


class TooManyRedirectsError(Exception):
    """
    L{Browser.follow} met more redirects than it was allowed to follow.
    """


@dataclass
class BrowserResponse:
    """
    A complete response as L{Browser} received it.

    @ivar status: The status code.
    @ivar headers: The response headers.
    @ivar body: The whole body.
    @ivar url: The URL requested (without its fragment).
    @ivar location: The C{Location} header exactly as sent, or L{None}.
    """

    status: int
    headers: Headers
    body: bytes
    url: str
    location: str | None

    def json(self) -> Any:
        """
        The body decoded as JSON.
        """
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """
        The first value of header C{name} (case-insensitive), or L{None}.
        """
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    @property
    def absolute_location(self) -> str | None:
        """
        The C{Location} header resolved against L{url}, or L{None}.
        """
        return None if self.location is None else urljoin(self.url, self.location)


def parse_set_cookie(line: str) -> tuple[str, str, dict[str, str]]:
    """
    Split one C{Set-Cookie} value into its name, its value and its attributes (names
    lowercased; a flag such as C{HttpOnly} maps to C{""}).
    """
    pair, *attributes = line.split(";")
    name, _, value = pair.partition("=")
    parsed: dict[str, str] = {}
    for attribute in attributes:
        key, _, attribute_value = attribute.partition("=")
        if key.strip():
            parsed[key.strip().lower()] = attribute_value.strip()
    return name.strip(), value.strip(), parsed


def _deletes(attributes: dict[str, str], now: float) -> bool:
    """
    Whether a cookie with these attributes is already expired (RFC 6265 5.2.2: a valid
    C{Max-Age} wins over C{Expires}).
    """
    max_age = attributes.get("max-age")
    if max_age is not None:
        try:
            return int(max_age) <= 0
        except ValueError:
            pass  # an invalid Max-Age is ignored
    expires = attributes.get("expires")
    if expires is not None:
        try:
            return parsedate_to_datetime(expires).timestamp() <= now
        except (TypeError, ValueError):
            return False
    return False


@implementer(IStreamClientEndpoint)
class _TrackingEndpoint:
    """
    An endpoint whose connections report to C{track} when they are made and lost.
    """

    def __init__(self, inner: IStreamClientEndpoint, track: _ConnectionTracker) -> None:
        self._inner = inner
        self._track = track

    def connect(self, protocolFactory: Any) -> Deferred[Any]:
        return self._inner.connect(_TrackingFactory(protocolFactory, self._track))


class _TrackingFactory(Factory):
    noisy = False

    def __init__(self, inner: Any, track: _ConnectionTracker) -> None:
        self._inner = inner
        self._track = track

    def buildProtocol(self, addr: Any) -> Protocol | None:
        protocol: Protocol | None = self._inner.buildProtocol(addr)
        if protocol is None:
            return None
        track = self._track
        original: Callable[[Failure], None] = protocol.connectionLost
        track.opened(protocol)

        def connectionLost(reason: Failure) -> None:
            try:
                original(reason)
            finally:
                track.closed(protocol)

        protocol.connectionLost = connectionLost  # type: ignore[method-assign,assignment]
        return protocol


class _ConnectionTracker:
    """
    The browser's open connections, and waiting for all of them to close.
    """

    def __init__(self) -> None:
        self.open: list[Protocol] = []
        self._waiters: list[Deferred[None]] = []

    def opened(self, protocol: Protocol) -> None:
        self.open.append(protocol)

    def closed(self, protocol: Protocol) -> None:
        if protocol in self.open:
            self.open.remove(protocol)
        if not self.open:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.callback(None)

    async def all_closed(self) -> None:
        while self.open:
            waiter: Deferred[None] = Deferred()
            self._waiters.append(waiter)
            await waiter


@implementer(IAgentEndpointFactory)
class _EndpointFactory:
    """
    What L{twisted.web.client.Agent} does by default (TCP for http, TLS over TCP for
    https), with every connection tracked.
    """

    def __init__(self, policy: IPolicyForHTTPS, track: _ConnectionTracker) -> None:
        self._policy = policy
        self._track = track

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        endpoint: IStreamClientEndpoint = HostnameEndpoint(
            reactor, uri.host.decode("ascii"), uri.port
        )
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self._policy.creatorForNetloc(uri.host, uri.port), endpoint)
        elif uri.scheme != b"http":
            raise ValueError(f"unsupported scheme in {uri.toBytes()!r}")
        return _TrackingEndpoint(endpoint, self._track)


@dataclass
class Browser:
    """
    A cookie-keeping HTTP client for tests that never follows redirects on its own.

    @ivar cookies: The cookie jar: name to value (all hosts and paths share it).
    @ivar set_cookie_lines: The raw C{Set-Cookie} values of the last response.
    @ivar history: The URLs the last L{follow} visited, in order (the first included).
    @ivar user_agent: The C{User-Agent} sent unless a request names its own.
    @ivar tls_policy: How https URLs are verified (a browser-like policy by default).
    """

    cookies: dict[str, str] = field(default_factory=dict)
    user_agent: str = USER_AGENT
    tls_policy: IPolicyForHTTPS = field(default_factory=BrowserLikePolicyForHTTPS)
    set_cookie_lines: list[str] = field(default_factory=list, init=False)
    history: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._connections = _ConnectionTracker()
        pool = HTTPConnectionPool(reactor, persistent=False)
        self._agent = Agent.usingEndpointFactory(
            reactor, _EndpointFactory(self.tls_policy, self._connections), pool=pool
        )

    async def request(
        self,
        method: str,
        url: str,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        cookies: bool = True,
    ) -> BrowserResponse:
        """
        Send one request (with the jar's cookies as one C{Cookie} header unless
        C{cookies} is false or C{headers} names its own), read the whole response, store
        its cookies, and wait until the connection has closed.
        """
        url = urldefrag(url).url
        outgoing = Headers({b"User-Agent": [self.user_agent.encode("latin-1")]})
        if cookies and self.cookies:
            outgoing.setRawHeaders(
                b"Cookie",
                ["; ".join(f"{name}={value}" for name, value in self.cookies.items())],
            )
        for name, value in (headers or {}).items():
            outgoing.setRawHeaders(name, [value])
        producer = None if body is None else FileBodyProducer(BytesIO(body))
        try:
            response = await self._agent.request(
                method.encode("ascii"), url.encode("ascii"), outgoing, producer
            )
            content = await readBody(response)
        finally:
            await self._connections.all_closed()
        lines = list(response.headers.getRawHeaders("Set-Cookie", []))
        self.set_cookie_lines = lines
        self._store(lines)
        location = response.headers.getRawHeaders("Location")
        return BrowserResponse(
            int(response.code), response.headers, content, url, location[0] if location else None
        )

    def _store(self, lines: list[str]) -> None:
        now = reactor.seconds()
        for line in lines:
            name, value, attributes = parse_set_cookie(line)
            if not name:
                continue
            if _deletes(attributes, now):
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value

    async def get(
        self, url: str, headers: dict[str, str] | None = None, cookies: bool = True
    ) -> BrowserResponse:
        """
        C{GET url}; a redirect is returned, not followed.
        """
        return await self.request("GET", url, headers, cookies=cookies)

    async def post(
        self,
        url: str,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        cookies: bool = True,
    ) -> BrowserResponse:
        """
        C{POST url} with C{data} form-encoded (C{application/x-www-form-urlencoded}).
        """
        sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
        return await self.request(
            "POST", url, sent, urlencode(data or {}).encode("ascii"), cookies=cookies
        )

    async def follow(
        self,
        url: str,
        max_hops: int = 10,
        headers: dict[str, str] | None = None,
        cookies: bool = True,
    ) -> BrowserResponse:
        """
        C{GET url} and follow redirects (C{Location}, resolved against the URL that
        answered) with C{GET}s until a response that is not one, at most C{max_hops}
        times; L{history} lists every URL requested.

        @raise TooManyRedirectsError: When the last hop allowed still answered a redirect.
        """
        self.history = []
        hops = 0
        while True:
            self.history.append(urldefrag(url).url)
            response = await self.get(url, headers, cookies=cookies)
            target = response.absolute_location
            if response.status not in REDIRECT_STATUSES or target is None:
                return response
            if hops == max_hops:
                raise TooManyRedirectsError(f"more than {max_hops} redirects: {self.history}")
            hops += 1
            url = target

    def set_cookie(self, name: str) -> str | None:
        """
        The last response's raw C{Set-Cookie} line for cookie C{name}, or L{None}.
        """
        for line in self.set_cookie_lines:
            if parse_set_cookie(line)[0] == name:
                return line
        return None
