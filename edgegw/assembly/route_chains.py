"""
Route building: each route's per-route chain (the stages it needs, ending in its
terminal) registered on the mux, and what those chains share (L{RouteWiring}).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import IResource

from edgegw.assembly.identity_wiring import IdentityStages
from edgegw.assembly.terminals import TerminalContext, terminal_for
from edgegw.authz.policy import CompiledPolicy, RoutePolicies
from edgegw.chain.auth_gate import auth_gate, refusal
from edgegw.chain.authz import authz
from edgegw.chain.pipeline import InFlight, IRouteTarget, RouteRunner, compose
from edgegw.chain.projection import groups_header_name, projection
from edgegw.chain.recover import recover
from edgegw.chain.render import render_stage
from edgegw.chain.request_id import request_id
from edgegw.chain.session import session_stage
from edgegw.compression.response_coding import CompressionPolicy
from edgegw.config.effective import EffectiveRoute
from edgegw.config.errors import Problems
from edgegw.header_names import USER_PREFIX
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.plugins.messages import Protected
from edgegw.plugins.registry import ConfiguredPlugins
from edgegw.plugins.stages import request_plugins_stage, response_plugins_stage
from edgegw.routing.mux import Mux
from edgegw.terminal.exchange import Stage
from edgegw.terminal.route import CompiledRoute


@attrs.frozen
class RoutePlugins:
    """
    The configured plugins, and what their stages share.

    @ivar configured: The hook of each plugin resource.
    @ivar protected: The header names plugins cannot change.
    @ivar reactor: Schedules the response stage's work.
    """

    configured: ConfiguredPlugins
    protected: Protected
    reactor: IReactorTime

    def stages(self, effective: EffectiveRoute) -> list[Stage]:
        """
        The request-plugins and response-plugins stages of one route (each only when
        some plugin resource selects it), its plugins in document order.
        """
        out: list[Stage] = []
        requests = self.configured.request
        responses = self.configured.response
        request_hooks = [
            (spec.name, requests[spec.order])
            for spec in effective.request_plugins
            if spec.order in requests
        ]
        response_hooks = [
            (spec.name, responses[spec.order])
            for spec in effective.response_plugins
            if spec.order in responses
        ]
        if request_hooks:
            out.append(request_plugins_stage(request_hooks, self.protected))
        if response_hooks:
            out.append(response_plugins_stage(response_hooks, self.protected, self.reactor))
        return out


@attrs.frozen
class RouteWiring:
    """
    What every route's chain of one gateway is composed from.

    @ivar inflight: Counts the requests in flight (for the drain).
    @ivar log_stage: The access log's stage.
    @ivar groups_as: C{identity.groups.as}: the default groups header's form.
    @ivar policies: The compiled policies, by name.
    @ivar projected: Lowercased names of every identity header any route projects
        outside C{X-User-*} (the projection stage strips them from every request).
    @ivar identity: The identity stages; L{None} when neither a session nor an IdP is
        configured (the session and auth-gate stages are then left out: rule 4).
    @ivar plugins: The configured request and response plugins.
    @ivar metrics: Counts authentications and policy denials.
    @ivar traced: Whether the edge's tracing layer runs (a request then has an
        L{IRequestTrace<edgegw.telemetry.IRequestTrace>} for its exchange).
    @ivar compression: C{Gateway.spec.compression} (L{None}: off), for the routes whose
        handler does not say C{compress: false}.
    """

    inflight: InFlight
    log_stage: Stage
    groups_as: str
    policies: Mapping[str, CompiledPolicy] = attrs.field(factory=dict)
    projected: frozenset[bytes] = frozenset()
    identity: IdentityStages | None = None
    plugins: RoutePlugins | None = None
    metrics: IMetrics = NO_METRICS
    traced: bool = True
    compression: CompressionPolicy | None = None


def route_runner(route: CompiledRoute, terminal: IResource, wiring: RouteWiring) -> RouteRunner:
    """
    Compose one route's per-route chain, ending in rendering its terminal Resource.

    Stages that have nothing to do on a route are left out rather than passed through:
    the session and auth-gate stages join the chain only where identity is configured,
    authz only where the route (directly or through its groups) names a policy.
    """
    effective = route.effective
    access = effective.access
    projection_spec = access.projection
    identity = wiring.identity
    metrics = wiring.metrics
    stages: list[Stage] = [recover, request_id, wiring.log_stage]
    if identity is not None:
        required = route.auth == "required"
        service = effective.type == "service"
        bearer = identity.bearer if service else None
        assertions = identity.assertions if service else None
        if identity.session is not None or bearer is not None or assertions is not None:
            # On a required route the session stage applies the gate's refusal itself.
            stages.append(
                session_stage(
                    identity.session,
                    identity.seconds,
                    identity.trusted_origins,
                    refusal(effective.type, identity.login_path) if required else None,
                    bearer,
                    assertions,
                    identity.server,
                    metrics,
                )
            )
        elif required:
            stages.append(auth_gate(effective.type, identity.login_path))
    if access.authorize:
        needed = [wiring.policies[name] for name in access.authorize]
        route_policies = RoutePolicies(needed, route.pattern, route.name, effective.spec.labels)
        on_deny = access.on_deny_redirect if effective.type == "app" else None
        stages.append(authz(route_policies, on_deny, metrics))
    stages.append(
        projection(
            groups_header_name(projection_spec.groups_header, wiring.groups_as),
            projection_spec.claims,
            wiring.projected,
        )
    )
    if wiring.plugins is not None:
        stages.extend(wiring.plugins.stages(effective))
    compression = wiring.compression if effective.spec.handler.compress else None
    return RouteRunner(
        route,
        compose(stages, render_stage(terminal)),
        wiring.inflight,
        wiring.traced,
        compression,
    )


def compile_routes(
    routes: Sequence[EffectiveRoute],
    terminals: TerminalContext,
    wiring: RouteWiring,
    problems: Problems,
) -> tuple[Mux[IRouteTarget], list[CompiledRoute]]:
    """
    The mux of C{routes}, each pattern routed to its chain, and the compiled routes in
    document order. A route whose terminal cannot be built, or that names a policy that
    did not compile, is left out (its problem is in C{problems}).
    """
    mux: Mux[IRouteTarget] = Mux()
    compiled: list[CompiledRoute] = []
    for effective in routes:
        terminal = terminal_for(effective, terminals, problems)
        if terminal is None or not set(effective.access.authorize) <= set(wiring.policies):
            continue
        route = CompiledRoute(
            name=effective.spec.name,
            pattern=effective.spec.match,
            effective=effective,
            handler_description=terminal.describe()
            + ("" if effective.spec.handler.compress else ", compress: false"),
        )
        mux.register(effective.spec.match, route_runner(route, terminal, wiring))
        compiled.append(route)
    return mux, compiled


def projected_header_names(routes: Sequence[EffectiveRoute], groups_as: str) -> frozenset[bytes]:
    """
    The identity headers some route projects under a name outside C{X-User-*} (an
    explicit claim map, a custom groups header), lowercased: a client must not be able
    to send them to any backend, whatever route it goes through.
    """
    names: set[bytes] = set()
    for effective in routes:
        spec = effective.access.projection
        names.add(groups_header_name(spec.groups_header, groups_as).lower())
        names.update(header.lower().encode("ascii") for header in (spec.claims or {}).values())
    return frozenset(name for name in names if not name.startswith(USER_PREFIX))
