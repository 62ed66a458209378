"""
Regression tests for the independent review of Bearer access tokens (issue 12): id_tokens
and logout tokens are not access tokens; no http key set under an https issuer;
credentials never logged; algorithm lists validated; namespaced claims and huge exp
values are not 500s; a token userinfo refuses costs one call per interval; an IdP
outage is 503, not invalid_token; the verified-token cache is bounded in bytes.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.model import GroupsSpec, IdentitySpec, IdpSpec
from edgegw.identity import bearer as bearer_module
from edgegw.identity.bearer import MAX_CACHED_ENTRY, BearerVerifier
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.keyset import KeySet
from tests.support.backends import SiteBackend, answer
from tests.support.configs import problems_of
from tests.support.fake_idp import FakeIdP, compact_jws
from tests.test_bearer import (
    CLIENT_ID,
    INVALID_TOKEN,
    KEY_ALGS,
    BearerTestCase,
    BearerWorld,
    bearer_world,
    challenges,
)

# -- F1: an OIDC id_token is accepted as a Bearer access token ---------------------------


class IdTokenAsAccessToken(BearerTestCase):
    async def test_id_token_is_not_an_access_token(self) -> None:
        """
        Default config (bearer.audience = clientID, access-token keys = jwks_uri): the
        id_token the IdP issues to this client (aud = clientID, nonce, azp, typ JWT) is
        signed by the same key, names the same issuer and audience, and is accepted as
        an access token on a service route.
        """
        w = await bearer_world(self)
        id_token = w.idp.make_id_token("some-login-nonce")
        response = await w.call("/api/x", id_token)
        self.assertEqual(
            (response.status, challenges(response)),
            (401, [INVALID_TOKEN]),
            "an id_token (it carries a nonce and typ JWT) authenticated a service request",
        )

    async def test_id_token_is_forwarded_as_an_access_token(self) -> None:
        """
        ... and on a forwardAccessToken route the backend then receives the id_token
        as 'Authorization: Bearer', which it may well accept in turn.
        """
        w = await bearer_world(self)
        id_token = w.idp.make_id_token("n")
        await w.call("/fwd/x", id_token)
        self.assertEqual(w.backend.requests, [], "the backend was called with an id_token")

    async def test_back_channel_logout_token_is_not_an_access_token(self) -> None:
        """
        A Back-Channel Logout token (OIDC BCL 1.0 2.4: iss, aud = clientID, events,
        typ logout+jwt) is accepted as an access token too (with userInfo: auto it is
        only saved by userinfo refusing it when the token lacks an allowlisted claim).
        """
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        now = w.now()
        key = w.idp.signing_key
        logout = compact_jws(
            {"alg": key.alg, "typ": "logout+jwt", "kid": key.kid},
            {
                "iss": w.idp.issuer,
                "aud": CLIENT_ID,
                "sub": "alice",
                "iat": now,
                "exp": now + 120,
                "jti": "j1",
                "sid": "s1",
                "events": {"http://schemas.openid.net/event/backchannel-logout": {}},
            },
            lambda data: key.signature(data),
        )
        response = await w.call("/api/x", logout)
        self.assertEqual(response.status, 401, "a logout token authenticated a request")


# -- F3: an IdP-signed token with a huge integer exp -> 500, not 401/200 -----------------


class HugeExp(BearerTestCase):
    async def test_huge_integer_exp_is_not_a_500(self) -> None:
        w = await bearer_world(self)
        token = w.token({"exp": 10**400}, register=False)
        response = await w.call("/api/x", token)
        self.assertIn(response.status, (200, 401), "exp=10**400 made the gateway answer 500")


# -- F4: tokens end up in the access log through accessLog.requestHeaders ----------------


class AuthorizationInAccessLog(SynchronousTestCase):
    def test_request_headers_authorization_is_refused(self) -> None:
        for header in ("Authorization", "Cookie", "Proxy-Authorization"):
            problems = problems_of(
                self.mktemp(),
                f"""\
                kind: Telemetry
                metadata: {{name: t}}
                spec:
                  service: {{name: edge-test}}
                  accessLog: {{requestHeaders: [{header}]}}
                """,
            )
            self.assertTrue(problems, header)


# -- F5: bearer.jwksURL over plain http for an https issuer -------------------------------


class JwksUrlDowngrade(SynchronousTestCase):
    def test_http_jwks_url_with_an_https_issuer_is_refused(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec:
              type: oidc
              issuer: "https://idp.example"
              clientID: c
              verificationOnly: true
              bearer: {jwksURL: "http://idp.example/keys"}
            """,
        )
        self.assertTrue(problems)


# -- F6: bearer.signingAlgs naming only refused algorithms loads without an error --------


class SigningAlgsValidation(SynchronousTestCase):
    def test_refused_algorithms_are_config_errors(self) -> None:
        for algs in ("[HS256]", "[none]", "[rs256]", "[RS256, HS512]"):
            problems = problems_of(
                self.mktemp(),
                f"""\
                kind: IdP
                metadata: {{name: i}}
                spec:
                  type: oidc
                  issuer: "https://idp.example"
                  clientID: c
                  verificationOnly: true
                  bearer: {{signingAlgs: {algs}}}
                """,
            )
            self.assertTrue(problems, algs)


# -- F7: a claim name that is not a header token makes every request of its user 500 ----


class ClaimHeaderName(BearerTestCase):
    async def test_namespaced_claim_is_not_a_500(self) -> None:
        idp = FakeIdP(key_algs=KEY_ALGS)
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = BearerWorld(self, idp, backend)
        upstream = f"http://127.0.0.1:{backend.port}"
        await w.serve(
            f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  identity:
    claims: [email, "https://example.com/roles"]
---
kind: IdP
metadata: {{name: idp}}
spec: {{type: oidc, issuer: "{idp.issuer}", clientID: {CLIENT_ID}, verificationOnly: true}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  type: service
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
"""
        )
        token = w.token({"https://example.com/roles": ["admin"]})
        response = await w.call("/api/x", token)
        self.assertNotEqual(response.status, 500, "the config loaded, the request 500s")


# -- F8: a signature-valid token that userinfo refuses: one userinfo call per request ----


class UserinfoAmplification(BearerTestCase):
    async def test_revoked_token_does_not_cost_a_userinfo_call_per_request(self) -> None:
        w = await bearer_world(self)
        # Signature, iss, aud, exp fine; the IdP no longer knows it (revoked): userinfo 401.
        token = w.token(user_claims=False, register=False)
        for _ in range(20):
            await self.assert_rejected(w, token)
        self.assertLessEqual(
            w.idp.userinfo_requests, 2, "each replay of a refused token called userinfo"
        )


# -- F9: the verified-token cache is bounded in entries, not in bytes --------------------


class OutageIsNotInvalidToken(BearerTestCase):
    async def test_userinfo_outage_is_503_not_invalid_token(self) -> None:
        w = await bearer_world(self)
        w.idp.userinfo_status = 503
        response = await w.call("/api/x", w.token(user_claims=False))
        self.assertNotIn(
            INVALID_TOKEN,
            challenges(response),
            "a good token during an IdP outage is answered invalid_token (RFC 6750: the "
            "client should discard it and get a new one, at the IdP that is down)",
        )


class CacheBound(SynchronousTestCase):
    """
    The verified-token cache is bounded in bytes: a principal larger than
    MAX_CACHED_ENTRY is verified again each time rather than held.
    """

    def verifier(self, name: str) -> tuple[BearerVerifier, Clock]:
        clock = Clock()
        clock.advance(1_000_000)
        identity = IdentitySpec(claims=("name",), user_info="never", groups=GroupsSpec())
        spec = IdpSpec(name="i", issuer="https://i.example", client_id="c")

        class Provider:
            def __init__(self) -> None:
                self.spec = spec
                self.metadata = type("M", (), {"id_token_algorithms": ("RS256",)})()
                self.access_token_keys = type("K", (), {"keys": KeySet.from_jwks({"keys": []})})()

        def fake_verify(token: str, *args: Any, **kwargs: Any) -> dict[str, object]:
            return {"sub": "alice", "exp": 2_000_000, "name": name}

        self.patch(bearer_module, "verify_jwt", fake_verify)
        self.patch(bearer_module, "peek_header", lambda token: {"alg": "RS256"})
        verifier = BearerVerifier(
            Provider(),  # type: ignore[arg-type]
            identity,
            GroupRenderer(identity.groups),
            clock,
        )
        return verifier, clock

    def test_small_principals_are_cached(self) -> None:
        verifier, _ = self.verifier("Alice")
        self.successResultOf(Deferred.fromCoroutine(verifier.verify(b"a.b.c")))
        self.assertIsNotNone(verifier.cached(b"a.b.c"))

    def test_large_principals_are_not_cached(self) -> None:
        verifier, _ = self.verifier("x" * MAX_CACHED_ENTRY)
        self.successResultOf(Deferred.fromCoroutine(verifier.verify(b"a.b.c")))
        self.assertIsNone(verifier.cached(b"a.b.c"))
