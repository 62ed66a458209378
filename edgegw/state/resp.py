"""
RESP2, Redis's wire format, for the few exchanges edgegw makes outside txredisapi (the
Sentinel discovery's questions): one command encoded, one reply parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["INCOMPLETE", "RedisReplyError", "encode_command", "parse_reply"]


class RedisReplyError(Exception):
    """
    Redis answered an error reply.
    """


INCOMPLETE: Any = object()
"""What L{parse_reply} answers while a reply has not wholly arrived."""


def encode_command(args: Sequence[bytes | str | int]) -> bytes:
    """
    One command as a RESP2 array of bulk strings (text and numbers in UTF-8).
    """
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def parse_reply(data: bytes, at: int = 0) -> tuple[Any, int]:
    """
    One RESP2 reply at C{data[at:]}: the value and where the next one starts, or
    (L{INCOMPLETE}, C{at}) while more bytes are needed.

    Simple strings and bulk strings are C{bytes}, integers C{int}, a null L{None}, an
    array a list, and an error reply a L{RedisReplyError} (returned, not raised).

    @raise ValueError: If C{data} is not RESP2.
    """
    end = data.find(b"\r\n", at)
    if end < 0:
        return INCOMPLETE, at
    kind, line, after = data[at : at + 1], data[at + 1 : end], end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return RedisReplyError(line.decode("utf-8", "replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(data) < after + size + 2:
            return INCOMPLETE, at
        return data[after : after + size], after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = parse_reply(data, after)
            if item is INCOMPLETE:
                return INCOMPLETE, at
            items.append(item)
        return items, after
    raise ValueError(f"not RESP: {data[at:]!r}")
