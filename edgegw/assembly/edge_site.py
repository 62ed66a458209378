"""
The gateway's Site: the edge layers (forwarded, security, tracing) in front of the
dispatcher, on streaming requests, with C{Gateway.spec.limits} on every connection.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from edgegw.chain.access_log import AccessLog
from edgegw.config.model import GatewaySpec
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.security import SecurityLayer
from edgegw.edge.site import Dispatcher, EdgeResource
from edgegw.edge.tracing import TracingDispatcher
from edgegw.metrics.gateway_metrics import NO_METRICS, GatewayMetrics
from edgegw.server.gateway_site import GatewaySite
from edgegw.telemetry import Telemetry

IDLE_CONNECTION_TIMEOUT = 75.0
"""Seconds an idle keep-alive client connection stays open (nginx's default)."""


def edge_site(
    spec: GatewaySpec,
    dispatcher: Dispatcher,
    reactor: IReactorTime,
    access: AccessLog | None = None,
    telemetry: Telemetry | None = None,
    csrf_exempt: frozenset[str] = frozenset(),
    metrics: GatewayMetrics | None = None,
) -> GatewaySite:
    """
    The Site: forwarded, security and (with telemetry) tracing layers, per C{spec}, in
    front of C{dispatcher}.

    @param csrf_exempt: Exact paths whose POSTs skip the CSRF check (server-to-server
        endpoints that authenticate what they are sent).
    @param metrics: Counts the edge's refusals (and the connections refused over limits).
    """
    forwarded = ForwardedFilter(spec.trusted_proxies)
    if telemetry is not None:
        dispatcher = TracingDispatcher(dispatcher, telemetry, forwarded)
    resource = EdgeResource(
        forwarded,
        SecurityLayer(spec.security, csrf_exempt),
        dispatcher,
        access or AccessLog(),
        metrics if metrics is not None else NO_METRICS,
    )
    site = GatewaySite(
        resource,
        spec.limits,
        forwarded.is_trusted,
        timeout=IDLE_CONNECTION_TIMEOUT,
        reactor=reactor,
    )
    site.displayTracebacks = False
    site.noisy = False
    if metrics is not None:
        site.metrics = metrics
        # A counter, not a reading of this site's counts: it is carried over a reload.
        site.connections.on_refused = metrics.connections_refused()
    return site
