"""
JWT verification for id_tokens and Bearer access tokens. Pure logic: the key set and the
current time are passed in.

The signature is checked by pyjwt with the one algorithm the token names, pinned, and a
key from the key set only (header members such as C{jku}, C{x5u}, C{jwk} and C{x5c} never
choose a key). The claims are checked here, against the given time, so that every pyjwt
release from 2.10.1 on behaves the same and none of them reads the wall clock.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import math
import re
from collections.abc import Collection

import jwt

from edgegw.identity.keyset import ASYMMETRIC_ALGORITHMS, KeySet

MAX_TOKEN_LENGTH = 16 * 1024
"""The longest token (in characters) looked at; a longer one is refused unread."""

DEFAULT_LEEWAY = 5.0
"""Seconds of clock difference tolerated on C{exp}, C{nbf} and C{iat}."""

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
# Knows the asymmetric algorithms only, so not even a bug in the pinning below could
# reach C{none} or HMAC; each call further pins the one algorithm of the token.
_JWS = jwt.PyJWS(algorithms=sorted(ASYMMETRIC_ALGORITHMS))
_NUMERIC_DATES = ("exp", "nbf", "iat")
_ID_TOKEN_REQUIRED = ("exp", "iat", "sub")


class TokenError(Exception):
    """
    A token that is not accepted.

    @ivar reason: A few words saying why, for logs; never holds the token or a claim value.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownKeyError(TokenError):
    """
    The token names a key id that the key set does not hold. The caller may refetch the
    key set (once, rate limited) and verify again.

    @ivar kid: The key id the token names.
    """

    def __init__(self, kid: str) -> None:
        super().__init__("unknown key id")
        self.kid = kid


def _reject_constant(name: str) -> object:
    # Python's json reads NaN and Infinity, which no JSON producer should send; an
    # "exp": Infinity would never expire.
    raise ValueError(f"{name} is not JSON")


def _segments(token: str) -> list[str]:
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenError("token too long")
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise TokenError("malformed token")
    return parts


# A \u escape of a UTF-16 surrogate: only a document holding one needs the encode check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _json_object(data: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise TokenError(f"malformed {what}") from None
    if not isinstance(value, dict):
        raise TokenError(f"malformed {what}")
    if _SURROGATE_ESCAPE.search(data):
        # A lone surrogate ("\ud800") parses into a string that cannot be encoded
        # again: it would break every header or document the claims go into.
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise TokenError(f"malformed {what} (lone surrogate)") from None
    return value


def _decode_segment(segment: str, what: str) -> dict[str, object]:
    try:
        data = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (ValueError, binascii.Error):
        raise TokenError(f"malformed {what}") from None
    return _json_object(data, what)


def peek_header(token: str) -> dict[str, object]:
    """
    The unverified header of a compact JWS, to look at before verifying (which key set
    to use, say). Nothing in it may be trusted.

    @raise TokenError: When the token is not a compact JWS with a JSON object header.
    """
    _segments(token)
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.exceptions.PyJWTError, RecursionError):
        raise TokenError("malformed header") from None
    return dict(header)


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    # math.isfinite would overflow on a huge int; every int is finite.
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _check_claims(
    claims: dict[str, object],
    *,
    issuer: str,
    audience: str,
    audience_claim: str,
    leeway: float,
    now: float,
    required: Collection[str],
) -> None:
    for name in required:
        if name not in claims:
            raise TokenError(f"missing {name} claim")
    for name in _NUMERIC_DATES:
        if name in claims and not _is_number(claims[name]):
            raise TokenError(f"{name} claim is not a number")
    iss = claims.get("iss")
    if not isinstance(iss, str) or iss != issuer:
        raise TokenError("wrong issuer")
    aud = claims.get(audience_claim)
    if not (aud == audience if isinstance(aud, str) else isinstance(aud, list) and audience in aud):
        raise TokenError("wrong audience")
    # The isinstance checks repeat what _is_number established, for the type checker.
    exp = claims.get("exp")
    if isinstance(exp, int | float) and not exp > now - leeway:
        raise TokenError("expired")
    nbf = claims.get("nbf")
    if isinstance(nbf, int | float) and nbf > now + leeway:
        raise TokenError("not yet valid")
    iat = claims.get("iat")
    if isinstance(iat, int | float) and iat > now + leeway:
        raise TokenError("issued in the future")


def verify_jwt(
    token: str,
    keys: KeySet,
    *,
    algorithms: Collection[str],
    issuer: str,
    audience: str,
    audience_claim: str = "aud",
    leeway: float = DEFAULT_LEEWAY,
    now: float,
    required: Collection[str] = ("exp", "iat"),
) -> dict[str, object]:
    """
    Verify a compact JWS signed JWT and return its claims.

    @param token: The token as received.
    @param keys: The key set the signing key must come from.
    @param algorithms: The accepted algorithms; only those also in
        L{ASYMMETRIC_ALGORITHMS} ever are.
    @param issuer: The exact C{iss} expected.
    @param audience: The value the audience claim must be, or (a list) contain.
    @param audience_claim: The claim holding the audience (C{client_id} for providers
        whose access tokens carry no C{aud}).
    @param leeway: Seconds of clock difference tolerated on C{exp}, C{nbf}, C{iat}.
    @param now: The current time, in seconds since the epoch.
    @param required: Claims that must be present.
    @return: The claims.
    @raise UnknownKeyError: When the token names a key id the set does not hold.
    @raise TokenError: For any other reason the token is not accepted.
    """
    if isinstance(algorithms, str):
        algorithms = (algorithms,)
    if isinstance(required, str):
        required = (required,)
    header = _decode_segment(_segments(token)[0], "header")
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in ASYMMETRIC_ALGORITHMS or alg not in algorithms:
        raise TokenError("algorithm not allowed")
    # No extension is understood here, so every critical one must be refused (RFC 7515
    # §4.1.11); b64 (RFC 7797) is only valid as one.
    if "crit" in header or "b64" in header:
        raise TokenError("critical header extension")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise TokenError("malformed key id")
    if kid is not None and not keys.has_kid(kid):
        raise UnknownKeyError(kid)
    candidates = keys.candidates(kid, alg)
    if not candidates:
        raise TokenError("no key for algorithm")
    for candidate in candidates:
        try:
            decoded = _JWS.decode_complete(token, key=candidate.key, algorithms=[alg])
        except jwt.exceptions.InvalidSignatureError:
            continue
        except jwt.exceptions.PyJWTError:
            raise TokenError("malformed token") from None
        break
    else:
        raise TokenError("bad signature")
    claims = _json_object(decoded["payload"], "claims")
    _check_claims(
        claims,
        issuer=issuer,
        audience=audience,
        audience_claim=audience_claim,
        leeway=leeway,
        now=now,
        required=required,
    )
    return claims


def verify_id_token(
    token: str,
    keys: KeySet,
    *,
    algorithms: Collection[str],
    issuer: str,
    client_id: str,
    nonce: str,
    now: float,
    leeway: float = DEFAULT_LEEWAY,
) -> dict[str, object]:
    """
    Verify an OpenID Connect id_token (OIDC Core 3.1.3.7) and return its claims.

    On top of L{verify_jwt} (audience C{client_id}; C{exp}, C{iat}, C{sub} required):
    C{sub} is a non-empty string, C{azp} when present is C{client_id} and must be present
    when C{aud} names more than one audience, and C{nonce} is the one sent with the
    authentication request.

    @param nonce: The nonce of this login; must not be empty.
    @raise UnknownKeyError: When the token names a key id the set does not hold.
    @raise TokenError: For any other reason the token is not accepted.
    """
    if not nonce:
        raise ValueError("an id_token is verified against a non-empty nonce")
    claims = verify_jwt(
        token,
        keys,
        algorithms=algorithms,
        issuer=issuer,
        audience=client_id,
        leeway=leeway,
        now=now,
        required=_ID_TOKEN_REQUIRED,
    )
    sub = claims["sub"]
    if not isinstance(sub, str) or not sub:
        raise TokenError("bad sub claim")
    if "azp" in claims:
        if claims["azp"] != client_id:
            raise TokenError("wrong authorized party")
    elif isinstance(claims["aud"], list) and len(claims["aud"]) > 1:
        raise TokenError("missing azp claim")
    sent = claims.get("nonce")
    if not isinstance(sent, str):
        raise TokenError("missing nonce claim")
    # surrogatepass: JSON can carry a lone surrogate ("\ud800"), which plain UTF-8 refuses.
    if not hmac.compare_digest(
        sent.encode("utf-8", "surrogatepass"), nonce.encode("utf-8", "surrogatepass")
    ):
        raise TokenError("nonce mismatch")
    return claims
