"""
The forwarded layer: forwarding headers are believed only from trusted proxies.

It runs first, before tracing, so nothing downstream ever sees forwarding headers that an
untrusted peer made up.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.web.server import Request

from edgegw.header_names import canonical_name
from edgegw.routing.hosts import normalise_host
from edgegw.seam import RAW_DICT_WRITABLE, raw_fields

FORWARDING_HEADERS = (
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-forwarded-port",
    b"x-real-ip",
    b"forwarded",
)

_CANONICAL_FORWARDING = frozenset(canonical_name(name) for name in FORWARDING_HEADERS)

# A request's headers are Twisted's dict of canonical name -> values: tested at once.
_DIRECT = RAW_DICT_WRITABLE

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ForwardedFilter:
    """
    Removes the six forwarding headers unless the immediate peer is trusted.

    @param trusted: C{Gateway.spec.trustedProxies}: CIDRs, bare IPs, or C{*}.
    """

    def __init__(self, trusted: Iterable[str]) -> None:
        entries = list(trusted)
        self.trust_all = "*" in entries
        self.networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(entry, strict=False) for entry in entries if entry != "*"
        )
        # Peers repeat (keep-alive, a handful of proxies): remember each decision.
        self._decisions: dict[str, bool] = {}

    def is_trusted(self, host: str) -> bool:
        """
        Whether a peer address is a trusted proxy.
        """
        if self.trust_all:
            return True
        decision = self._decisions.get(host)
        if decision is None:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                decision = False
            else:
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped
                decision = any(address in network for network in self.networks)
            if len(self._decisions) > 4096:
                self._decisions.clear()
            self._decisions[host] = decision
        return decision

    def clean(self, request: Request) -> None:
        """
        Strip the forwarding headers from C{request} unless its peer is trusted; from a
        trusted peer, keep C{X-Forwarded-Host} only as one valid host in its normal form
        (a backend must not read a host the gateway would not have routed by).
        """
        headers = request.requestHeaders
        if not self.trust_all:
            peer = request.getClientAddress()
            if not (isinstance(peer, IPv4Address | IPv6Address) and self.is_trusted(peer.host)):
                if _DIRECT:
                    # One C-level test that none is there, the usual case (-0.5 µs).
                    raw = raw_fields(headers)
                    if not raw.keys().isdisjoint(_CANONICAL_FORWARDING):
                        for name in _CANONICAL_FORWARDING:
                            raw.pop(name, None)
                    return
                for name in FORWARDING_HEADERS:
                    if headers.hasHeader(name):
                        headers.removeHeader(name)
                return
        forwarded_host = headers.getRawHeaders(b"x-forwarded-host")
        if forwarded_host is not None:
            normal = normalise_host(forwarded_host[0]) if len(forwarded_host) == 1 else None
            if not normal:
                headers.removeHeader(b"x-forwarded-host")
            elif normal != forwarded_host[0]:
                headers.setRawHeaders(b"x-forwarded-host", [normal])
