"""
The authz stage: every policy the route needs must be satisfied.
"""

from __future__ import annotations

from edgegw.authz.policy import RoutePolicies
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.terminal.answers import redirect, write_text
from edgegw.terminal.exchange import Exchange, Handler, Stage


def authz(
    policies: RoutePolicies, on_deny_redirect: str | None, metrics: IMetrics = NO_METRICS
) -> Stage:
    """
    Make the stage for one route.

    A denial stops the chain: 403 with a generic body, or, on an app route with
    C{onDeny.redirect}, a 302 there (pass L{None} for service routes: they always get
    403). The reason (policy name and deny messages) goes to the access log and the
    request span, never to the client; the denying policy's name is counted in
    C{metrics}.
    """
    location = on_deny_redirect.encode("utf-8") if on_deny_redirect is not None else None

    async def authorize(exchange: Exchange, next: Handler) -> None:
        reason = policies.first_denial(exchange)
        if reason is None:
            await next(exchange)
            return
        exchange.note("authz_denied", reason)
        metrics.policy_denied(_policy_name(reason), exchange.route.pattern)
        span = exchange.span
        if span is not None:
            span.add_event("authz.denied", {"reason": reason})
        if location is not None:
            redirect(exchange.request, 302, location)
        else:
            write_text(exchange.request, 403, b"forbidden\n")

    return authorize


def _policy_name(reason: str) -> str:
    """
    The configured name of the policy a denial reason comes from (C{policy NAME: ...}).
    """
    if reason.startswith("policy "):
        return reason[7:].split(":", 1)[0]
    return "other"
