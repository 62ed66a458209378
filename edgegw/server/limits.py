"""
The client-side limits of C{Gateway.spec.limits}, applied by the Site to each connection
it accepts: the request head and body deadlines (kept by L{GatewayChannel} itself).
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.interfaces import IAddress
from twisted.web.resource import IResource
from twisted.web.server import Site

from edgegw.config.model import LimitsSpec
from edgegw.server.request import GatewayChannel

__all__ = ["LimitedSite"]


class LimitedSite(Site):
    """
    A Site of L{GatewayChannel}s that gives each connection the configured deadlines.

    @ivar limits: The limits applied.
    """

    def __init__(self, resource: IResource, limits: LimitsSpec | None = None, **kwargs: Any):
        """
        @param limits: The limits; the defaults when not given.
        @param kwargs: As for L{Site} (C{timeout} is the idle timeout between requests).
        """
        super().__init__(resource, **kwargs)
        self.limits = limits or LimitsSpec()

    def buildProtocol(self, addr: IAddress | None) -> Any:
        """
        A L{GatewayChannel} with the limits' deadlines.
        """
        channel = cast(GatewayChannel, Site.buildProtocol(self, addr))
        limits = self.limits
        channel.headerTimeout = limits.header_timeout
        channel.bodyTimeout = limits.body_timeout
        return channel
