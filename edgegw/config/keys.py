"""
Key material in configuration: base64 text decoded, Ed25519 keys checked for length.
"""

from __future__ import annotations

import base64
import binascii

from edgegw.config.fields import Node

__all__ = ["ed25519_key"]


def _decode_key(text: str) -> bytes | None:
    """
    Standard or raw URL-safe base64, padding optional.
    """
    try:
        data = (text + "=" * (-len(text) % 4)).encode("ascii")
    except UnicodeEncodeError:
        return None
    if b"+" in data or b"/" in data:
        alphabets: tuple[bytes | None, ...] = (None,)  # standard only: no - or _ then
    else:
        alphabets = (None, b"-_")
    for altchars in alphabets:
        if altchars is None and (b"-" in data or b"_" in data):
            continue
        try:
            return base64.b64decode(data, altchars=altchars, validate=True)
        except binascii.Error:
            continue
    return None


def ed25519_key(node: Node, key: str, what: str) -> bytes:
    """
    The 32 raw bytes of the Ed25519 key in field C{key} (base64), or C{b""} after reporting
    why it is not one.

    @param what: What the key is, for messages (C{"the Ed25519 seed"}).
    """
    text = node.string(key, required=True, nonempty=True)
    if not text:
        return b""
    raw = _decode_key(text)
    if raw is None:
        node.error(key, f"{what} is not valid base64 (standard or raw URL-safe)")
        return b""
    if len(raw) != 32:
        node.error(key, f"{what} must decode to exactly 32 bytes, got {len(raw)}")
        return b""
    return raw
