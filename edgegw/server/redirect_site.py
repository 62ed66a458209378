"""
The Site of C{Gateway.spec.redirectHTTP}'s listener: the gateway's connection handling
(L{GatewayChannel}: the head, body and send deadlines, the connection caps of
C{Gateway.spec.limits}, counted apart from the TLS listener's) around an
L{HttpsRedirect}, logging nothing per request.
"""

from __future__ import annotations

from typing import Any, Final

from edgegw.config.model import LimitsSpec
from edgegw.edge.https_redirect import HttpsRedirect
from edgegw.server.channel import GatewayChannel
from edgegw.server.gateway_site import LimitedSite
from edgegw.server.request import GatewayRequest

__all__ = ["REDIRECT_IDLE_TIMEOUT", "RedirectSite"]

REDIRECT_IDLE_TIMEOUT: Final = 15.0
"""Seconds a connection may wait between requests (a browser's next one goes to HTTPS)."""


class RedirectSite(LimitedSite):
    """
    Serves an L{HttpsRedirect} under C{limits}.

    @ivar redirect: The resource.
    """

    requestFactory = GatewayRequest  # type: ignore[assignment]
    protocol = GatewayChannel  # type: ignore[assignment]

    def __init__(self, redirect: HttpsRedirect, limits: LimitsSpec, reactor: Any = None) -> None:
        super().__init__(redirect, limits, timeout=REDIRECT_IDLE_TIMEOUT, reactor=reactor)
        self.redirect = redirect
        self.displayTracebacks = False
        self.noisy = False

    def default_https_port(self, port: int | None) -> None:
        """
        Name C{port} (the TLS listener's, once bound) in the redirects, unless the
        configuration or the listen address named one.
        """
        if self.redirect.https_port is None:
            self.redirect.https_port = port

    def log(self, request: object) -> None:
        # Every redirect would otherwise write a combined-format line to the daemon's log.
        pass
