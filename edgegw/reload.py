"""
Reloading the configuration (SIGHUP): the steps of one reload.

  1. L{prepare}: read and build the configuration again; refuse it (logged, the running
     one serving on) when it is invalid or changes what only a restart can; start its
     generation of services outside the tree;
  2. L{warm_up}: wait, at most its C{reload.warmupTimeout}, until its IdP is discovered
     (or carried over) and its state store answers (or is carried over);
  3. L{switch}: put the new generation in the tree, send new connections to its Site
     (and its TLS contexts, and its redirect Site), hand the metrics over;
  4. retire: the replaced generation leaves the tree, drains and stops
     (L{GenerationService.retire<edgegw.generation.GenerationService.retire>}).

L{edgegw.service.GatewayService.reload} runs them (L{reload_configuration}) on the tree,
which a reload sees as a L{ReloadingTree}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IListeningPort, IOpenSSLContextFactory
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.errors import ConfigError, Problem
from edgegw.config.model import Config
from edgegw.config.parse import load_config
from edgegw.generation import GenerationService, discard, open_access_log
from edgegw.listener import ListenerService
from edgegw.metrics.serve import ScrapeListener
from edgegw.state.providers import take_over_store

# The namespace the daemon's log has always shown for the service tree's events.
_log = Logger(namespace="edgegw.service")

WARM_UP_POLL = 0.05
"""Seconds between two looks at whether a reload's new configuration is warm."""


class ReloadingTree(Protocol):
    """
    The service tree as a reload sees it (L{edgegw.service.GatewayService} is one).
    """

    @property
    def reactor(self) -> Any:
        """The reactor."""

    @property
    def source(self) -> str | None:
        """Where the configuration is read from."""

    @property
    def build_options(self) -> Mapping[str, Any]:
        """Passed to L{build_gateway} again."""

    @property
    def listener(self) -> ListenerService:
        """The listening socket (it outlives reloads)."""

    @property
    def redirect_listener(self) -> ListenerService | None:
        """The redirectHTTP listener, if any (it outlives reloads)."""

    @property
    def metrics_listener(self) -> ScrapeListener | None:
        """The metrics scrape listener, if any (it outlives reloads)."""

    @property
    def generation(self) -> GenerationService:
        """The serving generation."""

    @property
    def warm_up_timeout(self) -> float | None:
        """
        The most seconds a new configuration warms up before it takes over, when set;
        L{None}: its own C{reload.warmupTimeout}.
        """

    @property
    def stopping(self) -> bool:
        """Whether the tree has begun to stop, or is not running."""

    def generation_of(self, gateway: Gateway) -> GenerationService:
        """
        The generation that would serve C{gateway}, not started, its metrics export
        apart.

        @raise ConfigError: Its metrics export cannot be made.
        """

    def adopt(self, generation: GenerationService) -> GenerationService:
        """
        Put C{generation} (running) in the tree as the serving one.

        @return: The one it replaces, still in the tree until it retires.
        """

    def until_retired(self, retiring: Deferred[None]) -> None:
        """
        Keep the tree's stop (and its C{retired}) waiting for C{retiring}.
        """


async def reload_configuration(tree: ReloadingTree) -> bool:
    """
    Reload C{tree}'s configuration (the steps in the module docstring).

    @return: Whether the new configuration serves.
    """
    prepared = await prepare(tree)
    if prepared is None:
        return False
    generation, tls = prepared
    try:
        await warm_up(tree, generation.gateway)
    except BaseException:
        # A bug (or a cancellation): nothing of the new configuration keeps running.
        await _abandon(generation.gateway, generation)
        raise
    if not tree.stopping:
        # From here the new configuration serves: a failure is a bug, logged, and
        # never answered by stopping what now serves.
        switch(tree, generation, tls)
        return True
    # Stopping meanwhile: the new configuration never serves.
    await _abandon(generation.gateway, generation)
    return False


async def prepare(
    tree: ReloadingTree,
) -> tuple[GenerationService, IOpenSSLContextFactory | None] | None:
    """
    Load and build the new configuration and start its generation (outside the tree,
    the old one serving on); L{None}, logged, when it is refused. Whatever fails, what
    was built and started of it is let go of first (L{_abandon}).

    Its OTLP metrics export is built (so that one that cannot be refuses the reload)
    but not started: until the switch the running export sends the same series, and
    a configuration that never serves must send nothing.

    @return: The new generation, running, and the TLS context its listen address asks
        for, its files read again (L{ListenerService.read_tls}), or its C{tls} block's
        contexts.
    """
    assert tree.source is not None
    old = tree.generation.gateway
    new: Gateway | None = None
    generation: GenerationService | None = None
    try:
        config = load_config(tree.source)
        check_restart_fields(config, old.config)
        # Read now so that unreadable or mismatched files refuse the reload: with
        # the same listen value, new files at the same paths are a new certificate.
        tls = tree.listener.read_tls(config.gateway.location)
        new = build_gateway(config, tree.reactor, metrics_from=old.metrics, **tree.build_options)
        if new.tls is not None:
            # Gateway.spec.tls: its certificates were read and checked by the load.
            tls = new.tls
        open_access_log(new)
        generation = tree.generation_of(new)
        if new.idp is not None and old.idp is not None and new.idp.take_over(old.idp):
            # Logins and Bearer tokens go on without waiting for a rediscovery.
            _log.info("IdP {issuer}: discovery and keys carried over", issuer=new.idp.spec.issuer)
            bearer, old_bearer = new.idp.bearer, old.idp.bearer
            if bearer is not None and old_bearer is not None and bearer.take_over(old_bearer):
                # Tokens verified before are not verified (nor userinfo asked) again.
                _log.info("Bearer tokens verified before carried over")
        if take_over_store(new.state, old.state):
            # No reconnection: sessions go on on the same connections and subscriptions.
            _log.info("state store: connections carried over")
        carry_replay_records(new, old)
        generation.privilegedStartService()
        generation.startService()
    except BaseException as e:
        if new is not None:
            await _abandon(new, generation)
        if not isinstance(e, ConfigError):
            raise
        _log.error(
            "reload refused, the running configuration keeps serving: {problems}",
            problems=e.render(),
        )
        return None
    return generation, tls


async def warm_up(tree: ReloadingTree, new: Gateway) -> None:
    """
    Wait until C{new} can serve what the old one does: its IdP discovered (carried
    over when the issuer is the same) and its state store answering (carried over when
    its settings are the same); past C{new}'s C{reload.warmupTimeout} (or the tree's
    C{warm_up_timeout}, when set) it takes over anyway (logged), as it would at a start.
    """
    reactor = tree.reactor
    bound = tree.warm_up_timeout
    if bound is None:
        bound = new.config.gateway.reload.warmup_timeout
    deadline = reactor.seconds() + bound
    waiting = ["?"]
    while not tree.stopping:
        waiting = await cold_parts(new, max(0.0, deadline - reactor.seconds()), reactor)
        if not waiting or reactor.seconds() >= deadline:
            break
        await deferLater(reactor, WARM_UP_POLL, lambda: None)
    if waiting and not tree.stopping:
        _log.warn(
            "the new configuration takes over before it is warm ({parts}: not ready "
            "within reload.warmupTimeout, {bound:g}s); until then login and Bearer "
            "requests may answer 503 and server-side sessions fail closed",
            parts=", ".join(waiting),
            bound=bound,
        )


def switch(tree: ReloadingTree, new: GenerationService, tls: IOpenSSLContextFactory | None) -> None:
    """
    Make C{new} (running) the serving generation: new connections go to its Site (with
    C{tls}, the certificate read again, when not L{None}), its metrics export starts;
    the one it replaces drains and retires.
    """
    old = tree.adopt(new)
    gateway = new.gateway
    tree.listener.switch_site(gateway.site)
    if tls is not None:
        tree.listener.use_tls(tls)
    if tree.redirect_listener is not None and gateway.redirect_site is not None:
        redirect_to(gateway, tree.listener.port)
        tree.redirect_listener.switch_site(gateway.redirect_site)
    if old.gateway.readiness is not None:
        old.gateway.readiness.draining = True
    if gateway.readiness is not None:
        gateway.readiness.listening = tree.listener.port is not None
    telemetry = gateway.telemetry
    metrics_spec = telemetry.spec.metrics if telemetry is not None else None
    if gateway.metrics is not None:
        gateway.metrics.registry.adopt()
    if tree.metrics_listener is not None and gateway.metrics is not None:
        # The same series (the new registry carries the old one's instruments) with
        # the new gateway's observables, path and resource attributes.
        assert telemetry is not None and metrics_spec is not None
        tree.metrics_listener.serve(
            gateway.metrics.registry, metrics_spec.prometheus_path, telemetry.provider.resource
        )
    if gateway.metrics is not None:
        # The old export would send the same series as the new one through the
        # drain: it stops now, with its last export (which the shared export lock
        # sends before any of the new one's), and the new one starts.
        stopping = old.stop_export()
        if stopping is not None:
            stopping.addErrback(_log_retire_failure)
            # A stop of the daemon waits for that last export too, up to its
            # drainTimeout: the timeout cancels this wait, not the export.
            waited: Deferred[None] = Deferred()
            stopping.chainDeferred(waited)
            tree.until_retired(waited)
    new.start_export()
    _log.info(
        "configuration reloaded from {source}: {count} routes",
        source=tree.source,
        count=len(gateway.routes),
    )
    retiring = old.retire()
    retiring.addErrback(_log_retire_failure)
    tree.until_retired(retiring)


def carry_replay_records(new: Gateway, old: Gateway) -> None:
    """
    Have C{new} share C{old}'s per-process replay records, whatever else changed: the
    identity assertions' token ids and the login states spent at the callback. A
    replay refused before a reload stays refused after it (a record only ever refuses
    more), and one the replaced configuration refuses while it drains too.
    """
    if new.assertions is not None and old.assertions is not None:
        new.assertions.take_over(old.assertions)
    if new.login is not None and old.login is not None:
        new.login.spent.take_over(old.login.spent)


def redirect_to(gateway: Gateway, port: IListeningPort | None) -> None:
    """
    Have C{gateway}'s redirect Site (if any) name the port the TLS listener is bound to,
    when neither C{redirectHTTP.httpsPort} nor C{listen} named one.
    """
    site = gateway.redirect_site
    if site is not None and port is not None:
        site.default_https_port(getattr(port.getHost(), "port", None))


def check_restart_fields(config: Config, running: Config) -> None:
    """
    Refuse a reload that changes what only a restart can: the listen address, whether
    it speaks TLS (C{tls} set or not), the redirect listener's address (or whether there
    is one), and the metrics scrape listener's.

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
    tls, old_tls = config.gateway.tls is not None, running.gateway.tls is not None
    if tls != old_tls:
        problem = Problem(
            config.gateway.location,
            "spec.tls",
            f"{'added' if tls else 'removed'}: turning TLS on or off on the listener needs "
            "a restart (the running configuration keeps serving)",
        )
        raise ConfigError([problem])
    redirect, old_redirect = _redirect_address(config), _redirect_address(running)
    if redirect != old_redirect:
        problem = Problem(
            config.gateway.location,
            "spec.redirectHTTP.listen",
            f"changed from {old_redirect or 'none'} to {redirect or 'none'}: the redirect "
            "listener needs a restart (the running configuration keeps serving)",
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


async def cold_parts(gateway: Gateway, within: float, reactor: Any) -> list[str]:
    """
    What C{gateway} still lacks to serve like a warm one: C{IdP discovery} and C{state
    store} (a store that says it is not connected yet is not asked; one that is must
    answer a read within C{within} seconds; one that carried the old store's connections
    over is not waited for).
    """
    cold = []
    if gateway.idp is not None and not gateway.idp.ready:
        cold.append("IdP discovery")
    state = gateway.state
    # A store that took over the old one's connections is as warm as the old one: waiting
    # for it would keep the old configuration serving on the same connections.
    if state is not None and not getattr(state, "carried_over", False):
        if getattr(state, "connected", True) is False:
            cold.append("state store")
        else:
            try:
                await state.get(b"edgegw:warm-up-probe").addTimeout(within, reactor)
            except Exception:
                cold.append("state store")
    return cold


def _abandon(gateway: Gateway, generation: GenerationService | None = None) -> Deferred[None]:
    """
    Let go of a configuration that never served: stop what its generation (if it was
    made) started, outside the tree -- the children that did start, in reverse order,
    even when the start failed half-way or one of them fails to stop -- then what was
    built but never started (L{discard}: its span export's thread, its access-log file,
    its metrics exporter).

    @return: Fires once all that is done (a failure is logged, never passed on: the
        reload's own error is what is reported).
    """
    stopping: Deferred[None] = (
        maybeDeferred(generation.stopService) if generation is not None else succeed(None)
    )
    stopping.addErrback(_log_abandon_failure)
    export = generation.export if generation is not None else None
    stopping.addCallback(lambda _: discard(gateway, export))
    return stopping.addErrback(_log_abandon_failure)


def _log_retire_failure(failure: Failure) -> None:
    _log.failure("stopping the services of a replaced configuration", failure)


def _log_abandon_failure(failure: Failure) -> None:
    _log.failure("letting go of a configuration that never served", failure)


def _scrape_address(config: Config) -> str | None:
    """
    The metrics scrape listener's address in C{config}, if any.
    """
    telemetry = config.telemetry
    metrics = telemetry.metrics if telemetry is not None else None
    return metrics.prometheus_listen if metrics is not None else None


def _redirect_address(config: Config) -> str | None:
    """
    The redirectHTTP listener's address in C{config}, if any.
    """
    redirect = config.gateway.redirect_http
    return redirect.listen if redirect is not None else None
