"""
Group names from a token's group claim: RFC 4514 distinguished names filtered by
C{identity.groups.match}, rendered as their C{cn} or whole, and stripped of prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from edgegw.config.model import GroupsSpec

# A hostile or broken token must not cost seconds of parsing: only this many items of the
# source claim are looked at, and longer items are ignored.
MAX_ITEMS = 1000
MAX_ITEM_LENGTH = 4096

# One attributeTypeAndValue of RFC 4514 and the separator after it. The type is a descr
# or a numericoid; the value either a hexstring (BER, "#" and hex pairs) or a string of
# unescaped characters other than the specials, escaped specials and hex pairs. The
# possessive quantifiers keep a failing match linear.
_AVA = re.compile(
    r" *+(?P<type>[A-Za-z][A-Za-z0-9-]*+|(?:0|[1-9][0-9]*+)(?:\.(?:0|[1-9][0-9]*+))++)"
    r" *+= *+"
    r"(?:(?P<hex>#(?:[0-9A-Fa-f]{2})++) *+"
    r'|(?P<string>(?!#)(?:[^"+,;<>\\\x00]++|\\(?:[0-9A-Fa-f]{2}|["+,;<>\\ #=]))*+))'
    r"(?P<separator>[,+]|\Z)"
)
# One piece of an escaped string value: a run of unescaped characters, a run of hex pairs
# (decoded together, as UTF-8), or an escaped special character.
_PIECE = re.compile(r"([^\\]++)|((?:\\[0-9A-Fa-f]{2})++)|\\(.)", re.DOTALL)


def parse_dn(dn: str) -> list[list[tuple[str, str]]] | None:
    """
    Parse an RFC 4514 distinguished name.

    Attribute types are lowercased; values are unescaped (C{\\,}, C{\\2C}, runs of hex
    pairs as UTF-8) with their unescaped leading and trailing spaces trimmed. A value
    written as C{#} and hex pairs (BER) is kept as written. Spaces around C{,}, C{+} and
    C{=} are tolerated.

    @param dn: The distinguished name, e.g. C{cn=Admins,ou=Groups,dc=example,dc=com}.
    @return: The RDNs, leftmost first, each a list of (attribute type, value) pairs (more
        than one for a multi-valued RDN); or L{None} when C{dn} is empty or malformed.
    """
    rdns: list[list[tuple[str, str]]] = []
    rdn: list[tuple[str, str]] = []
    at = 0
    while True:
        match = _AVA.match(dn, at)
        if match is None:
            return None
        attribute, hexstring, string, separator = match.group("type", "hex", "string", "separator")
        if hexstring is not None:
            value = hexstring
        elif "\\" in string:
            unescaped = _unescape(string)
            if unescaped is None:
                return None
            value = unescaped
        else:
            value = string.rstrip(" ")
        rdn.append((attribute.lower(), value))
        if not separator:
            rdns.append(rdn)
            return rdns
        if separator == ",":
            rdns.append(rdn)
            rdn = []
        at = match.end()


def _unescape(string: str) -> str | None:
    """
    A well-formed escaped string value without its escapes and its unescaped trailing
    spaces, or L{None} when its hex pairs are not UTF-8.
    """
    pieces: list[str] = []
    length = 0
    # The length of the value without its unescaped trailing spaces.
    keep = 0
    for match in _PIECE.finditer(string):
        plain, hexpairs, escaped = match.groups()
        if plain is not None:
            piece = plain
            kept = len(plain.rstrip(" "))
            if kept:
                keep = length + kept
        else:
            if hexpairs is not None:
                try:
                    piece = bytes.fromhex(hexpairs.replace("\\", "")).decode("utf-8")
                except UnicodeDecodeError:
                    return None
            else:
                piece = escaped
            keep = length + len(piece)
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)[:keep]


def _first_cn(dn: str) -> str | None:
    """
    The value of the first C{cn} in the leftmost RDN that has one, or L{None} when C{dn}
    is malformed or has none.
    """
    rdns = parse_dn(dn)
    if rdns is None:
        return None
    for rdn in rdns:
        for attribute, value in rdn:
            if attribute == "cn":
                return value
    return None


class GroupRenderer:
    """
    Renders the group names of a caller from its claims, as C{identity.groups} says.
    """

    def __init__(self, spec: GroupsSpec) -> None:
        """
        @param spec: The C{identity.groups} configuration.
        """
        self._source = spec.source
        self._patterns = tuple(pattern.lower() for pattern in spec.match)
        self._cn = spec.render == "cn"
        # An empty prefix would remove nothing yet shadow every prefix after it.
        self._prefixes = tuple(prefix.lower() for prefix in spec.strip if prefix)

    def render(self, claims: Mapping[str, object]) -> tuple[str, ...]:
        """
        The rendered group names: the source claim's DNs that contain a C{match} pattern,
        rendered, stripped of their first matching prefix, without empty names and
        duplicates, in claim order.

        @param claims: The caller's claims (token merged with userinfo).
        @return: The group names; empty without a source, a usable source claim or a
            C{match} pattern.
        """
        if self._source is None or not self._patterns:
            return ()
        value = claims.get(self._source)
        if isinstance(value, str):
            items: list[object] | tuple[object, ...] = [value]
        elif isinstance(value, list | tuple):
            items = value[:MAX_ITEMS]
        else:
            return ()
        seen: set[str] = set()
        groups: list[str] = []
        for item in items:
            if not isinstance(item, str) or len(item) > MAX_ITEM_LENGTH:
                continue
            name = self._render_one(item)
            if name and name not in seen:
                seen.add(name)
                groups.append(name)
        return tuple(groups)

    def _render_one(self, dn: str) -> str | None:
        """
        One DN's group name, or L{None} when it does not match or has no name.
        """
        lowered = dn.lower()
        if not any(pattern in lowered for pattern in self._patterns):
            return None
        name = _first_cn(dn) if self._cn else dn.strip()
        if name is None:
            return None
        for prefix in self._prefixes:
            if name[: len(prefix)].lower() == prefix:
                return name[len(prefix) :]
        return name
