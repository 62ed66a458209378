"""
Seeing a response on its way out: the hook the response-plugin stage installs on a
request.

A route's terminal writes its response to the Twisted request as usual. While a
L{IResponseFilter} is installed on it (L{install_response_filter}), the request hands
the filter its C{write}, C{finish}, C{registerProducer} and C{unregisterProducer}
calls instead of carrying them out; the filter calls the same methods of Twisted's
L{Request<twisted.web.server.Request>} (L{passthrough}) once it has done its work, or
removes itself and lets the rest go straight through.
"""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request
from zope.interface import Interface

__all__ = ["IResponseFilter", "install_response_filter", "passthrough", "remove_response_filter"]


class IResponseFilter(Interface):
    """
    Receives a response's output calls while installed on its request.
    """

    def write(data: bytes) -> None:
        """
        The terminal wrote C{data} (the head goes out with the first write).
        """

    def finish() -> None:
        """
        The terminal finished the response.
        """

    def registerProducer(producer: Any, streaming: bool) -> None:
        """
        The terminal attached a producer that writes the body.
        """

    def unregisterProducer() -> None:
        """
        The terminal detached its producer.
        """


passthrough = Request
"""
Whose methods write to the client directly (C{passthrough.write(request, data)}): the
request class's own overrides only route calls to an installed filter.
"""


def install_response_filter(request: Request, response_filter: IResponseFilter) -> None:
    """
    Route C{request}'s output calls to C{response_filter}.

    @raise TypeError: The request's class does not support filters (the gateway's own
        L{GatewayRequest<edgegw.server.request.GatewayRequest>} does).
    """
    if not hasattr(type(request), "response_filter"):
        raise TypeError(f"{type(request).__name__} does not support response filters")
    request.response_filter = response_filter  # type: ignore[attr-defined]


def remove_response_filter(request: Request) -> None:
    """
    Let C{request}'s output calls go straight to the client again.
    """
    request.response_filter = None  # type: ignore[attr-defined]
