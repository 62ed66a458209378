"""
Verification key sets: the public keys an IdP publishes as a JWKS document.

Only public signature keys of an asymmetric type are kept, each paired with the
algorithms it may verify, so that a token can never choose how its own signature is
checked (algorithm confusion: an RSA public key used as an HMAC secret, an EC key used
with the wrong curve, C{alg: none}). Pure logic: fetching and refreshing live elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import attrs
import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

from edgegw.config.idp import ASYMMETRIC_ALGORITHMS as ASYMMETRIC_ALGORITHMS

MAX_KEYS = 100
"""The number of entries of a JWKS document considered; the rest are ignored."""

MAX_CANDIDATES = 5
"""
The most keys one token's signature is tried against. Bounds the work an attacker can
cause with a token that names no key (or a key id that a set repeats).
"""

MIN_RSA_BITS = 2048
"""The smallest RSA modulus accepted for verification."""

VerifyingKey = RSAPublicKey | EllipticCurvePublicKey | Ed25519PublicKey | Ed448PublicKey
"""A public key object that can verify one of L{ASYMMETRIC_ALGORITHMS}."""

_EC_CURVES: Mapping[str, str] = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}
_JWK_CURVES: Mapping[str, str] = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
_OKP_CURVES = frozenset({"Ed25519", "Ed448"})
# Private or symmetric key material (RFC 7518 §6.2.2, §6.3.2, §6.4.1). A published key set
# that carries any of it is misconfigured: such a key is never held.
_SECRET_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
# What pyjwt and cryptography raise for a JWK they cannot turn into a key.
_LOAD_ERRORS = (jwt.exceptions.PyJWTError, ValueError, TypeError, KeyError, UnsupportedAlgorithm)


class KeySetError(ValueError):
    """
    A JWKS document that cannot be used at all (not C{{"keys": [...]}}).
    """


@attrs.frozen
class VerificationKey:
    """
    One public signature key of a key set.

    @ivar kid: The key id (C{kid}), or L{None} when the JWK has none.
    @ivar kty: The key type: C{RSA}, C{EC} or C{OKP}.
    @ivar crv: The curve of an C{EC} or C{OKP} key, else L{None}.
    @ivar alg: The JWK's own C{alg}, which then is the only algorithm the key verifies;
        L{None} when the JWK names none.
    @ivar key: The key object, usable for every algorithm L{compatible} allows.
    """

    kid: str | None
    kty: str
    crv: str | None
    alg: str | None
    key: VerifyingKey = attrs.field(repr=False)


def compatible(key: VerificationKey, alg: str) -> bool:
    """
    Whether C{key} may verify a signature made with C{alg}.

    The algorithm must be one of L{ASYMMETRIC_ALGORITHMS} and fit the key object itself:
    C{RS*}/C{PS*} an RSA key of at least L{MIN_RSA_BITS}, C{ES256}/C{ES384}/C{ES512} an
    EC key on P-256/P-384/P-521, C{EdDSA} an Ed25519 or Ed448 key. A key whose JWK names
    an C{alg} verifies that algorithm only.
    """
    if alg not in ASYMMETRIC_ALGORITHMS or (key.alg is not None and key.alg != alg):
        return False
    public = key.key
    if alg.startswith(("RS", "PS")):
        return isinstance(public, RSAPublicKey) and public.key_size >= MIN_RSA_BITS
    curve = _EC_CURVES.get(alg)
    if curve is not None:
        return isinstance(public, EllipticCurvePublicKey) and public.curve.name == curve
    return isinstance(public, Ed25519PublicKey | Ed448PublicKey)


def _pyjwt_algorithm(kty: str, crv: str | None) -> str | None:
    """
    The algorithm pyjwt is told to load a JWK for. It only picks the key parser; the key
    object it yields serves every compatible algorithm.
    """
    if kty == "RSA":
        return "RS256"
    if kty == "EC":
        return _JWK_CURVES.get(crv) if crv is not None else None
    return "EdDSA" if crv in _OKP_CURVES else None


def load_key(jwk: object) -> VerificationKey | str:
    """
    Turn one JWK into a L{VerificationKey}, or say in a few words why it is not used.

    @param jwk: One entry of a JWKS document's C{keys}, as parsed from JSON.
    @return: The key, or the reason it is skipped (for logs; holds no key material).
    """
    if not isinstance(jwk, dict):
        return "not an object"
    kid = jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        return "kid is not a string"
    if "use" in jwk and jwk["use"] != "sig":
        return "not a signature key (use)"
    if "key_ops" in jwk:
        ops = jwk["key_ops"]
        if not isinstance(ops, list) or "verify" not in ops:
            return "not a verification key (key_ops)"
    kty = jwk.get("kty")
    if kty == "oct":
        return "symmetric key"
    if kty not in ("RSA", "EC", "OKP"):
        return "unsupported key type"
    if not _SECRET_MEMBERS.isdisjoint(jwk):
        return "holds private key material"
    alg = jwk.get("alg")
    if alg is not None and (not isinstance(alg, str) or alg not in ASYMMETRIC_ALGORITHMS):
        return "unsupported algorithm"
    crv = jwk.get("crv")
    if crv is not None and not isinstance(crv, str):
        return "crv is not a string"
    loader = _pyjwt_algorithm(kty, crv)
    if loader is None:
        return "unsupported curve"
    try:
        public = jwt.PyJWK(jwk, algorithm=loader).key
    except _LOAD_ERRORS:
        return "unreadable key"
    if not isinstance(public, VerifyingKey):
        return "not a public key"
    key = VerificationKey(kid=kid, kty=kty, crv=crv, alg=alg, key=public)
    if alg is not None and not compatible(key, alg):
        return "algorithm does not fit the key"
    return key


class KeySet:
    """
    The usable verification keys of one JWKS document, indexed for token verification.

    @ivar skipped: Why each unused entry of the document was skipped, in document order
        (C{"key 3 (kid 'x'): symmetric key"}), for logs.
    """

    __slots__ = ("_by_alg", "_by_kid", "_keys", "skipped")

    def __init__(self, keys: Iterable[VerificationKey], skipped: Iterable[str] = ()) -> None:
        """
        @param keys: The keys, in document order.
        @param skipped: Reasons for entries that were not kept.
        """
        self._keys = tuple(keys)
        self.skipped = tuple(skipped)
        by_kid: dict[str, list[VerificationKey]] = {}
        for key in self._keys:
            if key.kid is not None:
                by_kid.setdefault(key.kid, []).append(key)
        self._by_kid = {kid: tuple(found) for kid, found in by_kid.items()}
        self._by_alg = {
            alg: tuple(key for key in self._keys if compatible(key, alg))[:MAX_CANDIDATES]
            for alg in ASYMMETRIC_ALGORITHMS
        }

    @classmethod
    def from_jwks(cls, document: object) -> KeySet:
        """
        Build a key set from a parsed JWKS document.

        Entries that are not usable signature keys (C{use} other than C{sig}, C{key_ops}
        without C{verify}, symmetric or unknown types, private keys, keys that cannot be
        read) are skipped, not fatal; only the first L{MAX_KEYS} entries are considered.

        @param document: The parsed JSON, expected to be C{{"keys": [...]}}.
        @raise KeySetError: When the document does not have that shape.
        """
        if not isinstance(document, dict):
            raise KeySetError("key set is not a JSON object")
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise KeySetError('key set has no "keys" list')
        keys: list[VerificationKey] = []
        skipped: list[str] = []
        for index, entry in enumerate(entries[:MAX_KEYS]):
            loaded = load_key(entry)
            if isinstance(loaded, VerificationKey):
                keys.append(loaded)
                continue
            kid = entry.get("kid") if isinstance(entry, dict) else None
            named = f" (kid {kid[:64]!r})" if isinstance(kid, str) else ""
            skipped.append(f"key {index}{named}: {loaded}")
        if len(entries) > MAX_KEYS:
            skipped.append(f"{len(entries) - MAX_KEYS} keys beyond the first {MAX_KEYS}")
        return cls(keys, skipped)

    @property
    def keys(self) -> tuple[VerificationKey, ...]:
        """All keys of the set, in document order."""
        return self._keys

    @property
    def kids(self) -> frozenset[str]:
        """The key ids present in the set."""
        return frozenset(self._by_kid)

    def has_kid(self, kid: str) -> bool:
        """Whether some key of the set has the key id C{kid}."""
        return kid in self._by_kid

    def candidates(self, kid: str | None, alg: str) -> list[VerificationKey]:
        """
        The keys that may verify a token signed with C{alg}, at most L{MAX_CANDIDATES}.

        @param kid: The token's key id: only keys with this id qualify. L{None} (a token
            that names no key): every compatible key qualifies.
        @param alg: The token's algorithm (its header C{alg}).
        """
        if kid is None:
            return list(self._by_alg.get(alg, ()))
        found = [key for key in self._by_kid.get(kid, ()) if compatible(key, alg)]
        return found[:MAX_CANDIDATES]

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[VerificationKey]:
        return iter(self._keys)

    def __repr__(self) -> str:
        return f"<KeySet kids={sorted(self._by_kid)!r} keys={len(self._keys)}>"
