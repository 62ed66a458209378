"""
Assembling a running gateway from a loaded L{Config}: handlers, chains, mux and Site.

Everything that can be computed before the first request is computed here, once.
Building can still fail (an unreadable file, a feature this version does not run); such
failures are reported as L{ConfigError} problems, just like parse errors, so that
C{--check} catches everything startup would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from opentelemetry.sdk.trace import SpanProcessor
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import IResource

from edgegw.auth.backchannel import BackchannelLogoutResource
from edgegw.auth.callback import CallbackResource
from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint
from edgegw.auth.login import LoginResource
from edgegw.auth.logout import LogoutResource
from edgegw.auth.session_view import SessionViewResource
from edgegw.authz.policy import CompiledPolicy, RoutePolicies, compile_policies
from edgegw.chain.access_log import AccessLog
from edgegw.chain.auth_gate import auth_gate, refusal
from edgegw.chain.authz import authz
from edgegw.chain.pipeline import InFlight, IRouteTarget, RouteRunner, Stage, compose
from edgegw.chain.projection import USER_PREFIX, groups_header_name, projection
from edgegw.chain.recover import recover
from edgegw.chain.request_id import request_id
from edgegw.chain.resource_target import ResourceTarget
from edgegw.chain.route import CompiledRoute
from edgegw.chain.session import session_stage
from edgegw.chain.terminal import TerminalResource, render_stage
from edgegw.config.effective import EffectiveRoute, effective_routes
from edgegw.config.errors import Location, Problems
from edgegw.config.model import (
    ApiHandlerSpec,
    Config,
    GatewaySpec,
    ProxyHandlerSpec,
    StaticHandlerSpec,
)
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.security import SecurityLayer, security_headers
from edgegw.edge.site import Dispatcher, EdgeResource, MuxDispatcher
from edgegw.edge.tracing import TracingDispatcher
from edgegw.handlers.api import ApiHandler
from edgegw.handlers.health import HealthHandler
from edgegw.handlers.proxy import ProxyHandler
from edgegw.handlers.readiness import Readiness, ReadinessResource
from edgegw.handlers.static import StaticHandler
from edgegw.identity.assertion import AssertionIssuer, AssertionVerifier
from edgegw.identity.bearer import BearerVerifier
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.login_state import LoginStates
from edgegw.identity.provider import CALL_TIMEOUT, IdentityProvider
from edgegw.identity.session_cookie import SessionCookie
from edgegw.line_writer import LineWriter
from edgegw.metrics.gateway import NO_METRICS, GatewayMetrics, IMetrics
from edgegw.metrics.instruments import Registry
from edgegw.plugins.manifest import check_manifest
from edgegw.plugins.messages import Protected
from edgegw.plugins.registry import ConfiguredPlugins, configure_plugins
from edgegw.plugins.stages import request_plugins_stage, response_plugins_stage
from edgegw.routing.mux import Mux
from edgegw.server.limits import GatewaySite
from edgegw.sessions.server import ServerSessions
from edgegw.state.measured import MeasuredStore
from edgegw.state.providers import UnknownProviderError, find_provider
from edgegw.state.store import IStateStore
from edgegw.telemetry import Telemetry
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.pool import UpstreamClient

IDLE_CONNECTION_TIMEOUT = 75.0
"""Seconds an idle keep-alive client connection stays open (nginx's default)."""


@attrs.define
class Gateway:
    """
    A gateway ready to listen.

    @ivar site: The Twisted Site to serve.
    @ivar routes: The compiled routes, in document order.
    @ivar inflight: Requests in flight, for graceful shutdown.
    @ivar upstream_client: The connection pool shared by every proxy route.
    @ivar agent: The pool as an C{IAgent}: what treq runs over (api fan-out, IdP calls).
    @ivar access_log: The access log (flushed on shutdown).
    @ivar telemetry: Tracing, when a Telemetry resource exists (flushed on shutdown).
    @ivar idp: The IdP client and its refresher service, when an IdP is configured.
    @ivar auth_endpoints: The mounted auth endpoints as (method, path) pairs.
    @ivar state: The state store (a service), with a C{stateProvider}.
    @ivar sessions: The server-side sessions (a service), with a C{stateProvider}.
    @ivar metrics: The gateway's instruments, with C{Telemetry.metrics}.
    @ivar readiness: What the readiness endpoint is told, with C{readiness}.
    """

    config: Config
    site: GatewaySite
    routes: list[CompiledRoute]
    inflight: InFlight
    upstream_client: UpstreamClient
    agent: UpstreamAgent
    access_log: AccessLog
    telemetry: Telemetry | None = None
    idp: IdentityProvider | None = None
    auth_endpoints: tuple[tuple[str, str], ...] = ()
    state: IStateStore | None = None
    sessions: ServerSessions | None = None
    metrics: GatewayMetrics | None = None
    readiness: Readiness | None = None


@attrs.frozen
class IdentityStages:
    """
    What identity adds to the per-route chains (rule 4: nothing when neither a session
    block nor an IdP is configured).

    @ivar session: The session cookie, when a session block is configured.
    @ivar seconds: The reactor's clock.
    @ivar trusted_origins: C{security.csrf.trustedOrigins}.
    @ivar login_path: Where app routes send anonymous navigations, when login is mounted.
    @ivar bearer: Verifies Bearer tokens on service routes, when an IdP is configured.
    @ivar assertions: Verifies inbound identity assertions on service routes, with
        C{identity.assertion.accept}.
    @ivar server: The server-side sessions, with a C{stateProvider}.
    """

    session: SessionCookie | None
    seconds: Callable[[], float]
    trusted_origins: tuple[str, ...]
    login_path: str | None
    bearer: BearerVerifier | None = None
    assertions: AssertionVerifier | None = None
    server: ServerSessions | None = None


def build_gateway(
    config: Config,
    reactor: IReactorTime,
    upstream_client: UpstreamClient | None = None,
    span_processor: SpanProcessor | None = None,
    state_options: Mapping[str, Any] | None = None,
    metrics_from: GatewayMetrics | None = None,
) -> Gateway:
    """
    Build every handler and chain of C{config}.

    @param upstream_client: The connection pool for proxy routes; a new one by default
        (tests pass one that trusts their own certificate authority), with the configured
        bound on connections per upstream.
    @param span_processor: Replaces the OTLP batch export of finished spans (tests).
    @param state_options: Passed on to the state provider's C{build} (tests: retry
        timings).
    @param metrics_from: The metrics of the gateway this one replaces (a reload): both
        count into the same series (see L{Registry}).
    @raise ConfigError: Something in the configuration cannot run.
    """
    problems = Problems()
    _check_state_providers(config, problems)
    check_manifest(config.gateway, problems)
    # Built only from a config that passed: a provider's build may assume its own checks.
    store = None if problems else _state_store(config, reactor, state_options or {})
    inflight = InFlight()
    mux: Mux[IRouteTarget] = Mux()
    compiled: list[CompiledRoute] = []
    spec = config.telemetry
    output = config.gateway.access_log.output
    # Opens nothing (edgegw check builds this too): the file is opened when the daemon
    # starts (tap.makeService), the path was checked at load.
    writer = LineWriter(reactor, output) if output != "log" else None
    metrics_spec = spec.metrics if spec is not None else None
    carried = metrics_from.registry if metrics_from is not None else None
    metrics = (
        GatewayMetrics(Registry(metrics_spec.cardinality_limit, carried))
        if metrics_spec is not None
        else None
    )
    access = AccessLog(
        spec.access_log_level if spec is not None else "info",
        writer,
        spec.access_log_headers if spec is not None else (),
        spec.access_log_fields if spec is not None else None,
        traced=spec is not None,
        metrics=metrics,
    )
    telemetry = Telemetry(spec, reactor, span_processor) if spec is not None else None
    try:
        groups_as = config.gateway.identity.groups.as_
        routes = effective_routes(config)
        policies = compile_policies(config.policies, problems)
        limits = config.gateway.limits
        client = upstream_client or UpstreamClient(
            reactor,
            max_connections_per_upstream=limits.max_connections_per_upstream,
            queue_timeout=limits.upstream_queue_timeout,
        )
        measured: IMetrics = metrics if metrics is not None else NO_METRICS
        agent = UpstreamAgent(
            client,
            reactor,
            tracer=telemetry.tracer if telemetry is not None else None,
            metrics=measured,
        )
        if metrics is not None:
            _observe_pool(metrics, client)
            if writer is not None:
                # A counter, not a reading of the writer: the series is carried over a
                # reload, and the old writer's drops while it drains count on in it.
                writer.on_drop = metrics.access_log_dropped()
        projected = projected_header_names(routes, groups_as)
        # The sessions use the store through its counted view (not the readiness probe).
        used_store = (
            MeasuredStore(store, metrics) if store is not None and metrics is not None else store
        )
        provider, login, identity = _identity(
            config, routes, client, reactor, telemetry, used_store, measured
        )
        endpoints: tuple[tuple[str, str], ...] = ()
        reserved: dict[str, IRouteTarget] = {}
        if login is not None:
            endpoints = _mount_login(reserved, config, login, access, inflight)
        readiness = None
        readiness_path = config.gateway.readiness_path
        if readiness_path is not None:
            readiness = Readiness()
            endpoint = ReadinessResource(readiness, reactor, provider, store)
            reserved[readiness_path] = ResourceTarget(readiness_path, endpoint, access, inflight)
        context = _TerminalContext(config, client, agent, reactor, projected, login, measured)
        protected = Protected(
            request=projected | context.assertion_headers, response=context.gateway_headers
        )
        plugins = RoutePlugins(configure_plugins(config, problems, protected), protected, reactor)
        for effective in routes:
            terminal = _terminal(effective, context, problems)
            if terminal is None or not set(effective.access.authorize) <= set(policies):
                continue
            route = CompiledRoute(
                name=effective.spec.name,
                pattern=effective.spec.match,
                effective=effective,
                handler_description=terminal.describe(),
            )
            mux.register(
                effective.spec.match,
                route_runner(
                    route,
                    terminal,
                    inflight,
                    access.stage,
                    groups_as,
                    policies,
                    projected,
                    identity,
                    plugins,
                    measured,
                    traced=telemetry is not None,
                ),
            )
            compiled.append(route)
        problems.raise_if_any()
        dispatcher = MuxDispatcher(mux, traced=telemetry is not None, reserved=reserved)
        # The back-channel logout is posted by the IdP, server to server.
        exempt = frozenset(
            path
            for path in (config.gateway.auth.backchannel_logout_path,)
            if ("POST", path) in endpoints
        )
        site = edge_site(config.gateway, dispatcher, reactor, access, telemetry, exempt, metrics)
        return Gateway(
            config=config,
            site=site,
            routes=compiled,
            inflight=inflight,
            upstream_client=client,
            agent=agent,
            access_log=access,
            telemetry=telemetry,
            idp=provider,
            auth_endpoints=endpoints,
            state=store,
            sessions=identity.server if identity is not None else None,
            metrics=metrics,
            readiness=readiness,
        )
    except BaseException:
        # Its export thread started with it; nothing else built here holds anything.
        if telemetry is not None:
            telemetry.discard()
        raise


def _state_store(
    config: Config, reactor: IReactorTime, options: Mapping[str, Any]
) -> IStateStore | None:
    """
    The Gateway's state store, not started, when it has a C{stateProvider} (and a
    session block, which the load checked).
    """
    ref = config.gateway.state_provider
    if ref is None or config.gateway.session is None:
        return None
    return find_provider(ref.type).build(ref.config, ref.key_prefix, reactor, **options)


def _identity(
    config: Config,
    routes: Sequence[EffectiveRoute],
    client: UpstreamClient,
    reactor: IReactorTime,
    telemetry: Telemetry | None,
    store: IStateStore | None = None,
    metrics: IMetrics = NO_METRICS,
) -> tuple[IdentityProvider | None, BrowserLogin | None, IdentityStages | None]:
    """
    The IdP client (with any IdP), the browser login (session and IdP both configured)
    and the identity stages.
    """
    gateway = config.gateway
    session = gateway.session
    idp = config.idp
    assertion = gateway.identity.assertion
    accept = assertion.accept if assertion is not None else None
    if session is None and idp is None and accept is None:
        return None, None, None
    cookie = None
    login = None
    provider = None
    bearer = None
    groups = GroupRenderer(gateway.identity.groups)
    if idp is not None:
        agent = UpstreamAgent(
            client,
            reactor,
            timeout=CALL_TIMEOUT,
            tracer=telemetry.tracer if telemetry is not None else None,
            metrics=metrics,
        )
        provider = IdentityProvider(idp, agent, reactor, metrics=metrics)
        _observe_idp(metrics, provider)
        bearer = BearerVerifier(
            provider,
            gateway.identity,
            groups,
            reactor,
            keep_token=any(_forwards_access_token(route) for route in routes),
        )
    server = None
    if session is not None:
        cookie = SessionCookie(session, reactor)
        ref = gateway.state_provider
        if store is not None and ref is not None:
            server = ServerSessions(
                store, cookie, ref.key_prefix, ref.refresh_skew, provider, reactor, metrics
            )
        if provider is not None and idp is not None and not idp.verification_only:
            login = BrowserLogin(
                provider=provider,
                sessions=cookie,
                logins=LoginStates(cookie.sealer, session.cookie_name, reactor),
                identity=gateway.identity,
                groups=groups,
                callback_path=idp.callback_path,
                redirect_url=idp.redirect_url,
                keep_access_token=any(_forwards_access_token(route) for route in routes),
                reactor=reactor,
                server=server,
                metrics=metrics,
            )
    return (
        provider,
        login,
        IdentityStages(
            session=cookie,
            seconds=reactor.seconds,
            trusted_origins=gateway.security.csrf.trusted_origins,
            login_path=gateway.auth.login_path if login is not None else None,
            bearer=bearer,
            assertions=(AssertionVerifier(accept, reactor) if accept is not None else None),
            server=server,
        ),
    )


def _forwards_access_token(effective: EffectiveRoute) -> bool:
    handler = effective.spec.handler
    if getattr(handler, "forward_access_token", False):
        return True
    return any(backend.forward_access_token for backend in getattr(handler, "backends", ()))


def _mount_login(
    reserved: dict[str, IRouteTarget],
    config: Config,
    login: BrowserLogin,
    access: AccessLog,
    inflight: InFlight,
) -> tuple[tuple[str, str], ...]:
    """
    Mount the login, callback, logout and session-view endpoints (and, with a state
    provider, the back-channel logout): answered for their exact paths before the mux
    routes anything (routes that could never be reached
    because of them were reported at load).

    @return: The endpoints as (method, path) pairs.
    """
    gateway = config.gateway
    session = gateway.session
    assert session is not None
    mounted: tuple[tuple[str, AuthEndpoint], ...] = (
        (gateway.auth.login_path, LoginResource(login)),
        (login.callback_path, CallbackResource(login)),
        (gateway.auth.logout_path, LogoutResource(login, session.post_logout_redirect)),
        (session.info_path, SessionViewResource(login)),
    )
    if login.server is not None:
        mounted += (
            (
                gateway.auth.backchannel_logout_path,
                BackchannelLogoutResource(login.provider, login.server),
            ),
        )
    for path, resource in mounted:
        reserved[path] = ResourceTarget(path, resource, access, inflight)
    return tuple((resource.method.decode("ascii"), path) for path, resource in mounted)


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


def route_runner(
    route: CompiledRoute,
    terminal: IResource,
    inflight: InFlight,
    log_stage: Stage,
    groups_as: str,
    policies: Mapping[str, CompiledPolicy] | None = None,
    projected: frozenset[bytes] = frozenset(),
    identity: IdentityStages | None = None,
    plugins: RoutePlugins | None = None,
    metrics: IMetrics = NO_METRICS,
    traced: bool = True,
) -> RouteRunner:
    """
    Compose one route's per-route chain, ending in rendering its terminal Resource.

    @param projected: Lowercased names of every identity header any route projects
        outside C{X-User-*} (the projection stage strips them from every request).
    @param identity: The identity stages; L{None} when neither a session nor an IdP is
        configured (the session and auth-gate stages are then left out: rule 4).
    @param plugins: The configured request and response plugins.
    @param metrics: Counts authentications and policy denials.
    @param traced: Whether the edge's tracing layer runs (a request then has an
        L{IRequestTrace<edgegw.telemetry.IRequestTrace>} for its exchange).

    Stages that have nothing to do on a route are left out rather than passed through:
    the session and auth-gate stages join the chain only where identity is configured,
    authz only where the route (directly or through its groups) names a policy.
    """
    effective = route.effective
    access = effective.access
    projection_spec = access.projection
    stages: list[Stage] = [recover, request_id, log_stage]
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
        needed = [(policies or {})[name] for name in access.authorize]
        route_policies = RoutePolicies(needed, route.pattern, route.name, effective.spec.labels)
        on_deny = access.on_deny_redirect if effective.type == "app" else None
        stages.append(authz(route_policies, on_deny, metrics))
    stages.append(
        projection(
            groups_header_name(projection_spec.groups_header, groups_as),
            projection_spec.claims,
            projected,
        )
    )
    if plugins is not None:
        stages.extend(plugins.stages(effective))
    return RouteRunner(route, compose(stages, render_stage(terminal)), inflight, traced)


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


class _TerminalContext:
    """
    What terminals share, computed once per gateway.

    @ivar gateway_headers: Lowercased names of the response headers the gateway sets
        itself (the proxy does not let an upstream override them).
    @ivar assertion_headers: Lowercased identity-assertion header names (never forwarded
        from a client).
    @ivar projected: Lowercased identity header names projected outside C{X-User-*}.
    """

    def __init__(
        self,
        config: Config,
        client: UpstreamClient,
        agent: UpstreamAgent,
        reactor: IReactorTime,
        projected: frozenset[bytes] = frozenset(),
        login: BrowserLogin | None = None,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        self.config = config
        self.projected = projected
        self.metrics = metrics
        # forwardCookies never passes on the gateway's own session and login cookies.
        self.own_cookie = login.sessions.is_gateway_cookie if login is not None else None
        self.client = client
        self.agent = agent
        self.reactor = reactor
        self.gateway_headers = frozenset(
            name.lower() for name, _ in security_headers(config.gateway.security)
        )
        names = {b"x-gw-identity"}
        assertion = config.gateway.identity.assertion
        if assertion is not None and assertion.issue is not None:
            names.add(assertion.issue.header.lower().encode("ascii"))
        if assertion is not None and assertion.accept is not None:
            names.add(assertion.accept.header.lower().encode("ascii"))
        self.assertion_headers = frozenset(names)
        issue = assertion.issue if assertion is not None else None
        self.issuer = AssertionIssuer(issue, reactor) if issue is not None else None


def _terminal(
    effective: EffectiveRoute, context: _TerminalContext, problems: Problems
) -> TerminalResource | None:
    spec = effective.spec.handler
    try:
        if isinstance(spec, ApiHandlerSpec):
            return ApiHandler(
                spec, context.agent, context.reactor, context.issuer, metrics=context.metrics
            )
        if isinstance(spec, ProxyHandlerSpec):
            return ProxyHandler(
                spec,
                # A request waiting for a connection waits at most the route's timeout.
                context.client.with_queue_timeout(spec.timeout),
                context.reactor,
                gateway_headers=context.gateway_headers,
                assertion_headers=context.assertion_headers,
                identity_headers=context.projected,
                own_cookie=context.own_cookie,
                issuer=context.issuer,
                metrics=context.metrics,
            )
    except ValueError as e:
        # What load-time validation let through (an upstream URL the client refuses).
        problems.add(effective.spec.location, "spec.handler", str(e))
        return None
    if isinstance(spec, StaticHandlerSpec):
        try:
            return StaticHandler(spec)
        except ValueError as e:
            problems.add(effective.spec.location, "spec.handler", str(e))
            return None
    return HealthHandler()


def _check_state_providers(config: Config, problems: Problems) -> None:
    """
    Every state provider type named (the Gateway's C{stateProvider}, each StateProvider
    resource) must be installed (package entry points, group C{edgegw.state_providers}),
    and its C{config} must be what that provider accepts.
    """
    gateway = config.gateway
    named: list[tuple[Location | None, str, str, Mapping[str, Any]]] = []
    state = gateway.state_provider
    if state is not None and state.type:
        named.append((gateway.location, "spec.stateProvider", state.type, state.config))
    for resource in config.state_providers.values():
        named.append((resource.location, "spec", resource.type, resource.config))
    for where, path, type_, provider_config in named:
        try:
            factory = find_provider(type_)
        except UnknownProviderError as e:
            problems.add(where, f"{path}.type", str(e))
            continue
        if where is not None:
            for problem in factory.validate(provider_config, where, f"{path}.config"):
                problems.add(problem.location, problem.field, problem.message)


def _observe_pool(metrics: GatewayMetrics, client: UpstreamClient) -> None:
    """
    The upstream pool's connections (idle, active) and waiting requests, per upstream,
    read at each collection.
    """

    # Summed per origin: two pools to one origin (one of them skipping TLS
    # verification) would otherwise give two series with the same labels.
    def connections() -> list[tuple[tuple[object, ...], float]]:
        found: Counter[tuple[object, ...]] = Counter()
        for upstream, idle, active, _ in client.pool_state():
            found[(upstream, "idle")] += idle
            found[(upstream, "active")] += active
        return list(found.items())

    def waiting() -> list[tuple[tuple[object, ...], float]]:
        found: Counter[tuple[object, ...]] = Counter()
        for upstream, _, _, queued in client.pool_state():
            found[(upstream,)] += queued
        return list(found.items())

    metrics.observe(
        "http.client.open_connections",
        "{connection}",
        "Connections to upstreams, idle or active.",
        ("edgegw.upstream", "http.connection.state"),
        connections,
        "updowncounter",
    )
    metrics.observe(
        "edgegw.upstream.pool.waiting",
        "{request}",
        "Requests waiting for an upstream connection.",
        ("edgegw.upstream",),
        waiting,
        "updowncounter",
    )


def _observe_idp(metrics: IMetrics, provider: IdentityProvider) -> None:
    """
    The IdP's state, read at each collection: discovered or not, and its key sets' sizes.
    """
    metrics.observe(
        "edgegw.idp.ready",
        "1",
        "1 once the IdP's discovery document is loaded, else 0.",
        (),
        lambda: [((), 1 if provider.ready else 0)],
    )
    metrics.observe(
        "edgegw.idp.keys",
        "{key}",
        "Signing keys in the IdP's key sets.",
        ("edgegw.idp.key_set",),
        lambda: [
            (("id_token",), len(provider.id_token_keys.keys)),
            (("access_token",), len(provider.access_token_keys.keys)),
        ],
    )
