"""
The static terminal's C{Content-Type} by file extension: the same table on every host.
"""

from __future__ import annotations

import functools
import mimetypes
from collections.abc import Mapping
from typing import Final

__all__ = ["OCTET_STREAM", "content_types"]

OCTET_STREAM: Final = b"application/octet-stream"
"""The type of a file whose extension the table does not know, or that has none."""

_WEB_TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".cjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".webmanifest": "application/manifest+json",
    ".svg": "image/svg+xml",
    ".wasm": "application/wasm",
    ".ico": "image/x-icon",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".avif": "image/avif",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".otf": "font/otf",
    ".pdf": "application/pdf",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mp3": "audio/mpeg",
    ".gz": "application/gzip",
    ".zip": "application/zip",
}


@functools.cache
def content_types() -> Mapping[str, bytes]:
    """
    The extension table: Python's built-in C{mimetypes} defaults (never the host's
    C{mime.types}, so every machine answers alike), overridden by the web types above.

    @return: Lower-case extensions with their dot, mapped to C{Content-Type} values.
    """
    table: dict[str, bytes] = {}
    for extension, content_type in mimetypes.MimeTypes().types_map[True].items():
        if content_type.startswith("text/"):
            # Browsers read text without a charset as windows-1252; web assets are UTF-8.
            content_type += "; charset=utf-8"
        table[extension.lower()] = content_type.encode("ascii")
    for extension, content_type in _WEB_TYPES.items():
        table[extension] = content_type.encode("ascii")
    return table
