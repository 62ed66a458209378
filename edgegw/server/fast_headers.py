"""
Header look-ups and sets without Twisted's per-call name encoding.

A proxied request asks its headers for ~17 values and sets ~7; each
L{Headers.getRawHeaders} call encodes the name through Twisted's name encoder (a method
call and a cache look-up) and each L{Headers.setRawHeaders} sanitises every value (split
into lines and joined again). L{GatewayHeaders} does the same with a module-level cache
of canonical names and a check that a value holds no line break, for C{bytes} names and
values; anything else (C{str} names or values, a value with a line break, a name not
seen before) takes Twisted's own method, which also refuses an invalid name as Twisted
does.

It writes into C{Headers._rawHeaders}, Twisted's private dict of canonical name to
values, as the projection stage does: at import a probe checks that the dict is still
there and shaped so, and without it L{GatewayHeaders} is plain L{Headers}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.web.http_headers import Headers

from edgegw.header_names import RAW_DICT_WRITABLE, canonical_name
from edgegw.header_names import canonical_names as _canonical

if RAW_DICT_WRITABLE:

    class GatewayHeaders(Headers):
        """
        L{Headers} with look-ups, sets, additions and removals of C{bytes} names that
        skip the name encoder (~0.1 µs a look-up, ~0.3 µs a set).
        """

        __slots__ = ()

        def hasHeader(self, name: Any) -> bool:
            if type(name) is bytes:
                return (_canonical.get(name) or canonical_name(name)) in self._rawHeaders
            return Headers.hasHeader(self, name)

        def removeHeader(self, name: Any) -> None:
            if type(name) is bytes:
                self._rawHeaders.pop(_canonical.get(name) or canonical_name(name), None)
            else:
                Headers.removeHeader(self, name)

        def addRawHeader(self, name: Any, value: Any) -> None:
            # Every field of a request head comes this way (~0.3 µs a field saved).
            if type(name) is bytes and type(value) is bytes and 10 not in value and 13 not in value:
                canonical = _canonical.get(name) or canonical_name(name)
                values = self._rawHeaders.get(canonical)
                if values is None:
                    self._rawHeaders[canonical] = [value]
                else:
                    values.append(value)
                return
            Headers.addRawHeader(self, name, value)

        def getRawHeaders(self, name: Any, default: Any = None) -> Any:
            if type(name) is bytes:
                canonical = _canonical.get(name) or canonical_name(name)
                return self._rawHeaders.get(canonical) or default
            return Headers.getRawHeaders(self, name, default)

        def setRawHeaders(self, name: Any, values: Sequence[Any]) -> None:
            # A list only: the check below reads the values once, and an iterator handed
            # on to Headers after it would have lost them.
            if type(name) is bytes and type(values) is list:
                canonical = _canonical.get(name) or canonical_name(name)
                kept = []
                for value in values:
                    # LF and CR as ints: membership of an int is a byte scan (~12 ns),
                    # of a bytes object a substring search (~100 ns).
                    if type(value) is not bytes or 10 in value or 13 in value:
                        break
                    kept.append(value)
                else:
                    self._rawHeaders[canonical] = kept
                    return
            Headers.setRawHeaders(self, name, values)

else:  # pragma: no cover - a Twisted whose Headers is built otherwise

    class GatewayHeaders(Headers):  # type: ignore[no-redef]
        """
        Plain L{Headers}: this Twisted's C{Headers} has no C{_rawHeaders} dict.
        """

        __slots__ = ()
