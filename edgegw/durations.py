"""
Go-style duration strings: C{"500ms"}, C{"60s"}, C{"1h30m"}, C{"1.5h"}.
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """
    Parse a duration the way Go's C{time.ParseDuration} does, into seconds.

    A sign is allowed; C{"0"} needs no unit; every other number needs one.

    @raise ValueError: C{text} is not a duration.
    """
    body = text
    sign = 1.0
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    position = 0
    while position < len(body):
        part = _PART.match(body, position)
        if part is None:
            if re.match(r"\d+\.?\d*\Z", body[position:]):
                raise ValueError(f"missing unit in duration {text!r}")
            raise ValueError(f"invalid duration {text!r}")
        total += float(part.group(1)) * _UNITS[part.group(2)]
        position = part.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """
    A compact Go-like rendering, for the route table (C{90.0} -> C{"1m30s"}).
    """
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    fraction = seconds - whole
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs or fraction or not out:
        out += f"{secs + fraction:g}s"
    return out
