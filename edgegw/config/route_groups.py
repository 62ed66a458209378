"""
The RouteGroup kind: a selector of Routes and the type and access they share.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.access import read_access
from edgegw.config.errors import Location
from edgegw.config.fields import Node
from edgegw.config.model import RouteGroupSpec
from edgegw.config.selector import read_selector

__all__ = ["read_route_group"]


def read_route_group(spec: Node, name: str, location: Location, order: int) -> RouteGroupSpec:
    """
    The RouteGroup resource.

    @param order: Its position among all documents.
    """
    return RouteGroupSpec(
        name=name,
        location=location,
        order=order,
        type=cast(Any, spec.string("type", choices=("app", "service"))),
        selector=read_selector(spec.mapping("selector")),
        access=read_access(spec.mapping("access")),
    )
