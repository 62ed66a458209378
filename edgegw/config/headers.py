"""
HTTP header grammar for configuration values: tokens (header names, cookie names, methods)
and header values that can be sent as they are.
"""

from __future__ import annotations

import re

from edgegw.config.fields import Node
from edgegw.config.messages import describe_char, show

__all__ = ["TOKEN", "check_header_name", "check_header_value"]

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
"""
An RFC 9110 token: what a header name, a cookie name or a method must be.
"""

_BAD_HEADER_VALUE = re.compile(r"[^\t\x20-\x7e]")


def check_header_name(node: Node, key: str, value: str | None) -> None:
    """
    Report field C{key} of C{node} when its C{value} is set and is not a valid header name.
    """
    if value is not None and not TOKEN.match(value):
        node.error(key, f'"{value}" is not a valid HTTP header name')


def check_header_value(node: Node, key: str, value: str | None) -> None:
    """
    A header value must be sendable as it is: visible ASCII, spaces and tabs (RFC 9110
    field-vchar without obs-text); anything else is refused or mangled by clients.
    """
    if value is None:
        return
    bad = _BAD_HEADER_VALUE.search(value)
    if bad is not None:
        node.error(
            key,
            f'"{show(value)}" is not a valid HTTP header value: {describe_char(bad.group())} '
            "is not allowed; use printable ASCII",
        )
