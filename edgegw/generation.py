"""
One configuration's services: a generation.

L{GenerationService} (a C{MultiService}) holds the children that serve one L{Gateway},
named, in start order:

  - C{access-log}: L{AccessLogService}, the buffered access-log writer (flushed on stop);
  - C{upstream-pool}: L{UpstreamPoolService}, the upstream connection pool (idle
    connections closed on stop);
  - C{state} and C{sessions}: with a C{stateProvider}, the state store (connecting in
    the background, reconnecting with backoff; closed on stop) and, with a session
    block, the server-side sessions over it (listening on the store's logout channel);
  - C{idp}: L{IdentityProvider<edgegw.identity.provider.IdentityProvider>}, with an IdP
    resource (browser login, Bearer verification): discovery at start without holding
    the gateway up, retried with capped backoff, then the discovery document and key
    sets refreshed periodically; timers and calls in flight cancelled on stop;
  - C{telemetry}: L{TelemetryService}, only with a Telemetry resource (spans flushed to
    the exporter on stop);
  - C{metrics-export}: the OTLP metrics export, with C{Telemetry.metrics.otlp} (one last
    export on stop).

It stops them in reverse start order, one after another (one that fails to stop keeps
none of the others running). The service tree (L{edgegw.service.GatewayService}) holds
the serving generation; a reload starts the next one outside the tree to warm it up,
puts it in, and retires the one it replaced, which drains before it stops
(L{GenerationService.retire}).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, DeferredLock, maybeDeferred, succeed
from twisted.python.failure import Failure

from edgegw.assembly.assemble import Gateway
from edgegw.chain.access_log import AccessLog
from edgegw.config.errors import ConfigError, Problem
from edgegw.metrics.otlp import MetricsExportService
from edgegw.metrics.serve import export_service
from edgegw.server.gateway_site import LimitedSite
from edgegw.telemetry import Telemetry
from edgegw.upstream.pool import UpstreamClient


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


class GenerationService(MultiService):
    """
    The services of one L{Gateway} (see the module docstring).

    @ivar gateway: What they serve.
    @ivar export: Its OTLP metrics export (C{metrics-export}), when its Telemetry
        resource asks for one: a child once L{start_export} has run.
    """

    def __init__(
        self,
        gateway: Gateway,
        reactor: Any,
        children: Sequence[IService],
        export: MetricsExportService | None = None,
    ) -> None:
        """
        @param children: The services that serve C{gateway}, named, in start order.
        """
        super().__init__()
        self.gateway = gateway
        self.reactor = reactor
        self.export = export
        self._replaced = False
        for child in children:
            child.setServiceParent(self)

    def privilegedStartService(self) -> None:
        """
        As L{startService}: nothing when started already.
        """
        if not self.running:
            super().privilegedStartService()

    def startService(self) -> None:
        """
        Start the children in order. A reload starts a generation outside the tree (to
        warm it up) before it puts it in: started already, it starts nothing twice.
        """
        if not self.running:
            super().startService()

    def start_export(self) -> None:
        """
        Make the metrics export a child: it starts with the generation, or at once when
        the generation runs already (a reload starts it only when the generation takes
        over: one that never serves exports nothing).
        """
        if self.export is not None and self.export.parent is None:
            self.export.setServiceParent(self)

    def stop_export(self) -> Deferred[None] | None:
        """
        Take the metrics export out of the running generation, stopping it (its last
        export).

        @return: Fires once it has stopped; L{None} when no export is a child.
        """
        export = self.export
        if export is None or export.parent is not self:
            return None
        return maybeDeferred(export.disownServiceParent)

    def retire(self) -> Deferred[None]:
        """
        Leave the service tree, replaced by a reload's configuration. Leaving a running
        tree stops the generation, which then first drains its gateway: its requests in
        flight finish (their connections then serve the new configuration; past its
        C{drainTimeout} what it still serves is cut), then it stops its Site and its
        services in reverse start order.

        @return: Fires once it has; fails with what failed.
        """
        self._replaced = True
        retiring = self.disownServiceParent()
        if not isinstance(retiring, Deferred):
            # Out of a tree that was not running (a bug: a reload never switches into
            # one), which stopped nothing: stopped here all the same.
            retiring = maybeDeferred(self.stopService)
        return retiring

    def stopService(self) -> Deferred[None]:
        """
        Stop the children in reverse start order, one after another (a child that is not
        running has nothing to stop); a generation a reload replaced drains first
        (L{retire}). One that fails to stop keeps none of the others running.

        @return: Fires once they have; fails with the first failure.
        """
        Service.stopService(self)
        stopping: Deferred[Any] = self._drain() if self._replaced else succeed(None)
        failures: list[Failure] = []

        def record(failure: Failure) -> None:
            failures.append(failure)

        for child in reversed(list(self)):
            stopping.addErrback(record)
            stopping.addCallback(stop_child, child)
        stopping.addErrback(record)
        return stopping.addCallback(lambda _: failures[0] if failures else None)

    def _drain(self) -> Deferred[Any]:
        gateway = self.gateway
        sites: list[LimitedSite] = [gateway.site]
        if gateway.redirect_site is not None:
            sites.append(gateway.redirect_site)
        # Its connections serve their next requests from the new configuration's Sites
        # already (LimitedSite.take_over): only the requests in flight are waited for.
        drained = gateway.inflight.drained()
        drained.addTimeout(gateway.config.gateway.drain_timeout, self.reactor)

        def abort(_: object) -> None:
            for site in sites:
                site.abort_connections()

        def stop(_: object) -> None:
            for site in sites:
                site.doStop()

        # Past its drainTimeout, what the old configuration still serves (streams) is cut,
        # as a stop would: nothing keeps running on stopped services.
        stopping: Deferred[Any] = drained.addErrback(abort)
        return stopping.addCallback(stop)


def stop_child(result: object, child: IService) -> Deferred[Any]:
    """
    Stop C{child} unless it is not running (a callback: C{result} is ignored).
    """
    if not child.running:
        return succeed(None)
    return maybeDeferred(child.stopService)


def build_generation(
    gateway: Gateway, reactor: Any, export_locks: dict[tuple[str, str], DeferredLock]
) -> GenerationService:
    """
    The generation that serves C{gateway}, not started; its OTLP metrics export apart
    until L{GenerationService.start_export}.

    @param export_locks: One lock per collector (protocol, endpoint), shared by every
        generation of the tree (see L{edgegw.service.GatewayService}).
    @raise ConfigError: The OTLP metric exporter cannot be made.
    """
    export = _export_of(gateway, reactor, export_locks)
    try:
        return GenerationService(gateway, reactor, _children_of(gateway), export)
    except BaseException:
        # Its exporter was made: nothing else would shut it down.
        if export is not None:
            export.discard()
        raise


def _children_of(gateway: Gateway) -> list[IService]:
    """
    The children that serve C{gateway}, named, in start order (its metrics export
    apart: L{_export_of}).
    """
    children: list[tuple[str, Service]] = [
        ("access-log", AccessLogService(gateway.access_log)),
        ("upstream-pool", UpstreamPoolService(gateway.upstream_client)),
    ]
    if gateway.state is not None:
        # The store connects in the background; until it can be reached, requests
        # with server-side sessions are unauthenticated, and identity assertions are
        # not accepted (fail closed). Without a session block it holds only the
        # assertions' replay record.
        children.append(("state", gateway.state))  # type: ignore[arg-type]
        if gateway.sessions is not None:
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


def _export_of(
    gateway: Gateway, reactor: Any, export_locks: dict[tuple[str, str], DeferredLock]
) -> MetricsExportService | None:
    """
    The OTLP export of C{gateway}'s metrics (C{metrics-export}), when its Telemetry
    resource asks for one; not yet started.
    """
    telemetry = gateway.telemetry
    metrics = telemetry.spec.metrics if telemetry is not None else None
    if telemetry is None or metrics is None or gateway.metrics is None:
        return None
    collector = (telemetry.spec.otlp_protocol, metrics.otlp_endpoint or "")
    lock = export_locks.setdefault(collector, DeferredLock())
    try:
        export = export_service(
            telemetry.spec,
            metrics,
            gateway.metrics.registry,
            telemetry.provider.resource,
            reactor,
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


def discard(gateway: Gateway, export: MetricsExportService | None = None) -> None:
    """
    Let go of a gateway built for a reload that was then refused or abandoned, and of
    its metrics C{export} (never started): it never served. Each is let go of even when
    letting go of another fails.

    @raise Exception: The first failure, once all are let go of.
    """
    steps: list[Callable[[], object]] = []
    if export is not None:
        steps.append(export.discard)
    if gateway.telemetry is not None:
        steps.append(gateway.telemetry.discard)
    writer = gateway.access_log.writer
    if writer is not None:
        steps.append(writer.close)
    failed: Exception | None = None
    for step in steps:
        try:
            step()
        except Exception as e:
            failed = failed or e
    if failed is not None:
        raise failed
