"""
Header names as Twisted's L{Headers} stores them: the canonical form of each name
(C{Content-Type}, C{ETag}), learned through Twisted's public methods and remembered.

Writing Twisted's dict of canonical names to values directly
(L{edgegw.seam.raw_fields}) skips its per-call name encoding and value sanitising; the
names written there must be in this form.
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


USER_PREFIX = b"x-user-"
"""The prefix of the identity headers the gateway projects for backends (C{X-User-*})."""
