"""
The C{headers} plugin: set, add and remove request headers (as a RequestPlugin) or
response headers (as a ResponsePlugin) on the routes it selects.

Config (every block optional, at least one non-empty)::

    remove: [X-Powered-By]                    # names
    set: {Cache-Control: no-store}            # name: value (replaces)
    add: {Link: ["</app.css>; rel=preload"]}  # name: value or list of values (appends)

Applied in that order: remove, then set, then add. Headers the gateway frames messages
with or sets itself (C{Content-Length}, C{X-User-*}, C{X-Forwarded-*}, the security
headers, ...) are refused at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from zope.interface import implementer

from edgegw.plugins.interfaces import (
    IHeaderNames,
    IRequestHook,
    IRequestPlugin,
    IResponseHook,
    IResponsePlugin,
    PluginConfigError,
)
from edgegw.plugins.messages import (
    REQUEST_FRAMING,
    REQUEST_OWNED,
    REQUEST_OWNED_PREFIXES,
    RESPONSE_FRAMING,
    RESPONSE_OWNED,
    HeaderView,
    PluginRequest,
    PluginResponse,
    check_header_name,
    check_header_value,
)

__all__ = ["HeaderEdits", "HeadersPlugin", "plugin", "read_edits"]

_FIELDS: Final = ("remove", "set", "add")


class HeaderEdits:
    """
    A checked set of header edits.

    @ivar remove: Names to remove.
    @ivar set: (name, value) pairs; each replaces the name's values.
    @ivar add: (name, value) pairs, appended in order.
    """

    def __init__(
        self,
        remove: tuple[str, ...],
        set: tuple[tuple[str, str], ...],
        add: tuple[tuple[str, str], ...],
    ) -> None:
        self.remove = remove
        self.set = set
        self.add = add

    def header_names(self) -> list[tuple[str, str]]:
        """
        (config field, name) of every header edited.
        """
        return [
            *((f"remove[{index}]", name) for index, name in enumerate(self.remove)),
            *((f"set.{name}", name) for name, _ in self.set),
            *((f"add.{name}", name) for name, _ in self.add),
        ]

    def apply(self, headers: HeaderView) -> None:
        """
        Edit C{headers}: remove, then set, then add.
        """
        for name in self.remove:
            headers.remove(name)
        for name, value in self.set:
            headers.set(name, value)
        for name, value in self.add:
            headers.add(name, value)


def read_edits(
    config: Mapping[str, Any], owned: frozenset[bytes], prefixes: tuple[bytes, ...]
) -> HeaderEdits:
    """
    The edits C{config} describes.

    @param owned: Lowercased names no edit may touch.
    @param prefixes: Lowercased name prefixes likewise.
    @raise PluginConfigError: Every problem with C{config}.
    """
    problems: list[tuple[str, str]] = []

    def name_ok(field: str, name: object) -> bool:
        if not isinstance(name, str):
            problems.append((field, "a header name must be a string"))
            return False
        try:
            raw = check_header_name(name).lower()
        except ValueError as e:
            problems.append((field, str(e)))
            return False
        if raw in owned or raw.startswith(prefixes):
            problems.append((field, f"{name} is set by the gateway; a plugin cannot change it"))
            return False
        return True

    def value_ok(field: str, value: object) -> bool:
        if not isinstance(value, str):
            problems.append((field, "a header value must be a string"))
            return False
        try:
            check_header_value(value)
        except ValueError as e:
            problems.append((field, str(e)))
            return False
        return True

    for key in config:
        if key not in _FIELDS:
            problems.append((str(key), f"unknown field (expected one of: {', '.join(_FIELDS)})"))
    remove: list[str] = []
    raw_remove = config.get("remove", [])
    if not isinstance(raw_remove, list):
        problems.append(("remove", "must be a list of header names"))
    else:
        for index, name in enumerate(raw_remove):
            if name_ok(f"remove[{index}]", name):
                remove.append(name)
    pairs: dict[str, list[tuple[str, str]]] = {"set": [], "add": []}
    for field in ("set", "add"):
        block = config.get(field, {})
        if not isinstance(block, Mapping):
            problems.append((field, "must be a mapping of header name to value"))
            continue
        for name, value in block.items():
            where = f"{field}.{name}"
            if not name_ok(where, name):
                continue
            values = value if field == "add" and isinstance(value, list) else [value]
            for index, item in enumerate(values):
                at = f"{where}[{index}]" if isinstance(value, list) else where
                if value_ok(at, item):
                    pairs[field].append((name, item))
    if not problems and not (remove or pairs["set"] or pairs["add"]):
        problems.append(("", "needs at least one of remove, set or add"))
    if problems:
        raise PluginConfigError.of(problems)
    return HeaderEdits(tuple(remove), tuple(pairs["set"]), tuple(pairs["add"]))


@implementer(IRequestHook, IHeaderNames)
class RequestHeaders:
    """
    Edits request headers before the terminal.
    """

    def __init__(self, edits: HeaderEdits) -> None:
        self.edits = edits

    def on_request(self, request: PluginRequest) -> None:
        """
        Apply the edits.
        """
        self.edits.apply(request.headers)

    def header_names(self) -> list[tuple[str, str]]:
        """
        The edited names, for the gateway's load-time check.
        """
        return self.edits.header_names()


@implementer(IResponseHook, IHeaderNames)
class ResponseHeaders:
    """
    Edits response headers as the head goes out (the body keeps streaming).
    """

    wants_body = False
    max_body_bytes = 0

    def __init__(self, edits: HeaderEdits) -> None:
        self.edits = edits

    def on_response(self, response: PluginResponse) -> None:
        """
        Apply the edits.
        """
        self.edits.apply(response.headers)

    def header_names(self) -> list[tuple[str, str]]:
        """
        The edited names, for the gateway's load-time check.
        """
        return self.edits.header_names()


@implementer(IRequestPlugin, IResponsePlugin)
class HeadersPlugin:
    """
    The C{headers} plugin, as registered (entry point
    C{headers = edgegw.plugins.headers:plugin}).
    """

    def request_hook(self, config: Mapping[str, Any]) -> RequestHeaders:
        """
        Request header edits from C{config}.
        """
        return RequestHeaders(
            read_edits(config, REQUEST_FRAMING | REQUEST_OWNED, REQUEST_OWNED_PREFIXES)
        )

    def response_hook(self, config: Mapping[str, Any]) -> ResponseHeaders:
        """
        Response header edits from C{config}.
        """
        return ResponseHeaders(read_edits(config, RESPONSE_FRAMING | RESPONSE_OWNED, ()))


plugin = HeadersPlugin()
