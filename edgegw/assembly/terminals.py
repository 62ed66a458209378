"""
Each route's terminal, built from its handler block: reverse-proxy, api fan-out,
static files or health.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from edgegw.auth.context import BrowserLogin
from edgegw.config.effective import EffectiveRoute
from edgegw.config.errors import Problems
from edgegw.config.model import ApiHandlerSpec, Config, ProxyHandlerSpec, StaticHandlerSpec
from edgegw.edge.security import security_headers
from edgegw.handlers.api import ApiHandler
from edgegw.handlers.health import HealthHandler
from edgegw.handlers.proxy import ProxyHandler
from edgegw.handlers.static import StaticHandler
from edgegw.identity.assertion import AssertionIssuer
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.terminal.resource import TerminalResource
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.pool import UpstreamClient


class TerminalContext:
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


def terminal_for(
    effective: EffectiveRoute, context: TerminalContext, problems: Problems
) -> TerminalResource | None:
    """
    The terminal of one route, per its handler block; L{None} (with the problem added
    to C{problems}) when it cannot be built.
    """
    spec = effective.spec.handler
    try:
        if isinstance(spec, ApiHandlerSpec):
            return ApiHandler(
                spec,
                context.agent,
                context.reactor,
                context.issuer,
                metrics=context.metrics,
                identity_headers=context.projected,
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
