"""
Following a client's HTTP/2 frame boundaries: a header block still arriving, and the
frames that ask for nothing.

The h2 library collects a header block's HEADERS and CONTINUATION frames out of sight
(up to 64 frames of up to 16 KiB), and handles frames on streams already closed without
a word (answering an empty DATA frame with a RST_STREAM). L{HeaderBlockWatch} reads only
the 9-byte frame headers of what the client sends (skipping payloads), so the connection
can bound a block in bytes and in time whatever streams are open (CVE-2024-27316), and
charge its budgets per frame, whatever h2 reports.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HeaderBlockWatch"]

PREFACE_LENGTH: Final = 24
"""The client connection preface (C{PRI * HTTP/2.0...}), before the first frame."""

_DATA: Final = 0x0
_HEADERS: Final = 0x1
_PRIORITY: Final = 0x2
_RST_STREAM: Final = 0x3
_SETTINGS: Final = 0x4
_PING: Final = 0x6
_WINDOW_UPDATE: Final = 0x8
_CONTINUATION: Final = 0x9
_END_STREAM: Final = 0x1
_END_HEADERS: Final = 0x4
_CONTROL: Final = frozenset({_PRIORITY, _SETTINGS, _PING, _WINDOW_UPDATE})
_KNOWN: Final = frozenset(range(0xA))


class HeaderBlockWatch:
    """
    Where a client's frames begin and end, and whether a header block is open.

    @ivar open: Whether a HEADERS frame without END_HEADERS awaits its CONTINUATIONs.
    @ivar block_bytes: The open block's bytes so far (its frames' payloads).
    @ivar control: Frames that ask for nothing seen since the count was last taken:
        PRIORITY, SETTINGS, PING, WINDOW_UPDATE, empty DATA without END_STREAM, unknown
        types.
    @ivar resets: RST_STREAM frames seen since the count was last taken.
    """

    __slots__ = ("_head", "_preface", "_skip", "block_bytes", "control", "open", "resets")

    def __init__(self) -> None:
        self.open = False
        self.block_bytes = 0
        self.control = 0
        self.resets = 0
        self._preface = PREFACE_LENGTH
        self._skip = 0
        self._head = b""

    def feed(self, data: bytes) -> None:
        """
        Follow C{data}, the next bytes the client sent.
        """
        position = 0
        size = len(data)
        if self._preface:
            taken = min(self._preface, size)
            self._preface -= taken
            position = taken
        while position < size:
            if self._skip:
                taken = min(self._skip, size - position)
                self._skip -= taken
                position += taken
                continue
            missing = 9 - len(self._head)
            piece = data[position : position + missing]
            position += len(piece)
            head = self._head + piece if self._head else piece
            if len(head) < 9:
                self._head = head
                return
            self._head = b""
            length = int.from_bytes(head[:3], "big")
            kind = head[3]
            if kind in _CONTROL or kind not in _KNOWN:
                self.control += 1
            elif kind == _RST_STREAM:
                self.resets += 1
            elif kind == _DATA:
                if not length and not head[4] & _END_STREAM:
                    self.control += 1
            elif kind == _HEADERS:
                self.open = not head[4] & _END_HEADERS
                self.block_bytes = length if self.open else 0
            elif kind == _CONTINUATION and self.open:
                self.block_bytes += length
                if head[4] & _END_HEADERS:
                    self.open = False
                    self.block_bytes = 0
            self._skip = length
