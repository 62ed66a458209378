"""
HTTP header grammar for configuration values: tokens (header names, cookie names, methods)
and header values that can be sent as they are.
"""

from __future__ import annotations

import re

from edgegw.config.fields import Node
from edgegw.config.shown_values import describe_char, show

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


# Headers that mean something to HTTP itself, to the gateway or to its backends: no
# configuration may take one over for its own data (an assertion, say).
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "authorization",
        "cookie",
        "set-cookie",
        "expect",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-real-ip",
        "x-request-id",
        "traceparent",
        "tracestate",
        "baggage",
        "content-type",
        "content-encoding",
        "accept-encoding",
    }
)


def check_own_header_name(node: Node, key: str, value: str | None) -> None:
    """
    A header the gateway itself sends and strips (an identity assertion's): a valid
    name, without C{_} (the edge drops such headers from every request), and not one
    HTTP, the gateway or its identity projection already uses.
    """
    if value is None:
        return
    if not TOKEN.match(value):
        node.error(key, f'"{value}" is not a valid HTTP header name')
    elif "_" in value:
        node.error(key, f'"{value}": header names with "_" are dropped at the edge; use "-"')
    elif value.lower() in _RESERVED_HEADERS or value.lower().startswith("x-user-"):
        node.error(key, f'"{value}" is a header HTTP or the gateway already uses')
