"""
Conditional and range requests for the static terminal (RFC 9110 sections 13 and 14):
reading C{If-Match}, C{If-None-Match}, the date preconditions, C{If-Range} and C{Range}
against one file's entity tag, modification time and size. Pure functions of header
values; the order they are applied in is L{edgegw.handlers.static.handler}'s.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final

from twisted.web.http import stringToDatetime

__all__ = [
    "Range",
    "etag_listed",
    "if_range_holds",
    "parse_date",
    "parse_range",
    "single",
    "single_date",
]

_parse_http_date: Callable[[bytes], float] = stringToDatetime

# Larger than any file size, so an absurdly long position needs no big-integer parsing.
_HUGE: Final = 1 << 63


class Range(enum.Enum):
    """The outcomes of a C{Range} header other than one satisfiable span."""

    IGNORE = enum.auto()
    UNSATISFIABLE = enum.auto()


def if_range_holds(values: Sequence[bytes] | None, etag: bytes, modified: int) -> bool:
    """
    Whether C{If-Range} lets the C{Range} header apply (RFC 9110 section 13.1.5).

    @param values: The C{If-Range} field lines, if any.
    @param etag: The file's strong entity tag.
    @param modified: The file's modification time, whole seconds.
    @return: C{True} without C{If-Range}, or when it names the current file.
    """
    if values is None:
        return True
    if len(values) != 1:
        return False
    validator = values[0].strip()
    if validator.startswith(b'"'):
        return validator == etag
    if validator.startswith(b"W/"):
        return False
    return parse_date(validator) == modified


def single(values: Sequence[bytes] | None) -> bytes | None:
    """
    The value of a header that must appear once.

    @param values: The header's field lines.
    @return: The only value, or L{None} when absent or repeated (then it is ignored).
    """
    if values is None or len(values) != 1:
        return None
    return values[0]


def single_date(values: Sequence[bytes] | None) -> int | None:
    """
    The HTTP date of a header that must appear once.

    @param values: The header's field lines.
    @return: Seconds since the epoch, or L{None} when absent, repeated or not a date.
    """
    value = single(values)
    return None if value is None else parse_date(value)


def parse_date(value: bytes) -> int | None:
    """
    Parse an HTTP date (IMF-fixdate and the two obsolete forms).

    @param value: The header value.
    @return: Seconds since the epoch, or L{None} when it is not a date.
    """
    try:
        return int(_parse_http_date(value.strip()))
    except Exception:
        # The parser reports malformed input through several exception types; any of
        # them means "not a date", which RFC 9110 says to ignore.
        return None


def etag_listed(value: bytes, etag: bytes, weak: bool) -> bool:
    """
    Whether an C{If-Match} / C{If-None-Match} list selects the current file.

    @param value: The field value: C{*} or a comma-separated list of entity tags.
    @param etag: The file's strong entity tag.
    @param weak: Use weak comparison (C{If-None-Match}); otherwise strong (C{If-Match}).
    @return: C{True} when the list is C{*} or contains a tag that matches.
    """
    if value.strip() == b"*":
        return True
    for candidate in value.split(b","):
        tag = candidate.strip()
        if tag.startswith(b"W/"):
            if not weak:
                continue
            tag = tag[2:]
        if tag == etag:
            return True
    return False


def parse_range(value: bytes, size: int) -> tuple[int, int] | Range:
    """
    Interpret a C{Range} header for a file of C{size} bytes.

    @param value: The field value.
    @param size: The file size.
    @return: The half-open span C{(start, end)} to send, L{Range.UNSATISFIABLE}, or
        L{Range.IGNORE} for a malformed value, another unit, or several ranges.
    """
    unit, equals, ranges = value.partition(b"=")
    if not equals or unit.strip().lower() != b"bytes" or b"," in ranges:
        return Range.IGNORE
    first, dash, last = ranges.partition(b"-")
    if not dash:
        return Range.IGNORE
    # Lenient about blanks around the numbers, as Go's net/http is.
    first = first.strip()
    last = last.strip()
    if first:
        if not first.isdigit() or (last and not last.isdigit()):
            return Range.IGNORE
        start = _position(first)
        end = _position(last) if last else _HUGE
        if end < start:
            return Range.IGNORE
        if start >= size:
            return Range.UNSATISFIABLE
        return start, min(end + 1, size)
    if not last.isdigit():
        return Range.IGNORE
    suffix = _position(last)
    if suffix == 0 or size == 0:
        return Range.UNSATISFIABLE
    return max(size - suffix, 0), size


def _position(digits: bytes) -> int:
    """
    A byte position from ASCII digits, capped at L{_HUGE}.

    @param digits: One or more ASCII digits.
    @return: The number, or L{_HUGE} when it has more digits than any file size.
    """
    return _HUGE if len(digits) > 18 else int(digits)
