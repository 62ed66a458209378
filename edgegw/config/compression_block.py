"""
The Gateway's compression block, and the list of content codings a static handler's
C{precompressed} names (read the same way).
"""

from __future__ import annotations

import re
from typing import Final

from edgegw.config.fields import Node, suggest
from edgegw.config.model import CompressionSpec

__all__ = ["CODING_NAMES", "read_codings", "read_compression"]

CODING_NAMES: Final = ("zstd", "br", "gzip")
"""The content codings the gateway can compress with."""

_DEFAULTS = CompressionSpec()
# Names people write for the codings' tokens.
_SPELLED_OUT: Final = {"brotli": "br", "zstandard": "zstd", "zst": "zstd", "x-gzip": "gzip"}
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9a-z]+"
_MEDIA_TYPE: Final = re.compile(rf"{_TOKEN}/(?:{_TOKEN}|\*)\Z")
# A cache whose largest entry (an eighth of it) is under 128 KiB would keep little.
_SMALLEST_CACHE: Final = 1024 * 1024
_LARGEST_CACHE: Final = 4 * 1024 * 1024 * 1024


def read_compression(node: Node | None) -> CompressionSpec:
    """
    The compression block, or the defaults (on) when there is none.
    """
    if node is None:
        return _DEFAULTS
    enabled = node.boolean("enabled", _DEFAULTS.enabled)
    encodings = read_codings(node, "encodings", _DEFAULTS.encodings, nonempty=True)
    min_size = node.integer("minSize", _DEFAULTS.min_size, minimum=0)
    types = _types(node)
    static_cache_size = _static_cache_size(node)
    node.finish()
    return CompressionSpec(
        enabled=enabled,
        encodings=encodings,
        min_size=min_size,
        types=types,
        static_cache_size=static_cache_size,
    )


def _static_cache_size(node: Node) -> int:
    size = node.integer("staticCacheSize", _DEFAULTS.static_cache_size, minimum=0)
    if 0 < size < _SMALLEST_CACHE:
        node.error(
            "staticCacheSize",
            f"{size} bytes would hold no file worth compressing: at least "
            f"{_SMALLEST_CACHE} (1 MiB), or 0 to keep none",
        )
        return _DEFAULTS.static_cache_size
    if size > _LARGEST_CACHE:
        node.error(
            "staticCacheSize",
            f"{size} bytes is more than {_LARGEST_CACHE} (4 GiB): a second copy of the "
            "files in memory, per process",
        )
        return _DEFAULTS.static_cache_size
    return size


def read_codings(
    node: Node, key: str, default: tuple[str, ...], *, nonempty: bool
) -> tuple[str, ...]:
    """
    A list of content codings (C{zstd}, C{br}, C{gzip}), each at most once.
    """
    if not node.has(key):
        return default
    names = node.strings(key, nonempty=nonempty)
    out: list[str] = []
    for index, name in enumerate(names):
        if name not in CODING_NAMES:
            known = ", ".join(CODING_NAMES)
            hint = _SPELLED_OUT.get(name.lower())
            suggestion = f'; did you mean "{hint}"?' if hint else suggest(name, list(CODING_NAMES))
            node.error(
                f"{key}[{index}]",
                f'unknown encoding "{name}"{suggestion} (expected one of {known})',
            )
        elif name in out:
            node.error(f"{key}[{index}]", f'"{name}" is listed twice')
        else:
            out.append(name)
    return tuple(out)


def _types(node: Node) -> tuple[str, ...]:
    if not node.has("types"):
        return _DEFAULTS.types
    out: list[str] = []
    for index, raw in enumerate(node.strings("types", nonempty=True)):
        media = raw.strip().lower()
        where = f"types[{index}]"
        if not _MEDIA_TYPE.match(media):
            node.error(
                where,
                f'"{raw}" is not a media type such as "application/json" or "text/*" '
                "(no parameters)",
            )
        elif media.startswith("*/"):
            node.error(where, f'"{raw}" would compress images and archives too: name the types')
        elif media == "text/event-stream":
            node.error(
                where,
                '"text/event-stream" is never compressed (each event must reach the client '
                "as it is sent)",
            )
        elif media not in out:
            out.append(media)
    return tuple(out)
