"""
The client-side limits of C{Gateway.spec.limits}, applied by the Site to each connection
it accepts: the request head and body deadlines (kept by L{GatewayChannel} itself) and the
caps on concurrent connections, per process and per client address.

A connection beyond a cap is closed at once, before anything is read from it: no
channel, no timer, nothing parsed. Refusals are counted, and logged at most once per
L{REFUSAL_LOG_INTERVAL} (a flood must not flood the log too).

The connections outlive a reload: the new configuration's Site takes over the old one's
table (L{LimitedSite.take_over}), so the caps count every open connection of the
listener whichever configuration serves it, and each connection serves its next request
from the new Site. Nothing is closed because of a reload.
"""

from __future__ import annotations

import ipaddress
import resource
from collections.abc import Callable
from typing import Any, Final, cast
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.web.resource import IResource
from twisted.web.server import Site

from edgegw.config.model import LimitsSpec
from edgegw.metrics.gateway_metrics import IMetrics
from edgegw.server.channel import GatewayChannel
from edgegw.server.h2.connection import H2ServerConnection
from edgegw.server.negotiate import NegotiatingConnection
from edgegw.server.request import GatewayRequest

__all__ = [
    "DESCRIPTOR_RESERVE",
    "REFUSAL_LOG_INTERVAL",
    "ClientConnections",
    "GatewaySite",
    "LimitedSite",
    "address_key",
    "fit_descriptor_limit",
]

REFUSAL_LOG_INTERVAL: Final = 10.0
"""Seconds between two log lines about refused connections."""

DESCRIPTOR_RESERVE: Final = 256
"""
File descriptors kept for everything but client connections and the upstream connection
each may hold (listening sockets, log files, idle pooled connections, DNS).
"""

_REFUSED: Final = object()
_IPV4_MAPPED: Final = b"\0" * 10 + b"\xff\xff"


def address_key(address: IAddress | None) -> Any:
    """
    What connections from one client share, for the per-address cap: the IPv4 address;
    an IPv6 address's /64 prefix (one host usually controls a whole /64), an IPv4-mapped
    one as its IPv4 address; L{None} for peers without an IP address (UNIX sockets).
    """
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return None
    if ":" not in host:
        return host
    try:
        packed = ipaddress.IPv6Address(host.partition("%")[0]).packed
    except ValueError:
        return host
    if packed[:12] == _IPV4_MAPPED:
        return str(ipaddress.IPv4Address(packed[12:]))
    return packed[:8]


class ClientConnection(TypingProtocol):
    """
    What the site counts as one client connection: an HTTP/1.1 channel, an HTTP/2
    connection, or a TLS connection whose protocol is not chosen yet.
    """

    _release: Callable[[Any], object] | None

    def shutDown(self) -> None:
        """
        The gateway is stopping: close when idle, else after what is in flight (a
        connection that has not sent its first request yet gets a grace to send it).
        """

    def abortClient(self) -> None:
        """
        Drop the connection at once.
        """

    def serve_from(self, site: LimitedSite) -> None:
        """
        A reload: the requests this connection has not begun yet are served by C{site}
        (a request in progress finishes where it is).
        """

    def cut_for(self, site: LimitedSite) -> None:
        """
        C{site} (replaced by a reload) has drained as long as it may: cut what this
        connection still serves for it.
        """


class _Refused(Protocol):
    """
    A connection beyond a cap: closed as soon as it is made.
    """

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.abortConnection()


class ClientConnections:
    """
    The open client connections of one site, counted per process and per client address
    (see L{address_key}).

    @ivar max_connections: The most open connections (0: no cap).
    @ivar max_per_address: The most open connections from one client address (0: no
        cap); peers that are trusted proxies are exempt (every client behind a load
        balancer shares its address).
    @ivar trusted_peer: Whether a peer's host is a trusted proxy.
    @ivar count: Connections open now.
    @ivar channels: The open connections (a WebSocket tunnel's until the tunnel ends).
    @ivar refused_over_total: Connections refused because C{max_connections} were open.
    @ivar refused_over_address: Connections refused because their address had
        C{max_per_address} open.
    @ivar on_refused: Told of each refusal, with the cap's field name
        (C{maxConnections} or C{maxConnectionsPerAddress}): the gateway's metrics,
        which outlive the site across reloads.
    """

    log = Logger(namespace="edgegw.limits")

    def __init__(
        self,
        max_connections: int,
        max_per_address: int,
        clock: IReactorTime,
        trusted_peer: Callable[[str], bool] | None = None,
    ) -> None:
        """
        @param clock: Times the refusal log lines.
        @param trusted_peer: Whether a peer's host is a trusted proxy.
        """
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.count = 0
        self.channels: set[ClientConnection] = set()
        self.refused_over_total = 0
        self.refused_over_address = 0
        self.on_refused: Callable[[str], None] | None = None
        self._clock = clock
        self.trusted_peer = trusted_peer
        self._per_address: dict[Any, int] = {}
        self._keys: dict[ClientConnection, Any] = {}
        self._peers: dict[ClientConnection, tuple[Any, str]] = {}
        self._next_log = 0.0
        self._unlogged_total = 0
        self._unlogged_address = 0
        self._shut_down = False
        self._all_closed: list[Deferred[None]] = []

    @property
    def refused(self) -> int:
        """
        Connections refused so far, for either cap.
        """
        return self.refused_over_total + self.refused_over_address

    def admit(self, address: IAddress | None) -> Any:
        """
        Count a new connection from C{address} in, if the caps allow it.

        @return: What L{opened} needs for it, or the refusal marker.
        """
        if self._shut_down:
            return _REFUSED
        if self.max_connections and self.count >= self.max_connections:
            self.refused_over_total += 1
            if self.on_refused is not None:
                self.on_refused("maxConnections")
            self._unlogged_total += 1
            self._refusal_logged()
            return _REFUSED
        key = address_key(address)
        if key is None:
            self.count += 1
            return None
        host = getattr(address, "host", "")
        counted = bool(self.max_per_address) and not self._trusted(host)
        if counted:
            open_now = self._per_address.get(key, 0)
            if open_now >= self.max_per_address:
                self.refused_over_address += 1
                if self.on_refused is not None:
                    self.on_refused("maxConnectionsPerAddress")
                self._unlogged_address += 1
                self._refusal_logged()
                return _REFUSED
            self._per_address[key] = open_now + 1
        self.count += 1
        return (key, host, counted)

    def _trusted(self, host: str) -> bool:
        trusted = self.trusted_peer
        return trusted is not None and trusted(host)

    def opened(self, channel: ClientConnection, admitted: Any) -> None:
        """
        C{channel} is the connection L{admit} let in, with what it returned.
        """
        self.channels.add(channel)
        if admitted is not None:
            key, host, counted = admitted
            # Every client connection's address is kept: a reload may turn the
            # per-address cap on, or change which peers are trusted.
            self._peers[channel] = (key, host)
            if counted:
                self._keys[channel] = key
        channel._release = self.lost

    def hand_over(self, negotiating: ClientConnection, chosen: ClientConnection) -> None:
        """
        C{chosen} (the protocol ALPN chose) takes C{negotiating}'s place in the count.
        """
        self.channels.discard(negotiating)
        negotiating._release = None
        self.channels.add(chosen)
        peer = self._peers.pop(negotiating, None)
        if peer is not None:
            self._peers[chosen] = peer
        key = self._keys.pop(negotiating, None)
        if key is not None:
            self._keys[chosen] = key
        chosen._release = self.lost

    def lost(self, channel: ClientConnection) -> None:
        """
        C{channel} is gone (or its tunnel has ended).
        """
        self.channels.discard(channel)
        self.count -= 1
        self._peers.pop(channel, None)
        key = self._keys.pop(channel, None)
        if key is not None:
            left = self._per_address[key] - 1
            if left:
                self._per_address[key] = left
            else:
                del self._per_address[key]
        if not self.count and self._all_closed:
            waiting, self._all_closed = self._all_closed, []
            for closed in waiting:
                closed.callback(None)

    def shut_down(self) -> None:
        """
        Shutting down: close the idle connections (one that has not sent its first
        request after a grace, L{edgegw.server.channel.FRESH_GRACE}, unless it sends
        one), and every other after its response; refuse new ones.
        """
        self._shut_down = True
        for channel in list(self.channels):
            channel.shutDown()

    def closed(self) -> Deferred[None]:
        """
        Fires once no connection is open (at once when none is).
        """
        if not self.count:
            return succeed(None)
        closed: Deferred[None] = Deferred()
        self._all_closed.append(closed)
        return closed

    def reconfigure(
        self,
        max_connections: int,
        max_per_address: int,
        trusted_peer: Callable[[str], bool] | None,
        on_refused: Callable[[str], None] | None,
    ) -> None:
        """
        Apply a reload's caps from now on, counting the connections open under them
        (they stay open: a lower cap refuses new ones until enough have closed).
        """
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.trusted_peer = trusted_peer
        self.on_refused = on_refused
        # Counted again under the new cap and trust, the connections open included.
        self._keys = {}
        self._per_address = {}
        if max_per_address:
            for channel, (key, host) in self._peers.items():
                if not self._trusted(host):
                    self._keys[channel] = key
                    self._per_address[key] = self._per_address.get(key, 0) + 1

    def serve_from(self, site: LimitedSite) -> None:
        """
        A reload: every connection serves its next request from C{site}.
        """
        for channel in list(self.channels):
            channel.serve_from(site)

    def abort(self, site: LimitedSite) -> None:
        """
        C{site}'s drain time is up: cut what the connections still serve for it.
        """
        for channel in list(self.channels):
            channel.cut_for(site)

    def open_from(self, address: IAddress) -> int:
        """
        How many connections from C{address}'s client (see L{address_key}) are counted.
        """
        return self._per_address.get(address_key(address), 0)

    def _refusal_logged(self) -> None:
        now = self._clock.seconds()
        if now < self._next_log:
            return
        self._next_log = now + REFUSAL_LOG_INTERVAL
        self.log.warn(
            "refused {total} new connection(s) over limits.maxConnections ({max_connections})"
            " and {address} over limits.maxConnectionsPerAddress ({max_per_address}) since"
            " the last report; {count} open",
            total=self._unlogged_total,
            address=self._unlogged_address,
            max_connections=self.max_connections,
            max_per_address=self.max_per_address,
            count=self.count,
        )
        self._unlogged_total = self._unlogged_address = 0


class LimitedSite(Site):
    """
    A Site of L{GatewayChannel}s that admits connections within the caps and gives each
    the configured deadlines.

    @ivar limits: The limits applied.
    @ivar connections: The open connections, counted against the caps.
    @ivar http2: Whether the site is served over TLS with ALPN offering C{h2}: each
        connection's protocol is then chosen at its handshake.
    """

    http2 = False

    def __init__(
        self,
        resource: IResource,
        limits: LimitsSpec | None = None,
        trusted_peer: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ):
        """
        @param limits: The limits; the defaults when not given.
        @param trusted_peer: Whether a peer's host is a trusted proxy (exempt from the
            per-address cap).
        @param kwargs: As for L{Site} (C{timeout} is the idle timeout between requests).
        """
        super().__init__(resource, **kwargs)
        self.limits = limits = limits or LimitsSpec()
        self.connections = ClientConnections(
            limits.max_connections, limits.max_connections_per_address, self.reactor, trusted_peer
        )

    def buildProtocol(self, addr: IAddress | None) -> Any:
        """
        A L{GatewayChannel} with the limits' deadlines, or a connection closed at once
        when a cap is reached.
        """
        connections = self.connections
        admitted = connections.admit(addr)
        if admitted is _REFUSED:
            # Not None, which a plain TCP port would close at once too: a TLS port would
            # wrap None and fail.
            return _Refused()
        if self.http2:
            timeout = self.limits.header_timeout
            negotiating = NegotiatingConnection(self, addr, timeout, self.reactor)
            connections.opened(negotiating, admitted)
            return negotiating
        channel = self._http11(addr)
        connections.opened(channel, admitted)
        return channel

    def _http11(self, addr: IAddress | None) -> GatewayChannel:
        channel = cast(GatewayChannel, Site.buildProtocol(self, addr))
        channel.limit(self.limits)
        return channel

    def negotiated(
        self, addr: IAddress | None, name: bytes | None, negotiating: NegotiatingConnection
    ) -> Protocol:
        """
        The protocol for a TLS connection whose handshake chose C{name} by ALPN (L{None}:
        the client offered none), taking C{negotiating}'s place in the count.
        """
        chosen: GatewayChannel | H2ServerConnection
        if name == b"h2":
            chosen = H2ServerConnection(self, self.limits, self.timeOut)
        else:
            chosen = self._http11(addr)
        self.connections.hand_over(negotiating, chosen)
        return chosen

    def take_over(self, old: LimitedSite) -> None:
        """
        Serve C{old}'s connections from now on (a reload: this site is the new
        configuration's). They are counted together with the new ones against this
        site's caps; each serves its next request here — at once when idle, after the
        request in progress otherwise (which finishes on C{old}'s configuration). None
        is closed for the reload.
        """
        connections, mine = old.connections, self.connections
        connections.reconfigure(
            mine.max_connections, mine.max_per_address, mine.trusted_peer, mine.on_refused
        )
        self.connections = connections
        connections.serve_from(self)

    def shut_down(self) -> None:
        """
        The gateway is stopping: close idle connections at once (after a grace one that
        has not sent its first request), the others after their response, and refuse
        new ones.
        """
        self.connections.shut_down()

    def closed(self) -> Deferred[None]:
        """
        Fires once none of the site's connections is open.
        """
        return self.connections.closed()

    def abort_connections(self) -> None:
        """
        The drain's time is up: cut what the connections still serve for this site
        (whole connections, or a replaced site's HTTP/2 streams).
        """
        self.connections.abort(self)

    def fit_descriptor_limit(self) -> None:
        """
        Make room for the connection cap in the process's open-file limit (see
        L{fit_descriptor_limit}), lowering the cap when the limit cannot be raised enough.
        """
        connections = self.connections
        wanted = connections.max_connections
        fitted = fit_descriptor_limit(wanted)
        if fitted < wanted:
            ClientConnections.log.warn(
                "the open-file limit leaves room for {fitted} client connections, not"
                " limits.maxConnections ({wanted}): at most {fitted} are accepted",
                fitted=fitted,
                wanted=wanted,
            )
            connections.max_connections = fitted


def fit_descriptor_limit(max_connections: int) -> int:
    """
    Raise the soft limit on open files (C{RLIMIT_NOFILE}), up to the hard limit, so that
    C{max_connections} client connections, each with one upstream connection, and
    L{DESCRIPTOR_RESERVE} more descriptors fit.

    @return: The connection cap that fits: C{max_connections}, or less when the hard
        limit is too low (an accept failing for want of a descriptor would leave the
        listener, health checks included, refusing everyone).
    """
    if not max_connections:
        return max_connections
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return max_connections
    infinity = resource.RLIM_INFINITY
    needed = 2 * max_connections + DESCRIPTOR_RESERVE
    if soft != infinity and soft < needed:
        raised = needed if hard == infinity else min(hard, needed)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            except (OSError, ValueError):
                pass
            else:
                soft = raised
    if soft == infinity or soft >= needed:
        return max_connections
    return max(1, (soft - DESCRIPTOR_RESERVE) // 2)


class GatewaySite(LimitedSite):
    """
    The gateway's Site: without Twisted's own combined-format access log (edgegw logs
    every request once, as structured JSON), whose requests stream their bodies
    (L{GatewayRequest}) through L{GatewayChannel}s, with C{Gateway.spec.limits} on
    every connection.
    """

    requestFactory = GatewayRequest  # type: ignore[assignment]
    # Counts what the channels refuse themselves (400, 408, 414, 431), with metrics on.
    metrics: IMetrics | None = None
    # The HTTP/1.1 channels (HTTP/2 connections are chosen at the TLS handshake).
    protocol = GatewayChannel  # type: ignore[assignment]

    def log(self, request: object) -> None:
        pass
