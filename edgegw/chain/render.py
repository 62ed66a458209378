"""
The last stage of a route's chain: it renders the route's terminal Resource.

A gateway terminal (L{ITerminal}) is awaited directly, so that a failure or a
cancellation runs through the route's own stages (recover, access log) exactly like a
stage's would. Any other Resource is rendered and waited for until its request finishes.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.web.resource import IResource
from twisted.web.server import NOT_DONE_YET

from edgegw.terminal.exchange import Exchange, Handler
from edgegw.terminal.resource import ITerminal

__all__ = ["render_stage"]


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
