"""
Request routing with the pattern language and precedence rules of Go's C{net/http.ServeMux}
(Go 1.22 and later, as of Go 1.25).

A pattern is C{[METHOD ][HOST]/PATH}. C{{name}} matches one non-empty path segment,
C{{name...}} the rest of the path, C{{$}} only a trailing slash, and a trailing C{/} a whole
subtree. When several patterns match a request the most specific one wins; registering two
patterns where neither is more specific than the other but some request matches both is an
error (L{ConflictError}), so there is never a tie to break.

L{Mux.route} makes the whole C{ServeMux} decision for one request: path-cleaning and
trailing-slash redirects (301), the match with its wildcard values, 405 with C{Allow}, or 404.
Lookups walk a tree keyed by host, method and path segment; they never scan the list of
routes.

Paths are handled in their escaped form, as on the request line, and unescaped one segment at
a time, so C{%2F} stays inside its segment. Strings are expected to carry the raw bytes of the
request as C{str}; decoding the request-target with C{("utf-8", "surrogateescape")} makes raw
UTF-8 and percent-encoded UTF-8 match the same pattern, as they do in Go.
"""

from __future__ import annotations

import re
from typing import Generic, Literal, TypeAlias, TypeVar
from urllib.parse import quote, unquote_to_bytes

import attrs

__all__ = [
    "ConflictError",
    "Matched",
    "MethodNotAllowed",
    "Mux",
    "NotFound",
    "Pattern",
    "PatternError",
    "Redirect",
    "Relationship",
    "RouteResult",
    "Segment",
    "SegmentKind",
    "clean_path",
    "common_path",
    "compare_methods",
    "compare_paths",
    "compare_patterns",
    "conflicts",
    "describe_conflict",
    "difference_path",
    "go_quote",
    "parse_pattern",
    "path_segments",
    "split_request_target",
]

T = TypeVar("T")

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


class ConflictError(ValueError):
    """
    A pattern that conflicts with one already registered; C{str()} is Go's message without
    the C{(registered at FILE:LINE)} parts.

    @ivar pattern: The pattern being registered.
    @ivar existing: The registered pattern it conflicts with.
    """

    def __init__(self, pattern: Pattern, existing: Pattern) -> None:
        super().__init__(
            f"pattern {go_quote(pattern.text)} conflicts with pattern "
            f"{go_quote(existing.text)}:\n{describe_conflict(pattern, existing)}"
        )
        self.pattern = pattern
        self.existing = existing


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
        split = _split_path(path)
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
                    values[seg.value] = _unescape(remainder)
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


@attrs.frozen
class Matched(Generic[T]):
    """
    The request matched a pattern directly.

    @ivar target: What was registered with the pattern.
    @ivar pattern: The pattern that matched.
    @ivar params: Every named wildcard of the pattern mapped to its percent-decoded value.
    """

    target: T
    pattern: Pattern
    params: dict[str, str]


@attrs.frozen
class Redirect:
    """
    Answer 301 Moved Permanently.

    @ivar location: The C{Location} value: a relative reference (an absolute path plus the
        original query, if any), ASCII only.
    """

    location: str


@attrs.frozen
class NotFound:
    """
    Answer 404 Not Found.
    """


@attrs.frozen
class MethodNotAllowed:
    """
    Answer 405 Method Not Allowed.

    @ivar allow: The exact C{Allow} value: the methods that would match, sorted and joined
        with C{", "}, with C{HEAD} whenever C{GET} is among them.
    """

    allow: str


RouteResult: TypeAlias = Matched[T] | Redirect | NotFound | MethodNotAllowed
"""
What L{Mux.route} decides for one request.
"""

_NOT_FOUND = NotFound()


# Pattern parsing.

_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(_to_bytes(text))


def _to_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


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
            segments.append(Segment("literal", _unescape(seg)))
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


# Paths.

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _unescape(text: str) -> str:
    """
    Percent-decode C{text}, or return it unchanged when any escape in it is invalid.
    """
    if "%" not in text or _BAD_ESCAPE.search(text) is not None:
        return text
    return unquote_to_bytes(_to_bytes(text)).decode("utf-8", "surrogateescape")


def clean_path(path: str) -> str:
    """
    The canonical form of an escaped path, as Go's ServeMux computes it: rooted, with C{.}
    and C{..} segments resolved and repeated slashes merged, keeping a trailing slash.

    @param path: An escaped path; C{""} and relative paths are allowed.
    @return: The cleaned path, which always starts with C{/}.
    """
    if not path:
        return "/"
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "" or seg == ".":
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    cleaned = "/" + "/".join(out)
    if path[-1] == "/" and cleaned != "/":
        cleaned += "/"
    return cleaned


def _split_path(path: str) -> tuple[list[str], list[str], bool] | None:
    """
    Split an escaped path into its decoded segments, its raw segments, and whether it ends
    in a slash; L{None} for a non-empty path that does not start with C{/}.
    """
    if not path:
        return [], [], False
    if path[0] != "/":
        return None
    raw = path[1:].split("/")
    trailing = raw[-1] == ""
    if trailing:
        raw.pop()
    if "%" not in path:
        return raw, raw, trailing
    return [_unescape(s) for s in raw], raw, trailing


def path_segments(path: str) -> tuple[tuple[str, ...], bool]:
    """
    The segments a path is matched by: each percent-decoded on its own (so C{%2F} stays
    inside its segment), and whether the path ends in a slash.

    @param path: An escaped path starting with C{/}.
    @return: The decoded segments, and the trailing-slash flag.
    @raise ValueError: When C{path} is not empty and does not start with C{/}.
    """
    split = _split_path(path)
    if split is None:
        raise ValueError(f"path does not start with '/': {path!r}")
    return tuple(split[0]), split[2]


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def split_request_target(method: str, target: str) -> tuple[str, str, str]:
    """
    Split a raw request-target into the parts L{Mux.route} takes.

    An origin-form target (C{/p?q}) has no authority. An absolute-form target
    (C{http://h/p?q}) gives its authority, its path (possibly C{""}) and its query. A
    C{CONNECT} authority-form target (C{host:port}) gives the authority and an empty path.
    Anything else is taken as a relative path with an optional query.

    @param method: The request method.
    @param target: The request-target exactly as on the request line.
    @return: C{(authority, escaped path, raw query)}; the query excludes the C{?}.
    """
    if target[:1] == "/":
        path, _, query = target.partition("?")
        return "", path, query
    scheme = _SCHEME.match(target)
    if scheme is not None and target[scheme.end() : scheme.end() + 2] == "//":
        rest, _, query = target[scheme.end() + 2 :].partition("?")
        slash = rest.find("/")
        if slash < 0:
            return rest, "", query
        return rest[:slash], rest[slash:], query
    if method == "CONNECT":
        return target, "", ""
    if scheme is not None:
        _, _, query = target.partition("?")
        return "", "", query
    path, _, query = target.partition("?")
    return "", path, query


_LOCATION_PATH_SAFE = "!$&'()*+,;=:@/"
_LOCATION_QUERY_SAFE = "!\"$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def _location(path: str, query: str) -> str:
    """
    The Location of a redirect to the escaped C{path} with the raw C{query}: characters that
    may not appear in a URI are percent-encoded, and a segment whose escapes are invalid
    (and which is therefore matched as written) has its C{%} encoded too, so the redirected
    request matches the same segments.
    """
    parts = []
    for seg in path.split("/"):
        if _BAD_ESCAPE.search(seg) is not None:
            parts.append(quote(_to_bytes(seg), safe=_LOCATION_PATH_SAFE))
        else:
            parts.append(quote(_to_bytes(seg), safe=_LOCATION_PATH_SAFE + "%"))
    location = "/".join(parts)
    if query:
        location += "?" + quote(_to_bytes(query), safe=_LOCATION_QUERY_SAFE)
    return location


def _strip_port(host: str) -> str:
    """
    C{host} without a trailing C{:port}, following Go's C{net.SplitHostPort}: brackets
    around an IPv6 literal are removed with the port, and C{host} comes back unchanged when
    it does not split.
    """
    colon = host.rfind(":")
    if host[:1] == "[":
        end = host.find("]")
        if end < 0 or end + 1 != colon:
            return host
        name, after_open, after_close = host[1:end], 1, end + 1
    else:
        name, after_open, after_close = host[:colon], 0, 0
        if ":" in name:
            return host
    if "[" in host[after_open:] or "]" in host[after_close:]:
        return host
    return name


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
    Whether two patterns may not both be registered: they have the same host and match the
    same requests, or overlap with neither more specific than the other.
    """
    if p1.host != p2.host:
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


# The routing tree.


class _Entry(Generic[T]):
    __slots__ = ("multi_named", "names", "pattern", "target")

    def __init__(self, pattern: Pattern, target: T) -> None:
        self.pattern = pattern
        self.target = target
        self.names = pattern.wildcard_names
        last = pattern.segments[-1]
        self.multi_named = last.kind == "multi" and last.value != ""


class _Node(Generic[T]):
    """
    A position in the path: children by literal segment, one single-wildcard child, and
    the patterns that end here (exactly, with C{{$}}, or with a multi wildcard).
    """

    __slots__ = ("leaf", "literals", "multi", "slash", "wild")

    def __init__(self) -> None:
        self.literals: dict[str, _Node[T]] = {}
        self.wild: _Node[T] | None = None
        self.leaf: _Entry[T] | None = None
        self.slash: _Entry[T] | None = None
        self.multi: _Entry[T] | None = None


class _Methods(Generic[T]):
    """
    The trees of one host: one per method, and one for patterns without a method.
    """

    __slots__ = ("any", "by_method")

    def __init__(self) -> None:
        self.by_method: dict[str, _Node[T]] = {}
        self.any: _Node[T] | None = None


_Found: TypeAlias = tuple[_Entry[T], bool]


def _matched(entry: _Entry[T], values: list[str]) -> Matched[T]:
    if not values:
        return Matched(entry.target, entry.pattern, {})
    return Matched(entry.target, entry.pattern, dict(zip(entry.names, values, strict=True)))


def _match(
    node: _Node[T],
    segs: list[str],
    raw: list[str],
    i: int,
    trailing: bool,
    values: list[str],
) -> _Found[T] | None:
    """
    Match C{segs[i:]} below C{node}: literal children first, then the wildcard child, then
    the multi wildcard, backtracking on failure. Conflict detection at registration makes
    the first match found the most specific one.

    On success the wildcard values are appended to C{values}; on failure C{values} is left
    as it was. The flag in the result is whether the match is exact.
    """
    if i == len(segs):
        if not trailing:
            leaf = node.leaf
            return None if leaf is None else (leaf, True)
        entry = node.slash
        if entry is not None:
            return entry, True
        entry = node.multi
        if entry is None:
            return None
        if entry.multi_named:
            values.append("")
        return entry, True
    seg = segs[i]
    child = node.literals.get(seg)
    if child is not None:
        found = _match(child, segs, raw, i + 1, trailing, values)
        if found is not None:
            return found
    child = node.wild
    if child is not None and seg:
        values.append(seg)
        found = _match(child, segs, raw, i + 1, trailing, values)
        if found is not None:
            return found
        values.pop()
    entry = node.multi
    if entry is None:
        return None
    if entry.multi_named:
        remainder = "/".join(raw[i:])
        if trailing:
            remainder += "/"
        values.append(_unescape(remainder))
    return entry, False


def _match_methods(
    table: _Methods[T],
    method: str,
    segs: list[str],
    raw: list[str],
    trailing: bool,
    values: list[str],
) -> _Found[T] | None:
    node = table.by_method.get(method)
    if node is not None:
        found = _match(node, segs, raw, 0, trailing, values)
        if found is not None:
            return found
    if method == "HEAD":
        node = table.by_method.get("GET")
        if node is not None:
            found = _match(node, segs, raw, 0, trailing, values)
            if found is not None:
                return found
    node = table.any
    if node is not None:
        return _match(node, segs, raw, 0, trailing, values)
    return None


class Mux(Generic[T]):
    """
    A set of patterns, each with a target, and the ServeMux decision for requests.

    Registration is expected at load time; lookups do not scan the registered patterns.
    """

    def __init__(self) -> None:
        self._patterns: list[Pattern] = []
        self._by_host: dict[str, list[Pattern]] = {}
        self._hosts: dict[str, _Methods[T]] = {}
        self._hostless: _Methods[T] = _Methods()

    def patterns(self) -> list[Pattern]:
        """
        The registered patterns, in registration order.
        """
        return list(self._patterns)

    def register(self, pattern: str, target: T) -> Pattern:
        """
        Add a pattern.

        @param pattern: The pattern text.
        @param target: What a request matching the pattern is routed to.
        @return: The parsed pattern.
        @raise PatternError: When the pattern does not parse.
        @raise ConflictError: When the pattern conflicts with a registered one; the mux is
            left unchanged.
        """
        parsed = parse_pattern(pattern)
        same_host = self._by_host.setdefault(parsed.host, [])
        for existing in same_host:
            if conflicts(parsed, existing):
                raise ConflictError(parsed, existing)

        if parsed.host:
            table = self._hosts.get(parsed.host)
            if table is None:
                table = self._hosts[parsed.host] = _Methods()
        else:
            table = self._hostless
        if parsed.method:
            node = table.by_method.get(parsed.method)
            if node is None:
                node = table.by_method[parsed.method] = _Node()
        else:
            if table.any is None:
                table.any = _Node()
            node = table.any

        entry = _Entry(parsed, target)
        last = parsed.segments[-1]
        for seg in parsed.segments[:-1]:
            node = self._child(node, seg)
        if last.kind == "multi":
            slot = "multi"
        elif last.kind == "dollar":
            slot = "slash"
        else:
            node = self._child(node, last)
            slot = "leaf"
        if getattr(node, slot) is not None:
            raise RuntimeError(f"routing tree slot for {pattern!r} is taken")
        setattr(node, slot, entry)
        same_host.append(parsed)
        self._patterns.append(parsed)
        return parsed

    @staticmethod
    def _child(node: _Node[T], seg: Segment) -> _Node[T]:
        if seg.kind == "wildcard":
            if node.wild is None:
                node.wild = _Node()
            return node.wild
        child = node.literals.get(seg.value)
        if child is None:
            child = node.literals[seg.value] = _Node()
        return child

    def _find(
        self,
        host: str,
        method: str,
        segs: list[str],
        raw: list[str],
        trailing: bool,
        values: list[str],
    ) -> _Found[T] | None:
        if host:
            table = self._hosts.get(host)
            if table is not None:
                found = _match_methods(table, method, segs, raw, trailing, values)
                if found is not None:
                    return found
        return _match_methods(self._hostless, method, segs, raw, trailing, values)

    def _slash_redirect(self, host: str, method: str, segs: list[str], raw: list[str]) -> bool:
        """
        Whether the path with a slash appended matches some pattern exactly.
        """
        found = self._find(host, method, segs, raw, True, [])
        return found is not None and found[1]

    def lookup(self, method: str, host: str, path: str) -> Matched[T] | None:
        """
        Look up the routing tree alone: no cleaning, no port stripping, no redirects.

        @param method: The request method (case-sensitive).
        @param host: The host to match host patterns against, used as given.
        @param path: The escaped path, used as given.
        @return: The most specific match, or L{None}.
        """
        split = _split_path(path)
        if split is None:
            return None
        segs, raw, trailing = split
        values: list[str] = []
        found = self._find(host, method, segs, raw, trailing, values)
        if found is None:
            return None
        return _matched(found[0], values)

    def route(
        self,
        method: str,
        host: str,
        target_path: str,
        query: str = "",
        *,
        target_host: str = "",
    ) -> RouteResult[T]:
        """
        Decide what to answer to a request, as Go's C{ServeMux.ServeHTTP} does.

        For any method but C{CONNECT}: the port is stripped from C{host} and the path is
        cleaned. A path with no exact match whose slash-terminated form matches exactly is
        redirected there; then an unclean path is redirected to its clean form. Otherwise
        the most specific pattern for the host wins (host patterns first, then patterns
        without a host; the exact method, then C{GET} for a C{HEAD} request, then patterns
        without a method). Without a match, some pattern matching another method gives 405,
        else 404.

        C{CONNECT} paths are not cleaned and C{host} keeps its port. As in Go, the
        trailing-slash redirect and the 405 check for C{CONNECT} use C{target_host}.

        @param method: The request method, case-sensitive.
        @param host: The request's host: the C{Host} header, or the authority of an
            absolute-form target; may include a port; C{""} when there is none.
        @param target_path: The escaped path exactly as on the request line, without the
            query; C{""} for an absolute-form target without a path or for an
            authority-form C{CONNECT}.
        @param query: The raw query without the C{?}; C{""} when there is none.
        @param target_host: The authority of an absolute-form or authority-form
            request-target, C{""} for origin-form; consulted only for C{CONNECT}.
        @return: L{Matched}, L{Redirect} (301), L{MethodNotAllowed} (405) or L{NotFound}.
        """
        if method == "CONNECT":
            return self._route_connect(method, host, target_path, query, target_host)
        if ":" in host:
            host = _strip_port(host)
        path = target_path
        if path[:1] == "/" and "//" not in path and "/." not in path:
            clean = path
        else:
            clean = clean_path(path)
        raw = clean[1:].split("/")
        trailing = raw[-1] == ""
        if trailing:
            raw.pop()
        segs = raw if "%" not in clean else [_unescape(s) for s in raw]
        values: list[str] = []
        found = self._find(host, method, segs, raw, trailing, values)
        if (
            (found is None or not found[1])
            and not trailing
            and self._slash_redirect(host, method, segs, raw)
        ):
            return Redirect(_location(clean + "/", query))
        if clean != path:
            return Redirect(_location(clean, query))
        if found is not None:
            return _matched(found[0], values)
        return self._not_matched(host, segs, raw, trailing)

    def _route_connect(
        self, method: str, host: str, path: str, query: str, target_host: str
    ) -> RouteResult[T]:
        split = _split_path(path)
        if split is None:
            return _NOT_FOUND
        segs, raw, trailing = split
        found = self._find(target_host, method, segs, raw, trailing, [])
        if (
            (found is None or not found[1])
            and not trailing
            and self._slash_redirect(target_host, method, segs, raw)
        ):
            location = clean_path(path)
            if location[-1] != "/":
                location += "/"
            return Redirect(_location(location, query))
        values: list[str] = []
        found = self._find(host, method, segs, raw, trailing, values)
        if found is not None:
            return _matched(found[0], values)
        return self._not_matched(target_host, segs, raw, trailing)

    def _not_matched(
        self, host: str, segs: list[str], raw: list[str], trailing: bool
    ) -> MethodNotAllowed | NotFound:
        allowed: set[str] = set()
        tables = [self._hostless]
        if host:
            table = self._hosts.get(host)
            if table is not None:
                tables.append(table)
        for table in tables:
            for method, node in table.by_method.items():
                if method in allowed:
                    continue
                if _match(node, segs, raw, 0, trailing, []) is not None or (
                    not trailing and _match(node, segs, raw, 0, True, []) is not None
                ):
                    allowed.add(method)
        if not allowed:
            return _NOT_FOUND
        if "GET" in allowed:
            allowed.add("HEAD")
        return MethodNotAllowed(", ".join(sorted(allowed)))

    def matches_directly(
        self, method: str, host: str, target_path: str, *, target_host: str = ""
    ) -> bool:
        """
        Whether L{route} would answer with a match rather than a redirect, 404 or 405.

        @param method: As for L{route}.
        @param host: As for L{route}.
        @param target_path: As for L{route}.
        @param target_host: As for L{route}.
        """
        return isinstance(self.route(method, host, target_path, target_host=target_host), Matched)


# Go string quoting.

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """
    C{text} as Go's C{%q} (C{strconv.Quote}) writes it: double-quoted, with backslash
    escapes for quotes, backslashes and unprintable characters. Surrogate escapes of raw
    bytes come out as C{\\xNN}, like invalid UTF-8 in Go.
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = ['"']
    for c in text:
        escaped = _GO_ESCAPES.get(c)
        if escaped is not None:
            out.append(escaped)
            continue
        code = ord(c)
        if 0xD800 <= code <= 0xDFFF:
            out.extend(f"\\x{b:02x}" for b in _to_bytes(c))
        elif c.isprintable():
            out.append(c)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
