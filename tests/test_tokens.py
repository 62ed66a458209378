"""
Tests for L{edgegw.identity.tokens}: JWT signature and claim verification.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Collection
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from twisted.trial.unittest import SynchronousTestCase

from edgegw.identity.keyset import KeySet
from edgegw.identity.tokens import (
    MAX_TOKEN_LENGTH,
    TokenError,
    UnknownKeyError,
    peek_header,
    verify_id_token,
    verify_jwt,
)
from tests.test_keyset import ec_key, ed448_key, ed25519_key, jwk, rsa_key

NOW = 1_700_000_000
ISSUER = "https://idp.example.com"
CLIENT = "gateway"
NONCE = "n-0S6_WzA2Mj"
ALL = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def claims(**changes: object) -> dict[str, Any]:
    """Valid access-token claims at L{NOW}; a change to L{None} removes the claim."""
    result: dict[str, Any] = {
        "iss": ISSUER,
        "aud": CLIENT,
        "sub": "alice",
        "iat": NOW - 10,
        "exp": NOW + 300,
    }
    for name, value in changes.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


def sign(
    key: Any,
    alg: str,
    payload: dict[str, Any] | None = None,
    kid: str | None = "rsa",
    **headers: Any,
) -> str:
    """A token signed with C{jwt.encode}."""
    if kid is not None:
        headers["kid"] = kid
    return jwt.encode(claims() if payload is None else payload, key, algorithm=alg, headers=headers)


def sign_raw(key: Any, alg: str, payload: bytes, **headers: Any) -> str:
    """A token over exactly the C{payload} bytes (claims jwt.encode would refuse)."""
    return jwt.api_jws.encode(payload, key, algorithm=alg, headers=headers)


def forge(header: object, payload: object, signature: bytes = b"signature") -> str:
    """A token with the given (JSON) header and payload and an arbitrary signature."""
    encode = lambda value: b64(json.dumps(value).encode())  # noqa: E731
    return f"{encode(header)}.{encode(payload)}.{b64(signature)}"


def key_set() -> KeySet:
    return KeySet.from_jwks(
        {
            "keys": [
                jwk(rsa_key(), kid="rsa", use="sig"),
                jwk(ec_key("P-256"), kid="ec"),
                jwk(ec_key("P-384"), kid="ec384"),
                jwk(ec_key("P-521"), kid="ec521"),
                jwk(ed25519_key(), kid="ed"),
                jwk(ed448_key(), kid="ed448"),
                jwk(rsa_key(which=1), kid="r384", alg="RS384"),
                jwk(rsa_key(which=2), kid="enc", use="enc"),
                jwk(rsa_key(which=3), kid="priv", private=True, key_ops=None),
            ]
        }
    )


class VerifyTests(SynchronousTestCase):
    """
    L{verify_jwt}.
    """

    def setUp(self) -> None:
        self.keys = key_set()

    def verify(
        self,
        token: str,
        algorithms: Collection[str] = ALL,
        audience: str = CLIENT,
        **options: Any,
    ) -> dict[str, object]:
        return verify_jwt(
            token,
            self.keys,
            algorithms=algorithms,
            issuer=ISSUER,
            audience=audience,
            now=NOW,
            **options,
        )

    def refused(self, reason: str, token: str, **options: Any) -> None:
        error = self.assertRaises(TokenError, self.verify, token, **options)
        self.assertEqual(error.reason, reason)

    def test_rsa(self) -> None:
        """
        RS256, RS512 and PS256 tokens signed by the RSA key verify; the claims come back.
        """
        for alg in ("RS256", "RS512", "PS256"):
            self.assertEqual(self.verify(sign(rsa_key(), alg)), claims())

    def test_ec(self) -> None:
        """
        ES256 (P-256), ES384 (P-384) and ES512 (P-521) tokens verify.
        """
        self.assertEqual(self.verify(sign(ec_key("P-521"), "ES512", kid="ec521")), claims())
        self.assertEqual(self.verify(sign(ec_key("P-256"), "ES256", kid="ec")), claims())
        self.assertEqual(self.verify(sign(ec_key("P-384"), "ES384", kid="ec384")), claims())

    def test_ed25519(self) -> None:
        """
        EdDSA tokens signed by the Ed25519 and the Ed448 key verify.
        """
        self.assertEqual(self.verify(sign(ed25519_key(), "EdDSA", kid="ed")), claims())
        self.assertEqual(self.verify(sign(ed448_key(), "EdDSA", kid="ed448")), claims())
        self.refused("bad signature", sign(ed25519_key(), "EdDSA", kid="ed448"))

    def test_no_kid(self) -> None:
        """
        A token without a kid is tried against every compatible key.
        """
        self.assertEqual(self.verify(sign(ec_key("P-384"), "ES384", kid=None)), claims())
        self.assertEqual(self.verify(sign(rsa_key(), "RS256", kid=None)), claims())

    def test_algorithms_restrict(self) -> None:
        """
        Only the configured algorithms are accepted; a single name works as well.
        """
        token = sign(ec_key(), "ES256", kid="ec")
        self.refused("algorithm not allowed", token, algorithms=["RS256"])
        self.assertEqual(self.verify(token, algorithms="ES256"), claims())
        self.refused("algorithm not allowed", token, algorithms="ES2")

    def test_enc_key_skipped(self) -> None:
        """
        A C{use: enc} key is not in the set: a token naming it has an unknown kid.
        """
        self.assertFalse(self.keys.has_kid("enc"))
        token = sign(rsa_key(which=2), "RS256", kid="enc")
        self.assertRaises(UnknownKeyError, self.verify, token)

    def test_private_key_skipped(self) -> None:
        """
        A private key published in the set is not held: a token naming it has an
        unknown kid.
        """
        self.assertFalse(self.keys.has_kid("priv"))
        token = sign(rsa_key(which=3), "RS256", kid="priv")
        self.assertRaises(UnknownKeyError, self.verify, token)

    def test_alg_none(self) -> None:
        """
        An C{alg: none} token is refused even when C{none} is configured, with an empty
        signature (not a token) or any other.
        """
        algorithms = [*ALL, "none"]
        for kid in ("rsa", None):
            header = {"alg": "none", "typ": "JWT"} | ({"kid": kid} if kid else {})
            unsigned = forge(header, claims()).rsplit(".", 1)[0] + "."
            self.refused("malformed token", unsigned, algorithms=algorithms)
            signed = forge(header, claims())
            self.refused("algorithm not allowed", signed, algorithms=algorithms)
        self.refused("algorithm not allowed", forge({"alg": "None"}, claims()))
        self.refused("algorithm not allowed", forge({"kid": "rsa"}, claims()))
        self.refused("algorithm not allowed", forge({"alg": ["RS256"]}, claims()))

    def test_hmac_with_public_key(self) -> None:
        """
        An HS256 token whose HMAC secret is the RSA public key's PEM (algorithm
        confusion) is refused even when HS256 is configured.
        """
        pem = rsa_key().public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        for kid in ("rsa", None):
            header = {"alg": "HS256", "typ": "JWT"} | ({"kid": kid} if kid else {})
            signing_input = forge(header, claims()).rsplit(".", 1)[0]
            mac = hmac.new(pem, signing_input.encode("ascii"), hashlib.sha256).digest()
            token = f"{signing_input}.{b64(mac)}"
            self.refused("algorithm not allowed", token, algorithms=[*ALL, "HS256"])

    def test_hmac(self) -> None:
        """
        An HS256 token is refused whatever its secret.
        """
        token = jwt.encode(claims(), "a shared secret of thirty-two bytes", algorithm="HS256")
        self.refused("algorithm not allowed", token, algorithms=["HS256", "RS256"])

    def test_kid_of_other_key_type(self) -> None:
        """
        An RS256 token naming the EC key's kid finds no key for its algorithm.
        """
        self.refused("no key for algorithm", sign(rsa_key(), "RS256", kid="ec"))
        self.refused("no key for algorithm", sign(ec_key("P-256"), "ES256", kid="ec384"))

    def test_jwk_alg_pins(self) -> None:
        """
        A JWK with C{alg: RS384} refuses an RS256 token and verifies an RS384 one.
        """
        self.refused("no key for algorithm", sign(rsa_key(which=1), "RS256", kid="r384"))
        self.assertEqual(self.verify(sign(rsa_key(which=1), "RS384", kid="r384")), claims())

    def test_embedded_keys_ignored(self) -> None:
        """
        C{jwk}, C{jku}, C{x5u} and C{x5c} header members never choose the key: a token
        signed by an attacker's key that it embeds fails, and a genuine token carrying
        them verifies with the set's key.
        """
        attacker = rsa_key(which=4)
        pointers: dict[str, Any] = {
            "jwk": jwk(attacker, kid="evil"),
            "jku": "https://attacker.example/jwks.json",
            "x5u": "https://attacker.example/cert.pem",
            "x5c": ["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"],
        }
        self.refused("bad signature", sign(attacker, "RS256", kid="rsa", **pointers))
        self.refused("bad signature", sign(attacker, "RS256", kid=None, **pointers))
        self.assertRaises(UnknownKeyError, self.verify, sign(attacker, "RS256", kid="evil"))
        self.assertEqual(self.verify(sign(rsa_key(), "RS256", **pointers)), claims())

    def test_unknown_kid(self) -> None:
        """
        A kid the set does not hold raises L{UnknownKeyError}, naming the kid.
        """
        error = self.assertRaises(
            UnknownKeyError, self.verify, sign(rsa_key(), "RS256", kid="rotated")
        )
        self.assertEqual((error.kid, error.reason), ("rotated", "unknown key id"))
        self.assertIsInstance(error, TokenError)

    def test_issuer(self) -> None:
        """
        C{iss} must equal the issuer exactly.
        """
        for iss in (
            "https://idp.example.com/",
            "https://idp.example",
            "https://idp.example.com.evil.example",
            "https://IDP.example.com",
            "",
        ):
            self.refused("wrong issuer", sign(rsa_key(), "RS256", claims(iss=iss)))
        self.refused("wrong issuer", sign(rsa_key(), "RS256", claims(iss=None)))
        payload = json.dumps(claims(iss=[ISSUER])).encode()
        self.refused("wrong issuer", sign_raw(rsa_key(), "RS256", payload, kid="rsa"))

    def test_audience(self) -> None:
        """
        The audience claim must be the audience or a list holding it.
        """
        self.assertEqual(
            self.verify(sign(rsa_key(), "RS256", claims(aud=["api", CLIENT]))),
            claims(aud=["api", CLIENT]),
        )
        for aud in ("api", "gatewayx", "gatewa", ["api"], [], {"aud": CLIENT}, 7, None):
            self.refused("wrong audience", sign(rsa_key(), "RS256", claims(aud=aud)))
        self.refused("wrong audience", sign(rsa_key(), "RS256"), audience="api")

    def test_audience_claim(self) -> None:
        """
        A custom audience claim (C{client_id}) is compared instead of C{aud}.
        """
        token = sign(rsa_key(), "RS256", claims(aud="api://other", client_id=CLIENT))
        self.assertEqual(self.verify(token, audience_claim="client_id")["client_id"], CLIENT)
        self.refused("wrong audience", sign(rsa_key(), "RS256"), audience_claim="client_id")

    def test_expiry(self) -> None:
        """
        A token 4 s past C{exp} passes within the 5 s leeway; 5 or 6 s past fails.
        """
        self.verify(sign(rsa_key(), "RS256", claims(exp=NOW - 4)))
        self.refused("expired", sign(rsa_key(), "RS256", claims(exp=NOW - 5)))
        self.refused("expired", sign(rsa_key(), "RS256", claims(exp=NOW - 6)))
        self.refused("expired", sign(rsa_key(), "RS256", claims(exp=NOW - 4)), leeway=0)
        self.verify(sign(rsa_key(), "RS256", claims(exp=NOW - 9.5)), leeway=10)

    def test_not_before(self) -> None:
        """
        C{nbf} may be at most the leeway ahead.
        """
        self.verify(sign(rsa_key(), "RS256", claims(nbf=NOW + 4)))
        self.refused("not yet valid", sign(rsa_key(), "RS256", claims(nbf=NOW + 6)))

    def test_issued_at(self) -> None:
        """
        C{iat} may be at most the leeway ahead.
        """
        self.verify(sign(rsa_key(), "RS256", claims(iat=NOW + 4)))
        self.refused("issued in the future", sign(rsa_key(), "RS256", claims(iat=NOW + 6)))

    def test_required(self) -> None:
        """
        C{exp} and C{iat} are required by default; C{required} changes that.
        """
        self.refused("missing exp claim", sign(rsa_key(), "RS256", claims(exp=None)))
        self.refused("missing iat claim", sign(rsa_key(), "RS256", claims(iat=None)))
        self.verify(sign(rsa_key(), "RS256", claims(iat=None)), required=("exp",))
        self.refused("missing jti claim", sign(rsa_key(), "RS256"), required=("exp", "iat", "jti"))
        self.refused("missing jti claim", sign(rsa_key(), "RS256"), required="jti")

    def test_non_numeric_dates(self) -> None:
        """
        C{exp}, C{nbf} and C{iat} must be numbers: not strings, booleans or null, and not
        the non-JSON constants Python would read.
        """
        for value in ("9999999999", True, None, [NOW + 300]):
            payload = json.dumps(claims() | {"exp": value}).encode()
            token = sign_raw(rsa_key(), "RS256", payload, kid="rsa")
            self.refused("exp claim is not a number", token)
        for name in ("nbf", "iat"):
            token = sign(rsa_key(), "RS256", claims(**{name: str(NOW)}))
            self.refused(f"{name} claim is not a number", token)
        for constant in ("Infinity", "NaN", "-Infinity"):
            payload = json.dumps(claims(exp=0)).replace('"exp": 0', f'"exp": {constant}').encode()
            self.assertIn(constant.encode(), payload)
            token = sign_raw(rsa_key(), "RS256", payload, kid="rsa")
            self.refused("malformed claims", token)

    def test_huge_numbers(self) -> None:
        """
        A huge integer C{exp} is a number (it does not overflow); a float overflowing
        to infinity is refused.
        """
        token = sign(rsa_key(), "RS256", claims(exp=10**400))
        self.assertEqual(self.verify(token)["exp"], 10**400)
        payload = json.dumps(claims(exp=1)).replace('"exp": 1', '"exp": 1e400').encode()
        self.assertIn(b"1e400", payload)
        self.refused("exp claim is not a number", sign_raw(rsa_key(), "RS256", payload, kid="rsa"))

    def test_bad_signature(self) -> None:
        """
        A token with one flipped signature byte is refused.
        """
        token = sign(rsa_key(), "RS256")
        signing_input, signature = token.rsplit(".", 1)
        raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
        raw[10] ^= 0x01
        self.refused("bad signature", f"{signing_input}.{b64(bytes(raw))}")
        header, _, signature = token.split(".")
        other = b64(json.dumps(claims(sub="mallory")).encode())
        self.refused("bad signature", f"{header}.{other}.{signature}")

    def test_truncated(self) -> None:
        """
        Truncated and malformed tokens are refused.
        """
        token = sign(rsa_key(), "RS256")
        self.assertRaises(TokenError, self.verify, token[:-4])
        self.assertRaises(TokenError, self.verify, token[:-1])
        for malformed in (
            token.rsplit(".", 1)[0],
            token.rsplit(".", 1)[0] + ".",
            token + ".",
            token + ".abc",
            token.split(".", 1)[1],
            "",
            "...",
            token.replace(".", "=.", 1),
            token.replace(".", " .", 1),
            "Bearer " + token,
        ):
            self.refused("malformed token", malformed)

    def test_too_long(self) -> None:
        """
        A token over 16 KiB is refused before it is read.
        """
        token = sign(rsa_key(), "RS256", claims(pad="x" * MAX_TOKEN_LENGTH))
        self.refused("token too long", token)
        self.refused("token too long", "a" * (MAX_TOKEN_LENGTH + 1))

    def test_bad_header(self) -> None:
        """
        A header that is not a JSON object is refused, deep nesting included.
        """
        self.refused("malformed header", forge([], claims()))
        self.refused("malformed header", forge("RS256", claims()))
        self.refused("malformed header", f"{b64(b'{alg')}.{b64(b'{}')}.{b64(b'x')}")
        self.refused("malformed header", f"{b64(b'[' * 5000)}.{b64(b'{}')}.{b64(b'x')}")
        not_utf8 = b64(bytes([0xFF]))
        self.refused("malformed header", f"{not_utf8}.{b64(b'{}')}.{b64(b'x')}")
        self.refused("malformed key id", forge({"alg": "RS256", "kid": 5}, claims()))

    def test_bad_claims(self) -> None:
        """
        A signed payload that is not a JSON object is refused.
        """
        for payload in (b"[1]", b"null", b"not json", b"{" * 3000):
            token = sign_raw(rsa_key(), "RS256", payload, kid="rsa")
            self.refused("malformed claims", token)

    def test_crit(self) -> None:
        """
        A C{crit} header (or C{b64}, which needs one) is refused.
        """
        self.refused("critical header extension", sign(rsa_key(), "RS256", crit=["exp"], exp=1))
        self.refused("critical header extension", sign(rsa_key(), "RS256", crit=[]))
        unencoded = forge({"alg": "RS256", "kid": "rsa", "b64": False}, claims())
        self.refused("critical header extension", unencoded)


class PeekTests(SynchronousTestCase):
    """
    L{peek_header}.
    """

    def test_header(self) -> None:
        """
        The unverified header comes back as a dict.
        """
        header = peek_header(sign(ec_key(), "ES256", kid="ec", typ="at+jwt"))
        self.assertEqual(header, {"alg": "ES256", "kid": "ec", "typ": "at+jwt"})

    def test_malformed(self) -> None:
        """
        Anything but a compact JWS with a JSON object header raises L{TokenError}.
        """
        for token in (
            "",
            "abc",
            "a.b",
            forge([], {}),
            f"{b64(b'[' * 5000)}.{b64(b'{}')}.{b64(b'x')}",
            forge({"alg": "RS256", "kid": 5}, {}),
            "a" * (MAX_TOKEN_LENGTH + 1),
        ):
            self.assertRaises(TokenError, peek_header, token)


class IdTokenTests(SynchronousTestCase):
    """
    L{verify_id_token}.
    """

    def setUp(self) -> None:
        self.keys = key_set()

    def verify(self, token: str, nonce: str = NONCE) -> dict[str, object]:
        return verify_id_token(
            token,
            self.keys,
            algorithms=["RS256", "ES256"],
            issuer=ISSUER,
            client_id=CLIENT,
            nonce=nonce,
            now=NOW,
        )

    def token(self, **changes: object) -> str:
        return sign(rsa_key(), "RS256", claims(nonce=NONCE) | changes)

    def refused(self, reason: str, token: str) -> None:
        error = self.assertRaises(TokenError, self.verify, token)
        self.assertEqual(error.reason, reason)

    def test_valid(self) -> None:
        """
        A valid id_token's claims come back.
        """
        self.assertEqual(self.verify(self.token()), claims(nonce=NONCE))
        self.assertEqual(self.verify(self.token(azp=CLIENT))["azp"], CLIENT)
        self.verify(self.token(aud=[CLIENT]))
        self.verify(self.token(aud=[CLIENT, "api"], azp=CLIENT))

    def test_nonce(self) -> None:
        """
        The nonce must be present, a string, and the one of this login.
        """
        self.refused("nonce mismatch", self.token(nonce="other"))
        self.refused("nonce mismatch", self.token(nonce=NONCE + "x"))
        self.refused("nonce mismatch", self.token(nonce=""))
        # A lone surrogate cannot even be a claim (it could not be written out again).
        self.refused("malformed claims (lone surrogate)", self.token(nonce="\ud800"))
        payload = json.dumps(claims(nonce=NONCE) | {"nonce": None}).encode()
        self.refused("missing nonce claim", sign_raw(rsa_key(), "RS256", payload, kid="rsa"))
        self.refused("missing nonce claim", self.token(nonce=[NONCE]))
        self.refused("missing nonce claim", sign(rsa_key(), "RS256", claims()))
        self.assertRaises(ValueError, self.verify, self.token(), nonce="")

    def test_azp(self) -> None:
        """
        C{azp}, when present, must be the client; several audiences need one.
        """
        self.refused("wrong authorized party", self.token(azp="other"))
        self.refused("wrong authorized party", self.token(aud=[CLIENT, "api"], azp="api"))
        self.refused("missing azp claim", self.token(aud=[CLIENT, "api"]))

    def test_sub(self) -> None:
        """
        C{sub} is required and must be a non-empty string.
        """
        payload = claims(nonce=NONCE, sub=None)
        self.refused("missing sub claim", sign(rsa_key(), "RS256", payload))
        self.refused("bad sub claim", self.token(sub=""))
        self.refused("bad sub claim", self.token(sub=42))

    def test_verify_jwt_checks(self) -> None:
        """
        The checks of L{verify_jwt} apply: audience is the client, iat is required.
        """
        self.refused("wrong audience", self.token(aud="api"))
        self.refused("missing iat claim", sign(rsa_key(), "RS256", claims(nonce=NONCE, iat=None)))
        self.refused("algorithm not allowed", sign(rsa_key(), "PS256", claims(nonce=NONCE)))
        self.assertRaises(UnknownKeyError, self.verify, sign(rsa_key(), "RS256", kid="x"))
