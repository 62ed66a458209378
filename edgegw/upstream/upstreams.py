"""
Where upstream requests go, and how a connection there is made: L{Upstream} (scheme,
host, port, whether its certificate is checked) and L{upstream_endpoint} (TCP, and TLS
over it, verified or C{insecureSkipVerify}).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

import attrs
from OpenSSL.SSL import Connection as TLSConnection
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IStreamClientEndpoint
from twisted.internet.ssl import Certificate, CertificateOptions, optionsForClientTLS
from zope.interface import implementer

from edgegw.seam import IOpenSSLTrustRoot

__all__ = ["Upstream", "upstream_endpoint"]

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


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
    _name: str = attrs.field(init=False, eq=False, repr=False)
    _origin: str = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        authority = _authority(self.scheme, self.host, self.port)
        name = authority.decode("ascii")
        object.__setattr__(self, "_authority", authority)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_origin", f"{self.scheme}://{name}")

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

    @property
    def name(self) -> str:
        """
        L{authority} as text: how the upstream is named in access-log lines.
        """
        return self._name

    @property
    def origin(self) -> str:
        """
        C{scheme://authority}: how the upstream is named in metrics and spans.
        """
        return self._origin


def upstream_endpoint(
    reactor: Any,
    upstream: Upstream,
    connect_timeout: float,
    trust_root: IOpenSSLTrustRoot | Certificate | None,
) -> IStreamClientEndpoint:
    """
    The endpoint that connects to C{upstream}: TCP (an IP literal without the resolver),
    in TLS for https, its certificate checked against C{trust_root} (the platform's trust
    store when L{None}) unless C{upstream.verify_tls} is L{False}.

    @param reactor: Provides L{IReactorTCP}, L{IReactorTime} and (for host names)
        L{IReactorPluggableNameResolver}.
    @param connect_timeout: Seconds a TCP connection attempt may take.
    """
    host = upstream.host
    endpoint: IStreamClientEndpoint
    # IP literals skip the resolver (and its thread) altogether.
    if isIPAddress(host):
        endpoint = TCP4ClientEndpoint(reactor, host, upstream.port, connect_timeout)
    elif isIPv6Address(host):
        endpoint = TCP6ClientEndpoint(reactor, host, upstream.port, connect_timeout)
    else:
        endpoint = HostnameEndpoint(reactor, host, upstream.port, connect_timeout)
    if upstream.scheme == "https":
        creator: IOpenSSLClientConnectionCreator
        if upstream.verify_tls:
            # No ALPN offer: HTTP/1.1 is what a client without ALPN gets anyway, and
            # some servers (a Twisted TLS listener whose factory does not negotiate
            # protocols, as WebSocket servers often are) abort handshakes offering it.
            creator = optionsForClientTLS(host, trustRoot=trust_root)
        else:
            creator = _UnverifiedTLS(host)
        endpoint = wrapClientTLS(creator, endpoint)
    return endpoint


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
