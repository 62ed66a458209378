"""
The handler block of a Route: static, reverse-proxy, api and health.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from edgegw.config.compression_block import read_codings
from edgegw.config.fields import Node, suggest
from edgegw.config.header_syntax import TOKEN, check_header_value
from edgegw.config.model import (
    DEFAULT_PRECOMPRESSED,
    ApiBackendSpec,
    ApiHandlerSpec,
    HandlerSpec,
    HealthHandlerSpec,
    ProxyHandlerSpec,
    StaticHandlerSpec,
)
from edgegw.config.shown_values import show
from edgegw.config.urls import PLACEHOLDER, check_url, encode_path, path_template_problem

__all__ = ["HANDLER_TYPES", "read_handler"]

HANDLER_TYPES = ("api", "health", "reverse-proxy", "static")
"""
The handler types, in the order messages list them.
"""


def read_handler(node: Node, base_dir: str, match: str) -> HandlerSpec | None:
    """
    The handler of the Route whose pattern is C{match}, or L{None} when its type is missing
    or unknown.

    @param base_dir: The directory of the Route's file, for a relative static C{dir}.
    """
    type_ = node.string("type", required=True)
    builders: dict[str, Callable[[Node, str, str], HandlerSpec]] = {
        "static": _static,
        "reverse-proxy": _proxy,
        "api": _api,
        "health": lambda n, b, m: HealthHandlerSpec(compress=n.boolean("compress", True)),
    }
    if not type_:
        return None
    builder = builders.get(type_)
    if builder is None:
        node.error(
            "type",
            f'unknown handler type "{type_}"{suggest(type_, list(HANDLER_TYPES))} '
            f"(expected one of {', '.join(HANDLER_TYPES)})",
        )
        return None
    handler = builder(node, base_dir, match)
    node.finish()
    return handler


def _static(node: Node, base_dir: str, match: str) -> HandlerSpec:
    directory = node.required_string("dir")
    resolved = os.path.normpath(os.path.join(base_dir, directory)) if directory else ""
    if resolved and not os.path.isdir(resolved):
        node.error("dir", f'"{directory}" is not a directory (resolved to {resolved})')
    index = node.string("index", "index.html", nonempty=True) or "index.html"
    if "/" in index or index.startswith("."):
        node.error("index", f'"{index}" must be a plain file name')
    strip = _strip_prefix(node)
    cache_control = node.string("cacheControl")
    check_header_value(node, "cacheControl", cache_control)
    return StaticHandlerSpec(
        dir=resolved,
        index=index,
        spa_fallback=node.boolean("spaFallback", True),
        strip_prefix=strip,
        cache_control=cache_control,
        precompressed=read_codings(node, "precompressed", DEFAULT_PRECOMPRESSED, nonempty=False),
        compress=node.boolean("compress", True),
    )


def _proxy(node: Node, base_dir: str, match: str) -> HandlerSpec:
    upstream = node.required_string("upstream")
    check_url(node, "upstream", upstream, ("http", "https"))
    strip = _strip_prefix(node)
    return ProxyHandlerSpec(
        upstream=upstream,
        strip_prefix=strip,
        preserve_host=node.boolean("preserveHost", False),
        forward_access_token=node.boolean("forwardAccessToken", False),
        forward_cookies=node.boolean("forwardCookies", False),
        forward_identity=node.boolean("forwardIdentity", False),
        timeout=node.duration("timeout", None, positive=True),
        insecure_skip_verify=node.boolean("insecureSkipVerify", False),
        compress=node.boolean("compress", True),
    )


def _api(node: Node, base_dir: str, match: str) -> HandlerSpec:
    wildcards = set(re.findall(r"\{([^{}.$]+)(?:\.\.\.)?\}", match))
    backends = []
    seen: set[str] = set()
    for item in node.nodes("backends", required=True):
        group = item.required_string("group")
        if group in seen:
            item.error("group", f'duplicate group "{group}": groups must be unique')
        seen.add(group)
        upstream = item.required_string("upstream")
        check_url(item, "upstream", upstream, ("http", "https"))
        path = item.required_string("path")
        if path and not path.startswith("/"):
            item.error("path", f'"{path}" must start with "/"')
        else:
            problem = path_template_problem(path)
            if problem is not None:
                item.error("path", problem)
        for placeholder in PLACEHOLDER.findall(path):
            if placeholder not in wildcards:
                known = ", ".join(sorted(wildcards)) or "none"
                item.error(
                    "path",
                    f'placeholder "{{{placeholder}}}" is not a wildcard of the route '
                    f"match {match!r} (wildcards: {known})",
                )
        method = item.string("method", "GET") or "GET"
        if not TOKEN.match(method):
            item.error("method", f'"{method}" is not a valid HTTP method')
        backends.append(
            ApiBackendSpec(
                group=group,
                upstream=upstream,
                path=path,
                method=method,
                required=item.boolean("required", True),
                forward_query=item.boolean("forwardQuery", False),
                forward_access_token=item.boolean("forwardAccessToken", False),
                forward_identity=item.boolean("forwardIdentity", False),
            )
        )
        item.finish()
    return ApiHandlerSpec(
        backends=tuple(backends),
        timeout=node.duration("timeout", None, positive=True),
        compress=node.boolean("compress", True),
    )


def _strip_prefix(node: Node) -> str | None:
    """
    C{stripPrefix}, percent-encoded as request paths are (UTF-8), so that C{/ä} matches
    the C{/%C3%A4} a client sends; RFC 3986 path characters and C{%XX} escapes are kept.
    """
    strip = node.string("stripPrefix")
    if strip is None:
        return None
    if not strip.startswith("/"):
        node.error("stripPrefix", f'"{show(strip)}" must start with "/"')
        return strip
    return encode_path(strip)
