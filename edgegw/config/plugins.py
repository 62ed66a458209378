"""
The kinds that name code to load: RequestPlugin and ResponsePlugin (with a selector), and
StateProvider; their C{config} is passed on as it is.
"""

from __future__ import annotations

from typing import Any

from edgegw.config.errors import Location
from edgegw.config.fields import Node
from edgegw.config.model import PluginSpec, StateProviderSpec
from edgegw.config.selector import read_selector

__all__ = ["read_plugin", "read_state_provider"]


def read_plugin(spec: Node, name: str, kind: Any, location: Location, order: int) -> PluginSpec:
    """
    A RequestPlugin or ResponsePlugin resource (C{kind}).

    @param order: Its position among all documents.
    """
    return PluginSpec(
        name=name,
        kind=kind,
        location=location,
        order=order,
        plugin=spec.string("plugin", name, nonempty=True) or name,
        selector=read_selector(spec.mapping("selector")),
        config=spec.opaque_mapping("config"),
    )


def read_state_provider(spec: Node, name: str, location: Location) -> StateProviderSpec:
    """
    The StateProvider resource.
    """
    return StateProviderSpec(
        name=name,
        location=location,
        type=spec.required_string("type"),
        config=spec.opaque_mapping("config"),
    )
