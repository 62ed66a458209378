"""
Header names as Twisted's L{Headers} stores them, and whether its storage can be written
directly.

Twisted keeps a request's or response's headers in C{Headers._rawHeaders}, a private
dict of canonical name (C{Content-Type}, C{ETag}) to a list of values. Writing it
directly skips Twisted's per-call name encoding and value sanitising; the projection
stage and L{edgegw.server.fast_headers.GatewayHeaders} do, when L{RAW_DICT_WRITABLE}
(checked once, at import) says the dict is still there and shaped so.
"""

from __future__ import annotations

from twisted.web.http_headers import Headers

MAX_NAMES = 10_000
"""Canonical names remembered (as Twisted's encoder bounds its own cache)."""

MAX_NAME_LENGTH = 64
"""Longer names are not remembered: a client or upstream sending 10,000 names of 16 KB
would otherwise hold 160 MB here (Twisted's own cache has no such bound)."""

canonical_names: dict[bytes, bytes] = {}
"""Name as sent -> canonical name, for the names L{canonical_name} remembered."""


def canonical_name(name: bytes) -> bytes:
    """
    C{name} as L{Headers} stores it (its canonical capitalisation), learned through
    Twisted's public methods and remembered.

    @raise twisted.web.http_headers.InvalidHeaderName: C{name} is not a token.
    """
    canonical = canonical_names.get(name)
    if canonical is None:
        probe = Headers()
        probe.setRawHeaders(name, [b""])
        canonical = next(probe.getAllRawHeaders())[0]
        if len(canonical_names) < MAX_NAMES and len(name) <= MAX_NAME_LENGTH:
            canonical_names[name] = canonical
    return canonical


def _raw_dict_writable() -> bool:
    headers = Headers()
    headers.setRawHeaders(b"x-probe-name", [b"v"])
    raw = getattr(headers, "_rawHeaders", None)
    return isinstance(raw, dict) and raw == {canonical_name(b"x-probe-name"): [b"v"]}


RAW_DICT_WRITABLE = _raw_dict_writable()
"""Whether C{Headers._rawHeaders} is the dict of canonical name -> values this Twisted."""
