"""
A route's terminal: the Resource that writes the response, and the last stage of the
route's chain, which renders it.

Gateway terminals (static, reverse-proxy, api, health) are L{TerminalResource}s: leaf
Resources whose response comes from an async L{respond<ITerminal.respond>}. Rendered by
Twisted as a plain Resource (mounted without a chain), C{render} runs C{respond} on a
Deferred, answers its failures itself (500, or an aborted connection once the response
has started) and cancels it when the client goes away. At the end of a route's chain,
L{render_stage} awaits C{respond} instead, so that a failure or a cancellation runs
through the route's own stages (recover, access log) exactly like a stage's would. Any
other Resource at the end of a chain is rendered and waited for until its request
finishes.
"""

from __future__ import annotations

from collections.abc import Awaitable

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from edgegw.chain.exchange import Exchange, IExchange
from edgegw.chain.pipeline import Handler
from edgegw.chain.recover import report_failure


class ITerminal(IResource):
    """
    A Resource that writes a route's whole response asynchronously.
    """

    def respond(request: Request) -> Awaitable[None]:
        """
        Write the whole response to C{request}; return once it is finished (or the client
        went away). Cancelling it stops the work (upstream calls are aborted).
        """

    def describe() -> str:
        """
        One line for the route table.
        """


@implementer(ITerminal)
class TerminalResource(Resource):
    """
    Base class of the gateway's terminals: a leaf Resource whose C{render} runs
    L{respond} on a Deferred and returns C{NOT_DONE_YET}.
    """

    isLeaf = True

    async def respond(self, request: Request) -> None:
        """
        Write the whole response to C{request}.
        """
        raise NotImplementedError

    def describe(self) -> str:
        """
        One line for the route table.
        """
        raise NotImplementedError

    def render(self, request: Request) -> int:
        """
        Answer C{request} outside any route chain: failures become a 500 (or an aborted
        connection), and the work is cancelled when the client goes away.
        """
        running = Deferred.fromCoroutine(self.respond(request))
        if not running.called:
            request.notifyFinish().addErrback(_cancel, running)
        running.addErrback(_failed, request)
        return NOT_DONE_YET


def _cancel(reason: Failure, running: Deferred[None]) -> None:
    running.cancel()


def _failed(failure: Failure, request: Request) -> None:
    if failure.check(CancelledError):
        return
    exchange = IExchange(request, None)
    report_failure(failure, request, exchange if isinstance(exchange, Exchange) else None)


def render_stage(resource: IResource) -> Handler:
    """
    The last stage of a route's chain: render C{resource} for the exchange's request.
    """
    if ITerminal.providedBy(resource):
        respond = resource.respond

        async def respond_terminal(exchange: Exchange) -> None:
            await respond(exchange.request)

        return respond_terminal

    async def render_resource(exchange: Exchange) -> None:
        request = exchange.request
        # Asked before rendering: a resource that answers at once finishes the request
        # inside render, and a notification asked for afterwards would never fire.
        finished = request.notifyFinish()
        body = resource.render(request)
        if body is not NOT_DONE_YET and not request.finished:
            # As Twisted's Request.render answers a resource's bytes.
            request.setHeader(b"content-length", b"%d" % len(body))
            request.write(body)
            request.finish()
        try:
            await finished
        except CancelledError:
            raise
        except Exception:
            # The client went away; the route's runner deals with that.
            return

    return render_resource
