"""
Parsing a whole, simple request head in one pass.

Twisted's channel parses a request head line by line (a method call or three per line,
the header name encoded and the value checked one at a time). Most heads arrive whole in
one read and are plain: a request line, token-named fields with visible values, no body.
L{parse_simple_head} reads such a head with two regular-expression calls and declines
(L{None}) everything else, which then goes through Twisted's parser unchanged: so it
accepts only heads that Twisted's parser reads the same way, and every refusal stays
Twisted's (and the channel's) own.
"""

from __future__ import annotations

import re
from typing import Final

_TCHAR = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"

# Stricter than Twisted's request line (which takes bytes up to 0xB0 in the target): a
# line this does not match goes to Twisted's parser.
_REQUEST_LINE: Final = re.compile(rb"(" + _TCHAR + rb"++) ([\x21-\x7e]++) (HTTP/1\.[01])\r\n")

# One field line, anchored at a line start, its value visible characters, spaces and tabs
# (Twisted also takes other control characters but NUL: those heads go to it). A line
# this does not match (obs-fold, a space before the colon, a bare CR or LF) makes
# findall's count fall short of the line count.
_FIELD_LINE: Final = re.compile(
    rb"^(" + _TCHAR + rb"++):[ \t]*+([\t\x20-\x7e\x80-\xff]*+)\r\n", re.MULTILINE
)

# Fields that frame a body: a head with either is left to Twisted's parser and the
# channel's own checks (body framing, the number of Content-Length digits).
_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})

_PADDING: Final = (32, 9)
"""A space and a tab, as the ints that indexing a C{bytes} value gives."""

SimpleHead = tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]]]
"""The method, the request-target, the version and the fields (name, value) in order."""


def parse_simple_head(data: bytes, max_fields: int) -> SimpleHead | None:
    """
    Parse C{data} if it is exactly one whole request head without a body, every line
    of it plain, and at most C{max_fields} fields; else L{None}.

    Field values are stripped of surrounding spaces and tabs, as Twisted strips them;
    names are as sent.
    """
    end = len(data) - 2
    # An earlier empty line (a body, a second head) is a line no field matches: the
    # count below declines it, without a search of the whole head here.
    if end < 2 or not data.endswith(b"\r\n\r\n"):
        return None
    line = _REQUEST_LINE.match(data)
    if line is None:
        return None
    start = line.end()
    if start == end:
        return line[1], line[2], line[3], []
    fields: list[tuple[bytes, bytes]] = _FIELD_LINE.findall(data, start, end)
    if len(fields) != data.count(b"\n", start, end) or len(fields) > max_fields:
        return None
    padded = False
    for name, value in fields:
        size = len(name)
        if (size == 14 or size == 17) and name.lower() in _FRAMING:
            return None
        # Per field rather than two searches of the whole head for a space or tab
        # before CRLF (-1.2 µs with a 900-byte Bearer token).
        if value and value[-1] in _PADDING:
            padded = True
    if padded:
        fields = [(name, value.rstrip(b" \t")) for name, value in fields]
    return line[1], line[2], line[3], fields
