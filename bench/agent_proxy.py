"""
A minimal reverse proxy on C{twisted.web.client.Agent}: the floor that edgegw's
C{reverse-proxy} route is compared against.

One Twisted Site whose leaf resource forwards each GET (and HEAD) to the upstream with an
Agent over a persistent L{HTTPConnectionPool} sized to the benchmark's concurrency, and
relays the status, the end-to-end headers and the body (with back-pressure from the
client to the upstream). No access log, no routing, no header policy: nothing but the
proxying itself.

Run as C{python -m bench.agent_proxy --port PORT --upstream http://127.0.0.1:N}.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IPushProducer, IReactorTCP
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

# RFC 9110 section 7.6.1: connection-specific fields are not forwarded. Host is dropped
# from requests too; the Agent sets the upstream's (as nginx's proxy_pass does).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED_UPSTREAM = HOP_BY_HOP | {b"host"}


def _copy_headers(source: Headers, target: Headers, skip: frozenset[bytes]) -> None:
    for name, values in source.getAllRawHeaders():
        if name.lower() not in skip:
            target.setRawHeaders(name, values)


_DONE = Failure(ResponseDone())


class _BodyRelay(Protocol):
    """
    Writes the upstream response body to the client request as it arrives, pausing the
    upstream while the client's send buffer is full.
    """

    def __init__(self, request: Request) -> None:
        self.request = request

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.request.registerProducer(IPushProducer(self.transport), True)

    def dataReceived(self, data: bytes) -> None:
        self.request.write(data)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        request = self.request
        if request._disconnected:
            return
        request.unregisterProducer()
        if reason.check(ResponseDone, PotentialDataLoss):
            request.finish()
        else:
            # The upstream broke off mid-body: the client must not take it as complete.
            assert request.channel is not None
            request.channel.forceAbortClient()


class _Exchange:
    """
    One proxied request: the upstream request, then the relay of its response.
    """

    def __init__(self, request: Request, upstream: Deferred[IResponse]) -> None:
        self.request = request
        self.upstream = upstream
        self.relay: _BodyRelay | None = None
        request.notifyFinish().addErrback(self._client_gone)
        upstream.addCallbacks(self._respond, self._failed)

    def _respond(self, response: IResponse) -> None:
        request = self.request
        if request._disconnected:
            response.deliverBody(Protocol())
            return
        request.setResponseCode(response.code, response.phrase)
        _copy_headers(response.headers, request.responseHeaders, HOP_BY_HOP)
        # Send the head now, not with the first body bytes: a stream (server-sent
        # events) may send nothing for a long time.
        request.write(b"")
        self.relay = _BodyRelay(request)
        response.deliverBody(self.relay)

    def _failed(self, reason: Failure) -> None:
        request = self.request
        if reason.check(CancelledError) or request._disconnected:
            return
        request.setResponseCode(502)
        request.responseHeaders.setRawHeaders(b"content-type", [b"text/plain"])
        request.write(b"bad gateway\n")
        request.finish()

    def _client_gone(self, reason: Failure) -> None:
        if self.relay is None:
            self.upstream.cancel()
        elif self.relay.transport is not None:
            IPushProducer(self.relay.transport).stopProducing()


class ProxyResource(Resource):
    """
    The Site's only resource: forwards every GET and HEAD to C{upstream}.
    """

    isLeaf = True

    def __init__(self, agent: IAgent, upstream: bytes) -> None:
        super().__init__()
        self.agent = agent
        self.upstream = upstream.rstrip(b"/")

    def render(self, request: Request) -> bytes | int:
        """
        Start the upstream request and answer when its response arrives.
        """
        if request.method not in (b"GET", b"HEAD"):
            request.setResponseCode(405)
            request.responseHeaders.setRawHeaders(b"allow", [b"GET, HEAD"])
            return b""
        headers = Headers()
        _copy_headers(request.requestHeaders, headers, _NOT_FORWARDED_UPSTREAM)
        upstream = self.agent.request(request.method, self.upstream + request.uri, headers)
        _Exchange(request, upstream)
        return NOT_DONE_YET


class QuietSite(Site):
    """
    A Site without an access log, like the nginx instances (C{access_log off}).
    """

    def log(self, request: http.Request) -> None:
        """Log nothing."""


def make_site(upstream: str, pool_size: int) -> Site:
    """
    The proxy's Site: an Agent on a persistent pool keeping up to C{pool_size} idle
    connections to C{upstream} (C{http://host:port}).
    """
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = pool_size
    pool.cachedConnectionTimeout = 600
    agent = Agent(reactor, pool=pool)
    return QuietSite(ProxyResource(agent, upstream.encode("ascii")))


def main(argv: Sequence[str] | None = None) -> None:
    """
    Serve the proxy on 127.0.0.1 until SIGTERM.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.agent_proxy", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--pool-size", type=int, default=50, help="idle upstream connections")
    args = parser.parse_args(argv)
    listen(args.port, make_site(args.upstream, args.pool_size))
    reactor.run()


def listen(port: int, site: Site) -> None:
    """
    Listen on 127.0.0.1:C{port} with a backlog deep enough for thousands of connects.
    """
    tcp: IReactorTCP = reactor
    TCP4ServerEndpoint(tcp, port, backlog=4096, interface="127.0.0.1").listen(site)


if __name__ == "__main__":
    main()
