"""
The metrics scrape listener's Site: the public listener's connection handling (a head
deadline, no combined-format log line) with small caps of its own, so that whoever can
reach the scrape port cannot use up the gateway's file descriptors.
"""

from __future__ import annotations

from typing import Any, Final

from twisted.web.resource import IResource

from edgegw.config.model import LimitsSpec
from edgegw.server.channel import GatewayChannel
from edgegw.server.gateway_site import LimitedSite
from edgegw.server.request import GatewayRequest

__all__ = ["SCRAPE_LIMITS", "ScrapeSite"]

SCRAPE_LIMITS: Final = LimitsSpec(
    header_timeout=10.0,
    body_timeout=10.0,
    send_timeout=30.0,
    max_connections=32,
    max_connections_per_address=32,
)
"""
A scraper needs one connection; 32 fit in L{DESCRIPTOR_RESERVE
<edgegw.server.gateway_site.DESCRIPTOR_RESERVE>} beside the public listener's cap.
"""

SCRAPE_IDLE_TIMEOUT: Final = 30.0
"""Seconds a scrape connection may wait between requests."""


class ScrapeSite(LimitedSite):
    """
    Serves C{root} under L{SCRAPE_LIMITS}, logging nothing per request.
    """

    requestFactory = GatewayRequest  # type: ignore[assignment]
    protocol = GatewayChannel  # type: ignore[assignment]

    def __init__(self, root: IResource, reactor: Any = None) -> None:
        super().__init__(root, SCRAPE_LIMITS, timeout=SCRAPE_IDLE_TIMEOUT, reactor=reactor)
        self.displayTracebacks = False
        self.noisy = False

    def log(self, request: object) -> None:
        # Every scrape would otherwise write a combined-format line to the daemon's log.
        pass
