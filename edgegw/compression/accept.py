"""
C{Accept-Encoding} (RFC 9110 section 12.5.3): which of the codings the gateway offers a
client accepts, best first.

A coding is acceptable when the client lists it (or C{x-gzip} for C{gzip}) with a q-value
above 0, or lists C{*} above 0 and not the coding itself. The client's q-values decide;
ties go to the gateway's own order. A q-value that does not parse (C{q=high}, C{q=2})
makes its element unacceptable, and a coding listed twice gets the lower of its two: the
gateway never compresses with a coding the client may not have asked for. No
C{Accept-Encoding} field, or an empty one, accepts none (the body goes as it is). A
client that lists C{identity} with a q-value is not sent a coding it ranks lower (a tie
goes to the coding). Parameters other than C{q} are ignored. A field over 1 KiB is not
read at all (the body goes as it is).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["AcceptedCodings"]

_QVALUE: Final = re.compile(rb"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)\Z")
_ALIASES: Final = {b"x-gzip": b"gzip"}
_CACHE_SIZE: Final = 256
_CACHED_LENGTH: Final = 256
_LONGEST: Final = 1024


def _qvalue(parameters: list[bytes]) -> float:
    for parameter in parameters:
        name, equals, value = parameter.partition(b"=")
        if name.strip().lower() == b"q":
            value = value.strip()
            if not equals or not _QVALUE.match(value):
                return 0.0
            return float(value)
    return 1.0


class AcceptedCodings:
    """
    Ranks a fixed list of offered codings against clients' C{Accept-Encoding} fields.

    The answers for recent field values are kept (browsers send a handful of distinct
    values), up to a bound.
    """

    def __init__(self, offered: Sequence[str]) -> None:
        """
        @param offered: The codings the gateway may use, its preferred first.
        """
        self.offered = tuple(offered)
        self._tokens = tuple(name.encode("ascii") for name in self.offered)
        self._cache: dict[bytes, tuple[str, ...]] = {}

    def ranked(self, values: Sequence[bytes] | None) -> tuple[str, ...]:
        """
        The offered codings the client accepts, best first.

        @param values: The request's C{Accept-Encoding} field values, if any.
        """
        if not values:
            return ()
        field = values[0] if len(values) == 1 else b",".join(values)
        cache = self._cache
        answer = cache.get(field)
        if answer is None:
            if len(field) > _LONGEST:
                # Browsers send a few dozen bytes; thousands of elements to parse on every
                # request are someone's attempt at the gateway's CPU: the body as it is.
                return ()
            answer = self._rank(field)
            if len(field) <= _CACHED_LENGTH:
                if len(cache) >= _CACHE_SIZE:
                    cache.clear()
                cache[field] = answer
        return answer

    def best(self, values: Sequence[bytes] | None) -> str | None:
        """
        The offered coding the client prefers, or L{None} (the body goes as it is).
        """
        ranked = self.ranked(values)
        return ranked[0] if ranked else None

    def _rank(self, field: bytes) -> tuple[str, ...]:
        listed: dict[bytes, float] = {}
        star: float | None = None
        identity: float | None = None
        for element in field.split(b","):
            coding, *parameters = element.split(b";")
            coding = coding.strip().lower()
            if not coding:
                continue
            q = _qvalue(parameters)
            if coding == b"*":
                star = q
                continue
            if coding == b"identity":
                identity = q if identity is None else min(q, identity)
                continue
            coding = _ALIASES.get(coding, coding)
            # Listed twice: the lower q-value counts (q=0 anywhere refuses it).
            listed[coding] = min(q, listed.get(coding, q))
        scored = []
        for position, token in enumerate(self._tokens):
            accepted = listed.get(token, star)
            if accepted is not None and accepted > 0:
                scored.append((-accepted, position))
        if identity is not None:
            # The body as it is, preferred to codings the client ranks lower.
            scored = [entry for entry in scored if -entry[0] >= identity]
        scored.sort()
        return tuple(self.offered[position] for _, position in scored)
