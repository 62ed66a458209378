"""
URL grammar for configuration values: absolute URLs (upstreams, the IdP, OTLP) checked
strictly, same-origin paths, and the RFC 3986 path characters of path templates.
"""

from __future__ import annotations

import ipaddress
import re

from edgegw.config.fields import Node
from edgegw.config.shown_values import describe_char, show
from edgegw.routing.redirects import is_same_origin_path, unsafe_redirect_char

__all__ = [
    "PLACEHOLDER",
    "check_local_path",
    "check_url",
    "encode_path",
    "path_template_problem",
]

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
"""
A C{{name}} placeholder of a path template; the group is the name.
"""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*\Z")
# A character that cannot appear as it is in an RFC 3986 path: not unreserved, not a
# sub-delim, ":", "@" or "/", and not the "%" of a valid %XX escape.
_BAD_PATH = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]")
_BAD_QUERY = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+\Z")
# Underscores are not DNS host-name syntax, but service names (Docker Compose, SRV-style
# labels) use them and resolve fine over plain http.
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?\Z")


def check_local_path(node: Node, key: str, value: str | None) -> None:
    """
    Report field C{key} of C{node} when its C{value} is not a local redirect target
    (L{edgegw.routing.redirects}): a same-origin path of printable ASCII characters
    without spaces or backslashes.
    """
    if value is None:
        return
    if not is_same_origin_path(value):
        node.error(
            key,
            f'"{show(value)}" is not a same-origin path: it must start with "/", must not '
            'start with "//" or "/\\" and must not contain "://"',
        )
        return
    char = unsafe_redirect_char(value)
    if char is not None:
        node.error(
            key,
            f'"{show(value)}": {describe_char(char)} is not allowed in a redirect target '
            '(browsers drop or rewrite control characters, whitespace, "\\" and non-ASCII '
            "characters); "
            f'percent-encode it ("{_percent_encode(char)}")',
        )


def check_url(node: Node, key: str, value: str | None, schemes: tuple[str, ...]) -> None:
    """
    Report field C{key} of C{node} when its C{value} is set and is not a usable absolute URL
    with one of C{schemes}.
    """
    if value:
        problem = _url_problem(value, schemes)
        if problem is not None:
            node.error(key, problem)


def _url_problem(value: str, schemes: tuple[str, ...]) -> str | None:
    """
    Why C{value} is not a usable absolute URL with one of C{schemes}, or L{None}.

    Checked strictly, so that nothing fails later: ASCII only; the host an IP address
    (IPv6 in brackets) or a DNS name (internationalized names in punycode); no
    credentials; a port from 1 to 65535; a path of RFC 3986 path characters and
    C{%XX} escapes; no query or fragment.
    """
    shown = show(value)
    invalid = f'"{shown}" is not a valid URL'
    wanted = " or ".join(f"{name}://" for name in schemes)
    scheme, separator, rest = value.partition("://")
    if not separator or scheme.lower() not in schemes or not _SCHEME.match(scheme):
        return f"{invalid}: expected {wanted} followed by a host"
    end = len(rest)
    for delimiter in "/?#":
        position = rest.find(delimiter)
        if position != -1:
            end = min(end, position)
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        redacted = f"{scheme}://***@{authority.rpartition('@')[2]}{tail}"
        return f'"{show(redacted)}" is not a valid URL: credentials in the URL are not allowed'
    if not authority or (authority.startswith(":") and authority.count(":") == 1):
        return f"{invalid}: expected {wanted} followed by a host"
    problem = _authority_problem(authority)
    if problem is not None:
        return f"{invalid}: {problem}"
    path = tail.partition("?")[0].partition("#")[0]
    if path != tail:
        return f'"{shown}": a query or fragment is not allowed here'
    bad = _BAD_PATH.search(path)
    if bad is None:
        return None
    if bad.group() == "%":
        escape = show(path[bad.start() : bad.start() + 3])
        return (
            f'{invalid}: "{escape}" is not a valid percent-escape (use "%" and two hex '
            'digits; "%25" for "%" itself)'
        )
    char = bad.group()
    return (
        f"{invalid}: {describe_char(char)} is not allowed in the path; percent-encode it "
        f'("{_percent_encode(char)}")'
    )


def _authority_problem(authority: str) -> str | None:
    """
    What is wrong with C{host[:port]} (no credentials), or L{None}.
    """
    if authority.startswith("["):
        literal, bracket, port = authority[1:].partition("]")
        if not bracket:
            return f'"[{show(literal)}" has no closing "]"'
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return f'"{show(literal)}" is not a valid IPv6 address'
        if "%" in literal:
            return f'"{show(literal)}": IPv6 zone identifiers are not supported'
        if port and not port.startswith(":"):
            return f'unexpected "{show(port)}" after the IPv6 address'
        port = port[1:]
    else:
        host, _, port = authority.partition(":")
        if ":" in port:
            return 'an IPv6 address must be written in brackets, such as "[::1]"'
        problem = _host_problem(host)
        if problem is not None:
            return problem
    if port and not (port.isascii() and port.isdigit()):
        return f'the port "{show(port)}" is not a number'
    if port and not 0 < int(port) < 65536:
        return f"the port must be between 1 and 65535, got {int(port)}"
    return None


def _host_problem(host: str) -> str | None:
    """
    What is wrong with a host that is not an IPv6 literal, or L{None}.
    """
    if not host.isascii():
        try:
            punycode = host.encode("idna").decode("ascii")
        except UnicodeError:
            example = ""
        else:
            example = f' ("{punycode}")'
        return (
            f'the host "{show(host)}" is not ASCII: write internationalized names in '
            f"punycode{example}"
        )
    if _DOTTED_NUMBERS.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f'"{host}" is not a valid IPv4 address'
        return None
    name = host.removesuffix(".")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return (
            f'"{show(host)}" is not a valid host name: use letters, digits, hyphens, '
            "underscores and dots (labels of 1 to 63 characters, not starting or ending with "
            '"-"), or an IP address'
        )
    return None


def encode_path(path: str) -> str:
    """
    C{path} with every character that cannot appear as it is in an RFC 3986 path
    percent-encoded (as UTF-8); path characters and valid C{%XX} escapes are kept.
    """
    return _BAD_PATH.sub(lambda found: _percent_encode(found.group()), path)


def path_template_problem(path: str) -> str | None:
    """
    What is wrong with the characters of a path template, or L{None}: a path with
    C{{name}} placeholders, which a static query may follow (C{/users/{id}?expand=1}).
    """
    literal, question, query = PLACEHOLDER.sub("x", path).partition("?")
    bad = _BAD_PATH.search(literal) or (_BAD_QUERY.search(query) if question else None)
    if bad is None:
        return None
    char = bad.group()
    return f'"{show(path)}": ' + (
        "a percent-escape needs two hex digits"
        if char == "%"
        else f"{describe_char(char)} is not allowed in a path; percent-encode "
        f'it ("{_percent_encode(char)}")'
    )


def _percent_encode(text: str) -> str:
    return "".join(f"%{byte:02X}" for byte in text.encode("utf-8", "surrogatepass"))
