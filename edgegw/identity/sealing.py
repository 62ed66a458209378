"""
Authenticated encryption of the gateway's cookies.

A sealed value is base64url, without padding, of C{nonce || ciphertext || tag} under
AES-256-GCM with a fresh random 12-byte nonce. The associated data names what was sealed,
so that a value sealed as one kind of cookie (say a login state) never opens as another
(a session), even under the same key.
"""

from __future__ import annotations

import binascii
import json
import os
from base64 import urlsafe_b64encode
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SESSION_AAD = b"edgegw session v1"
LOGIN_STATE_AAD = b"edgegw login-state v1"
SESSION_ID_AAD = b"edgegw session-id v1"
"""The cookie of a server-side session: only its session id."""
SESSION_RECORD_AAD = b"edgegw session-record v1\x00"
"""A server-side session record; the store key it is kept under is appended."""

KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16

# To the standard alphabet, for the strict C decoder; C{+}, C{/} and C{=} are not
# unpadded base64url, so they become a character that decoder rejects.
_TO_STANDARD = bytes.maketrans(b"-_+/=", b"+/!!!")
_PADDING = (b"", b"", b"==", b"=")
# The last character of an unpadded encoding carries unused low bits; only the characters
# whose unused bits are zero are canonical. Without this check, two different strings
# would open to the same plaintext.
_CANONICAL_LAST = {2: b"AQgw", 3: b"AEIMQUYcgkosw048"}


def b64url(data: bytes) -> str:
    """
    Base64url of C{data} without padding (RFC 4648 section 5, as JOSE and PKCE use it).
    """
    return urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(encoded: bytes) -> bytes | None:
    """
    Strictly decode unpadded base64url: L{None} for padding, any character outside the
    alphabet, an impossible length or a non-canonical last character.
    """
    remainder = len(encoded) % 4
    if remainder == 1 or (remainder and encoded[-1:] not in _CANONICAL_LAST[remainder]):
        return None
    try:
        return binascii.a2b_base64(
            encoded.translate(_TO_STANDARD) + _PADDING[remainder], strict_mode=True
        )
    except binascii.Error:
        return None


class Sealer:
    """
    Seals and opens cookie values with one AES-256-GCM key.
    """

    def __init__(self, key: bytes) -> None:
        """
        @param key: The AES-256-GCM key.
        @raise ValueError: The key is not exactly 32 bytes.
        """
        if len(key) != KEY_SIZE:
            raise ValueError(f"a sealing key is exactly {KEY_SIZE} bytes, not {len(key)}")
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, aad: bytes) -> str:
        """
        Encrypt and authenticate C{plaintext}, bound to C{aad}.

        @return: base64url without padding of nonce, ciphertext and tag.
        """
        nonce = os.urandom(NONCE_SIZE)
        return b64url(nonce + self._aead.encrypt(nonce, plaintext, aad))

    def unseal(self, sealed: str | bytes, aad: bytes) -> bytes | None:
        """
        Open a value made by L{seal} with the same key and C{aad}.

        @return: The plaintext, or L{None} for anything else: bad encoding, a value too
            short to hold a nonce and a tag, or a failed authentication (tampering, another
            key, another C{aad}). Never raises.
        """
        if isinstance(sealed, str):
            if not sealed.isascii():
                return None
            sealed = sealed.encode("ascii")
        raw = b64url_decode(sealed)
        if raw is None or len(raw) < NONCE_SIZE + TAG_SIZE:
            return None
        try:
            return self._aead.decrypt(raw[:NONCE_SIZE], raw[NONCE_SIZE:], aad)
        except InvalidTag:
            return None


def open_record(plaintext: bytes, version: int) -> dict[str, Any] | None:
    """
    An unsealed record's JSON object, when it is one of C{version} (its C{"v"} member,
    an int: C{true} or C{1.0} are not C{1}); L{None} otherwise.
    """
    try:
        data: Any = json.loads(plaintext)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or type(data.get("v")) is not int or data["v"] != version:
        return None
    return data
