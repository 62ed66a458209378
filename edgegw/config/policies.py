"""
The Policy kind: a built-in require rule, a Rego module, or both.
"""

from __future__ import annotations

import os

from edgegw.config.errors import Location
from edgegw.config.fields import Node, type_name
from edgegw.config.model import PolicySpec, RegoSpec, RequireSpec

__all__ = ["read_policy"]


def read_policy(spec: Node, name: str, location: Location, base_dir: str) -> PolicySpec:
    """
    The Policy resource.

    @param base_dir: The directory of its file, for a relative Rego C{path}.
    """
    require = None
    require_node = spec.mapping("require")
    if require_node is not None:
        groups = require_node.strings("groups")
        claims: dict[str, tuple[str, ...]] = {}
        claims_node = require_node.mapping("claims")
        if claims_node is not None:
            for claim, value in claims_node.raw.items():
                claims_node.know(claim)
                if isinstance(value, str):
                    claims[claim] = (value,)
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    if not value:
                        claims_node.error(str(claim), "empty list: list at least one value")
                    claims[claim] = tuple(value)
                else:
                    claims_node.error(
                        str(claim),
                        f"expected a string or a list of strings, got {type_name(value)}",
                    )
            claims_node.finish()
        if require_node.has("groups") and not groups:
            require_node.error("groups", "empty list: list at least one group")
        if not require_node.has("groups") and not (claims_node and claims_node.raw):
            require_node.error("", "a require block needs groups, claims, or both")
        require = RequireSpec(groups=groups, claims=claims)
        require_node.finish()
    rego = None
    rego_node = spec.mapping("rego")
    if rego_node is not None:
        path = rego_node.required_string("path")
        rego = RegoSpec(path=os.path.normpath(os.path.join(base_dir, path)) if path else "")
        rego_node.finish()
    if require is None and rego is None:
        spec.error("", "a Policy needs require, rego, or both")
    return PolicySpec(name=name, location=location, require=require, rego=rego)
