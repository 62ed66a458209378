"""
Origins in configuration: trusted origins checked as Go's C{CrossOriginProtection} checks
them, with a URL parser that gives the results and error messages of Go's C{net/url.Parse}
as far as origins need them.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote_to_bytes

import attrs

from edgegw.routing.goquote import go_quote
from edgegw.routing.paths import to_bytes

__all__ = ["URL", "TrustedOriginError", "URLError", "parse_url", "validate_trusted_origin"]


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
        url = parse_url(origin)
    except URLError as e:
        raise TrustedOriginError(origin, str(e)) from None
    if not url.scheme:
        raise TrustedOriginError(origin, "scheme is required")
    if not url.host:
        raise TrustedOriginError(origin, "host is required")
    if url.path or url.query or url.fragment:
        raise TrustedOriginError(origin, "path, query, and fragment are not allowed")


class URLError(Exception):
    """
    A value Go's C{url.Parse} refuses; C{str()} is Go's message.
    """


@attrs.frozen
class URL:
    """
    The parts of a parsed URL that origins need: the scheme (lower-cased), the host with
    its port as written, the path, the query and the decoded fragment.
    """

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


def parse_url(raw: str) -> URL:
    """
    Parse C{raw} as Go's C{url.Parse} does.

    @raise URLError: With Go's message, where Go refuses C{raw}.
    """
    before, _, fragment = raw.partition("#")
    try:
        url = _parse_without_fragment(before)
    except URLError as e:
        raise URLError(f"parse {go_quote(before)}: {e}") from None
    if not fragment:
        return url
    try:
        _check_escapes(fragment, "fragment")
    except URLError as e:
        raise URLError(f"parse {go_quote(raw)}: {e}") from None
    return attrs.evolve(url, fragment=_decode(fragment))


def _parse_without_fragment(raw: str) -> URL:
    if any(c < " " or c == "\x7f" for c in raw):
        raise URLError("net/url: invalid control character in URL")
    if raw == "*":
        return URL(path="*")
    scheme, rest = _split_scheme(raw)
    scheme = scheme.lower()
    if rest.endswith("?") and rest.count("?") == 1:
        rest, query = rest[:-1], ""
    else:
        rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            # An opaque URL such as "mailto:x": no host.
            return URL(scheme=scheme, query=query)
        if ":" in rest.partition("/")[0]:
            raise URLError("first path segment in URL cannot contain colon")
    host = ""
    if (scheme or not rest.startswith("///")) and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        host = _parse_authority(authority)
    _check_escapes(rest, "path")
    return URL(scheme=scheme, host=host, path=rest, query=query)


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
                raise URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _parse_authority(authority: str) -> str:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1 :])
    if at >= 0:
        userinfo = authority[:at]
        if not all(c in _USERINFO_CHARS for c in userinfo):
            raise URLError("net/url: invalid userinfo")
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
            raise URLError("missing ']' in host")
        port = host[close + 1 :]
        if not _valid_optional_port(port):
            raise URLError(f"invalid port {go_quote(port)} after host")
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
            raise URLError(
                f"invalid host: ParseAddr({go_quote(address)}): unable to parse IP"
            ) from None
        if parsed.version == 4:
            raise URLError("invalid IP-literal")
        return "[" + address + "]" + port
    colon = host.find(":")
    if colon >= 0:
        # Go 1.26 and later reject a second colon; so does this, for every scheme.
        port = host[colon:]
        if not _valid_optional_port(port):
            raise URLError(f"invalid port {go_quote(port)} after host")
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
                raise URLError(f"invalid URL escape {go_quote(escape)}")
            value = int(escape[1:], 16)
            # Hosts may only escape non-ASCII bytes, and "%25" introduces a zone.
            if mode == "host" and value < 0x80 and escape != "%25":
                raise URLError(f"invalid URL escape {go_quote(escape)}")
            if (
                mode == "zone"
                and escape != "%25"
                and value != 0x20
                and (value >= 0x80 or chr(value) not in _HOST_CHARS)
            ):
                raise URLError(f"invalid URL escape {go_quote(escape)}")
            i += 3
            continue
        if in_host and c < "\x80" and c not in _HOST_CHARS:
            raise URLError(f"invalid character {go_quote(c)} in host name")
        i += 1


def _decode(text: str) -> str:
    if "%" not in text:
        return text
    return unquote_to_bytes(to_bytes(text)).decode("utf-8", "surrogateescape")
