"""
The Route kind: a mux pattern, its handler and its access block.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.access import read_access
from edgegw.config.errors import Location
from edgegw.config.fields import Node
from edgegw.config.handlers import read_handler
from edgegw.config.model import RouteSpec

__all__ = ["read_route"]


def read_route(
    spec: Node,
    name: str,
    labels: dict[str, str],
    location: Location,
    order: int,
    base_dir: str,
) -> RouteSpec | None:
    """
    The Route resource, or L{None} when its handler cannot be read.

    @param order: Its position among all documents.
    @param base_dir: The directory of its file, for a relative static C{dir}.
    """
    match = spec.required_string("match")
    route_type = spec.string("type", choices=("app", "service"))
    handler_node = spec.mapping("handler", required=True)
    handler = read_handler(handler_node, base_dir, match) if handler_node is not None else None
    access = read_access(spec.mapping("access"))
    if handler is None:
        return None
    return RouteSpec(
        name=name,
        location=location,
        order=order,
        match=match,
        handler=handler,
        labels=labels,
        type=cast(Any, route_type),
        access=access,
    )
