"""
What the gateway keeps of a token endpoint's answer: the access token when it can be sent
as a header, and when it expires.
"""

from __future__ import annotations

import re

__all__ = ["MAX_ACCESS_TOKEN", "MAX_REFRESH_TOKEN", "access_token_expiry", "usable_token"]

MAX_ACCESS_TOKEN = 8192
"""The longest access token kept in a session."""

MAX_REFRESH_TOKEN = 8192
"""The longest refresh token kept in a server-side session."""

# RFC 6750 2.1: what a Bearer token may be made of (a refresh token is kept only when it
# is of the same alphabet: it travels in a form, but nothing legitimate needs more).
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def usable_token(token: object, limit: int = MAX_ACCESS_TOKEN) -> bool:
    """
    Whether C{token} is a non-empty string of RFC 6750 characters of at most C{limit}.
    """
    return (
        isinstance(token, str)
        and 0 < len(token) <= limit
        and _B64TOKEN.fullmatch(token) is not None
    )


def access_token_expiry(now: int, expires_in: object) -> int | None:
    """
    When the access token expires: C{expires_in} seconds from now, a number or a string
    of digits (some providers send one); L{None} when it says nothing usable.
    """
    if isinstance(expires_in, str) and expires_in.isascii() and expires_in.isdigit():
        expires_in = int(expires_in)
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
        return None
    return now + int(expires_in) if 0 < expires_in < 10 * 365 * 86400 else None
