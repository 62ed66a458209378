"""
Header hygiene for proxied requests and responses (RFC 9110 section 7.6.1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Headers that describe one connection, never forwarded in either direction."""


def connection_tokens(values: Iterable[bytes] | None) -> frozenset[bytes]:
    """
    The lowercased header names listed in C{Connection} header values: they are
    hop-by-hop for this message too.
    """
    if not values:
        return frozenset()
    tokens: set[bytes] = set()
    for value in values:
        for token in value.split(b","):
            token = token.strip().lower()
            if token:
                tokens.add(token)
    return frozenset(tokens)


def is_websocket_upgrade(
    connection: Sequence[bytes] | None, upgrade: Sequence[bytes] | None
) -> bool:
    """
    Whether a request asks to upgrade to WebSocket (C{Connection: upgrade} and
    C{Upgrade: websocket}); other upgrades (h2c) are not tunnelled.
    """
    if not upgrade or not connection:
        return False
    if b"upgrade" not in connection_tokens(connection):
        return False
    return any(
        token.strip().lower() == b"websocket" for value in upgrade for token in value.split(b",")
    )
