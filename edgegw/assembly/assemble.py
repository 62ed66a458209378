"""
Assembling a running gateway from a loaded L{Config}: handlers, chains, mux and Site.

Everything that can be computed before the first request is computed here, once.
Building can still fail (an unreadable file, a feature this version does not run); such
failures are reported as L{ConfigError<edgegw.config.errors.ConfigError>} problems, just
like parse errors, so that C{--check} catches everything startup would.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import attrs
from opentelemetry.sdk.trace import SpanProcessor
from twisted.internet.interfaces import IReactorTime

from edgegw.assembly.edge_site import edge_site
from edgegw.assembly.identity_wiring import (
    check_state_providers,
    mount_login,
    state_store,
    wire_identity,
)
from edgegw.assembly.observers import observe_pool
from edgegw.assembly.route_chains import (
    RoutePlugins,
    RouteWiring,
    compile_routes,
    projected_header_names,
)
from edgegw.assembly.terminals import TerminalContext
from edgegw.auth.context import BrowserLogin
from edgegw.authz.policy import compile_policies
from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import InFlight, IRouteTarget
from edgegw.chain.resource_target import ResourceTarget
from edgegw.compression.response_coding import CompressionPolicy
from edgegw.config.addresses import listen_port
from edgegw.config.effective import effective_routes
from edgegw.config.errors import Problems
from edgegw.config.model import CompressionSpec, Config
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.https_redirect import HttpsRedirect
from edgegw.edge.site import MuxDispatcher
from edgegw.handlers.readiness import Readiness, ReadinessResource
from edgegw.identity.assertion import AssertionVerifier
from edgegw.identity.provider import IdentityProvider
from edgegw.line_writer import LineWriter
from edgegw.metrics.gateway_metrics import NO_METRICS, GatewayMetrics, IMetrics
from edgegw.metrics.instruments import Registry
from edgegw.plugins.manifest import check_manifest
from edgegw.plugins.messages import Protected
from edgegw.plugins.registry import configure_plugins, plugin_context_of
from edgegw.server.gateway_site import GatewaySite
from edgegw.server.redirect_site import RedirectSite
from edgegw.server.tls_contexts import CertificateContextError, ServerTLS, server_tls
from edgegw.sessions.server import ServerSessions
from edgegw.state.measured import MeasuredStore
from edgegw.state.store import IStateStore
from edgegw.telemetry import Telemetry
from edgegw.terminal.route import CompiledRoute
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.pool import UpstreamClient


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
    @ivar tls: The TLS contexts of C{Gateway.spec.tls} (built at load, so that a reload
        reads the certificates again), when it is set.
    @ivar redirect_site: The Site of C{Gateway.spec.redirectHTTP}'s listener, when set.
    @ivar login: What the browser-login endpoints share, with a login IdP.
    @ivar assertions: The identity-assertion verifier, with C{identity.assertion.accept}.
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
    tls: ServerTLS | None = None
    redirect_site: RedirectSite | None = None
    login: BrowserLogin | None = None
    assertions: AssertionVerifier | None = None


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
    check_state_providers(config, problems)
    check_manifest(config.gateway, problems)
    tls = _tls(config, problems)
    # Built only from a config that passed: a provider's build may assume its own checks.
    store = None if problems else state_store(config, reactor, state_options or {})
    inflight = InFlight()
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
            observe_pool(metrics, client)
            if writer is not None:
                # A counter, not a reading of the writer: the series is carried over a
                # reload, and the old writer's drops while it drains count on in it.
                writer.on_drop = metrics.access_log_dropped()
        projected = projected_header_names(routes, groups_as)
        # The sessions use the store through its counted view (not the readiness probe).
        used_store = (
            MeasuredStore(store, metrics) if store is not None and metrics is not None else store
        )
        provider, login, identity = wire_identity(
            config, routes, client, reactor, telemetry, used_store, measured
        )
        endpoints: tuple[tuple[str, str], ...] = ()
        reserved: dict[str, IRouteTarget] = {}
        if login is not None:
            endpoints = mount_login(reserved, config, login, access, inflight)
        readiness = None
        readiness_path = config.gateway.readiness_path
        if readiness_path is not None:
            readiness = Readiness()
            endpoint = ReadinessResource(readiness, reactor, provider, store)
            reserved[readiness_path] = ResourceTarget(readiness_path, endpoint, access, inflight)
        terminals = TerminalContext(config, client, agent, reactor, projected, login, measured)
        trusted = config.gateway.trusted_proxies
        protected = Protected(
            request=projected | terminals.assertion_headers,
            response=terminals.gateway_headers,
            is_trusted=ForwardedFilter(trusted).is_trusted if trusted else None,
        )
        plugin_context = partial(plugin_context_of, reactor=reactor, store=store, metrics=metrics)
        plugins = RoutePlugins(
            configure_plugins(config, problems, protected, plugin_context), protected, reactor
        )
        wiring = RouteWiring(
            inflight=inflight,
            log_stage=access.stage,
            groups_as=groups_as,
            policies=policies,
            projected=projected,
            identity=identity,
            plugins=plugins,
            metrics=measured,
            traced=telemetry is not None,
            compression=_compression(config.gateway.compression),
        )
        mux, compiled = compile_routes(routes, terminals, wiring, problems)
        problems.raise_if_any()
        dispatcher = MuxDispatcher(mux, traced=telemetry is not None, reserved=reserved)
        # The back-channel logout is posted by the IdP, server to server.
        exempt = frozenset(
            path
            for path in (config.gateway.auth.backchannel_logout_path,)
            if ("POST", path) in endpoints
        )
        site = edge_site(config.gateway, dispatcher, reactor, access, telemetry, exempt, metrics)
        # The HTTP/2 protocol is chosen per connection by what ALPN negotiated.
        site.http2 = tls is not None and tls.http2
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
            tls=tls,
            login=login,
            assertions=identity.assertions if identity is not None else None,
            redirect_site=_redirect_site(config, reactor),
        )
    except BaseException:
        # Its export thread started with it; nothing else built here holds anything.
        if telemetry is not None:
            telemetry.discard()
        raise


def _tls(config: Config, problems: Problems) -> ServerTLS | None:
    """
    The TLS contexts of C{Gateway.spec.tls} (its files were read and checked at load);
    what OpenSSL still refuses is a problem at the certificate's entry.
    """
    spec = config.gateway.tls
    if spec is None or not spec.certificates:
        return None
    try:
        return server_tls(spec)
    except CertificateContextError as e:
        problems.add(config.gateway.location, f"spec.tls.certificates[{e.index}]", str(e))
        return None


def _redirect_site(config: Config, reactor: IReactorTime) -> RedirectSite | None:
    """
    The Site of C{Gateway.spec.redirectHTTP}'s listener, naming C{httpsPort}, else the
    port C{listen} names (one it names only once bound, the listener gives it).
    """
    spec = config.gateway
    redirect = spec.redirect_http
    if redirect is None:
        return None
    port = redirect.https_port if redirect.https_port is not None else listen_port(spec.listen)
    return RedirectSite(HttpsRedirect(port, redirect.acme_webroot), spec.limits, reactor)


def _compression(spec: CompressionSpec) -> CompressionPolicy | None:
    """
    C{Gateway.spec.compression} as the routes apply it (L{None}: off).
    """
    if not spec.enabled:
        return None
    return CompressionPolicy(spec.encodings, spec.min_size, spec.types, spec.static_cache_size)
