"""
The gateway as a tree of Twisted services.

L{GatewayService} (a C{MultiService}) has one child per long-lived part, in start order:

  - C{listener}: L{ListenerService}, the listening socket serving the gateway's Site;
  - C{access-log}: L{AccessLogService}, the buffered access-log writer (flushed on stop);
  - C{upstream-pool}: L{UpstreamPoolService}, the upstream connection pool (idle
    connections closed on stop);
  - C{state} and C{sessions}: with a C{stateProvider}, the state store (connecting in
    the background, reconnecting with backoff; closed on stop) and the server-side
    sessions over it (listening on the store's logout channel);
  - C{idp}: L{IdentityProvider<edgegw.identity.provider.IdentityProvider>}, with an IdP
    resource (browser login, Bearer verification): discovery at start without holding
    the gateway up, retried with capped backoff, then the discovery document and key
    sets refreshed periodically; timers and calls in flight cancelled on stop;
  - C{telemetry}: L{TelemetryService}, only with a Telemetry resource (spans flushed to
    the exporter on stop).

Stopping (SIGTERM under twistd) runs in a stated order: idle keep-alive client
connections are closed, the listener stops accepting, the requests in flight drain (up
to C{Gateway.spec.drainTimeout}; every further response closes its connection), then the
other children stop one after another, in reverse start order, each waiting for the one
before.

L{build_service} builds the whole tree without starting anything; C{edgegw check} builds
exactly this tree.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import (
    IListeningPort,
    IStreamServerEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.chain.access_log import AccessLog
from edgegw.config.model import Config
from edgegw.gateway import Gateway, build_gateway
from edgegw.server.limits import LimitedSite
from edgegw.server.listen import server_endpoint
from edgegw.telemetry import Telemetry
from edgegw.upstream.pool import UpstreamClient

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

    def __init__(self, listen: str, factory: Any, reactor: Any) -> None:
        super().__init__(None, factory)
        self.listen = listen
        self.reactor = reactor
        self._recording: _RecordingEndpoint | None = None

    @property
    def port(self) -> IListeningPort | None:
        """
        The listening port once bound.
        """
        return self._recording.port if self._recording is not None else None

    def build_endpoint(self) -> IStreamServerEndpoint:
        """
        The server endpoint for the listen address (TLS files are read here).

        @raise ValueError: With a message that says what is wrong.
        """
        return server_endpoint(self.reactor, self.listen)

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


class AccessLogService(Service):
    """
    The access log's buffered writer: flushed and closed when the service stops.
    """

    def __init__(self, access_log: AccessLog) -> None:
        self.access_log = access_log

    def stopService(self) -> None:
        """
        Write out and close the buffered lines (nothing to do when the log goes to
        Twisted's logger).
        """
        super().stopService()
        writer = self.access_log.writer
        if writer is not None:
            writer.close()


class UpstreamPoolService(Service):
    """
    The upstream connection pool: its idle connections are closed when it stops.
    """

    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    def stopService(self) -> Deferred[None]:
        """
        Close the idle pooled connections.
        """
        super().stopService()
        return self.client.close()


class TelemetryService(Service):
    """
    Tracing: on stop, the spans still queued are exported (bounded by the exporter's
    own timeout) and the tracer provider shut down.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def stopService(self) -> Deferred[None]:
        """
        Flush and shut down the span export.
        """
        super().stopService()
        return self.telemetry.shutdown()


class GatewayService(MultiService):
    """
    Serves one L{Gateway}: the root of the service tree (see the module docstring).
    """

    def __init__(self, gateway: Gateway, reactor: Any) -> None:
        super().__init__()
        self.gateway = gateway
        self.reactor = reactor
        self.listener = ListenerService(gateway.config.gateway.listen, gateway.site, reactor)
        children: list[tuple[str, Service]] = [
            ("listener", self.listener),
            ("access-log", AccessLogService(gateway.access_log)),
            ("upstream-pool", UpstreamPoolService(gateway.upstream_client)),
        ]
        if gateway.state is not None and gateway.sessions is not None:
            # The store connects in the background; until it can be reached, requests
            # with server-side sessions are unauthenticated (fail closed).
            children.append(("state", gateway.state))  # type: ignore[arg-type]
            children.append(("sessions", gateway.sessions))
        if gateway.idp is not None:
            # Discovery starts with the gateway and never holds it up: until it succeeds
            # the login endpoint answers 503.
            children.append(("idp", gateway.idp))
        if gateway.telemetry is not None:
            children.append(("telemetry", TelemetryService(gateway.telemetry)))
        for name, child in children:
            child.setName(name)
            child.setServiceParent(self)
        self._stop_waiters: list[Deferred[None]] | None = None

    @property
    def port(self) -> IListeningPort | None:
        """
        The listening port once bound (the listener's).
        """
        return self.listener.port

    def startService(self) -> None:
        """
        Start the children; say where the gateway listens.
        """
        super().startService()
        port = self.listener.port
        if port is not None:
            _log.info(
                "edgegw listening on {address} with {count} routes",
                address=port.getHost(),
                count=len(self.gateway.routes),
            )

    def stopService(self) -> Deferred[None]:
        """
        Stop listening, drain the requests in flight, then stop the other children in
        reverse start order, one after another.

        Asked again while stopping, it answers when the same stop is done; a service
        that never started (or a child that is not running) has nothing to stop.
        """
        if self._stop_waiters is not None:
            waiter: Deferred[None] = Deferred()
            self._stop_waiters.append(waiter)
            return waiter
        self._stop_waiters = []
        Service.stopService(self)
        # From now on every response closes its connection, those in flight included.
        drained = self._drain()
        stopping: Deferred[Any] = _stop_child(None, self.listener)
        stopping.addCallback(lambda _: drained)
        for child in reversed(list(self)):
            if child is not self.listener:
                stopping.addCallback(_stop_child, child)
        stopping.addBoth(self._stopped)
        return stopping

    def _stopped(self, result: Any) -> Any:
        waiters, self._stop_waiters = self._stop_waiters or [], None
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(None)
        return None if not isinstance(result, Failure) else result

    def _drain(self) -> Deferred[None]:
        inflight = self.gateway.inflight
        drained = inflight.drain()
        # An idle keep-alive connection would otherwise carry new requests until the end.
        self.gateway.site.shut_down()
        timeout = self.gateway.config.gateway.drain_timeout
        if inflight.count:
            _log.info(
                "draining {count} request(s) in flight (up to {timeout}s)",
                count=inflight.count,
                timeout=timeout,
            )
        drained.addTimeout(timeout, self.reactor, onTimeoutCancel=self._gave_up)
        return drained

    def _gave_up(self, result: object, timeout: float) -> None:
        _log.warn(
            "drain timeout: {count} request(s) still in flight after {timeout}s; closing",
            count=self.gateway.inflight.count,
            timeout=timeout,
        )


def _stop_child(result: object, child: IService) -> Deferred[Any]:
    if not child.running:
        return succeed(None)
    return maybeDeferred(child.stopService)


def build_service(config: Config, reactor: Any, **build_options: Any) -> GatewayService:
    """
    Build the gateway of C{config} and its whole service tree, starting nothing.

    @param reactor: The reactor (a test clock for C{edgegw check}, which starts nothing).

    @param build_options: Passed to L{build_gateway} (tests inject an upstream client or
        a span processor).
    @raise ConfigError: Something in the configuration cannot run.
    """
    return GatewayService(build_gateway(config, reactor, **build_options), reactor)
