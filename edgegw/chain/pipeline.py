"""
Composing per-route stages into one handler, and running it for a request: the targets
the mux routes to.

Stages are C{async def stage(exchange, next)} functions: an onion, so that a stage can act
before and after the rest of the chain (access log, recover, response plugins). They are
coroutines run by L{Deferred.fromCoroutine} because context variables (and so the current
trace span) survive C{await} there and are lost in plain callback chains.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from time import monotonic

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import Attribute, Interface, implementer

from edgegw.compression.response_coding import CompressionPolicy, attach_coding
from edgegw.stream.boundary import client_gone, close_after_response
from edgegw.terminal.answers import abort
from edgegw.terminal.exchange import Exchange, Handler, IExchange, Stage
from edgegw.terminal.route import CompiledRoute

_log = Logger(namespace="edgegw.pipeline")


def compose(stages: Sequence[Stage], terminal: Handler) -> Handler:
    """
    Bind C{stages} (outermost first) around C{terminal}, once, at load.
    """
    handler = terminal
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, inner: Handler) -> Handler:
    def run(exchange: Exchange) -> Awaitable[None]:
        return stage(exchange, inner)

    return run


class InFlight:
    """
    Counts requests being handled, so that shutdown can wait for them to finish.

    @ivar draining: Set when the gateway stops accepting; responses then close their
        connection instead of keeping it alive.
    """

    def __init__(self) -> None:
        self.requests: set[Request] = set()
        self.draining = False
        self._waiters: list[Deferred[None]] = []

    @property
    def count(self) -> int:
        """
        How many requests are in flight.
        """
        return len(self.requests)

    def started(self, request: Request) -> None:
        """
        A request has begun.
        """
        self.requests.add(request)
        if self.draining:
            close_after_response(request)

    def finished(self, request: Request) -> None:
        """
        A request has finished (or its client went away).
        """
        self.requests.discard(request)
        if not self.requests and self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.called:  # a waiter that timed out was cancelled
                    waiter.callback(None)

    def drain(self) -> Deferred[None]:
        """
        Start draining: every response from now on, those in flight included, closes its
        connection. Fire when no request is in flight (at once if none is).
        """
        self.draining = True
        for request in self.requests:
            close_after_response(request)
        return self.drained()

    def drained(self) -> Deferred[None]:
        """
        Fire when no request is in flight (at once if none is).
        """
        waiter: Deferred[None] = Deferred()
        if self.count == 0:
            waiter.callback(None)
        else:
            self._waiters.append(waiter)
        return waiter


class IRouteTarget(Interface):
    """
    What the mux routes a request to: a route's chain (L{RouteRunner}), or a plain
    Resource that skips the per-route chain
    (L{ResourceTarget<edgegw.chain.resource_target.ResourceTarget>}).
    """

    pattern = Attribute("The pattern it is registered under (str).")

    def serve(request: Request, params: dict[str, str]) -> bytes | int:
        """
        Answer C{request}, matched with the path wildcards C{params}: return the body,
        or C{NOT_DONE_YET} when the response is written later.
        """


@implementer(IRouteTarget)
class RouteRunner:
    """
    Runs one route's composed chain for each request the mux gives it.
    """

    def __init__(
        self,
        route: CompiledRoute,
        handler: Handler,
        inflight: InFlight,
        traced: bool = True,
        compression: CompressionPolicy | None = None,
    ) -> None:
        """
        @param traced: Whether requests may have a trace (the edge's tracing layer
            runs); without one, no exchange looks for it.
        @param compression: What the route's responses are compressed with (L{None}:
            never on the fly).
        """
        self.route = route
        self.pattern = route.pattern
        self._handler = handler
        self._inflight = inflight
        self._traced = traced
        self._compression = compression

    def serve(self, request: Request, params: dict[str, str]) -> int:
        """
        Start the chain for C{request}; the response is written asynchronously.

        The L{Exchange} is attached to the request as its L{IExchange} component, where
        the route's terminal Resource finds it; so is the response's coding, on a route
        that compresses. If the client goes away first, the chain
        is cancelled at its current C{await}.
        """
        inflight = self._inflight
        inflight.started(request)
        compression = self._compression
        if compression is not None:
            # Before any stage: the preconditions every stage and the terminal see are
            # those of the representation the client asked for.
            attach_coding(request, compression.offer(request))
        exchange = Exchange(request, self.route, params, monotonic(), self._traced)
        request.setComponent(IExchange, exchange)
        # Ask for the finish notification first: a chain that completes synchronously
        # finishes the request before fromCoroutine returns.
        finished = request.notifyFinish()
        running = Deferred.fromCoroutine(self._run(exchange))
        finished.addBoth(_request_done, request, running, inflight)
        running.addErrback(_unhandled, exchange)
        return NOT_DONE_YET

    async def _run(self, exchange: Exchange) -> None:
        await self._handler(exchange)
        request = exchange.request
        if not request.finished and not client_gone(request):
            if not request.startedWriting:
                _log.error(
                    "route {route} produced no response",
                    route=exchange.route.pattern,
                )
                request.setResponseCode(500)
            request.finish()


def _request_done(
    result: object, request: Request, running: Deferred[None], inflight: InFlight
) -> None:
    inflight.finished(request)
    # The exchange points at the request: dropping the component leaves no cycle for the
    # garbage collector (everything still running holds the exchange itself).
    request.unsetComponent(IExchange)
    if isinstance(result, Failure):
        # The client went away before the response was complete.
        running.cancel()


def _unhandled(failure: Failure, exchange: Exchange) -> None:
    if failure.check(CancelledError):
        return
    _log.failure("unhandled error in route {route}", failure=failure, route=exchange.route.pattern)
    request = exchange.request
    if not request.finished and not client_gone(request):
        if request.startedWriting:
            abort(request)
        else:
            request.setResponseCode(500)
            request.finish()
