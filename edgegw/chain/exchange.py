"""
The one per-request object that the per-route stages share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from edgegw.identity.principal import Principal

if TYPE_CHECKING:
    from edgegw.chain.route import CompiledRoute


class Exchange:
    """
    One request on its way through a route's stages.

    Stages communicate only through this object, never through globals.

    @ivar request: The Twisted request; the response is written to it.
    @ivar route: The compiled route the mux chose.
    @ivar params: The route's path wildcards, decoded.
    @ivar request_id: Set by the request-id stage.
    @ivar principal: Set by the session stage when a credential is valid.
    @ivar started: C{time.monotonic()} when the route began handling the request.
    @ivar notes: Facts for the access log and the request span (denial reasons, upstream
        timings); never sent to the client.
    @ivar span: The tracing layer's SERVER span for this request, when tracing is on.
    @ivar tracer: The tracer, when tracing is on (upstream calls start CLIENT spans).
    """

    __slots__ = (
        "notes",
        "params",
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
    ) -> None:
        self.request = request
        self.route = route
        self.params = params
        self.started = started
        self.request_id = ""
        self.principal: Principal | None = None
        self.notes: dict[str, Any] | None = None
        # Set by the tracing layer (only when a Telemetry resource exists).
        self.span: Any = getattr(request, "span", None)
        self.tracer: Any = getattr(request, "tracer", None)

    def note(self, key: str, value: Any) -> None:
        """
        Record a fact about this request for the access log and span.
        """
        if self.notes is None:
            self.notes = {}
        self.notes[key] = value
