"""
Turning C{Gateway.spec.listen} into a Twisted server endpoint (wrapped in TLS with
C{Gateway.spec.tls}: L{TLSServerEndpoint}), keeping a TLS listener's certificate current
across reloads, and sharing an inherited socket fairly among worker processes.
"""

from __future__ import annotations

import os
from typing import Any

from OpenSSL.SSL import Context
from twisted.internet import defer, tcp
from twisted.internet.endpoints import (
    AdoptedStreamServerEndpoint,
    SSL4ServerEndpoint,
    serverFromString,
)
from twisted.internet.error import AlreadyListened as AlreadyListenedError
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLContextFactory,
    IProtocolFactory,
    IStreamServerEndpoint,
)
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from edgegw.config.addresses import endpoint_description
from edgegw.seam import adopt_listening_port, endpoint_tls_context, set_endpoint_tls_context

__all__ = [
    "ReloadableContext",
    "SharedSocketEndpoint",
    "TLSServerEndpoint",
    "UnreadableTLSFilesError",
    "server_endpoint",
    "tls_context",
]


class _SharedSocketPort(tcp.Port):
    """
    A port on a listening socket that other processes accept from too: one connection
    per wake-up (nginx's default, C{multi_accept off}). Twisted's port accepts up to
    100 pending connections per wake-up, and more as long as there are: the worker that
    woke first took all 50 of a load generator's connections and the other none
    (2 workers measured 1.00x one).
    """

    @property
    def numberAccepts(self) -> int:
        return 1

    @numberAccepts.setter
    def numberAccepts(self, value: int) -> None:
        # Twisted's accept loop scales its batch after each wake-up: kept at one.
        pass


@implementer(IStreamServerEndpoint)
class SharedSocketEndpoint(AdoptedStreamServerEndpoint):
    """
    A listening socket passed in (systemd's), served by a L{_SharedSocketPort}: the
    same socket may be served by several worker processes (C{edgegw@.service}).
    """

    def listen(self, factory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        try:
            # What the reactor's adoptStreamPort does, with the port class ours.
            port = adopt_listening_port(self, _SharedSocketPort, factory)
            if port is None:
                return defer.fail(AlreadyListenedError())
            port.startListening()
            os.close(self.fileno)
        except BaseException:
            return defer.fail()
        return defer.succeed(port)


class UnreadableTLSFilesError(ValueError):
    """
    The TLS key or certificate cannot be read by this process (at a reload, files only
    root could read before twistd dropped privileges).
    """


@implementer(IStreamServerEndpoint)
class TLSServerEndpoint:
    """
    A stream endpoint (TCP, an inherited socket) whose connections speak TLS, server
    side: C{Gateway.spec.tls}.

    @ivar endpoint: The endpoint wrapped.
    @ivar context: Asked for each new connection's context; its C{current} is what a
        reload replaces.
    """

    def __init__(self, endpoint: IStreamServerEndpoint, context: ReloadableContext) -> None:
        self.endpoint = endpoint
        self.context = context

    def listen(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IListeningPort]:
        """
        Listen with C{protocolFactory} behind TLS (the port's factory is the
        C{TLSMemoryBIOFactory}, its C{wrappedFactory} the Site).
        """
        factory = TLSMemoryBIOFactory(self.context, False, protocolFactory)
        # Twisted's default (BufferingTLSTransport) holds every write for a callLater(0)
        # to coalesce small ones; the gateway's protocols already write a whole response
        # head with its body, and HTTP/2 one batch per read: the plain TLS protocol saves
        # the timer and a reactor turn per response.
        factory.protocol = TLSMemoryBIOProtocol
        listening: defer.Deferred[IListeningPort] = self.endpoint.listen(factory)
        return listening


def server_endpoint(
    reactor: Any, listen: str, tls: IOpenSSLContextFactory | None = None
) -> IStreamServerEndpoint:
    """
    Build the server endpoint for a listen address (reading TLS key and certificate files
    for C{ssl:}, taking the inherited socket for C{systemd:}). An C{ssl:} endpoint's
    context is a L{ReloadableContext}, which L{tls_context} can replace later.

    @param tls: The contexts of C{Gateway.spec.tls}: the endpoint is then a
        L{TLSServerEndpoint} around the address's, its context a L{ReloadableContext}.
    @raise ValueError: With a message that says what is wrong.
    """
    description = endpoint_description(listen)
    if tls is not None:
        if description.startswith("ssl:"):
            raise ValueError(f'invalid endpoint "{listen}": tls is set, and an ssl: endpoint too')
        return TLSServerEndpoint(server_endpoint(reactor, listen), ReloadableContext(tls))
    try:
        endpoint: IStreamServerEndpoint = serverFromString(reactor, description)
    except IndexError:
        if description.startswith("systemd:"):
            raise ValueError(
                "no socket with that index was passed by systemd (LISTEN_FDS/LISTEN_PID)"
            ) from None
        raise ValueError(f'invalid endpoint "{listen}"') from None
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f'invalid endpoint "{listen}": {e}') from None
    except PermissionError as e:
        raise UnreadableTLSFilesError(f'invalid endpoint "{listen}": {e.strerror or e}') from None
    except OSError as e:
        raise ValueError(f'invalid endpoint "{listen}": {e.strerror or e}') from None
    except Exception as e:  # pyOpenSSL errors for unreadable keys or certificates
        raise ValueError(f'invalid endpoint "{listen}": {e}') from None
    if isinstance(endpoint, AdoptedStreamServerEndpoint):
        endpoint = SharedSocketEndpoint(endpoint.reactor, endpoint.fileno, endpoint.addressFamily)
    if isinstance(endpoint, SSL4ServerEndpoint):
        factory = endpoint_tls_context(endpoint)
        try:
            # Built now, not at the first handshake: what only building it reads (a
            # dhParameters file, the ciphers) would otherwise fail every connection.
            factory.getContext()
        except Exception as e:
            raise ValueError(f'invalid endpoint "{listen}": {e or type(e).__name__}') from None
        # Twisted keeps the context factory it parsed in a private attribute and asks
        # it for a context on every connection: putting ours in between is what lets a
        # reload take new certificate files without closing the socket.
        set_endpoint_tls_context(endpoint, ReloadableContext(factory))
    return endpoint


def tls_context(reactor: Any, listen: str) -> IOpenSSLContextFactory | None:
    """
    The TLS context a listen address asks for, read from its files now (a reload's new
    certificate); L{None} when it is not C{ssl:}.

    @raise ValueError: The files cannot be read or do not match (the message says why).
    """
    if not endpoint_description(listen).startswith("ssl:"):
        return None
    endpoint = server_endpoint(reactor, listen)
    assert isinstance(endpoint, SSL4ServerEndpoint)
    reloadable = endpoint_tls_context(endpoint)
    assert isinstance(reloadable, ReloadableContext)
    return reloadable.current


@implementer(IOpenSSLContextFactory)
class ReloadableContext:
    """
    A TLS server's context factory whose certificate can be replaced while it listens:
    each new connection uses the current one, connections already open keep theirs.

    @ivar current: The context factory new connections use.
    """

    def __init__(self, current: IOpenSSLContextFactory) -> None:
        self.current = current

    def getContext(self) -> Context:
        """
        The current context (built once per certificate, then shared).
        """
        return self.current.getContext()
