"""
Identity assertions: a gateway hands the principal it authenticated to the gateway
behind it as a compact JWS signed with Ed25519 (header C{{alg: EdDSA, kid}}, claims C{iss,
sub, iat, exp, jti, groups, claims} and C{aud} when bound to one peer).

The minting side (L{AssertionIssuer}) signs with the C{identity.assertion.issue} seed; the
accepting side (L{AssertionVerifier}) verifies against C{identity.assertion.accept.keys},
with 30 s of clock leeway and a record of the token ids it accepted (a replayed
assertion is refused): bounded and in memory, per process, or -- with a state provider
-- in the shared store (L{AssertionVerifier.accept}), so that an assertion used at one
instance is refused at every other.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
from collections.abc import Awaitable, Callable, Mapping

import attrs
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from twisted.internet.interfaces import IReactorTime

from edgegw.config.model import AssertionAcceptSpec, AssertionIssueSpec
from edgegw.identity.principal import ClaimValue, Principal
from edgegw.identity.sealing import b64url, b64url_decode

__all__ = [
    "Asserted",
    "AssertionIssuer",
    "AssertionRefusedError",
    "AssertionUnavailableError",
    "AssertionVerifier",
    "ClaimOnce",
    "record_key",
]

LEEWAY = 30.0
"""Seconds of clock difference tolerated between the two gateways."""

MAX_ASSERTION = 16 * 1024
"""The longest assertion header looked at."""

MAX_SEEN = 100_000
"""Accepted token ids remembered (each until its assertion has expired)."""

MAX_LIFETIME = 600.0
"""The longest an accepted assertion may be valid (C{exp - iat}); issue.ttl's bound."""


class AssertionRefusedError(Exception):
    """
    An inbound assertion that is not accepted; C{reason} is for the log only.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AssertionUnavailableError(Exception):
    """
    A valid assertion whose token id could not be recorded in the shared store (it is
    down, or did not answer in time): whether it was used before cannot be told, so it
    is not accepted -- and it is not the caller's fault. C{reason} is for the log only.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


ClaimOnce = Callable[[bytes, float], Awaitable[bool]]
"""
The shared replay record: C{claim(key, ttl)} records C{key} for C{ttl} seconds unless it
is recorded already, atomically, and answers whether this call recorded it (the first
use); raises L{AssertionUnavailableError} when the record cannot be reached.
"""


@attrs.frozen
class Asserted:
    """
    What a verified assertion says about the caller.
    """

    subject: str
    groups: tuple[str, ...]
    claims: Mapping[str, ClaimValue]


class AssertionIssuer:
    """
    Mints assertions for the principals of this gateway's requests.
    """

    def __init__(self, spec: AssertionIssueSpec, clock: IReactorTime) -> None:
        self.spec = spec
        self.header = spec.header.encode("ascii")
        self._key = SigningKey(spec.seed)
        self._clock = clock
        self._head = b64url(
            json.dumps({"alg": "EdDSA", "kid": spec.key_id}, separators=(",", ":")).encode()
        ).encode("ascii")

    def mint(self, principal: Principal) -> bytes:
        """
        A fresh assertion for C{principal}: issued now, valid for C{issue.ttl}, with a
        random token id.
        """
        spec = self.spec
        now = int(self._clock.seconds())
        claims: dict[str, object] = {
            "iss": spec.name,
            "sub": principal.subject,
            "iat": now,
            "exp": now + max(1, int(spec.ttl)),
            "jti": b64url(os.urandom(16)),
            "groups": list(principal.groups),
            "claims": dict(principal.passport),
        }
        if spec.audience is not None:
            claims["aud"] = spec.audience
        payload = b64url(
            json.dumps(claims, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        ).encode("ascii")
        signing_input = self._head + b"." + payload
        signature = self._key.sign(signing_input).signature
        return signing_input + b"." + b64url(signature).encode("ascii")


class AssertionVerifier:
    """
    Verifies inbound assertions: the kid names a configured key, the signature, the
    algorithm exactly C{EdDSA}, C{iss} equal to C{accept.issuer}, C{aud} when
    C{accept.audience} is set, C{exp} and C{iat} with 30 s leeway, a token id not seen
    before within its validity.
    """

    def __init__(
        self,
        spec: AssertionAcceptSpec,
        clock: IReactorTime,
        allowed_claims: tuple[str, ...] | None = None,
        shared: ClaimOnce | None = None,
    ) -> None:
        """
        @param allowed_claims: This gateway's C{identity.claims}: the only asserted claims
            kept (a peer's allowlist is not this one's); L{None} keeps them all.
        @param shared: With a state provider, the store's record of token ids, which
            L{accept} uses instead of this process's.
        """
        self.spec = spec
        self._shared = shared
        self._allowed = frozenset(allowed_claims) if allowed_claims is not None else None
        self.header = spec.header.encode("ascii")
        self._keys = {key.key_id: VerifyKey(key.public_key) for key in spec.keys}
        self._clock = clock
        # jti -> when its assertion expires (then it can no longer be replayed anyway),
        # the same as a heap by expiry, and how many each subject holds.
        self._seen: dict[str, float] = {}
        self._expiring: list[tuple[float, str, str]] = []
        self._per_subject: dict[str, int] = {}

    def take_over(self, old: AssertionVerifier) -> None:
        """
        Share C{old}'s record of token ids (a reload): an assertion accepted before the
        reload, or by the replaced configuration while it drains, stays spent in this
        process (the shared store's record needs no hand-over).
        """
        self._seen = old._seen
        self._expiring = old._expiring
        self._per_subject = old._per_subject

    async def accept(self, token: bytes) -> Asserted:
        """
        The caller C{token} vouches for, its token id recorded where this gateway keeps
        the record: in the shared store with one (one round trip, after every other
        check passed), else in this process (L{verify}).

        @raise AssertionRefusedError: It is not a valid, fresh, unseen assertion.
        @raise AssertionUnavailableError: The shared record cannot be reached.
        """
        shared = self._shared
        if shared is None:
            return self.verify(token)
        asserted, jti, _, expires, now = self._verified(token)
        # Accepted here until exp + leeway by this clock; the other instances' clocks may
        # differ from this one's by as much again: the record outlives the assertion at
        # every instance whose clock is within the leeway.
        lifetime = expires + 2 * LEEWAY - now
        if not await shared(record_key(self.spec.issuer, jti), lifetime):
            raise AssertionRefusedError("replayed token id")
        return asserted

    def verify(self, token: bytes) -> Asserted:
        """
        The caller C{token} vouches for, its token id recorded in this process.

        @raise AssertionRefusedError: It is not a valid, fresh, unseen assertion.
        """
        asserted, jti, subject, expires, now = self._verified(token)
        self._remember(jti, subject, expires + LEEWAY, now)
        return asserted

    def _verified(self, token: bytes) -> tuple[Asserted, str, str, float, float]:
        """
        What C{token} vouches for when it is valid and fresh, with its token id,
        subject, expiry and the time it was checked at; nothing recorded yet.
        """
        if len(token) > MAX_ASSERTION:
            raise AssertionRefusedError("too long")
        parts = token.split(b".")
        if len(parts) != 3:
            raise AssertionRefusedError("not a compact JWS")
        head, payload, signature = parts
        header = _json_object(head, "header")
        if header.get("alg") != "EdDSA":
            raise AssertionRefusedError("alg is not EdDSA")
        if "crit" in header:
            raise AssertionRefusedError("crit header")
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise AssertionRefusedError("unknown kid")
        raw_signature = b64url_decode(signature)
        if raw_signature is None or len(raw_signature) != 64:
            raise AssertionRefusedError("malformed signature")
        try:
            key.verify(head + b"." + payload, raw_signature)
        except BadSignatureError:
            raise AssertionRefusedError("bad signature") from None
        claims = _json_object(payload, "claims")
        return self._check(claims)

    def _check(self, claims: Mapping[str, object]) -> tuple[Asserted, str, str, float, float]:
        spec = self.spec
        if claims.get("iss") != spec.issuer:
            raise AssertionRefusedError("wrong issuer")
        audience = claims.get("aud")
        if spec.audience is not None:
            if not (
                audience == spec.audience
                or (isinstance(audience, list) and spec.audience in audience)
            ):
                raise AssertionRefusedError("wrong audience")
        elif audience is not None:
            # RFC 7519 4.1.3: a token bound to a recipient is not for another one.
            raise AssertionRefusedError("bound to an audience, and none is accepted here")
        now = self._clock.seconds()
        expires, issued = claims.get("exp"), claims.get("iat")
        if not _number(expires) or not _number(issued):
            raise AssertionRefusedError("exp or iat missing or not a number")
        assert isinstance(expires, int | float) and isinstance(issued, int | float)
        if expires <= now - LEEWAY:
            raise AssertionRefusedError("expired")
        if issued > now + LEEWAY:
            raise AssertionRefusedError("issued in the future")
        subject, jti = claims.get("sub"), claims.get("jti")
        if not isinstance(subject, str) or not subject:
            raise AssertionRefusedError("no subject")
        if not isinstance(jti, str) or not jti or len(jti) > 256:
            raise AssertionRefusedError("no token id")
        groups = claims.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise AssertionRefusedError("groups is not a list of strings")
        passport = claims.get("claims", {})
        if not isinstance(passport, dict) or not all(
            _claim_value(value) for value in passport.values()
        ):
            raise AssertionRefusedError("claims is not an object of claim values")
        if expires - issued > MAX_LIFETIME:
            raise AssertionRefusedError("valid for longer than an assertion may be")
        allowed = self._allowed
        if allowed is not None:
            passport = {name: value for name, value in passport.items() if name in allowed}
        return Asserted(subject, tuple(groups), passport), jti, subject, float(expires), now

    def _remember(self, jti: str, subject: str, until: float, now: float) -> None:
        seen = self._seen
        expiring = self._expiring
        # Forget every expired id, whatever order they came in (ids from issuers with
        # different lifetimes, or clocks that jumped, expire out of arrival order).
        while expiring and expiring[0][0] <= now:
            _, old_jti, old_subject = heapq.heappop(expiring)
            if seen.pop(old_jti, None) is not None:
                left = self._per_subject.get(old_subject, 1) - 1
                if left:
                    self._per_subject[old_subject] = left
                else:
                    self._per_subject.pop(old_subject, None)
        if jti in seen:
            raise AssertionRefusedError("replayed token id")
        # Forgetting an unexpired id would let it be replayed: refuse instead. One
        # subject may hold a tenth of the record: it cannot shut everyone else out.
        if len(seen) >= MAX_SEEN:
            raise AssertionRefusedError("too many assertions in flight to remember")
        if self._per_subject.get(subject, 0) >= max(1, MAX_SEEN // 10):
            raise AssertionRefusedError("too many assertions in flight for this subject")
        seen[jti] = until
        heapq.heappush(expiring, (until, jti, subject))
        self._per_subject[subject] = self._per_subject.get(subject, 0) + 1


def record_key(issuer: str, jti: str) -> bytes:
    """
    The shared record's key (under the store's prefix) of token id C{jti} from
    C{issuer}: a hash of both, length-delimited, so that no two pairs share a key and
    any id makes a short key of fixed shape.
    """
    digest = hashlib.sha256()
    for part in (issuer, jti):
        raw = part.encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(raw))
        digest.update(raw)
    return b"assertion-jti:" + digest.hexdigest().encode("ascii")


def _json_object(segment: bytes, what: str) -> dict[str, object]:
    data = b64url_decode(segment)
    if data is None:
        raise AssertionRefusedError(f"malformed {what}")
    try:
        value = json.loads(data, parse_constant=_no_constant)
        if isinstance(value, dict):
            # The values go into headers and documents: they must encode again.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError, UnicodeEncodeError):
        raise AssertionRefusedError(f"malformed {what}") from None
    if not isinstance(value, dict):
        raise AssertionRefusedError(f"malformed {what}")
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _claim_value(value: object) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
