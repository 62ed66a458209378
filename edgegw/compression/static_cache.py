"""
L{StaticBodyCache}: static files compressed once per file version and coding, per
process, instead of once per request.

The static terminal asks it (through L{ResponseCoding.write_cached
<edgegw.compression.response_coding.ResponseCoding.write_cached>}) before it reads a file
whose answer would be compressed whole. An entry's key is what the static terminal knows
of the file it opened, never anything of the request: the opened file's device, inode,
size, modification and change times (the facts its C{ETag} is cached by; no path, which
would cost memory per entry and tell nothing more: two paths to one inode are the same
bytes), and the coding's name. A file written again gets a new change time, a file
replaced by a rename a new inode: either is a new key, whose first request compresses
the new bytes; the old entry is never served again and ages out. The value is exactly
what compressing the whole file at once gives
(L{Coding.whole<edgegw.compression.codings.Coding.whole>}), so a hit sends the same bytes
a miss does.

Bounded in bytes: each entry counts its encoded length and L{ENTRY_OVERHEAD}; past the
capacity the least recently used entries go. A body over the capacity's
L{ENTRY_FRACTION}, or over L{ENTRY_LIMIT}, is never stored (it is compressed as before,
on every request, as it streams), so that one file cannot push everything else out, the
cache holds at least that many entries, and a miss, compressed whole in one call, holds
the reactor for a bounded time (~30 ms for 2 MiB at gzip 5, the slowest coding). One
cache per loaded configuration (its L{CompressionPolicy
<edgegw.compression.response_coding.CompressionPolicy>}): a reload starts empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = [
    "DEFAULT_CAPACITY",
    "ENTRY_FRACTION",
    "ENTRY_LIMIT",
    "ENTRY_OVERHEAD",
    "FileVersion",
    "StaticBodyCache",
]

DEFAULT_CAPACITY: Final = 32 * 1024 * 1024
"""C{compression.staticCacheSize}'s default, in bytes."""

ENTRY_FRACTION: Final = 8
"""A body larger than the capacity over this is never stored."""

ENTRY_LIMIT: Final = 2 * 1024 * 1024
"""Nor is one larger than this, whatever the capacity."""

ENTRY_OVERHEAD: Final = 512
"""
Bytes counted for each entry on top of its body: its key (two tuples, five integers),
the bytes object's header and the ordered dictionary's slot and link, about 420 bytes
measured (sys.getsizeof), rounded up; so that many tiny entries cannot outgrow the
bound either.
"""

FileVersion = tuple[int, int, int, int, int]
"""An opened file's device, inode, size, modification and change times (ns)."""

_Key = tuple[FileVersion, str]


class StaticBodyCache:
    """
    Whole compressed bodies of static files, least recently used out first.

    @ivar capacity: The most bytes held (bodies and L{ENTRY_OVERHEAD} each).
    @ivar entry_limit: The largest body stored, in bytes (identity or encoded).
    @ivar size: The bytes held now.
    @ivar misses: How many lookups found nothing (the body was compressed, or could not be).
    """

    def __init__(self, capacity: int) -> None:
        """
        @param capacity: The most bytes held; more than 0.
        """
        self.capacity = capacity
        self.entry_limit = min(capacity // ENTRY_FRACTION, ENTRY_LIMIT)
        self.size = 0
        self.misses = 0
        self._entries: OrderedDict[_Key, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def body(
        self, version: FileVersion, coding: str, compress: Callable[[], bytes | None]
    ) -> bytes | None:
        """
        The encoded body of C{version} with C{coding}: from the cache, or made by
        C{compress} and stored.

        @param compress: Reads the file and compresses it whole; L{None} when it could
            not (the file changed or failed while it was read, the encoder failed):
            nothing is stored then.
        @return: The encoded body, or L{None} from C{compress}.
        """
        key = (version, coding)
        entries = self._entries
        encoded = entries.get(key)
        if encoded is not None:
            entries.move_to_end(key)
            return encoded
        self.misses += 1
        encoded = compress()
        if encoded is None:
            return None
        self._store(key, encoded)
        return encoded

    def _store(self, key: _Key, encoded: bytes) -> None:
        cost = len(encoded) + ENTRY_OVERHEAD
        if cost > self.entry_limit:
            return
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.size -= len(old) + ENTRY_OVERHEAD
        limit = self.capacity - cost
        while self.size > limit:
            _, evicted = entries.popitem(last=False)
            self.size -= len(evicted) + ENTRY_OVERHEAD
        entries[key] = encoded
        self.size += cost
