"""
The gateway's listening socket, as a service: bound before twistd drops privileges,
its TLS files read again (an C{ssl:} endpoint) or its TLS contexts replaced
(C{Gateway.spec.tls}) and its Site switched by a reload.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLContextFactory,
    IStreamServerEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.config.errors import ConfigError, Problem
from edgegw.seam import endpoint_tls_context
from edgegw.server.gateway_site import LimitedSite
from edgegw.server.listen import (
    ReloadableContext,
    TLSServerEndpoint,
    UnreadableTLSFilesError,
    server_endpoint,
    tls_context,
)

# The namespace the daemon's log has always shown for the service tree's events.
_log = Logger(namespace="edgegw.service")


@implementer(IStreamServerEndpoint)
class _RecordingEndpoint:
    """
    An endpoint that remembers what listening gave: the port, or the failure.
    """

    def __init__(self, endpoint: IStreamServerEndpoint) -> None:
        self.endpoint = endpoint
        self.port: IListeningPort | None = None
        self.failure: Failure | None = None

    def listen(self, protocolFactory: Any) -> Deferred[IListeningPort]:
        listening: Deferred[Any] = self.endpoint.listen(protocolFactory)
        recorded: Deferred[IListeningPort] = listening.addCallbacks(self._listening, self._failed)
        return recorded

    def _listening(self, port: IListeningPort) -> IListeningPort:
        self.port = port
        return port

    def _failed(self, failure: Failure) -> Any:
        # Kept for privilegedStartService to report; the service then sees no port.
        self.failure = failure


class ListenerService(StreamServerEndpointService):
    """
    The gateway's listening socket.

    A L{StreamServerEndpointService} whose endpoint is built from C{Gateway.spec.listen}
    when the service starts, not when the tree is built, so that C{edgegw check} can
    build the tree without holding a socket systemd passes in (socket activation). A
    failure to build the endpoint or to bind is printed without a traceback and exits
    with status 1, before twistd drops privileges. Before binding, the open-file limit is
    raised to fit the site's connection cap (or the cap lowered to fit the limit).
    """

    def __init__(
        self, listen: str, factory: Any, reactor: Any, tls: IOpenSSLContextFactory | None = None
    ) -> None:
        """
        @param tls: The contexts of C{Gateway.spec.tls}: the socket is wrapped in TLS.
        """
        super().__init__(None, factory)
        self.listen = listen
        self.reactor = reactor
        self.tls = tls
        self._recording: _RecordingEndpoint | None = None

    @property
    def port(self) -> IListeningPort | None:
        """
        The listening port once bound.
        """
        return self._recording.port if self._recording is not None else None

    def read_tls(self, location: Any) -> IOpenSSLContextFactory | None:
        """
        The TLS context the listen address asks for, its files read again (a reload);
        L{None} when it is not C{ssl:} or the listener is not listening.

        @param location: Where the Gateway resource is, for the error.
        @raise ConfigError: The files cannot be read or do not match.
        """
        if self.port is None:
            return None
        try:
            return tls_context(self.reactor, self.listen)
        except UnreadableTLSFilesError as e:
            # Readable at start, before twistd dropped privileges (--uid): the running
            # certificate goes on, the rest of the configuration is taken.
            _log.warn(
                "reload: the TLS files cannot be read by this process ({reason}); the "
                "running certificate keeps serving (a restart reads them again)",
                reason=e,
            )
            return None
        except ValueError as e:
            raise ConfigError([Problem(location, "spec.listen", str(e))]) from None

    def use_tls(self, context: IOpenSSLContextFactory) -> None:
        """
        New connections get C{context} (its certificates); open ones keep theirs.
        """
        assert self._recording is not None
        endpoint = self._recording.endpoint
        reloadable: object
        if isinstance(endpoint, TLSServerEndpoint):
            reloadable = endpoint.context
        else:
            assert isinstance(endpoint, SSL4ServerEndpoint)
            reloadable = endpoint_tls_context(endpoint)
        assert isinstance(reloadable, ReloadableContext)
        reloadable.current = context

    def switch_site(self, site: Any) -> None:
        """
        New connections go to C{site} (a reload's), and so does the next request of each
        open one (L{LimitedSite.take_over}); the connection cap is fitted to the
        open-file limit as at start (a reload may raise C{limits.maxConnections}).
        """
        if isinstance(site, LimitedSite):
            if isinstance(self.factory, LimitedSite) and self.factory is not site:
                site.take_over(self.factory)
            site.fit_descriptor_limit()
        # Started as the listening port started the first one (its timers run), and
        # stopped once its generation retires, else each reload would leave one behind.
        site.doStart()
        self.factory = site
        port: Any = self.port
        if port is not None:
            factory = port.factory
            if getattr(factory, "wrappedFactory", None) is not None:
                factory.wrappedFactory = site  # a TLS wrapper around the Site
            else:
                port.factory = site

    def build_endpoint(self) -> IStreamServerEndpoint:
        """
        The server endpoint for the listen address (an C{ssl:} endpoint's TLS files are
        read here), wrapped in TLS with C{Gateway.spec.tls}.

        @raise ValueError: With a message that says what is wrong.
        """
        return server_endpoint(self.reactor, self.listen, self.tls)

    def privilegedStartService(self) -> None:
        """
        Bind the listening socket (before twistd drops privileges).
        """
        try:
            endpoint = self.build_endpoint()
        except ValueError as e:
            sys.stderr.write(f"edgegw: cannot listen on {self.listen}: {e}\n")
            raise SystemExit(1) from None
        self._recording = self.endpoint = _RecordingEndpoint(endpoint)
        if isinstance(self.factory, LimitedSite):
            self.factory.fit_descriptor_limit()
        super().privilegedStartService()
        failure = self._recording.failure
        if failure is not None:
            sys.stderr.write(
                f"edgegw: cannot listen on {self.listen}: {failure.getErrorMessage()}\n"
            )
            raise SystemExit(1)
