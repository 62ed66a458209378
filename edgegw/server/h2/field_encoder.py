"""
HPACK for the gateway's responses: cheap to encode, without a compression oracle.

hpack's own encoder searches its whole dynamic table for every field of every response
(about a third of an HTTP/2 response's CPU here). The gateway's responses share most
of their fields (the security headers, C{server}, the usual content types), and vary in
a few (C{date}, C{content-length}, validators, cookies, locations). L{ResponseFieldEncoder}
indexes a field the first time it is sent and only while the dynamic table has room
for it without evicting anything: an indexed field then keeps its index for the whole
connection, found with one dictionary lookup. Fields whose values vary, and fields that
carry secrets (C{set-cookie}), are never indexed, so that nothing a response carries
can be probed through the table's compression (CRIME/BREACH for headers).

H2 calls it through its public C{encoder} attribute: C{encode(fields)} and the
C{header_table_size} the client's SETTINGS set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from hpack.table import HeaderTable

__all__ = ["ResponseFieldEncoder", "encode_integer"]

_STATIC: Final = HeaderTable.STATIC_TABLE
_STATIC_FIELDS: Final = {field: index for index, field in enumerate(_STATIC, 1)}
_STATIC_NAMES: Final[dict[bytes, int]] = {}
for _index, (_name, _) in enumerate(_STATIC, 1):
    _STATIC_NAMES.setdefault(_name, _index)

NEVER_INDEXED: Final = frozenset(
    {
        b"set-cookie",
        b"authorization",
        b"proxy-authorization",
        b"cookie",
        b"www-authenticate",
    }
)
"""Fields sent as never-indexed literals (RFC 7541 section 6.2.3): they carry secrets."""

VARYING: Final = frozenset(
    {
        b"date",
        b"content-length",
        b"content-range",
        b"etag",
        b"last-modified",
        b"expires",
        b"age",
        b"location",
        b"x-request-id",
        b"traceparent",
        b"link",
    }
)
"""Fields whose values differ from response to response: not worth a table entry."""

_ENTRY_OVERHEAD: Final = 32

MAX_TABLE_SIZE: Final = 4096
"""The most dynamic-table bytes used, whatever size the client allows."""


def encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """
    An HPACK integer with an N-bit prefix (RFC 7541 section 5.1), its first octet's high
    bits from C{first}.
    """
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    # Raw (no Huffman): what Huffman saves on a response's few literals costs more CPU
    # than their bytes cost time.
    return encode_integer(len(data), 7, 0) + data


def _literal(name: bytes, value: bytes, first: int, prefix_bits: int) -> bytes:
    index = _STATIC_NAMES.get(name)
    if index is None:
        return bytes((first,)) + _string(name) + _string(value)
    return encode_integer(index, prefix_bits, first) + _string(value)


class ResponseFieldEncoder:
    """
    An HPACK encoder that indexes a field once, only while the table has room for it,
    and never evicts: each indexed field keeps its index for the connection's life.
    """

    def __init__(self) -> None:
        self._max_size = MAX_TABLE_SIZE
        self._used = 0
        # The fields in the dynamic table, oldest first.
        self._entries: list[tuple[bytes, bytes]] = []
        # (name, value) -> its encoding as an index (static or dynamic).
        self._known: dict[tuple[bytes, bytes], bytes] = {}
        self._pending_update: bytes = b""

    @property
    def header_table_size(self) -> int:
        """
        The dynamic table's size the client allows (SETTINGS_HEADER_TABLE_SIZE).
        """
        return self._max_size

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        # An encoder may use less than the client allows (RFC 7541 section 4.2): never
        # more than the default, whatever a client announces (memory, and the cost of
        # re-indexing).
        value = min(value, MAX_TABLE_SIZE)
        if value == self._max_size:
            return
        self._max_size = value
        if self._used > value:
            # Shrunk below what is indexed: start over, an empty table first.
            self._used = 0
            self._entries = []
            self._reindex()
            self._pending_update = encode_integer(0, 5, 0x20)
        self._pending_update += encode_integer(value, 5, 0x20)

    def encode(self, fields: Iterable[tuple[bytes, bytes]], huffman: bool = False) -> bytes:
        """
        Encode a header block (C{huffman} is hpack's parameter, ignored: literals are
        sent raw).
        """
        parts = [self._pending_update] if self._pending_update else []
        self._pending_update = b""
        known = self._known
        for field in fields:
            encoded = known.get(field)
            if encoded is None:
                encoded = self._field(field)
                # An insertion renumbered the dynamic table: the fields after this one
                # are read by the client with the new numbers.
                known = self._known
            parts.append(encoded)
        return b"".join(parts)

    def _field(self, field: tuple[bytes, bytes]) -> bytes:
        name, value = field[0], field[1]
        static = _STATIC_FIELDS.get((name, value))
        if static is not None:
            encoded = encode_integer(static, 7, 0x80)
        elif name in NEVER_INDEXED or getattr(field, "indexable", True) is False:
            return _literal(name, value, 0x10, 4)
        elif name in VARYING:
            return _literal(name, value, 0x00, 4)
        else:
            size = len(name) + len(value) + _ENTRY_OVERHEAD
            if self._used + size > self._max_size:
                return _literal(name, value, 0x00, 4)
            self._used += size
            self._entries.append((name, value))
            self._reindex()
            return _literal(name, value, 0x40, 6)
        self._known[(name, value)] = encoded
        return encoded

    def _reindex(self) -> None:
        # An insertion shifts every dynamic entry's index by one (the newest is 62): the
        # cache of their encodings is rebuilt (insertions stop once the table is full,
        # a few dozen per connection at most).
        known = {key: value for key, value in self._known.items() if key in _STATIC_FIELDS}
        count = len(self._entries)
        for number, entry in enumerate(self._entries):
            known[entry] = encode_integer(len(_STATIC) + count - number, 7, 0x80)
        self._known = known
