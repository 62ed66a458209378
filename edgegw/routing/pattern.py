"""
The pattern language of Go's C{net/http.ServeMux} (Go 1.22 and later, as of Go 1.25):
parsing, and how the requests two patterns match relate.

A pattern is C{[METHOD ][HOST]/PATH}. C{{name}} matches one non-empty path segment,
C{{name...}} the rest of the path, C{{$}} only a trailing slash, and a trailing C{/} a whole
subtree. When several patterns match a request the most specific one wins; two patterns where
neither is more specific than the other but some request matches both conflict (L{conflicts}),
and the mux refuses to register the second.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import attrs

from edgegw.routing.goquote import go_quote
from edgegw.routing.hosts import host_key
from edgegw.routing.paths import clean_path, split_path, to_bytes, unescape

__all__ = [
    "Pattern",
    "PatternError",
    "Relationship",
    "Segment",
    "SegmentKind",
    "common_path",
    "compare_methods",
    "compare_paths",
    "compare_patterns",
    "conflicts",
    "describe_conflict",
    "difference_path",
    "parse_pattern",
]

SegmentKind: TypeAlias = Literal["literal", "wildcard", "multi", "dollar"]
"""
The kinds of pattern segment: a literal, C{{name}}, C{{name...}} (or the anonymous multi
wildcard a trailing slash stands for), and C{{$}}.
"""

Relationship: TypeAlias = Literal[
    "equivalent", "more_specific", "more_general", "overlaps", "disjoint"
]
"""
How the set of requests one pattern matches relates to another's, read as "p1 is ... p2".
"""


class PatternError(ValueError):
    """
    A pattern that does not parse; C{str()} is Go's message, for example
    C{parsing "/{a...}/x": at offset 1: {...} wildcard not at end}.

    @ivar pattern: The pattern as given.
    @ivar offset: The byte offset Go reports, or L{None} for the empty pattern.
    @ivar reason: The message without the C{parsing ...: at offset N: } prefix.
    """

    def __init__(self, pattern: str, offset: int | None, reason: str) -> None:
        if offset is None:
            message = "http: invalid pattern"
        else:
            message = f"parsing {go_quote(pattern)}: at offset {offset}: {reason}"
        super().__init__(message)
        self.pattern = pattern
        self.offset = offset
        self.reason = reason


@attrs.frozen
class Segment:
    """
    One segment of a parsed pattern's path.

    @ivar kind: C{"literal"}, C{"wildcard"} (C{{name}}), C{"multi"} (C{{name...}}, or the
        anonymous one a trailing slash stands for) or C{"dollar"} (C{{$}}).
    @ivar value: The percent-decoded text of a literal; the name of a wildcard or multi
        wildcard (C{""} for the anonymous multi wildcard); C{""} for C{{$}}.
    """

    kind: SegmentKind
    value: str = ""


@attrs.frozen
class Pattern:
    """
    A parsed pattern; make one with L{parse_pattern}.

    @ivar text: The pattern exactly as written.
    @ivar method: The method, or C{""} for any method.
    @ivar host: The host, or C{""} for any host.
    @ivar segments: The path, one L{Segment} per segment.
    @ivar wildcard_names: The names of the named wildcards, in path order: the keys of a
        match's parameters.
    """

    text: str
    method: str
    host: str
    segments: tuple[Segment, ...]
    wildcard_names: tuple[str, ...]

    def __str__(self) -> str:
        return self.text

    def match_path(self, path: str) -> tuple[dict[str, str], bool] | None:
        """
        Match this pattern's path alone against an escaped request path, as the mux does
        after cleaning (method and host are not considered).

        @param path: The escaped path.
        @return: The wildcard values and whether the match is exact (no multi wildcard
            matched a non-empty remainder), or L{None} when the path does not match.
        """
        split = split_path(path)
        if split is None:
            return None
        segs, raw, trailing = split
        n = len(segs)
        values: dict[str, str] = {}
        for i, seg in enumerate(self.segments):
            kind = seg.kind
            if kind == "multi":
                if i < n:
                    remainder = "/".join(raw[i:]) + ("/" if trailing else "")
                    exact = False
                elif trailing:
                    remainder = ""
                    exact = True
                else:
                    return None
                if seg.value:
                    values[seg.value] = unescape(remainder)
                return values, exact
            if kind == "dollar":
                return (values, True) if i == n and trailing else None
            if i >= n:
                return None
            if kind == "literal":
                if segs[i] != seg.value:
                    return None
            elif segs[i] == "":
                return None
            else:
                values[seg.value] = segs[i]
        if n == len(self.segments) and not trailing:
            return values, True
        return None


_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(to_bytes(text))


def _valid_wildcard_name(name: str) -> bool:
    # A Go identifier: a letter or "_", then letters, digits or "_".
    for i, c in enumerate(name):
        if not (c.isalpha() or c == "_" or (i > 0 and c.isdecimal())):
            return False
    return name != ""


def parse_pattern(text: str) -> Pattern:
    """
    Parse a pattern of the form C{[METHOD ][HOST]/PATH}.

    One or more spaces or tabs separate the method from the rest. Literal path segments are
    percent-decoded one at a time (a segment with an invalid escape stays as written);
    wildcard names are not.

    @param text: The pattern.
    @return: The parsed pattern.
    @raise PatternError: When C{text} is not a valid pattern; the message is Go's.
    """
    if not text:
        raise PatternError(text, None, "empty pattern")
    cut = len(text)
    for sep in (" ", "\t"):
        at = text.find(sep)
        if 0 <= at < cut:
            cut = at
    if cut < len(text):
        method = text[:cut]
        rest = text[cut + 1 :].lstrip(" \t")
        base = _utf8_len(method) + 1
    else:
        method = ""
        rest = text
        base = 0
    if method and not all(c in _TOKEN_CHARS for c in method):
        raise PatternError(text, 0, f"invalid method {go_quote(method)}")
    slash = rest.find("/")
    if slash < 0:
        raise PatternError(text, base, "host/path missing /")
    host, path = rest[:slash], rest[slash:]
    brace = host.find("{")
    if brace >= 0:
        raise PatternError(
            text, base + _utf8_len(host[:brace]), "host contains '{' (missing initial '/'?)"
        )
    if method not in ("", "CONNECT") and path != clean_path(path):
        raise PatternError(
            text,
            base + _utf8_len(host),
            "non-CONNECT pattern with unclean path can never match",
        )

    segments: list[Segment] = []
    names: list[str] = []
    rest = path
    while rest:
        rest = rest[1:]
        offset = _utf8_len(text[: len(text) - len(rest)])
        if not rest:
            segments.append(Segment("multi"))
            break
        end = rest.find("/")
        if end < 0:
            end = len(rest)
        seg, rest = rest[:end], rest[end:]
        brace = seg.find("{")
        if brace < 0:
            segments.append(Segment("literal", unescape(seg)))
            continue
        if brace != 0:
            raise PatternError(text, offset, "bad wildcard segment (must start with '{')")
        if seg[-1] != "}":
            raise PatternError(text, offset, "bad wildcard segment (must end with '}')")
        name = seg[1:-1]
        if name == "$":
            if rest:
                raise PatternError(text, offset, "{$} not at end")
            segments.append(Segment("dollar"))
            break
        multi = name.endswith("...")
        if multi:
            name = name[:-3]
            if rest:
                raise PatternError(text, offset, "{...} wildcard not at end")
        if not name:
            raise PatternError(text, offset, "empty wildcard")
        if not _valid_wildcard_name(name):
            raise PatternError(text, offset, f"bad wildcard name {go_quote(name)}")
        if name in names:
            raise PatternError(text, offset, f"duplicate wildcard name {go_quote(name)}")
        names.append(name)
        segments.append(Segment("multi" if multi else "wildcard", name))
    return Pattern(text, method, host, tuple(segments), tuple(names))


# Relationships and conflicts.


def _combine(r1: Relationship, r2: Relationship) -> Relationship:
    if r1 == "equivalent":
        return r2
    if r1 == "disjoint" or r2 == "disjoint":
        return "disjoint"
    if r2 == "equivalent" or r2 == r1:
        return r1
    return "overlaps"


def compare_methods(p1: Pattern, p2: Pattern) -> Relationship:
    """
    Compare the sets of methods two patterns match.

    A pattern without a method is more general than one with a method, and C{GET} is more
    general than C{HEAD}; other different methods are disjoint.

    @return: How C{p1}'s methods relate to C{p2}'s.
    """
    m1, m2 = p1.method, p2.method
    if m1 == m2:
        return "equivalent"
    if m1 == "":
        return "more_general"
    if m2 == "":
        return "more_specific"
    if m1 == "GET" and m2 == "HEAD":
        return "more_general"
    if m1 == "HEAD" and m2 == "GET":
        return "more_specific"
    return "disjoint"


def _compare_segments(s1: Segment, s2: Segment) -> Relationship:
    k1, k2 = s1.kind, s2.kind
    if k1 == "multi":
        return "equivalent" if k2 == "multi" else "more_general"
    if k2 == "multi":
        return "more_specific"
    if k1 == "dollar" or k2 == "dollar":
        return "equivalent" if k1 == k2 else "disjoint"
    if k1 == "wildcard":
        if k2 == "wildcard":
            return "equivalent"
        # A wildcard never matches an empty segment.
        return "more_general" if s2.value else "disjoint"
    if k2 == "wildcard":
        return "more_specific" if s1.value else "disjoint"
    return "equivalent" if s1.value == s2.value else "disjoint"


def compare_paths(p1: Pattern, p2: Pattern) -> Relationship:
    """
    Compare the sets of paths two patterns match.

    @return: How C{p1}'s paths relate to C{p2}'s.
    """
    segs1, segs2 = p1.segments, p2.segments
    multi1 = segs1[-1].kind == "multi"
    multi2 = segs2[-1].kind == "multi"
    if len(segs1) != len(segs2) and not multi1 and not multi2:
        return "disjoint"
    rel: Relationship = "equivalent"
    for s1, s2 in zip(segs1, segs2, strict=False):
        rel = _combine(rel, _compare_segments(s1, s2))
        if rel == "disjoint":
            return rel
    if len(segs1) == len(segs2):
        return rel
    if len(segs1) < len(segs2) and multi1:
        return _combine(rel, "more_general")
    if len(segs2) < len(segs1) and multi2:
        return _combine(rel, "more_specific")
    return "disjoint"


def compare_patterns(p1: Pattern, p2: Pattern) -> Relationship:
    """
    Compare the sets of requests two patterns match, by method and path (not by host).

    @return: How C{p1} relates to C{p2}.
    """
    methods = compare_methods(p1, p2)
    if methods == "disjoint":
        return methods
    return _combine(methods, compare_paths(p1, p2))


def conflicts(p1: Pattern, p2: Pattern) -> bool:
    """
    Whether two patterns may not both be registered: they have the same host (compared as
    requests are matched: case-insensitively, without a trailing dot) and match the same
    requests, or overlap with neither more specific than the other.
    """
    if p1.host != p2.host and host_key(p1.host) != host_key(p2.host):
        return False
    return compare_patterns(p1, p2) in ("equivalent", "overlaps")


def _write_segment(out: list[str], seg: Segment) -> None:
    out.append("/")
    if seg.kind in ("literal", "wildcard"):
        out.append(seg.value)


def common_path(p1: Pattern, p2: Pattern) -> str:
    """
    An example path that both patterns match, for conflict messages.

    @param p1: A pattern that overlaps with C{p2}.
    @param p2: The other pattern.
    """
    out: list[str] = []
    segs1, segs2 = p1.segments, p2.segments
    for i, (s1, s2) in enumerate(zip(segs1, segs2, strict=False)):
        if s1.kind == "multi" and s2.kind == "multi":
            out.append("/")
            break
        if s2.kind == "multi":
            for seg in segs1[i:]:
                _write_segment(out, seg)
            break
        if s1.kind == "multi":
            for seg in segs2[i:]:
                _write_segment(out, seg)
            break
        _write_segment(out, s2 if s1.kind == "wildcard" else s1)
    return "".join(out)


def difference_path(p1: Pattern, p2: Pattern) -> str:
    """
    An example path that C{p1} matches and C{p2} does not, for conflict messages.

    @param p1: A pattern that overlaps with C{p2}.
    @param p2: The other pattern.
    """
    out: list[str] = []
    segs1, segs2 = p1.segments, p2.segments
    for s1, s2 in zip(segs1, segs2, strict=False):
        if s1.kind == "multi":
            out.append("/")
            if s2.kind == "dollar":
                # After the trailing slash, any segment escapes s2; prefer the name.
                out.append(s1.value or "x")
            return "".join(out)
        if s1.kind == "wildcard" and s2.kind == "literal" and s1.value == s2.value:
            out.append("/" + s2.value + "x")
        else:
            _write_segment(out, s1)
    shorter = min(len(segs1), len(segs2))
    for seg in (segs1 if len(segs1) > len(segs2) else segs2)[shorter:]:
        _write_segment(out, seg)
    return "".join(out)


def describe_conflict(new: Pattern, existing: Pattern) -> str:
    """
    Go's explanation of why two conflicting patterns conflict, naming C{new} first.
    """
    methods = compare_methods(new, existing)
    paths = compare_paths(new, existing)
    if _combine(methods, paths) == "equivalent":
        return f"{new} matches the same requests as {existing}"
    if paths == "overlaps":
        return (
            f"{new} and {existing} both match some paths, like "
            f"{go_quote(common_path(new, existing))}.\n"
            "But neither is more specific than the other.\n"
            f"{new} matches {go_quote(difference_path(new, existing))}, "
            f"but {existing} doesn't.\n"
            f"{existing} matches {go_quote(difference_path(existing, new))}, "
            f"but {new} doesn't."
        )
    if methods == "more_general" and paths == "more_specific":
        return f"{new} matches more methods than {existing}, but has a more specific path pattern"
    if methods == "more_specific" and paths == "more_general":
        return f"{new} matches fewer methods than {existing}, but has a more general path pattern"
    return f"{new} and {existing} do not conflict"
