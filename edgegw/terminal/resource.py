"""
A route's terminal: the Resource that writes the response.

Gateway terminals (static, reverse-proxy, api, health) are L{TerminalResource}s: leaf
Resources whose response comes from an async L{respond<ITerminal.respond>}. Rendered by
Twisted as a plain Resource (mounted without a chain), C{render} runs C{respond} on a
Deferred, answers its failures itself (500, or an aborted connection once the response
has started) and cancels it when the client goes away. At the end of a route's chain,
the chain's last stage (L{edgegw.chain.render.render_stage}) awaits C{respond} instead,
so that a failure or a cancellation runs through the route's own stages (recover, access
log) exactly like a stage's would.
"""

from __future__ import annotations

from collections.abc import Awaitable

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from edgegw.terminal.answers import report_failure
from edgegw.terminal.exchange import Exchange, IExchange


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
