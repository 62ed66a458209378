"""
The label selector of RouteGroups and plugins: C{matchLabels} and C{matchExpressions}.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.fields import Node
from edgegw.config.model import LabelExpression, Selector

__all__ = ["read_selector"]


def read_selector(node: Node | None) -> Selector:
    """
    The selector block, or the empty selector (matching everything) when there is none.
    """
    if node is None:
        return Selector()
    match_labels = node.string_map("matchLabels") or {}
    expressions = []
    for item in node.nodes("matchExpressions"):
        key = item.required_string("key")
        operator = item.string(
            "operator", required=True, choices=("In", "NotIn", "Exists", "DoesNotExist")
        )
        values = item.strings("values")
        if operator in ("In", "NotIn") and not values:
            item.error("values", f"{operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and item.has("values"):
            item.error("values", f"{operator} takes no values")
        item.finish()
        if operator:
            expressions.append(LabelExpression(key, cast(Any, operator), values))
    node.finish()
    return Selector(match_labels=match_labels, match_expressions=tuple(expressions))
