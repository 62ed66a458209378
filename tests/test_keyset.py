"""
Tests for L{edgegw.identity.keyset}: which JWKs a key set keeps, and which algorithms
each key may verify; an entry or a discovery document's algorithm list of an odd JSON
type is skipped or refused, never a C{TypeError}.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from twisted.trial.unittest import SynchronousTestCase

from edgegw.identity.discovery import DiscoveryError, parse_discovery
from edgegw.identity.keyset import (
    ASYMMETRIC_ALGORITHMS,
    MAX_CANDIDATES,
    MAX_KEYS,
    KeySet,
    KeySetError,
    VerificationKey,
    compatible,
    load_key,
)
from tests.support.fake_idp import SigningKey


def rsa_key(bits: int = 2048, which: int = 0) -> rsa.RSAPrivateKey:
    """An RSA private key, the same for the same arguments; C{which} tells keys apart."""
    return _rsa_key(bits, which)


def ec_key(curve: str = "P-256", which: int = 0) -> ec.EllipticCurvePrivateKey:
    """An EC private key on the JWK-named C{curve}, the same for the same arguments."""
    return _ec_key(curve, which)


def ed25519_key(which: int = 0) -> ed25519.Ed25519PrivateKey:
    """An Ed25519 private key, the same for the same argument."""
    return _ed25519_key(which)


def ed448_key() -> ed448.Ed448PrivateKey:
    """An Ed448 private key, the same on every call."""
    return _ed448_key()


# Cached on positional arguments only: functools.cache tells f() from f(default) apart.
@cache
def _rsa_key(bits: int, which: int) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


@cache
def _ec_key(curve: str, which: int) -> ec.EllipticCurvePrivateKey:
    curves: dict[str, ec.EllipticCurve] = {
        "P-256": ec.SECP256R1(),
        "P-384": ec.SECP384R1(),
        "P-521": ec.SECP521R1(),
        "secp256k1": ec.SECP256K1(),
    }
    return ec.generate_private_key(curves[curve])


@cache
def _ed25519_key(which: int) -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


@cache
def _ed448_key() -> ed448.Ed448PrivateKey:
    return ed448.Ed448PrivateKey.generate()


def jwk(key: Any, **members: object) -> dict[str, Any]:
    """
    The JWK of C{key} (a private key gives its public half unless C{private=True}),
    with C{members} added; a member given as L{None} is removed.
    """
    private = members.pop("private", False)
    if not private and hasattr(key, "public_key"):
        key = key.public_key()
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        document = RSAAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        document = ECAlgorithm.to_jwk(key, as_dict=True)
    else:
        document = OKPAlgorithm.to_jwk(key, as_dict=True)
    document = dict(document)
    for name, value in members.items():
        if value is None:
            document.pop(name, None)
        else:
            document[name] = value
    return document


def key_set(*jwks: dict[str, Any]) -> KeySet:
    """A key set from the given JWKs."""
    return KeySet.from_jwks({"keys": list(jwks)})


class LoadTests(SynchronousTestCase):
    """
    L{KeySet.from_jwks} and L{load_key}: which entries become keys.
    """

    def test_rsa(self) -> None:
        """
        An RSA public JWK becomes a key with its kid, kty, no crv and no alg.
        """
        keys = key_set(jwk(rsa_key(), kid="r1", use="sig"))
        [key] = keys.keys
        self.assertEqual((key.kid, key.kty, key.crv, key.alg), ("r1", "RSA", None, None))
        self.assertIsInstance(key.key, rsa.RSAPublicKey)
        self.assertEqual(keys.skipped, ())

    def test_ec_curves(self) -> None:
        """
        EC keys on P-256, P-384 and P-521 are kept with their curve.
        """
        keys = key_set(
            jwk(ec_key("P-256"), kid="p256"),
            jwk(ec_key("P-384"), kid="p384"),
            jwk(ec_key("P-521"), kid="p521"),
        )
        self.assertEqual(
            [(key.kid, key.kty, key.crv) for key in keys],
            [("p256", "EC", "P-256"), ("p384", "EC", "P-384"), ("p521", "EC", "P-521")],
        )
        for key in keys:
            self.assertIsInstance(key.key, ec.EllipticCurvePublicKey)

    def test_okp(self) -> None:
        """
        Ed25519 and Ed448 keys are kept; pyjwt would not load Ed448 without an alg.
        """
        keys = key_set(jwk(ed25519_key(), kid="ed"), jwk(ed448_key(), kid="ed448"))
        self.assertEqual(
            [(key.kid, key.kty, key.crv) for key in keys],
            [
                ("ed", "OKP", "Ed25519"),
                ("ed448", "OKP", "Ed448"),
            ],
        )
        self.assertIsInstance(keys.keys[0].key, ed25519.Ed25519PublicKey)
        self.assertIsInstance(keys.keys[1].key, ed448.Ed448PublicKey)

    def test_own_alg_kept(self) -> None:
        """
        The JWK's own C{alg} is kept.
        """
        [key] = key_set(jwk(rsa_key(), kid="r", alg="PS384")).keys
        self.assertEqual(key.alg, "PS384")

    def test_no_kid(self) -> None:
        """
        A JWK without a kid is kept, with kid L{None}.
        """
        [key] = key_set(jwk(ec_key(), kid=None)).keys
        self.assertIsNone(key.kid)

    def test_skipped(self) -> None:
        """
        Entries that are not usable public signature keys are skipped, each with its
        reason, and the rest of the set is kept.
        """
        cases: list[tuple[object, str]] = [
            (jwk(rsa_key(), kid="enc", use="enc"), "not a signature key (use)"),
            (jwk(rsa_key(), kid="u", use=["sig"]), "not a signature key (use)"),
            (jwk(rsa_key(), kid="ops", key_ops=["encrypt"]), "not a verification key (key_ops)"),
            (jwk(rsa_key(), kid="ops2", key_ops="verify"), "not a verification key (key_ops)"),
            ({"kty": "oct", "kid": "h", "k": "c2VjcmV0"}, "symmetric key"),
            ({"kty": "oct", "kid": "h2", "k": "c2VjcmV0", "alg": "HS256"}, "symmetric key"),
            ({"kid": "nokty", "n": "AQAB", "e": "AQAB"}, "unsupported key type"),
            ({"kty": "FOO", "kid": "foo"}, "unsupported key type"),
            (jwk(rsa_key(), kid="rp", private=True, key_ops=None), "holds private key material"),
            (jwk(ec_key(), kid="ep", private=True, key_ops=None), "holds private key material"),
            (
                jwk(ed25519_key(), kid="op", private=True, key_ops=None),
                "holds private key material",
            ),
            (jwk(rsa_key(), kid="rd", d="AQAB"), "holds private key material"),
            (
                jwk(ec_key(), kid="eu", private=True, use="sig", key_ops=["verify"]),
                "holds private key material",
            ),
            (jwk(rsa_key(), kid="hs", alg="HS256"), "unsupported algorithm"),
            (jwk(rsa_key(), kid="none", alg="none"), "unsupported algorithm"),
            (jwk(rsa_key(), kid="oaep", alg="RSA-OAEP"), "unsupported algorithm"),
            (jwk(rsa_key(), kid="mis", alg="ES256"), "algorithm does not fit the key"),
            (jwk(ec_key("P-256"), kid="mis2", alg="ES384"), "algorithm does not fit the key"),
            (jwk(ec_key("secp256k1"), kid="k1"), "unsupported curve"),
            ({"kty": "EC", "kid": "nocrv", "x": "AA", "y": "AA"}, "unsupported curve"),
            ({"kty": "OKP", "kid": "x25519", "crv": "X25519", "x": "AA"}, "unsupported curve"),
            (jwk(ec_key(), kid="badx", x="AAAA"), "unreadable key"),
            (jwk(ed25519_key(), kid="intx", x=12), "unreadable key"),
            (jwk(rsa_key(), kid="non", n=None), "unreadable key"),
            (jwk(rsa_key(), kid=7), "kid is not a string"),
            (jwk(ec_key(), kid="crv", crv=["P-256"]), "crv is not a string"),
            ("not a key", "not an object"),
        ]
        good = jwk(rsa_key(), kid="good")
        keys = KeySet.from_jwks({"keys": [case for case, _ in cases] + [good]})
        self.assertEqual([key.kid for key in keys], ["good"])
        self.assertEqual(len(keys.skipped), len(cases))
        for (case, reason), message in zip(cases, keys.skipped, strict=True):
            self.assertEqual(load_key(case), reason)
            self.assertTrue(message.endswith(": " + reason), message)
        self.assertEqual(keys.skipped[0], "key 0 (kid 'enc'): not a signature key (use)")

    def test_use_absent_and_key_ops_verify(self) -> None:
        """
        A JWK without C{use}, or whose C{key_ops} include C{verify}, is kept.
        """
        keys = key_set(
            jwk(rsa_key(), kid="a", use=None),
            jwk(rsa_key(), kid="b", key_ops=["verify"]),
            jwk(rsa_key(), kid="c", use="sig", key_ops=["sign", "verify"]),
        )
        self.assertEqual([key.kid for key in keys], ["a", "b", "c"])

    def test_bad_documents(self) -> None:
        """
        A document that is not C{{"keys": [...]}} raises L{KeySetError}.
        """
        documents: list[object] = [None, [], "keys", {}, {"keys": None}, {"keys": {"kid": "x"}}]
        for document in documents:
            self.assertRaises(KeySetError, KeySet.from_jwks, document)

    def test_empty(self) -> None:
        """
        An empty key list is a valid, empty key set.
        """
        keys = KeySet.from_jwks({"keys": []})
        self.assertEqual(len(keys), 0)
        self.assertEqual(keys.kids, frozenset())

    def test_bound(self) -> None:
        """
        Only the first L{MAX_KEYS} entries are considered.
        """
        entry = jwk(ec_key())
        entries = [dict(entry, kid=f"k{index}") for index in range(MAX_KEYS + 5)]
        keys = KeySet.from_jwks({"keys": entries})
        self.assertEqual(len(keys), MAX_KEYS)
        self.assertFalse(keys.has_kid(f"k{MAX_KEYS}"))
        self.assertEqual(keys.skipped, (f"5 keys beyond the first {MAX_KEYS}",))


class CompatibleTests(SynchronousTestCase):
    """
    L{compatible}: the algorithm must fit the key object and the JWK's own C{alg}.
    """

    def key(self, private: Any, **members: object) -> VerificationKey:
        loaded = load_key(jwk(private, **members))
        assert isinstance(loaded, VerificationKey), loaded
        return loaded

    def allowed(self, key: VerificationKey) -> set[str]:
        candidates = ASYMMETRIC_ALGORITHMS | {"none", "HS256", "HS384", "HS512", "ES256K"}
        return {alg for alg in candidates if compatible(key, alg)}

    def test_rsa(self) -> None:
        """
        An RSA key verifies every RS* and PS* algorithm, nothing else.
        """
        self.assertEqual(
            self.allowed(self.key(rsa_key())),
            {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"},
        )

    def test_short_rsa(self) -> None:
        """
        An RSA key under 2048 bits is loaded but verifies nothing.
        """
        self.assertEqual(self.allowed(self.key(rsa_key(1024))), set())

    def test_ec(self) -> None:
        """
        Each EC curve verifies its one ES algorithm.
        """
        self.assertEqual(self.allowed(self.key(ec_key("P-256"))), {"ES256"})
        self.assertEqual(self.allowed(self.key(ec_key("P-384"))), {"ES384"})
        self.assertEqual(self.allowed(self.key(ec_key("P-521"))), {"ES512"})

    def test_okp(self) -> None:
        """
        Ed25519 and Ed448 keys verify EdDSA only.
        """
        self.assertEqual(self.allowed(self.key(ed25519_key())), {"EdDSA"})
        self.assertEqual(self.allowed(self.key(ed448_key())), {"EdDSA"})

    def test_own_alg(self) -> None:
        """
        A JWK with C{alg: RS384} verifies RS384 only, not RS256.
        """
        key = self.key(rsa_key(), alg="RS384")
        self.assertEqual(self.allowed(key), {"RS384"})
        self.assertFalse(compatible(key, "RS256"))


class LookupTests(SynchronousTestCase):
    """
    L{KeySet.candidates}, L{KeySet.has_kid}, L{KeySet.kids}.
    """

    def setUp(self) -> None:
        self.keys = key_set(
            jwk(rsa_key(), kid="rsa"),
            jwk(rsa_key(which=1), kid="rsa", alg="PS256"),
            jwk(ec_key(), kid="ec"),
            jwk(ed25519_key(), kid=None),
            jwk(rsa_key(which=2), kid=None),
        )

    def test_kids(self) -> None:
        """
        C{kids} holds every key id once; keys without one count in C{len} only.
        """
        self.assertEqual(self.keys.kids, frozenset({"rsa", "ec"}))
        self.assertEqual(len(self.keys), 5)
        self.assertTrue(self.keys.has_kid("ec"))
        self.assertFalse(self.keys.has_kid("EC"))
        self.assertFalse(self.keys.has_kid(""))

    def test_with_kid(self) -> None:
        """
        With a kid, the compatible keys with that kid qualify.
        """
        self.assertEqual([key.alg for key in self.keys.candidates("rsa", "RS256")], [None])
        self.assertEqual([key.alg for key in self.keys.candidates("rsa", "PS256")], [None, "PS256"])
        self.assertEqual(self.keys.candidates("ec", "RS256"), [])
        self.assertEqual(self.keys.candidates("ec", "ES384"), [])
        self.assertEqual([key.kid for key in self.keys.candidates("ec", "ES256")], ["ec"])
        self.assertEqual(self.keys.candidates("other", "RS256"), [])
        self.assertEqual(self.keys.candidates("rsa", "HS256"), [])

    def test_without_kid(self) -> None:
        """
        Without a kid, every compatible key qualifies, whatever its kid.
        """
        self.assertEqual(
            [(key.kid, key.alg) for key in self.keys.candidates(None, "RS256")],
            [("rsa", None), (None, None)],
        )
        self.assertEqual([key.kty for key in self.keys.candidates(None, "EdDSA")], ["OKP"])
        self.assertEqual(self.keys.candidates(None, "none"), [])

    def test_bounded(self) -> None:
        """
        At most L{MAX_CANDIDATES} keys are tried for one token.
        """
        entry = jwk(ec_key())
        keys = KeySet.from_jwks({"keys": [dict(entry, kid="same") for _ in range(20)]})
        self.assertEqual(len(keys.candidates("same", "ES256")), MAX_CANDIDATES)
        self.assertEqual(len(keys.candidates(None, "ES256")), MAX_CANDIDATES)


class SeedTests(SynchronousTestCase):
    """
    L{KeySource.seed}: a reload's new IdP client starting from the old one's keys, a
    refetch the old one has under way included.
    """

    def test_a_refetch_under_way_carries_over(self) -> None:
        from twisted.internet.defer import Deferred
        from twisted.internet.task import Clock

        from edgegw.identity.key_source import KeySource

        first = key_set(jwk(rsa_key(), kid="k1"))
        rotated = key_set(jwk(rsa_key(), kid="k1"), jwk(rsa_key(which=1), kid="k2"))
        pending: list[Deferred[KeySet]] = []

        async def fetch(url: str) -> KeySet:
            waiting: Deferred[KeySet] = Deferred()
            pending.append(waiting)
            return await waiting

        clock = Clock()
        clock.advance(100)
        old = KeySource("id_token", fetch, clock)
        old.url, old.keys = "https://idp/jwks", first
        asked = Deferred.fromCoroutine(old.keys_for("k2"))
        self.assertEqual(len(pending), 1)
        new = KeySource("id_token", fetch, clock)
        new.seed(old)
        self.assertIs(new.keys, first)
        pending[0].callback(rotated)
        self.assertIs(self.successResultOf(asked), rotated)
        # The old one's refetch is the new one's too; no second fetch (rate-limited).
        self.assertIs(new.keys, rotated)
        self.assertIs(self.successResultOf(Deferred.fromCoroutine(new.keys_for("k2"))), rotated)
        self.assertEqual(len(pending), 1)


class OddTypes(SynchronousTestCase):
    """
    Unusable entries are skipped, not fatal, even when an entry's C{alg} (or an item of
    a discovery document's C{id_token_signing_alg_values_supported}) is a JSON array or
    object (unhashable: a C{TypeError} in a frozenset membership test would throw away
    the whole key set, and escape C{parse_discovery} instead of L{DiscoveryError}).
    """

    def test_one_odd_jwk_is_skipped_not_fatal(self) -> None:
        good = SigningKey.generate("rsa-1", "RS256").public_jwk()
        odd = dict(good, kid="odd", alg=["RS256"])
        keys = KeySet.from_jwks({"keys": [odd, good]})
        self.assertEqual(keys.kids, frozenset({"rsa-1"}))

    def test_odd_algorithm_list_item_is_a_discovery_error(self) -> None:
        document = {
            "issuer": "https://i.example",
            "authorization_endpoint": "https://i.example/a",
            "token_endpoint": "https://i.example/t",
            "jwks_uri": "https://i.example/j",
            "id_token_signing_alg_values_supported": [{"x": 1}, "RS256"],
        }
        try:
            parse_discovery(document, "https://i.example")
        except DiscoveryError:
            pass
        except TypeError as e:
            self.fail(f"TypeError escaped: {e}")
