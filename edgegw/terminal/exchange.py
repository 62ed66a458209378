"""
The one per-request object that the per-route stages and the route's terminal share.

The route runner attaches it to the Twisted request as a component, so that a terminal
Resource (which Twisted hands only the request) reads it with C{IExchange(request)}.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.web.server import Request
from zope.interface import Attribute, Interface, implementer

from edgegw.identity.principal import Principal
from edgegw.telemetry import IRequestTrace
from edgegw.terminal.route import CompiledRoute


class IExchange(Interface):
    """
    A request on its way through a route: what the stages learned about it.
    """

    request = Attribute("The Twisted request; the response is written to it.")
    route = Attribute("The compiled route the mux chose.")
    params = Attribute("The route's path wildcards, decoded (dict of str).")
    body = Attribute("The request body the terminal forwards (IBodyProducer or None).")
    request_id = Attribute("The request id (set by the request-id stage).")
    principal = Attribute("The authenticated Principal, or None.")
    span = Attribute("The request's SERVER span, or None when tracing is off.")
    tracer = Attribute("The tracer, or None when tracing is off.")

    def note(key: str, value: Any) -> None:
        """
        Record a fact about this request for the access log and span.
        """

    def add_call(record: dict[str, Any]) -> None:
        """
        Keep one upstream call's record for the access-log line.
        """


@implementer(IExchange)
class Exchange:
    """
    One request on its way through a route's stages.

    Stages communicate only through this object, never through globals.

    @ivar request: The Twisted request; the response is written to it.
    @ivar route: The compiled route the mux chose.
    @ivar params: The route's path wildcards, decoded.
    @ivar body: The request body the terminal forwards (an C{IBodyProducer}, or
        L{None}): the request's own, unless a request plugin wrapped it.
    @ivar plugin_headers: Lowercased names of the request headers request plugins set or
        added (the client's C{Connection} list cannot remove them), or L{None}.
    @ivar request_id: Set by the request-id stage.
    @ivar principal: Set by the session stage when a credential is valid.
    @ivar started: C{time.monotonic()} when the route began handling the request.
    @ivar notes: Facts for the access log and the request span (denial reasons, upstream
        timings); never sent to the client.
    @ivar span: The tracing layer's SERVER span for this request, when tracing is on.
    @ivar tracer: The tracer, when tracing is on (upstream calls start CLIENT spans).
    """

    __slots__ = (
        "body",
        "notes",
        "params",
        "plugin_headers",
        "principal",
        "request",
        "request_id",
        "route",
        "span",
        "started",
        "tracer",
    )

    def __init__(
        self,
        request: Request,
        route: CompiledRoute,
        params: dict[str, str],
        started: float,
        traced: bool = True,
    ) -> None:
        """
        @param traced: Whether to look for the request's trace (L{IRequestTrace}): an
            adaptation that finds none costs ~0.8 µs, so untraced gateways skip it.
        """
        self.request = request
        self.route = route
        self.params = params
        self.started = started
        self.body: Any = getattr(request, "body", None)
        self.plugin_headers: set[bytes] | None = None
        self.request_id = ""
        self.principal: Principal | None = None
        self.notes: dict[str, Any] | None = None
        trace: Any = IRequestTrace(request, None) if traced else None
        if trace is None:
            self.span: Any = None
            self.tracer: Any = None
        else:
            self.span = trace.span
            self.tracer = trace.tracer

    def add_call(self, record: dict[str, Any]) -> None:
        """
        Keep one upstream call's record for the access-log line (C{upstream_calls}).
        """
        notes = self.notes
        calls = notes.get("upstream_calls") if notes is not None else None
        if calls is None:
            self.note("upstream_calls", [record])
        else:
            calls.append(record)

    def note(self, key: str, value: Any) -> None:
        """
        Record a fact about this request for the access log and span.
        """
        if self.notes is None:
            self.notes = {}
        self.notes[key] = value


def exchange_of(request: Request) -> Exchange:
    """
    The L{Exchange} a route's runner attached to C{request}.

    @raise TypeError: The request was not routed through a route's chain.
    """
    exchange = IExchange(request, None)
    if not isinstance(exchange, Exchange):
        raise TypeError("the request has no route exchange (IExchange component)")
    return exchange


Handler = Callable[[Exchange], Awaitable[None]]
"""The rest of the chain, from some stage inward to the terminal."""

Stage = Callable[[Exchange, Handler], Awaitable[None]]
"""One per-route stage: acts on the exchange and calls (or skips) the next handler."""
