"""
Cross-origin request protection with the semantics of Go's C{net/http.CrossOriginProtection}
(Go 1.25).

Safe methods pass. A C{Sec-Fetch-Site} of C{same-origin} or C{none} passes; any other value is
refused. Without C{Sec-Fetch-Site}, a request without C{Origin} passes (it is same-origin or
not from a browser), and so does one whose C{Origin} host equals the C{Host}. A refused request
still passes when its C{Origin} is a trusted origin or a bypass pattern matches it directly.

The caller answers a refusal: by default 403 with the reason plus C{"\\n"} as C{text/plain}.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes

import attrs

from edgegw.routing.mux import Mux, Pattern, go_quote

__all__ = [
    "ORIGIN_MISMATCH",
    "SEC_FETCH_SITE_CROSS",
    "CrossOriginProtection",
    "TrustedOriginError",
    "validate_trusted_origin",
]

SEC_FETCH_SITE_CROSS = "cross-origin request detected from Sec-Fetch-Site header"
"""
The denial reason when C{Sec-Fetch-Site} says the request is cross-origin.
"""

ORIGIN_MISMATCH = (
    "cross-origin request detected, and/or browser is out of date: "
    "Sec-Fetch-Site is missing, and Origin does not match Host"
)
"""
The denial reason when C{Sec-Fetch-Site} is missing and C{Origin} does not match C{Host}.
"""

_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_SAME_SITE_VALUES = frozenset(("same-origin", "none"))


class TrustedOriginError(ValueError):
    """
    A trusted origin that is not of the form C{scheme://host[:port]}; C{str()} is Go's
    message, for example C{invalid origin "https://example.com/": path, query, and fragment
    are not allowed}.

    @ivar origin: The rejected value.
    """

    def __init__(self, origin: str, reason: str) -> None:
        super().__init__(f"invalid origin {go_quote(origin)}: {reason}")
        self.origin = origin


def validate_trusted_origin(origin: str) -> None:
    """
    Check that C{origin} can be a trusted origin: a URL with a scheme and a host, and no
    path (not even C{/}), query or fragment.

    @param origin: The value, compared later as a string with C{Origin} headers.
    @raise TrustedOriginError: When it is not acceptable.
    """
    try:
        url = _parse_url(origin)
    except _URLError as e:
        raise TrustedOriginError(origin, str(e)) from None
    if not url.scheme:
        raise TrustedOriginError(origin, "scheme is required")
    if not url.host:
        raise TrustedOriginError(origin, "host is required")
    if url.path or url.query or url.fragment:
        raise TrustedOriginError(origin, "path, query, and fragment are not allowed")


class CrossOriginProtection:
    """
    Decides whether a request passes cross-origin checks.
    """

    def __init__(
        self, trusted_origins: Iterable[str] = (), bypass_patterns: Iterable[str] = ()
    ) -> None:
        """
        @param trusted_origins: Origins whose requests always pass, as
            C{scheme://host[:port]}.
        @param bypass_patterns: Mux patterns whose direct matches always pass.
        @raise TrustedOriginError: For an invalid trusted origin.
        @raise edgegw.routing.mux.PatternError: For an invalid bypass pattern.
        @raise edgegw.routing.mux.ConflictError: For bypass patterns that conflict.
        """
        self._trusted: set[str] = set()
        self._bypass: Mux[None] = Mux()
        self._has_bypass = False
        for origin in trusted_origins:
            self.add_trusted_origin(origin)
        for pattern in bypass_patterns:
            self.add_bypass_pattern(pattern)

    @property
    def trusted_origins(self) -> frozenset[str]:
        """
        The trusted origins.
        """
        return frozenset(self._trusted)

    @property
    def bypass_patterns(self) -> list[Pattern]:
        """
        The bypass patterns, in the order they were added.
        """
        return self._bypass.patterns()

    def add_trusted_origin(self, origin: str) -> None:
        """
        Let every request whose C{Origin} header equals C{origin} exactly pass.

        @raise TrustedOriginError: When C{origin} is not C{scheme://host[:port]}.
        """
        validate_trusted_origin(origin)
        self._trusted.add(origin)

    def add_bypass_pattern(self, pattern: str) -> None:
        """
        Let every request that C{pattern} matches directly pass. Patterns have the syntax
        and precedence of the mux; a request the mux would redirect (an unclean path, or
        C{/x} when only C{/x/} is a pattern) is not a direct match.

        @raise edgegw.routing.mux.PatternError: When C{pattern} does not parse.
        @raise edgegw.routing.mux.ConflictError: When it conflicts with another bypass pattern.
        """
        self._bypass.register(pattern, None)
        self._has_bypass = True

    def check(
        self,
        method: str,
        host: str,
        target_path: str,
        sec_fetch_site: str | None,
        origin: str | None,
    ) -> str | None:
        """
        Apply the cross-origin checks to a request.

        @param method: The request method.
        @param host: The C{Host} header as sent, port included; C{""} when absent.
        @param target_path: The escaped request path exactly as on the request line (not
            cleaned), without the query.
        @param sec_fetch_site: The first C{Sec-Fetch-Site} value, or L{None}.
        @param origin: The first C{Origin} value, or L{None}.
        @return: L{None} when the request may proceed, else the denial reason
            (L{SEC_FETCH_SITE_CROSS} or L{ORIGIN_MISMATCH}).
        """
        if method in _SAFE_METHODS:
            return None
        if sec_fetch_site:
            if sec_fetch_site in _SAME_SITE_VALUES:
                return None
            if self._exempt(method, host, target_path, origin):
                return None
            return SEC_FETCH_SITE_CROSS
        if not origin:
            return None
        if host and _origin_host(origin) == host:
            return None
        if self._exempt(method, host, target_path, origin):
            return None
        return ORIGIN_MISMATCH

    def _exempt(self, method: str, host: str, target_path: str, origin: str | None) -> bool:
        if origin and origin in self._trusted:
            return True
        return self._has_bypass and self._bypass.matches_directly(method, host, target_path)


# A subset of what Go's url.Parse accepts, whose host is the authority as written.
_SIMPLE_ORIGIN = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*://([A-Za-z0-9\-._~!$&'()*+,;=]+(?::[0-9]*)?)"
)


def _origin_host(origin: str) -> str | None:
    """
    The host (with port) that Go's C{url.Parse} finds in an C{Origin} value, or L{None}
    when it does not parse.
    """
    simple = _SIMPLE_ORIGIN.fullmatch(origin)
    if simple is not None:
        return simple.group(1)
    try:
        return _parse_url(origin).host
    except _URLError:
        return None


# URL parsing, as far as trusted-origin validation and Origin hosts need it, with the
# results and error messages of Go's net/url.Parse.


class _URLError(Exception):
    pass


@attrs.frozen
class _URL:
    scheme: str = ""
    host: str = ""
    path: str = ""
    query: str = ""
    fragment: str = ""


_HEX = frozenset("0123456789abcdefABCDEF")
_HOST_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~!$&'()*+,;=:[]<>\""
)
_USERINFO_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._:~!$&'()*+,;=%@"
)


def _parse_url(raw: str) -> _URL:
    before, _, fragment = raw.partition("#")
    try:
        url = _parse_without_fragment(before)
    except _URLError as e:
        raise _URLError(f"parse {go_quote(before)}: {e}") from None
    if not fragment:
        return url
    try:
        _check_escapes(fragment, "fragment")
    except _URLError as e:
        raise _URLError(f"parse {go_quote(raw)}: {e}") from None
    return attrs.evolve(url, fragment=_decode(fragment))


def _parse_without_fragment(raw: str) -> _URL:
    if any(c < " " or c == "\x7f" for c in raw):
        raise _URLError("net/url: invalid control character in URL")
    if raw == "*":
        return _URL(path="*")
    scheme, rest = _split_scheme(raw)
    scheme = scheme.lower()
    if rest.endswith("?") and rest.count("?") == 1:
        rest, query = rest[:-1], ""
    else:
        rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            # An opaque URL such as "mailto:x": no host.
            return _URL(scheme=scheme, query=query)
        if ":" in rest.partition("/")[0]:
            raise _URLError("first path segment in URL cannot contain colon")
    host = ""
    if (scheme or not rest.startswith("///")) and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        host = _parse_authority(authority)
    _check_escapes(rest, "path")
    return _URL(scheme=scheme, host=host, path=rest, query=query)


def _split_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if "a" <= c <= "z" or "A" <= c <= "Z":
            continue
        if "0" <= c <= "9" or c in "+-.":
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise _URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _parse_authority(authority: str) -> str:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1 :])
    if at >= 0:
        userinfo = authority[:at]
        if not all(c in _USERINFO_CHARS for c in userinfo):
            raise _URLError("net/url: invalid userinfo")
        for part in userinfo.split(":", 1):
            _check_escapes(part, "userinfo")
    return host


def _valid_optional_port(port: str) -> bool:
    if not port:
        return True
    return port[0] == ":" and all("0" <= c <= "9" for c in port[1:])


def _parse_host(host: str) -> str:
    if host.startswith("["):
        close = host.rfind("]")
        if close < 0:
            raise _URLError("missing ']' in host")
        port = host[close + 1 :]
        if not _valid_optional_port(port):
            raise _URLError(f"invalid port {go_quote(port)} after host")
        literal = host[1:close]
        zone = literal.find("%25")
        if zone >= 0:
            _check_escapes(literal[:zone], "host")
            _check_escapes(literal[zone:], "zone")
        else:
            _check_escapes(literal, "host")
        address = _decode(literal)
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            raise _URLError(
                f"invalid host: ParseAddr({go_quote(address)}): unable to parse IP"
            ) from None
        if parsed.version == 4:
            raise _URLError("invalid IP-literal")
        return "[" + address + "]" + port
    colon = host.find(":")
    if colon >= 0:
        # Go 1.26 and later reject a second colon; so does this, for every scheme.
        port = host[colon:]
        if not _valid_optional_port(port):
            raise _URLError(f"invalid port {go_quote(port)} after host")
    _check_escapes(host, "host")
    return _decode(host)


def _check_escapes(text: str, mode: str) -> None:
    """
    Raise Go's error for a malformed escape in C{text}, or for a character a host may not
    contain when C{mode} is C{"host"} or C{"zone"}.
    """
    in_host = mode in ("host", "zone")
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%":
            escape = text[i : i + 3]
            if len(escape) < 3 or escape[1] not in _HEX or escape[2] not in _HEX:
                raise _URLError(f"invalid URL escape {go_quote(escape)}")
            value = int(escape[1:], 16)
            # Hosts may only escape non-ASCII bytes, and "%25" introduces a zone.
            if mode == "host" and value < 0x80 and escape != "%25":
                raise _URLError(f"invalid URL escape {go_quote(escape)}")
            if (
                mode == "zone"
                and escape != "%25"
                and value != 0x20
                and (value >= 0x80 or chr(value) not in _HOST_CHARS)
            ):
                raise _URLError(f"invalid URL escape {go_quote(escape)}")
            i += 3
            continue
        if in_host and c < "\x80" and c not in _HOST_CHARS:
            raise _URLError(f"invalid character {go_quote(c)} in host name")
        i += 1


def _decode(text: str) -> str:
    if "%" not in text:
        return text
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")
    return unquote_to_bytes(data).decode("utf-8", "surrogateescape")
