"""
The routing tree of Go's C{net/http.ServeMux}: registration with conflict detection, and
the whole C{ServeMux} decision for one request.

L{Mux.route} makes that decision: path-cleaning and trailing-slash redirects (301), the match
with its wildcard values, 405 with C{Allow}, or 404. Lookups walk a tree keyed by host,
method and path segment; they never scan the list of routes.
"""

from __future__ import annotations

from typing import Generic, TypeAlias, TypeVar

import attrs

from edgegw.routing.goquote import go_quote
from edgegw.routing.hosts import MAX_REMEMBERED_HOST, host_key
from edgegw.routing.paths import clean_path, redirect_location, split_path, unescape
from edgegw.routing.pattern import (
    Pattern,
    Segment,
    conflicts,
    describe_conflict,
    parse_pattern,
)

__all__ = [
    "ConflictError",
    "Matched",
    "MethodNotAllowed",
    "Mux",
    "NotFound",
    "Redirect",
    "RouteResult",
]

T = TypeVar("T")


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


_MAX_HOST_KEYS = 4096
"""Request hosts whose key a mux remembers (emptied when full: hosts are the client's)."""


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
        values.append(unescape(remainder))
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
        # Path depths (segments before the last) of the patterns that can match a path
        # ending in a slash exactly (a subtree root, {$}): only a path that deep can be
        # redirected to its slash form, so other paths skip that second look-up.
        self._slash_depths: set[int] = set()
        # Request host (maybe with a port) -> the spelling host patterns are keyed by.
        self._host_keys: dict[str, str] = {}

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
        host = host_key(parsed.host)
        same_host = self._by_host.setdefault(host, [])
        for existing in same_host:
            if conflicts(parsed, existing):
                raise ConflictError(parsed, existing)

        if host:
            table = self._hosts.get(host)
            if table is None:
                table = self._hosts[host] = _Methods()
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
            self._slash_depths.add(len(parsed.segments) - 1)
        elif last.kind == "dollar":
            slot = "slash"
            self._slash_depths.add(len(parsed.segments) - 1)
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
        @param host: The host to match host patterns against, lowercase and without a
            trailing dot (L{host_key}); no port.
        @param path: The escaped path, used as given.
        @return: The most specific match, or L{None}.
        """
        split = split_path(path)
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

        For any method but C{CONNECT}: the port is stripped from C{host}, which is then
        matched case-insensitively and without a trailing dot (RFC 9110 section 4.2.3; Go
        compares hosts byte for byte), and the path is cleaned. A path with no exact match
        whose slash-terminated form matches exactly is redirected there; then an unclean
        path is redirected to its clean form. Otherwise the most specific pattern for the
        host wins (host patterns first, then patterns without a host; the exact method,
        then C{GET} for a C{HEAD} request, then patterns without a method). Without a
        match, some pattern matching another method gives 405, else 404.

        Paths are taken with Go's semantics (an encoded slash stays inside its segment);
        the edge applies C{encodedSlashes} before the mux sees a path.

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
        if host:
            keyed = self._host_keys.get(host)
            if keyed is None:
                keyed = host_key(_strip_port(host)) if ":" in host else host_key(host)
                if len(host) <= MAX_REMEMBERED_HOST:
                    if len(self._host_keys) >= _MAX_HOST_KEYS:
                        self._host_keys.clear()
                    self._host_keys[host] = keyed
            host = keyed
        path = target_path
        if path[:1] == "/" and "//" not in path and "/." not in path:
            clean = path
        else:
            clean = clean_path(path)
        raw = clean[1:].split("/")
        trailing = raw[-1] == ""
        if trailing:
            raw.pop()
        segs = raw if "%" not in clean else [unescape(s) for s in raw]
        values: list[str] = []
        found = self._find(host, method, segs, raw, trailing, values)
        if (
            (found is None or not found[1])
            and not trailing
            and len(segs) in self._slash_depths
            and self._slash_redirect(host, method, segs, raw)
        ):
            return Redirect(redirect_location(clean + "/", query))
        if clean != path:
            return Redirect(redirect_location(clean, query))
        if found is not None:
            return _matched(found[0], values)
        return self._not_matched(host, segs, raw, trailing)

    def _route_connect(
        self, method: str, host: str, path: str, query: str, target_host: str
    ) -> RouteResult[T]:
        split = split_path(path)
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
            return Redirect(redirect_location(location, query))
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
