"""
Upstream addresses, connections, TLS, and the pool of idle keep-alive connections.

Pool policy: idle connections are kept per L{Upstream}, most recently used first
(LIFO keeps a few connections warm and lets the rest reach the idle timeout), at most
C{max_idle_per_upstream} of them; one timer sweeps those idle for longer than
C{idle_timeout}. Concurrency is not capped: a request that finds no idle connection
opens a new one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any, Final, cast
from urllib.parse import urlsplit

import attrs
from OpenSSL.SSL import Connection as TLSConnection
from twisted.internet._sslverify import IOpenSSLTrustRoot
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.error import ConnectingCancelledError, ConnectionAborted, ConnectionClosed
from twisted.internet.interfaces import (
    IDelayedCall,
    IOpenSSLClientConnectionCreator,
    IProtocol,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.internet.ssl import Certificate, CertificateOptions, optionsForClientTLS
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

from edgegw.upstream.http11 import UpstreamConnection, UpstreamResponse, encode_request

__all__ = ["Upstream", "UpstreamClient"]

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# Methods a client may repeat without changing the outcome (RFC 9110 section 9.2.2);
# PUT and DELETE only qualify here because retries are limited to bodiless requests.
_RETRYABLE: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
# Slack when comparing idle deadlines, so that a sweep scheduled for exactly the
# deadline is not defeated by float rounding.
_SWEEP_SLACK: Final = 0.001


def _authority(scheme: str, host: str, port: int) -> bytes:
    try:
        name = host.encode("ascii")
    except UnicodeEncodeError:
        name = host.encode("idna")
    if ":" in host:
        name = b"[" + name + b"]"
    if port == _DEFAULT_PORTS.get(scheme):
        return name
    return b"%s:%d" % (name, port)


@attrs.frozen(cache_hash=True)
class Upstream:
    """
    Where requests go: scheme, host and port, and whether its certificate is checked.

    @ivar scheme: C{"http"} or C{"https"}.
    @ivar host: A host name or an IP literal (IPv6 without brackets).
    @ivar port: The TCP port.
    @ivar verify_tls: L{False} to accept any certificate (C{insecureSkipVerify}).
    """

    scheme: str = attrs.field(validator=attrs.validators.in_(("http", "https")))
    host: str
    port: int
    verify_tls: bool = True
    _authority: bytes = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_authority", _authority(self.scheme, self.host, self.port))

    @classmethod
    def from_url(cls, url: str, verify_tls: bool = True) -> Upstream:
        """
        The upstream of a base URL such as C{"https://api.internal:8443/v1"} (the path
        is not part of it).

        @raise ValueError: Not an http or https URL with a host (and no credentials).
        """
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"upstream URL must be http or https: {url!r}")
        host = parts.hostname
        if not host:
            raise ValueError(f"upstream URL has no host: {url!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"upstream URL must not carry credentials: {url!r}")
        port = parts.port  # raises ValueError when out of range
        if port == 0:
            raise ValueError(f"upstream URL has port 0: {url!r}")
        return cls(scheme, host, port or _DEFAULT_PORTS[scheme], verify_tls)

    @property
    def authority(self) -> bytes:
        """
        The C{Host} header value: C{host[:port]}, the port left out when it is the
        scheme's default, an IPv6 literal in brackets.
        """
        return self._authority


@implementer(IOpenSSLClientConnectionCreator)
class _UnverifiedTLS:
    """
    TLS for C{insecureSkipVerify}: any certificate is accepted, but the server name is
    still sent (SNI).
    """

    def __init__(self, hostname: str) -> None:
        self._options = CertificateOptions(verify=False)
        self._server_name: bytes | None = None
        if not (isIPAddress(hostname) or isIPv6Address(hostname)):
            self._server_name = hostname.encode("idna")

    def clientConnectionForTLS(self, tlsProtocol: Any) -> TLSConnection:
        connection: TLSConnection = self._options.clientConnectionForTLS(tlsProtocol)
        if self._server_name is not None:
            connection.set_tlsext_host_name(self._server_name)
        return connection


class _ConnectionFactory(Factory):
    """
    Builds the connections of one upstream, wired to its pool.
    """

    noisy = False

    def __init__(
        self,
        on_idle: Callable[[UpstreamConnection], None],
        on_lost: Callable[[UpstreamConnection], None],
    ) -> None:
        self._on_idle = on_idle
        self._on_lost = on_lost

    def buildProtocol(self, addr: Any) -> UpstreamConnection:
        return UpstreamConnection(self._on_idle, self._on_lost)


@attrs.frozen
class _Connector:
    endpoint: IStreamClientEndpoint
    factory: _ConnectionFactory


def _send(
    protocol: IProtocol,
    head: bytes,
    head_request: bool,
    body: IBodyProducer | None,
    length: int | None,
    upgrade: bool,
) -> Deferred[UpstreamResponse]:
    connection = cast(UpstreamConnection, protocol)
    return connection.send(head, head_request, body, length, upgrade)


def _connect_cancelled(reason: Failure) -> Failure:
    # An endpoint cancelled while connecting fails with ConnectingCancelledError: to the
    # caller that cancelled (a deadline, a client gone) it is a cancellation like any
    # other, which addTimeout turns into a timeout.
    if reason.check(ConnectingCancelledError):
        return Failure(CancelledError())
    return reason


class UpstreamClient:
    """
    The gateway's HTTP/1.1 client for upstreams, with a persistent connection pool.

    @param reactor: Provides L{IReactorTCP}, L{IReactorTime} and (for host names)
        L{IReactorPluggableNameResolver}.
    @param max_idle_per_upstream: The most idle connections kept per upstream.
    @param idle_timeout: Seconds an idle connection is kept.
    @param connect_timeout: Seconds a TCP connection attempt may take.
    @param tls_trust_root: What verified https upstreams' certificates must chain to
        (a L{Certificate}, or e.g. L{twisted.internet.ssl.trustRootFromCertificates});
        the platform's trust store by default. Tests inject their own CA here.
    """

    def __init__(
        self,
        reactor: Any,
        *,
        max_idle_per_upstream: int = 128,
        idle_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        tls_trust_root: IOpenSSLTrustRoot | Certificate | None = None,
    ) -> None:
        self._reactor = reactor
        self._max_idle = max_idle_per_upstream
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self._trust_root = tls_trust_root
        self._idle: dict[Upstream, list[UpstreamConnection]] = {}
        self._connectors: dict[Upstream, _Connector] = {}
        self._sweep: IDelayedCall | None = None
        self._closed = False

    def request(
        self,
        upstream: Upstream,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: IBodyProducer | None = None,
        *,
        upgrade: bool = False,
    ) -> Deferred[UpstreamResponse]:
        """
        Send a request upstream, on an idle pooled connection when there is one.

        @param method: The request method.
        @param target: The request-target (origin form: path and query).
        @param headers: Exactly the header fields to send, in order: C{Host} included,
            hop-by-hop fields, C{Content-Length} and C{Transfer-Encoding} left out. The
            client adds the body framing: C{Content-Length} when C{body.length} is an
            integer, C{Transfer-Encoding: chunked} when it is C{UNKNOWN_LENGTH},
            nothing when C{body} is L{None}.
        @param body: Streamed with C{body.startProducing}; paused while the socket's
            send buffer is full.
        @param upgrade: The headers ask for a protocol upgrade: use a fresh connection,
            never pooled afterwards; a 101 response can then be
            L{detached<UpstreamResponse.detach>}.

        @return: Fires with the response once its head has arrived. Fails with the
            original failure (refused, DNS, TLS verification, L{UpstreamProtocolError},
            the connection closing before a complete head). Cancelling it aborts the
            connection. A bodiless request with an idempotent method that finds its
            pooled connection closed by the server before any response byte is retried
            once on a fresh connection.
        """
        try:
            head, length = encode_request(method, target, headers, body)
        except ValueError:
            return fail()
        head_request = method == b"HEAD"
        if not upgrade:
            idle = self._idle.get(upstream)
            if idle:
                connection = idle.pop()
                d = connection.send(head, head_request, body, length, False)
                if body is None and method in _RETRYABLE:
                    d.addErrback(self._retry_stale, connection, upstream, head, head_request)
                return d
        return self._connect(upstream, head, head_request, body, length, upgrade)

    def close(self) -> Deferred[None]:
        """
        Close every idle pooled connection; exchanges in flight finish, and their
        connections are then closed instead of kept (the pool is shutting down: nothing
        may be left holding a socket or a timer).

        @return: Fires once the idle connections are closed.
        """
        self._closed = True
        if self._sweep is not None:
            if self._sweep.active():
                self._sweep.cancel()
            self._sweep = None
        closing: list[Deferred[None]] = []
        for idle in self._idle.values():
            connections = idle[:]
            idle.clear()
            closing.extend(connection.close() for connection in connections)
        return gatherResults(closing).addCallback(lambda ignored: None)

    def idle_connections(self, upstream: Upstream) -> int:
        """
        How many idle connections the pool holds for C{upstream}.
        """
        return len(self._idle.get(upstream, ()))

    # -- connecting --------------------------------------------------------------------

    def _connect(
        self,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
        body: IBodyProducer | None,
        length: int | None,
        upgrade: bool,
    ) -> Deferred[UpstreamResponse]:
        connector = self._connectors.get(upstream)
        if connector is None:
            connector = self._connectors[upstream] = self._connector(upstream)
        connecting: Deferred[IProtocol] = connector.endpoint.connect(connector.factory)
        connecting.addErrback(_connect_cancelled)
        return connecting.addCallback(_send, head, head_request, body, length, upgrade)

    def _connector(self, upstream: Upstream) -> _Connector:
        reactor = self._reactor
        host = upstream.host
        timeout = self._connect_timeout
        endpoint: IStreamClientEndpoint
        # IP literals skip the resolver (and its thread) altogether.
        if isIPAddress(host):
            endpoint = TCP4ClientEndpoint(reactor, host, upstream.port, timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(reactor, host, upstream.port, timeout)
        else:
            endpoint = HostnameEndpoint(reactor, host, upstream.port, timeout)
        if upstream.scheme == "https":
            creator: IOpenSSLClientConnectionCreator
            if upstream.verify_tls:
                # No ALPN offer: HTTP/1.1 is what a client without ALPN gets anyway, and
                # some servers (a Twisted TLS listener whose factory does not negotiate
                # protocols, as WebSocket servers often are) abort handshakes offering it.
                creator = optionsForClientTLS(host, trustRoot=self._trust_root)
            else:
                creator = _UnverifiedTLS(host)
            endpoint = wrapClientTLS(creator, endpoint)
        factory = _ConnectionFactory(
            partial(self._release, upstream), partial(self._forget, upstream)
        )
        return _Connector(endpoint, factory)

    def _retry_stale(
        self,
        reason: Failure,
        connection: UpstreamConnection,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
    ) -> Deferred[UpstreamResponse] | Failure:
        # The server closed a kept-alive connection as we reused it (the request and
        # its FIN crossed): nothing was processed, so one retry on a fresh connection
        # is safe for a repeatable request.
        if (
            connection.response_started
            or not reason.check(ConnectionClosed)
            or reason.check(ConnectionAborted, CancelledError)
        ):
            return reason
        return self._connect(upstream, head, head_request, None, None, False)

    # -- the pool ----------------------------------------------------------------------

    def _release(self, upstream: Upstream, connection: UpstreamConnection) -> None:
        if self._closed:
            connection.close()
            return
        idle = self._idle.get(upstream)
        if idle is None:
            idle = self._idle[upstream] = []
        if len(idle) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = self._reactor.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._reactor.callLater(self._idle_timeout, self._expire)

    def _forget(self, upstream: Upstream, connection: UpstreamConnection) -> None:
        idle = self._idle.get(upstream)
        if idle:
            with contextlib.suppress(ValueError):
                idle.remove(connection)

    def _expire(self) -> None:
        self._sweep = None
        now = self._reactor.seconds()
        cutoff = now - self._idle_timeout + _SWEEP_SLACK
        earliest: float | None = None
        for idle in self._idle.values():
            # Each list is in release order, so the expired ones are a prefix.
            count = 0
            for connection in idle:
                if connection.idle_since > cutoff:
                    break
                count += 1
            if count:
                expired = idle[:count]
                del idle[:count]
                for connection in expired:
                    connection.close()
            if idle and (earliest is None or idle[0].idle_since < earliest):
                earliest = idle[0].idle_since
        if earliest is not None:
            delay = max(0.0, earliest + self._idle_timeout - now)
            self._sweep = self._reactor.callLater(delay, self._expire)
