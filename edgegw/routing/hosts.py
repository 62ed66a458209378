"""
Request hosts: the syntax of a C{Host} value and the one spelling it is routed and
forwarded by.

Host names are case-insensitive and a trailing dot names the same host (RFC 9110
section 4.2.3, RFC 3986 section 6.2.2.1), so C{ADMIN.example.:80} is C{admin.example:80}:
a host pattern must not be skipped by a spelling its backend reads as the same host.
"""

from __future__ import annotations

import ipaddress

__all__ = ["host_key", "normalise_host"]

# What a host name can be made of (letters, digits, "-", ".", and "_", which internal
# names use), ":" for the port and the
# brackets of an IPv6 literal. RFC 3986 also lets a reg-name carry sub-delims and
# percent-escapes, but no DNS name does, and each is a differential: "%61dmin.example" is
# admin.example to a backend that decodes it, and "x,admin.example" is admin.example to one
# that splits X-Forwarded-Host on commas. Anything else ("a b", "a@b/c?d", non-ASCII) is
# not a host at all.
_HOST_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._:[]"
_MAX_PORT = 65535


def normalise_host(value: bytes) -> bytes | None:
    """
    A C{Host} value (or the authority of an absolute-form target) in its normal form, or
    L{None} when it is not C{host[:port]} per RFC 3986.

    The host is an IPv6 literal in brackets (no zone identifier, no IPvFuture), an IPv4
    address or a name of letters, digits, C{-}, C{_} and C{.}; the port is 1 to 65535 in at
    most five digits. The normal form is lowercase, without the trailing dot of a name,
    with the port's leading zeros and an empty port removed; C{""} stays C{""}.
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
        if port[:1] != b":":
            return None
        digits = port[1:]
        if not digits:
            port = b""
        elif not digits.isdigit() or len(digits) > 5 or not 0 < int(digits) <= _MAX_PORT:
            return None
        else:
            port = b":%d" % int(digits)
    return name + port


def _is_ip_literal(literal: bytes) -> bool:
    try:
        ipaddress.IPv6Address(literal.decode("ascii"))
    except ValueError:
        return False
    return True


MAX_REMEMBERED_HOST = 300
"""Longest request host (a name of at most 253 bytes, a port) a cache keeps: the edge's
checks let through hosts of kilobytes, which thousands of entries must not hold."""


def host_key(host: str) -> str:
    """
    The spelling of a host name (no port) that host patterns are registered and looked up
    by: lowercase, without a trailing dot.
    """
    host = host.lower()
    if host[-1:] == ".":
        return host[:-1]
    return host
