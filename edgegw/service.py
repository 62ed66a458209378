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
from twisted.internet.defer import Deferred, DeferredLock, gatherResults, maybeDeferred, succeed
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLContextFactory,
    IStreamServerEndpoint,
)
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.chain.access_log import AccessLog
from edgegw.config.errors import ConfigError, Problem
from edgegw.config.model import Config
from edgegw.config.parse import load_config
from edgegw.metrics.otlp import MetricsExportService
from edgegw.metrics.serve import ScrapeListener, export_service, scrape_root
from edgegw.notify import SystemdNotifier
from edgegw.server.limits import LimitedSite
from edgegw.server.listen import (
    ReloadableContext,
    UnreadableTLSFilesError,
    server_endpoint,
    tls_context,
)
from edgegw.server.scrape_site import ScrapeSite
from edgegw.telemetry import Telemetry
from edgegw.upstream.pool import UpstreamClient

_log = Logger(namespace="edgegw.service")

WARM_UP_TIMEOUT = 5.0
"""
The most seconds a reload waits for the new configuration to be warm (see
L{GatewayService.reload}).
"""

WARM_UP_POLL = 0.05
"""Seconds between two looks at whether a reload's new configuration is warm."""

STATUS_INTERVAL = 10.0
"""Seconds between checks of the C{STATUS=} line sent to systemd (sent when it changes)."""


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
        New connections get C{context} (its certificate); open ones keep theirs.
        """
        assert self._recording is not None
        endpoint = self._recording.endpoint
        assert isinstance(endpoint, SSL4ServerEndpoint)
        reloadable = endpoint._sslContextFactory
        assert isinstance(reloadable, ReloadableContext)
        reloadable.current = context

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

    def __init__(
        self,
        gateway: Gateway,
        reactor: Any,
        source: str | None = None,
        notifier: SystemdNotifier | None = None,
        **build_options: Any,
    ) -> None:
        """
        @param source: Where the configuration was read from, read again by L{reload}.
        @param notifier: Tells systemd when the gateway is ready, reloading, stopping.
        @param build_options: Passed to L{build_gateway} again on a reload.
        """
        super().__init__()
        self.gateway = gateway
        self.reactor = reactor
        self.source = source
        self.notifier = notifier or SystemdNotifier({})
        self._build_options = build_options
        self.listener = ListenerService(gateway.config.gateway.listen, gateway.site, reactor)
        self.listener.setName("listener")
        self.listener.setServiceParent(self)
        # Like the listener, the scrape listener outlives reloads (they swap its registry).
        self.metrics_listener = _scrape_listener(gateway, reactor)
        if self.metrics_listener is not None:
            self.metrics_listener.setName("metrics-scrape")
            self.metrics_listener.setServiceParent(self)
        # One OTLP metrics export at a time to each collector, across reloads: the
        # series are cumulative, and an old export's last one must not cross the new
        # one's first. Keyed by protocol and endpoint: a reload that moves to another
        # collector (away from one that does not answer) does not wait for the old one.
        self._export_locks: dict[tuple[str, str], DeferredLock] = {}
        self._adopt(gateway)
        self._stop_waiters: list[Deferred[None]] | None = None
        # Gateways replaced by a reload, until their requests in flight have finished
        # and their services have stopped.
        self._retiring: list[Deferred[None]] = []
        self._status_call: Any = None
        self._status = ""
        self._reloading: Deferred[bool] | None = None
        self._reload_again = False
        self._tls: IOpenSSLContextFactory | None = None
        self.warm_up_timeout = WARM_UP_TIMEOUT

    def _adopt(self, gateway: Gateway) -> None:
        """
        Add the children that serve C{gateway} (all but the listeners), started when the
        tree is running.
        """
        for child in self._children_of(gateway):
            child.setServiceParent(self)
        export = self._export_of(gateway)
        if export is not None:
            # Its last export, when the gateway retires, counts what it served.
            export.setServiceParent(self)

    def _children_of(self, gateway: Gateway) -> list[IService]:
        """
        The children that serve C{gateway}, named, in start order; not yet in the tree.
        Its OTLP metrics export is apart (L{_export_of}): a reload starts it only when
        the new gateway takes over.
        """
        children: list[tuple[str, Service]] = [
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
        return [child for _, child in children]

    def _export_of(self, gateway: Gateway) -> MetricsExportService | None:
        """
        The OTLP export of C{gateway}'s metrics (C{metrics-export}), when its Telemetry
        resource asks for one; not yet started.
        """
        telemetry = gateway.telemetry
        metrics = telemetry.spec.metrics if telemetry is not None else None
        if telemetry is None or metrics is None or gateway.metrics is None:
            return None
        collector = (telemetry.spec.otlp_protocol, metrics.otlp_endpoint or "")
        lock = self._export_locks.setdefault(collector, DeferredLock())
        try:
            export = export_service(
                telemetry.spec,
                metrics,
                gateway.metrics.registry,
                telemetry.provider.resource,
                self.reactor,
                lock,
            )
        except Exception as e:
            # The SDK's exporter refuses its settings (OTEL_EXPORTER_OTLP_* variables
            # naming a certificate it cannot read, a missing grpc extra): a configuration
            # problem, located, rather than a traceback.
            problem = Problem(
                telemetry.spec.location,
                "spec.metrics.otlp",
                f"the OTLP metric exporter cannot be made: {type(e).__name__}: {e}",
            )
            raise ConfigError([problem]) from None
        if export is not None:
            export.setName("metrics-export")
        return export

    @property
    def port(self) -> IListeningPort | None:
        """
        The listening port once bound (the listener's).
        """
        return self.listener.port

    def startService(self) -> None:
        """
        Start the children; say where the gateway listens, and tell systemd it is ready.
        """
        super().startService()
        port = self.listener.port
        if port is not None:
            if self.gateway.readiness is not None:
                self.gateway.readiness.listening = True
            _log.info(
                "edgegw listening on {address} with {count} routes (reactor {reactor})",
                address=port.getHost(),
                count=len(self.gateway.routes),
                reactor=type(self.reactor).__name__,
            )
            # Under twistd this runs before the reactor does, and so before its SIGTERM
            # handler exists: systemd may stop the service as soon as it is ready.
            self.reactor.callWhenRunning(self._ready)

    def _ready(self) -> None:
        if not self.running or self._stop_waiters is not None:
            return
        self._status = self.status_line()
        self.notifier.ready(self._status)
        self._status_call = self.reactor.callLater(STATUS_INTERVAL, self._update_status)

    def status_line(self) -> str:
        """
        One line for C{systemctl status}: routes, the listen address, the IdP's state.
        """
        gateway = self.gateway
        port = self.listener.port
        line = f"serving {len(gateway.routes)} routes on {port.getHost() if port else '-'}"
        idp = gateway.idp
        if idp is not None:
            reachable = "reachable" if idp.ready else "not reachable yet"
            line += f"; IdP {idp.spec.issuer} {reachable}"
        return line

    def _update_status(self) -> None:
        status = self.status_line()
        if status != self._status:
            self._status = status
            self.notifier.status(status)
        self._status_call = self.reactor.callLater(STATUS_INTERVAL, self._update_status)

    def reload(self) -> Deferred[bool]:
        """
        Read the configuration again (SIGHUP). A valid one is built and its services
        started beside the running ones; once it is warm (its IdP discovered, its state
        store answering; at most L{warm_up_timeout} seconds) it serves every new
        connection. The requests in flight finish on the old one, whose connections
        close after their response (idle ones at once), and whose services stop once
        they have (or after its C{drainTimeout}). An invalid one, or one that listens
        elsewhere (that needs a restart), is logged and the old one keeps serving.

        A reload asked for while one is warming up runs again once it is done.

        @return: Fires with whether the new configuration was taken.
        """
        if self._reloading is not None:
            self._reload_again = True
            return self._reloading
        if self.source is None or not self.running or self._stop_waiters is not None:
            return succeed(False)
        self.notifier.reloading()
        reloading = self._reloading = Deferred.fromCoroutine(self._reload())
        return reloading.addBoth(self._reloaded)

    def _reloaded(self, result: bool | Failure) -> bool | Deferred[bool]:
        self._reloading = None
        if isinstance(result, Failure):
            # A bug, not a configuration problem: logged, and the old one keeps serving.
            _log.failure("reload failed", result)
            result = False
        if self._stop_waiters is None:
            self._status = self.status_line()
            self.notifier.ready(self._status)
            if self._reload_again:
                self._reload_again = False
                return self.reload()
        return result

    async def _reload(self) -> bool:
        new = self._prepare()
        if new is None:
            return False
        gateway, children, export = new
        try:
            await self._warm_up(gateway)
        except BaseException:
            # A bug (or a cancellation): nothing of the new configuration keeps running.
            await _stop_all(children)
            _discard(gateway, export)
            raise
        if self._stop_waiters is None:
            # From here the new configuration serves: a failure is a bug, logged, and
            # never answered by stopping what now serves.
            self._switch(gateway, children, export)
            return True
        # Stopping meanwhile: the new configuration never serves.
        await _stop_all(children)
        _discard(gateway, export)
        return False

    def _prepare(self) -> tuple[Gateway, list[IService], MetricsExportService | None] | None:
        """
        Load and build the new configuration and start its services (outside the tree,
        the old ones serving on); L{None}, logged, when it is refused.

        Its OTLP metrics export is built (so that one that cannot be refuses the reload)
        but not started: until the switch the running export sends the same series, and
        a configuration that never serves must send nothing.
        """
        assert self.source is not None
        old = self.gateway
        new: Gateway | None = None
        export: MetricsExportService | None = None
        started: list[IService] = []
        try:
            config = load_config(self.source)
            _check_restart_fields(config, old.config)
            # Read now so that unreadable or mismatched files refuse the reload: with
            # the same listen value, new files at the same paths are a new certificate.
            self._tls = self.listener.read_tls(config.gateway.location)
            new = build_gateway(
                config, self.reactor, metrics_from=old.metrics, **self._build_options
            )
            open_access_log(new)
            children = self._children_of(new)
            export = self._export_of(new)
            if new.idp is not None and old.idp is not None and new.idp.take_over(old.idp):
                # Logins and Bearer tokens go on without waiting for a rediscovery.
                _log.info(
                    "IdP {issuer}: discovery and keys carried over", issuer=new.idp.spec.issuer
                )
            for child in children:
                started.append(child)
                child.privilegedStartService()
                child.startService()
        except BaseException as e:
            if started:
                _stop_all(started)
            if new is not None:
                _discard(new, export)
            if not isinstance(e, ConfigError):
                raise
            _log.error(
                "reload refused, the running configuration keeps serving: {problems}",
                problems=e.render(),
            )
            return None
        return new, children, export

    async def _warm_up(self, new: Gateway) -> None:
        """
        Wait until C{new} can serve what the old one does: its IdP discovered (carried
        over when the issuer is the same) and its state store answering; past
        L{warm_up_timeout} it takes over anyway (logged), as it would at a start.
        """
        deadline = self.reactor.seconds() + self.warm_up_timeout
        waiting = ["?"]
        while self._stop_waiters is None:
            waiting = await _cold_parts(
                new, max(0.0, deadline - self.reactor.seconds()), self.reactor
            )
            if not waiting or self.reactor.seconds() >= deadline:
                break
            await deferLater(self.reactor, WARM_UP_POLL, lambda: None)
        if waiting and self._stop_waiters is None:
            _log.warn(
                "the new configuration takes over before it is warm ({parts}); until "
                "then login and Bearer requests may answer 503 and server-side sessions "
                "fail closed",
                parts=", ".join(waiting),
            )

    def _switch(
        self, new: Gateway, children: list[IService], export: MetricsExportService | None
    ) -> None:
        """
        Make C{new} (its C{children} started) the serving configuration: new connections
        go to its Site, its metrics C{export} starts; the old one drains and retires.
        """
        old = self.gateway
        retired = [child for child in self if child not in (self.listener, self.metrics_listener)]
        for child in retired:
            # Out of the tree without being stopped: they stop once the old requests
            # have finished.
            self._detach(child)
        for child in children:
            # Already running: put in the tree without starting them again.
            self.services.append(child)
            if child.name is not None:
                self.namedServices[child.name] = child
            child.parent = self
        self.gateway = new
        self._switch_site(new)
        tls, self._tls = self._tls, None
        if tls is not None:
            self.listener.use_tls(tls)
        if old.readiness is not None:
            old.readiness.draining = True
        if new.readiness is not None:
            new.readiness.listening = self.listener.port is not None
        telemetry = new.telemetry
        metrics_spec = telemetry.spec.metrics if telemetry is not None else None
        if new.metrics is not None:
            new.metrics.registry.adopt()
        if self.metrics_listener is not None and new.metrics is not None:
            # The same series (the new registry carries the old one's instruments) with
            # the new gateway's observables, path and resource attributes.
            assert telemetry is not None and metrics_spec is not None
            self.metrics_listener.serve(
                new.metrics.registry, metrics_spec.prometheus_path, telemetry.provider.resource
            )
        if new.metrics is not None:
            # The old export would send the same series as the new one through the
            # drain: it stops now, with its last export (which the shared export lock
            # sends before any of the new one's), and the new one starts.
            for child in retired:
                if child.name == "metrics-export":
                    retired.remove(child)
                    stopping = maybeDeferred(child.stopService)
                    stopping.addErrback(_log_retire_failure)
                    # A stop of the daemon waits for that last export too, up to its
                    # drainTimeout: the timeout cancels this wait, not the export.
                    waited: Deferred[None] = Deferred()
                    stopping.chainDeferred(waited)
                    self._retiring.append(waited)
                    waited.addBoth(self._retired, waited)
                    break
        if export is not None:
            export.setServiceParent(self)
        _log.info(
            "configuration reloaded from {source}: {count} routes",
            source=self.source,
            count=len(new.routes),
        )
        retiring = self._retire(old, retired)
        self._retiring.append(retiring)
        retiring.addBoth(self._retired, retiring)

    def _detach(self, child: IService) -> None:
        self.services.remove(child)
        if child.name is not None:
            del self.namedServices[child.name]
        child.parent = None

    def retired(self) -> Deferred[object]:
        """
        Fires once every gateway a reload replaced so far has drained and stopped, and
        the last exports of their metrics exports have ended.
        """
        return gatherResults(list(self._retiring)).addCallback(lambda _: None)

    def _retired(self, result: object, retiring: Deferred[None]) -> None:
        if retiring in self._retiring:
            self._retiring.remove(retiring)

    def _switch_site(self, new: Gateway) -> None:
        """
        New connections go to C{new}'s Site, its connection cap fitted to the open-file
        limit as at start (a reload may raise C{limits.maxConnections}).
        """
        if isinstance(new.site, LimitedSite):
            new.site.fit_descriptor_limit()
        # Started as the listening port started the first one (its timers run), and
        # stopped once retired (see _retire), else each reload would leave one behind.
        new.site.doStart()
        self.listener.factory = new.site
        port: Any = self.listener.port
        if port is not None:
            factory = port.factory
            if getattr(factory, "wrappedFactory", None) is not None:
                factory.wrappedFactory = new.site  # a TLS wrapper around the Site
            else:
                port.factory = new.site

    def _retire(self, old: Gateway, children: list[IService]) -> Deferred[None]:
        """
        Drain C{old} (its connections close after their response, idle ones now), then
        stop its services in reverse start order.
        """
        drained = old.inflight.drain()
        old.site.shut_down()
        drained.addTimeout(old.config.gateway.drain_timeout, self.reactor)
        # Past its drainTimeout, what the old configuration still serves (streams) is cut,
        # as a stop would: nothing keeps running on stopped services.
        stopping: Deferred[Any] = drained.addErrback(lambda _: _abort_connections(old))
        stopping.addCallback(lambda _: old.site.doStop())
        for child in reversed(children):
            stopping.addCallback(_stop_child, child)
        stopping.addErrback(_log_retire_failure)
        return stopping.addCallback(lambda _: None)

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
        self.notifier.stopping()
        if self.gateway.readiness is not None:
            # Load balancers stop sending new requests while the ones in flight finish.
            self.gateway.readiness.draining = True
        if self._status_call is not None and self._status_call.active():
            self._status_call.cancel()
        Service.stopService(self)
        # From now on every response closes its connection, those in flight included.
        drained = self._drain()
        stopping: Deferred[Any] = _stop_child(None, self.listener)
        stopping.addCallback(lambda _: drained)
        for child in reversed(list(self)):
            if child is not self.listener:
                stopping.addCallback(_stop_child, child)
        # And what a reload replaced, if it has not finished yet, and a configuration
        # warming up (abandoned: its reload stops its services).
        stopping.addCallback(lambda _: gatherResults(self._unfinished_reloads()))
        stopping.addBoth(self._stopped)
        return stopping

    def _unfinished_reloads(self) -> list[Deferred[Any]]:
        unfinished: list[Deferred[Any]] = list(self._retiring)
        if self._reloading is not None:
            unfinished.append(self._reloading)
        return unfinished

    def _stopped(self, result: Any) -> Any:
        self._reload_again = False
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
        for retiring in self._retiring:
            # Their gateways are draining already; keep the tree's stop within its own.
            retiring.addTimeout(self.gateway.config.gateway.drain_timeout, self.reactor)
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


def build_service(
    config: Config,
    reactor: Any,
    source: str | None = None,
    notifier: SystemdNotifier | None = None,
    **build_options: Any,
) -> GatewayService:
    """
    Build the gateway of C{config} and its whole service tree, starting nothing.

    @param reactor: The reactor (a test clock for C{edgegw check}, which starts nothing).
    @param source: Where C{config} was read from (what a reload reads again).
    @param notifier: Tells systemd about readiness, reloads and stopping.
    @param build_options: Passed to L{build_gateway} (tests inject an upstream client or
        a span processor).
    @raise ConfigError: Something in the configuration cannot run.
    """
    gateway = build_gateway(config, reactor, **build_options)
    return GatewayService(gateway, reactor, source, notifier, **build_options)


def open_access_log(gateway: Gateway) -> None:
    """
    Open (and create) the access-log file as the daemon starts: building the gateway
    opens nothing, so that C{edgegw check} leaves no file behind (run as root, it would
    leave one the service user cannot write).

    @raise ConfigError: The file cannot be opened.
    """
    writer = gateway.access_log.writer
    if writer is None:
        return
    try:
        writer.open()
    except OSError as e:
        problem = Problem(
            gateway.config.gateway.location,
            "spec.accessLog.output",
            f"cannot open {writer.output}: {e.strerror or e}",
        )
        raise ConfigError([problem]) from None


def _abort_connections(gateway: Gateway) -> None:
    for channel in list(gateway.site.connections.channels):
        transport = getattr(channel, "transport", None)
        if transport is not None:
            transport.abortConnection()


def _check_restart_fields(config: Config, running: Config) -> None:
    """
    Refuse a reload that changes what only a restart can: the listen address and the
    metrics scrape listener's.

    @raise ConfigError: Located at the field that changed.
    """
    listen, before = config.gateway.listen, running.gateway.listen
    if listen != before:
        problem = Problem(
            config.gateway.location,
            "spec.listen",
            f"changed from {before} to {listen}: a new listen address needs a restart "
            "(the running configuration keeps serving)",
        )
        raise ConfigError([problem])
    scrape, old_scrape = _scrape_address(config), _scrape_address(running)
    if scrape != old_scrape:
        telemetry = config.telemetry or running.telemetry
        assert telemetry is not None
        problem = Problem(
            telemetry.location,
            "spec.metrics.prometheus.listen",
            f"changed from {old_scrape or 'none'} to {scrape or 'none'}: the metrics "
            "listener needs a restart (the running configuration keeps serving)",
        )
        raise ConfigError([problem])


def _stop_all(children: list[IService]) -> Deferred[None]:
    """
    Stop C{children} (started outside the tree) in reverse start order.
    """
    stopping: Deferred[Any] = succeed(None)
    for child in reversed(children):
        stopping.addCallback(_stop_child, child)
    stopping.addErrback(_log_retire_failure)
    return stopping.addCallback(lambda _: None)


async def _cold_parts(gateway: Gateway, within: float, reactor: Any) -> list[str]:
    """
    What C{gateway} still lacks to serve like a warm one: C{IdP discovery} and C{state
    store} (a store that says it is not connected yet is not asked; one that is must
    answer a read within C{within} seconds).
    """
    cold = []
    if gateway.idp is not None and not gateway.idp.ready:
        cold.append("IdP discovery")
    state = gateway.state
    if state is not None:
        if getattr(state, "connected", True) is False:
            cold.append("state store")
        else:
            try:
                await state.get(b"edgegw:warm-up-probe").addTimeout(within, reactor)
            except Exception:
                cold.append("state store")
    return cold


def _discard(gateway: Gateway, export: MetricsExportService | None = None) -> None:
    """
    Let go of a gateway built for a reload that was then refused, and of its metrics
    C{export} (never started): it never served.
    """
    if export is not None:
        export.discard()
    if gateway.telemetry is not None:
        gateway.telemetry.discard()
    writer = gateway.access_log.writer
    if writer is not None:
        writer.close()


def _log_retire_failure(failure: Failure) -> None:
    _log.failure("stopping the services of a replaced configuration", failure)


def _scrape_address(config: Config) -> str | None:
    """
    The metrics scrape listener's address in C{config}, if any.
    """
    telemetry = config.telemetry
    metrics = telemetry.metrics if telemetry is not None else None
    return metrics.prometheus_listen if metrics is not None else None


def _scrape_listener(gateway: Gateway, reactor: Any) -> ScrapeListener | None:
    """
    The scrape listener of C{gateway}'s metrics, if they ask for one.
    """
    telemetry = gateway.telemetry
    metrics = telemetry.spec.metrics if telemetry is not None else None
    if telemetry is None or metrics is None or gateway.metrics is None:
        return None
    if metrics.prometheus_listen is None:
        return None
    attributes = dict(telemetry.provider.resource.attributes)
    root = scrape_root(gateway.metrics.registry, metrics.prometheus_path, attributes)
    return ScrapeListener(reactor, metrics.prometheus_listen, ScrapeSite(root, reactor))
