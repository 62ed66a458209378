"""
The gateway as a tree of Twisted services.

L{GatewayService} (a C{MultiService}) has these children, in start order:

  - C{listener}: L{ListenerService<edgegw.listener.ListenerService>}, the listening
    socket serving the gateway's Site (behind TLS with C{Gateway.spec.tls});
  - C{redirect-listener}: with C{Gateway.spec.redirectHTTP}, a second one, whose Site
    redirects plain HTTP to the first;
  - C{metrics-scrape}: with C{Telemetry.metrics.prometheus}, the scrape listener;
  - the serving generation: L{GenerationService<edgegw.generation.GenerationService>},
    the services of one configuration (access log, upstream pool, state store and
    sessions, IdP, telemetry, metrics export), which a reload replaces
    (L{edgegw.reload}). The listeners outlive reloads.

Stopping (SIGTERM under twistd) runs in a stated order: idle keep-alive client
connections are closed, the listeners stop accepting, the requests in flight drain (up
to C{Gateway.spec.drainTimeout}; every further response closes its connection), then the
other children stop one after another, in reverse start order, each waiting for the one
before (the generation's own children likewise).

L{build_service} builds the whole tree without starting anything; C{edgegw check} builds
exactly this tree.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, DeferredLock, gatherResults, succeed
from twisted.internet.interfaces import IListeningPort
from twisted.logger import ILogObserver, LogEvent, Logger, LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.model import Config
from edgegw.generation import GenerationService, build_generation, stop_child
from edgegw.listener import ListenerService
from edgegw.metrics.serve import ScrapeListener, scrape_root
from edgegw.notify import SystemdNotifier, monotonic_usec, one_line
from edgegw.reload import redirect_to, reload_configuration
from edgegw.reload_outcome import OutcomeRecord
from edgegw.server.gateway_site import LimitedSite
from edgegw.server.scrape_site import ScrapeSite

_log = Logger(namespace="edgegw.service")

STATUS_INTERVAL = 10.0
"""Seconds between checks of the C{STATUS=} line sent to systemd (sent when it changes)."""


class GatewayService(MultiService):
    """
    Serves one L{Gateway} at a time: the root of the service tree (see the module
    docstring).

    @ivar generation: The serving generation: the services of the configuration that
        serves new connections (named: C{getServiceNamed("idp")} on it).
    @ivar warm_up_timeout: When set, the most seconds a reload's configuration warms
        up before it takes over (L{reload}), whatever it says; L{None} (the default):
        its own C{reload.warmupTimeout}.
    @ivar outcomes: Where each reload's outcome is written for C{edgegw reload} (the
        twistd plugin sets it when the daemon has a runtime directory).
    """

    outcomes: OutcomeRecord | None = None
    # Why the last reload was not taken ("reload refused: ..." or "reload failed ..."),
    # for L{status_line}, until one is.
    _refused: str | None = None

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
        self.reactor = reactor
        self.source = source
        self.notifier = notifier or SystemdNotifier({})
        self.build_options = build_options
        self.listener = ListenerService(
            gateway.config.gateway.listen, gateway.site, reactor, gateway.tls
        )
        self.listener.setName("listener")
        self.listener.setServiceParent(self)
        # With redirectHTTP, the plain-HTTP listener redirecting to the TLS one (it
        # outlives reloads too: they switch its Site).
        self.redirect_listener: ListenerService | None = None
        redirect = gateway.config.gateway.redirect_http
        if redirect is not None and gateway.redirect_site is not None:
            listener = ListenerService(redirect.listen, gateway.redirect_site, reactor)
            listener.setName("redirect-listener")
            listener.setServiceParent(self)
            self.redirect_listener = listener
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
        self.generation = self.generation_of(gateway)
        # Its last export, when the gateway retires, counts what it served.
        self.generation.start_export()
        self.generation.setServiceParent(self)
        self._stop_waiters: list[Deferred[None]] | None = None
        # Generations replaced by a reload, until their requests in flight have finished
        # and their services have stopped.
        self._retiring: list[Deferred[None]] = []
        self._status_call: Any = None
        self._status = ""
        self._reloading: Deferred[bool] | None = None
        self._reload_again = False
        self.warm_up_timeout: float | None = None

    @property
    def gateway(self) -> Gateway:
        """
        The serving configuration's gateway.
        """
        return self.generation.gateway

    @property
    def port(self) -> IListeningPort | None:
        """
        The listening port once bound (the listener's).
        """
        return self.listener.port

    @property
    def stopping(self) -> bool:
        """
        Whether the tree has begun to stop, or is not running (a stop that failed
        leaves no stop under way, and a reload must not switch into such a tree).
        """
        return self._stop_waiters is not None or not self.running

    def generation_of(self, gateway: Gateway) -> GenerationService:
        """
        The generation that would serve C{gateway}, not started, its metrics export
        apart (L{GenerationService.start_export}).

        @raise ConfigError: Its metrics export cannot be made.
        """
        return build_generation(gateway, self.reactor, self._export_locks)

    def adopt(self, generation: GenerationService) -> GenerationService:
        """
        Put C{generation}, started outside the tree by a reload, in it as the serving
        one (joining starts nothing twice).

        @return: The generation it replaces, still in the tree until it retires.
        """
        replaced, self.generation = self.generation, generation
        generation.setServiceParent(self)
        return replaced

    def until_retired(self, retiring: Deferred[None]) -> None:
        """
        Keep a stop (and L{retired}) waiting for C{retiring}, a replaced generation's
        retirement or its metrics export's last export.
        """
        self._retiring.append(retiring)
        retiring.addBoth(self._retired, retiring)

    def retired(self) -> Deferred[object]:
        """
        Fires once every gateway a reload replaced so far has drained and stopped, and
        the last exports of their metrics exports have ended.
        """
        return gatherResults(list(self._retiring)).addCallback(lambda _: None)

    def _retired(self, result: object, retiring: Deferred[None]) -> None:
        if retiring in self._retiring:
            self._retiring.remove(retiring)

    def startService(self) -> None:
        """
        Start the children; say where the gateway listens, and tell systemd it is ready.
        """
        super().startService()
        port = self.listener.port
        redirect = self.redirect_listener
        if redirect is not None and redirect.port is not None:
            redirect_to(self.gateway, port)
            _log.info(
                "redirecting plain HTTP on {address} to https",
                address=redirect.port.getHost(),
            )
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
        if not self.running or self.stopping:
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
        if self._refused is not None:
            # Until a reload is taken: systemctl status shows why the last one was not.
            line = f"{one_line(self._refused, 600)}; still {line}"
        return line

    def _update_status(self) -> None:
        status = self.status_line()
        if status != self._status:
            self._status = status
            self.notifier.status(status)
        self._status_call = self.reactor.callLater(STATUS_INTERVAL, self._update_status)

    @property
    def warm_up_bound(self) -> float:
        """
        The most seconds the next reload should warm up: L{warm_up_timeout} when set,
        else the serving configuration's C{reload.warmupTimeout} (what C{edgegw reload}
        waits for; a new configuration's own may differ).
        """
        if self.warm_up_timeout is not None:
            return self.warm_up_timeout
        return self.gateway.config.gateway.reload.warmup_timeout

    def reload(self) -> Deferred[bool]:
        """
        Read the configuration again (SIGHUP). A valid one is built and its services
        started beside the running ones; once it is warm (its IdP discovered, its state
        store answering; at most its C{reload.warmupTimeout}) it serves every new
        connection. The requests in flight finish on the old one, whose connections
        close after their response (idle ones at once), and whose services stop once
        they have (or after its C{drainTimeout}). An invalid one, or one that listens
        elsewhere (that needs a restart), is logged and the old one keeps serving. The
        steps are L{edgegw.reload}'s.

        A reload asked for while one is warming up runs again once it is done.

        systemd is told the truth: C{RELOADING=1} once the reload is under way past the
        reactor turn it began in (it warms up; with C{MONOTONIC_USEC}, when it began),
        C{READY=1} once the new configuration serves. A configuration refused at once
        (before anything of it ran) sends no C{RELOADING=1} (the unit never leaves
        C{active}) and no C{READY=1}, only a C{STATUS=} line that says why, kept until a
        reload is taken. A reload that ends untaken after its C{RELOADING=1} (a bug
        while warming up, or a refusal that first had to stop what it had started)
        sends C{READY=1} without a switch, with that status: the old configuration
        serves, and a unit must not stay C{reloading}. Each reload's outcome, with the
        located problems, goes to L{outcomes} for C{edgegw reload}.

        @return: Fires with whether the new configuration was taken.
        """
        if self._reloading is not None:
            self._reload_again = True
            return self._reloading
        if self.source is None or not self.running or self.stopping:
            if self.outcomes is not None:
                self.outcomes.refuse(
                    "the gateway is stopping"
                    if self.source is not None
                    else "the gateway was not started from a configuration to read again"
                )
            return succeed(False)
        number = self.outcomes.begin(self.warm_up_bound) if self.outcomes is not None else 0
        began = monotonic_usec()
        refusals = _Refusals()
        globalLogPublisher.addObserver(refusals)
        reloading = self._reloading = Deferred.fromCoroutine(reload_configuration(self))
        announced = not reloading.called
        if announced:
            # Built and started: it warms up, and READY=1 follows whatever comes of it.
            self.notifier.reloading(began)
        return reloading.addBoth(self._reloaded, number, began, announced, refusals)

    def _reloaded(
        self,
        result: bool | Failure,
        number: int,
        began: int,
        announced: bool,
        refusals: _Refusals,
    ) -> bool | Deferred[bool]:
        self._reloading = None
        globalLogPublisher.removeObserver(refusals)
        problems = "\n".join(refusals.problems)
        if isinstance(result, Failure):
            # A bug, not a configuration problem: logged, and the old one keeps serving.
            _log.failure("reload failed", result)
            error = result.value
            problems = f"reload failed (a bug): {type(error).__name__}: {error}"
            result = False
        if not result and not problems:
            problems = "the gateway began to stop" if self.stopping else "see the daemon's log"
        if not self.stopping:
            headline = problems if problems.startswith("reload ") else f"reload refused: {problems}"
            self._refused = None if result else headline
            self._status = self.status_line()
            if result and not announced:
                # The whole reload ran at once (nothing to warm up): still a reload.
                self.notifier.reloading(began)
            if result or announced:
                self.notifier.ready(self._status)
            else:
                self.notifier.status(self._status)
        if self.outcomes is not None:
            # After the notification: `edgegw reload` exits on this, and systemd
            # should have READY=1 by then.
            self.outcomes.warm_up_timeout = self.warm_up_bound
            self.outcomes.end(number, result, problems, self.status_line())
        if self._reload_again:
            self._reload_again = False
            if not self.stopping:
                return self.reload()
            if self.outcomes is not None:
                self.outcomes.refuse("the gateway began to stop")
        return result

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
        listeners = [self.listener]
        if self.redirect_listener is not None:
            listeners.append(self.redirect_listener)
        stopping: Deferred[Any] = stop_child(None, self.listener)
        if self.redirect_listener is not None:
            stopping.addCallback(stop_child, self.redirect_listener)
        stopping.addCallback(lambda _: drained)
        for child in reversed(list(self)):
            if child not in listeners:
                stopping.addCallback(stop_child, child)
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
        # An idle keep-alive connection would otherwise carry new requests until the end.
        sites: list[LimitedSite] = [self.gateway.site]
        if self.gateway.redirect_site is not None:
            sites.append(self.gateway.redirect_site)
        for site in sites:
            site.shut_down()
        # Done once every connection has closed (after its response; one that has not
        # sent its first request yet after it, or after a grace), and with it every
        # request in flight.
        waits = [inflight.drain()] + [site.closed() for site in sites]
        drained: Deferred[Any] = gatherResults(waits, consumeErrors=True)
        drained.addCallback(lambda _: None)
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


@implementer(ILogObserver)
class _Refusals:
    """
    The located problems a reload logs as it refuses the configuration (an error of
    the service's namespace with a C{problems} field: L{edgegw.reload.prepare}'s),
    collected while it runs, for its outcome record and C{STATUS=} line.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []

    def __call__(self, event: LogEvent) -> None:
        if (
            event.get("log_namespace") == _log.namespace
            and event.get("log_level") in (LogLevel.error, LogLevel.critical)
            and "problems" in event
        ):
            self.problems.append(str(event["problems"]))


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
