"""
What the gateway keeps of a token endpoint's answer: the access token when it can be sent
as a header, and when it expires; the id_token as the hint of a logout at the IdP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_ACCESS_TOKEN",
    "MAX_ID_TOKEN",
    "MAX_REFRESH_TOKEN",
    "access_token_expiry",
    "latest_id_token",
    "usable_id_token",
    "usable_token",
]

MAX_ACCESS_TOKEN = 8192
"""The longest access token kept in a session."""

MAX_REFRESH_TOKEN = 8192
"""The longest refresh token kept in a server-side session."""

MAX_ID_TOKEN = 8192
"""
The longest id_token kept for a logout's C{id_token_hint}: it travels in the query of
the redirect to the IdP, and servers commonly refuse request lines past 8 KiB.
"""

# RFC 6750 2.1: what a Bearer token may be made of (a refresh token is kept only when it
# is of the same alphabet: it travels in a form, but nothing legitimate needs more).
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# A compact JWS (the id_token of OIDC Core 2): three base64url parts.
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


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


def usable_id_token(token: object) -> bool:
    """
    Whether C{token} can be kept as a logout's C{id_token_hint}: a compact JWS of at
    most L{MAX_ID_TOKEN} characters. (It is sent back to the IdP that issued it and never
    read for identity, so it is not verified again here.)
    """
    return (
        isinstance(token, str)
        and len(token) <= MAX_ID_TOKEN
        and _COMPACT_JWS.fullmatch(token) is not None
    )


def latest_id_token(tokens: Mapping[str, Any], current: str | None) -> str | None:
    """
    The id_token a session keeps after a token response (a refresh's): the new one when
    the answer has a usable one, else C{current}. Only the logout's hint uses it; the
    session's subject, claims and groups stay those of the login.
    """
    token = tokens.get("id_token")
    return token if usable_id_token(token) else current
