"""
Request hosts: the syntax of a C{Host} value and the one spelling it is routed and
forwarded by.

Host names are case-insensitive and a trailing dot names the same host (RFC 9110
section 4.2.3, RFC 3986 section 6.2.2.1), so C{ADMIN.example.:80} is C{admin.example:80}:
a host pattern must not be skipped by a spelling its backend reads as the same host.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["host_key", "normalise_host"]

# RFC 3986: unreserved, sub-delims, ":" (port) and the brackets of an IP literal. Anything
# else ("a b", "a@b/c?d", non-ASCII) is not a host. Percent-escapes are refused too: a
# reg-name may have them, but no DNS name does, and "%61dmin.example" would be one more
# spelling of admin.example for a backend that decodes it.
_HOST_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:[]"
_IP_FUTURE = re.compile(rb"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+")


def normalise_host(value: bytes) -> bytes | None:
    """
    A C{Host} value (or the authority of an absolute-form target) in its normal form, or
    L{None} when it is not C{host[:port]} per RFC 3986.

    The host is an IP literal in brackets (no zone identifier), an IPv4 address or a
    reg-name without percent-escapes; the port is digits. The normal form is lowercase,
    without the trailing dot of a name and without an empty port; C{""} stays C{""}.
    """
    if value.translate(None, _HOST_BYTES):
        return None
    if value[:1] == b"[":
        end = value.find(b"]")
        if end < 0 or not _is_ip_literal(value[1:end]):
            return None
        name, port = value[: end + 1].lower(), value[end + 1 :]
    else:
        colon = value.find(b":")
        if colon < 0:
            name, port = value, b""
        else:
            name, port = value[:colon], value[colon:]
        if b"[" in name or b"]" in name or b".." in name:
            return None
        name = name.lower()
        if name[-1:] == b".":
            if len(name) == 1:
                return None
            name = name[:-1]
    if port:
        if port[:1] != b":" or not (len(port) == 1 or port[1:].isdigit()):
            return None
        if len(port) == 1:
            port = b""
    return name + port


def _is_ip_literal(literal: bytes) -> bool:
    if _IP_FUTURE.fullmatch(literal):
        return True
    try:
        ipaddress.IPv6Address(literal.decode("ascii"))
    except ValueError:
        return False
    return True


def host_key(host: str) -> str:
    """
    The spelling of a host name (no port) that host patterns are registered and looked up
    by: lowercase, without a trailing dot.
    """
    host = host.lower()
    if host[-1:] == ".":
        return host[:-1]
    return host
