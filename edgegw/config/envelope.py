"""
The envelope every resource shares: C{apiVersion}, C{kind}, C{metadata} (name, labels,
annotations) and C{spec}.
"""

from __future__ import annotations

import re

from edgegw.config.errors import Problems
from edgegw.config.fields import Node, suggest, type_name
from edgegw.config.load import Document

__all__ = ["KINDS", "read_envelope"]

KINDS = (
    "Gateway",
    "IdP",
    "Telemetry",
    "Route",
    "RouteGroup",
    "Policy",
    "RequestPlugin",
    "ResponsePlugin",
    "StateProvider",
)
"""
The resource kinds, in the order messages list them.
"""

_LABEL_VALUE = re.compile(r"[^\x00-\x1f\x7f]*\Z")


def read_envelope(
    document: Document, problems: Problems
) -> tuple[str, str, dict[str, str], Node] | None:
    """
    The kind, name, labels and spec of a document, reporting what is wrong with its
    envelope; L{None} when there is no spec to read (not a mapping, no or an unknown kind).
    """
    location = document.location
    body = document.body
    if not isinstance(body, dict):
        problems.add(location, "", f"expected a resource mapping, got {type_name(body)}")
        return None
    root = Node(body, location, "", problems)
    root.know("apiVersion")
    if "apiVersion" in body and not isinstance(body["apiVersion"], str | int | float):
        root.error("apiVersion", f"expected a string, got {type_name(body['apiVersion'])}")
    kind = root.string("kind", required=True)
    if kind and kind not in KINDS:
        root.error(
            "kind",
            f'unknown kind "{kind}"{suggest(kind, list(KINDS))} '
            f"(expected one of {', '.join(KINDS)})",
        )
        return None
    metadata = root.mapping("metadata", required=True)
    name = ""
    labels: dict[str, str] = {}
    if metadata is not None:
        name = metadata.required_string("name")
        labels = metadata.string_map("labels") or {}
        for label, value in labels.items():
            if not label or not _LABEL_VALUE.match(label + value):
                metadata.error(f"labels.{label}", "labels must be printable text")
        metadata.know("annotations")
        metadata.finish()
    spec = root.mapping("spec")
    if spec is None:
        if "spec" in body and body["spec"] is not None:
            return None
        spec = Node({}, location, "spec", problems)
    root.finish()
    if not kind:
        return None
    return kind, name, labels, spec
