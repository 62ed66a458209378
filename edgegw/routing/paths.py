"""
Request paths as Go's C{net/http.ServeMux} sees them: cleaning, splitting into segments,
splitting a request-target, and the C{Location} of a redirect.

Paths are handled in their escaped form, as on the request line, and unescaped one segment at
a time, so C{%2F} stays inside its segment. Strings are expected to carry the raw bytes of the
request as C{str}; decoding the request-target with C{("utf-8", "surrogateescape")} makes raw
UTF-8 and percent-encoded UTF-8 match the same pattern, as they do in Go.
"""

from __future__ import annotations

import re
from typing import Literal, TypeAlias
from urllib.parse import quote, unquote_to_bytes

__all__ = [
    "ENCODED_SLASH_MODES",
    "EncodedSlashes",
    "clean_path",
    "has_dot_segment",
    "path_segments",
    "redirect_location",
    "split_path",
    "split_request_target",
    "to_bytes",
    "unescape",
    "vet_path",
]

EncodedSlashes: TypeAlias = Literal["reject", "decode", "keep"]
"""
What a request path with an encoded slash (C{%2F}) gets: refused, decoded into a real
separator before routing, or kept inside its segment (Go's semantics).
"""

ENCODED_SLASH_MODES: tuple[EncodedSlashes, ...] = ("reject", "decode", "keep")
"""
The values of C{Gateway.spec.security.encodedSlashes}, the default first.
"""


def to_bytes(text: str) -> bytes:
    """
    The raw bytes a request string carries: surrogate escapes back to the bytes they stand
    for, everything else as UTF-8.
    """
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Escapes of unreserved characters (ALPHA, DIGIT, "-", ".", "_", "~"): RFC 3986 section
# 6.2.2.2 makes them the same URI as the characters themselves.
_UNRESERVED_ESCAPE = re.compile(
    r"%(?:4[1-9A-Fa-f]|5[0-9Aa]|6[1-9A-Fa-f]|7[0-9Aa]|3[0-9]|2[DdEe]|5[Ff]|7[Ee])"
)


def _unreserved(found: re.Match[str]) -> str:
    return chr(int(found.group(0)[1:], 16))


def unescape(text: str) -> str:
    """
    Percent-decode C{text}, or return it unchanged when any escape in it is invalid.
    """
    if "%" not in text or _BAD_ESCAPE.search(text) is not None:
        return text
    return unquote_to_bytes(to_bytes(text)).decode("utf-8", "surrogateescape")


def has_dot_segment(value: str) -> bool:
    """
    Whether a decoded path, segment or wildcard value has a C{.} or C{..} segment once
    split at C{/} (and at C{\\}, which some backends read as C{/}).
    """
    if "." not in value:
        return False
    if "\\" in value:
        value = value.replace("\\", "/")
    return any(piece in (".", "..") for piece in value.split("/"))


def vet_path(path: str, encoded_slashes: EncodedSlashes) -> str | None:
    """
    The escaped path to route, authorize and forward, or L{None} when the request must be
    refused: a path a backend that decodes or normalises could read as another path than
    the one the gateway routed.

    Refused in every mode: an invalid escape (Go refuses it too), a backslash (raw or
    C{%5C}), an encoded NUL (C{%00}), and a segment that decodes to a dot segment or into
    pieces one of which is one (C{%2e%2e}, C{..%2F}, C{a%2F..}); plain C{.} and C{..} are
    left to path cleaning.
    Escapes of unreserved characters are decoded (C{%61} is C{a}: the same URI, RFC 3986
    section 6.2.2.2), so that every layer and the backend read one spelling.
    An encoded slash is then refused (C{reject}), decoded into a separator (C{decode}: the
    result is what the mux and the backend see), or kept inside its segment (C{keep}).

    @param path: The escaped path, without the query.
    @return: C{path} itself when nothing changes.
    """
    if "\\" in path:
        return None
    if "%" not in path:
        return path
    if _BAD_ESCAPE.search(path) is not None or "%5c" in path or "%5C" in path or "%00" in path:
        # %00: C servers and WSGI stacks end the path at a NUL.
        return None
    slash = "%2f" in path or "%2F" in path
    if slash and encoded_slashes == "reject":
        return None
    if slash or "%2e" in path or "%2E" in path:
        for seg in path.split("/"):
            if "%2" in seg and has_dot_segment(unescape(seg)):
                return None
    if _UNRESERVED_ESCAPE.search(path) is not None:
        # One spelling for everyone: "/%61pi/x" would match a route "/api/" (the mux
        # decodes) but escape its stripPrefix (a byte compare) and a backend's own
        # prefix checks.
        path = _UNRESERVED_ESCAPE.sub(_unreserved, path)
    if slash and encoded_slashes == "decode":
        return path.replace("%2F", "/").replace("%2f", "/")
    return path


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


def split_path(path: str) -> tuple[list[str], list[str], bool] | None:
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
    return [unescape(s) for s in raw], raw, trailing


def path_segments(path: str) -> tuple[tuple[str, ...], bool]:
    """
    The segments a path is matched by: each percent-decoded on its own (so C{%2F} stays
    inside its segment), and whether the path ends in a slash.

    @param path: An escaped path starting with C{/}.
    @return: The decoded segments, and the trailing-slash flag.
    @raise ValueError: When C{path} is not empty and does not start with C{/}.
    """
    split = split_path(path)
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


def redirect_location(path: str, query: str) -> str:
    """
    The Location of a redirect to the escaped C{path} with the raw C{query}: characters that
    may not appear in a URI are percent-encoded, and a segment whose escapes are invalid
    (and which is therefore matched as written) has its C{%} encoded too, so the redirected
    request matches the same segments.
    """
    parts = []
    for seg in path.split("/"):
        if _BAD_ESCAPE.search(seg) is not None:
            parts.append(quote(to_bytes(seg), safe=_LOCATION_PATH_SAFE))
        else:
            parts.append(quote(to_bytes(seg), safe=_LOCATION_PATH_SAFE + "%"))
    location = "/".join(parts)
    if query:
        location += "?" + quote(to_bytes(query), safe=_LOCATION_QUERY_SAFE)
    return location
