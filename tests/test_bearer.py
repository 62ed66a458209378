"""
Bearer access tokens on service routes (issue 12), end to end on real sockets: a
listening gateway, the in-repo fake OpenID provider (tests/support/fake_idp.py) with real
RS256, ES256 and EdDSA keys, and a backend recording what it receives.

Most tests run a verificationOnly instance (no session); the cookie-versus-Bearer tests
run the browser-login world of tests/test_login.py. The gateway's clock is the real
reactor's, moved on at will (L{ShiftedReactor}), so that expiry, the verified-token
cache and the key-set refetch interval are tested without waiting.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable
from typing import Any, cast

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.config.model import BearerSpec, GroupsSpec, IdentitySpec, IdpSpec
from edgegw.config.parse import load_config
from edgegw.identity import bearer as bearer_module
from edgegw.identity.bearer import MAX_CACHED_ENTRY, REFUSAL_SECONDS, BearerVerifier
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.keyset import KeySet
from edgegw.identity.principal import Principal
from edgegw.identity.provider import IdentityProvider
from edgegw.identity.tokens import verify_jwt as real_verify_jwt
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import load_text, problems_of, write_tree
from tests.support.fake_idp import FakeIdP, SigningKey, b64url, compact_jws
from tests.support.processes import listen_local, port_of
from tests.support.rawclient import connect
from tests.test_login import LoginWorld, world

reactor: Any = _reactor

CLIENT_ID = "gw"
INVALID_TOKEN = 'Bearer error="invalid_token"'
KEY_ALGS = ("RS256", "ES256", "EdDSA")


class ShiftedReactor:
    """
    The real reactor with its clock moved on by L{offset} seconds: what the gateway
    reads as the time (token expiry, the cache, the refetch interval), while its timers
    and sockets stay the real reactor's. L{freeze} stops that clock: from then on only
    L{advance} moves it, so a test can stand exactly one second before a deadline.
    """

    def __init__(self) -> None:
        self.offset = 0.0
        self.frozen: float | None = None

    def seconds(self) -> float:
        if self.frozen is not None:
            return self.frozen
        return float(reactor.seconds()) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        if self.frozen is not None:
            self.frozen += seconds

    def freeze(self) -> int:
        """
        Stop the gateway's clock at the current whole second, which is returned.
        """
        now = int(self.seconds())
        self.frozen = float(now)
        return now

    def __getattr__(self, name: str) -> Any:
        return getattr(reactor, name)


class BearerWorld(LoginWorld):
    """
    A verificationOnly gateway in front of a recording backend, and its fake IdP.

    Routes (all proxied to the backend): C{/api/} (service, auth required), C{/fwd/}
    (service, required, C{forwardAccessToken}), C{/app/} (app, required), C{/pub/}
    (service, public), plus L{extra_routes}. Identity: claims C{email} and C{name},
    groups from C{groups} (cn of C{ou=groups} DNs).
    """

    def __init__(self, test: TestCase, idp: FakeIdP, backend: SiteBackend) -> None:
        super().__init__(test, idp, backend)
        self.clock = ShiftedReactor()

    def now(self) -> int:
        """
        The gateway's time, in whole seconds.
        """
        return int(self.clock.seconds())

    async def start_bearer(
        self,
        idp_spec: str = "",
        identity_spec: str = "",
        gateway_spec: str = "",
        wait: bool = True,
    ) -> None:
        """
        @param idp_spec: YAML lines added to the IdP's spec (indented by two).
        @param identity_spec: YAML lines added to the Gateway's identity (by four).
        @param gateway_spec: YAML lines added to the Gateway's spec (by two).
        """
        upstream = f"http://127.0.0.1:{self.backend.port}"
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
{gateway_spec}  identity:
    claims: [email, name]
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
{identity_spec}---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{self.idp.issuer}"
  clientID: {CLIENT_ID}
  verificationOnly: true
{idp_spec}---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  type: service
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: fwd}}
spec:
  match: /fwd/
  type: service
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardAccessToken: true}}
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: pub}}
spec:
  match: /pub/
  type: service
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
{self.extra_routes}"""
        await self.serve(text, wait)

    async def serve(self, text: str, wait: bool = True) -> None:
        """
        As L{LoginWorld.serve}, with the gateway on L{clock}.
        """
        root = write_tree(self.test.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.gateway = build_gateway(load_config(root, {}), cast(Any, self.clock), client)
        listening = listen_local(self.gateway.site)
        self.test.addCleanup(listening.stopListening)
        self.test.addCleanup(client.close)
        self.port = port_of(listening)
        provider = self.gateway.idp
        assert provider is not None
        provider.first_retry = 0.05
        provider.retry_cap = 0.2
        provider.startService()
        self.test.addCleanup(provider.stopService)
        if wait:
            await self.ready()

    def token(
        self, claims: dict[str, Any] | None = None, user_claims: bool = True, **mint: Any
    ) -> str:
        """
        An access token for this gateway (C{aud} its client id, valid now by its clock,
        carrying the user's claims unless told not to), as L{FakeIdP.mint_access_token}
        with C{claims} and C{mint}.
        """
        now = self.now()
        base: dict[str, Any] = {"aud": CLIENT_ID, "iat": now, "exp": now + 300}
        base.update(claims or {})
        return self.idp.mint_access_token(base, user_claims=user_claims, **mint)

    async def call(
        self,
        path: str = "/api/x",
        token: str | None = None,
        headers: dict[str, str] | None = None,
        browser: Browser | None = None,
    ) -> BrowserResponse:
        """
        C{GET path} with C{Authorization: Bearer token} (when given) and C{headers}.
        """
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        return await (browser or Browser()).get(self.url(path), headers=sent)


async def bearer_world(
    test: TestCase, configure: Callable[[FakeIdP], None] | None = None, **start: Any
) -> BearerWorld:
    """
    A started L{BearerWorld} whose IdP has an RSA, an EC and an Ed25519 key;
    C{configure} sets the IdP's knobs before the gateway discovers it.
    """
    idp = FakeIdP(key_algs=KEY_ALGS)
    await idp.start(test)
    if configure is not None:
        configure(idp)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    built = BearerWorld(test, idp, backend)
    await built.start_bearer(**start)
    return built


def last_header(backend: SiteBackend, name: bytes) -> bytes | None:
    return backend.requests[-1].header(name)


def challenges(response: BrowserResponse) -> list[str]:
    return list(response.headers.getRawHeaders("WWW-Authenticate") or [])


def count_verifications(test: TestCase) -> list[str]:
    """
    Patch the verifier's signature-and-claims check to record each token it checks.
    """
    checked: list[str] = []
    real = real_verify_jwt

    def counting(token: str, *args: Any, **kwargs: Any) -> dict[str, object]:
        checked.append(token)
        return real(token, *args, **kwargs)

    test.patch(bearer_module, "verify_jwt", counting)
    return checked


async def raw_get(
    port: int, path: str, headers: list[tuple[str, str]]
) -> tuple[int, list[tuple[str, str]], bytes]:
    """
    C{GET path} over a raw connection with exactly C{headers} (repeats kept): the
    status, the response headers and the body.
    """
    client = await connect(port)
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    client.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await client.closed
    head, _, body = client.received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = []
    for line in header_lines:
        name, _, value = line.partition(":")
        parsed.append((name.strip().lower(), value.strip()))
    return int(status_line.split(" ")[1]), parsed, body


class BearerTestCase(TestCase):
    async def assert_accepted(
        self, w: BearerWorld, token: str, path: str = "/api/x", subject: bytes = b"alice"
    ) -> BrowserResponse:
        before = len(w.backend.requests)
        response = await w.call(path, token)
        self.assertEqual((response.status, response.body), (200, b"backend"))
        self.assertEqual(len(w.backend.requests), before + 1)
        self.assertEqual(last_header(w.backend, b"X-User-Id"), subject)
        return response

    async def assert_unavailable(
        self, w: BearerWorld, token: str, path: str = "/api/x"
    ) -> BrowserResponse:
        """
        The token could not be checked (the IdP is away): 503 with Retry-After, not
        invalid_token (the client keeps its token), and nothing reaches the backend.
        """
        before = len(w.backend.requests)
        response = await w.call(path, token)
        self.assertEqual(response.status, 503, token[:120])
        self.assertEqual(response.header("Retry-After"), "5")
        self.assertEqual(challenges(response), [])
        self.assertEqual(len(w.backend.requests), before)
        return response

    async def assert_rejected(
        self,
        w: BearerWorld,
        token: str | None = None,
        path: str = "/api/x",
        headers: dict[str, str] | None = None,
        challenge: str = INVALID_TOKEN,
        message: str | None = None,
    ) -> BrowserResponse:
        message = (message or token or "")[:120]
        before = len(w.backend.requests)
        response = await w.call(path, token, headers)
        self.assertEqual(response.status, 401, message)
        self.assertEqual(challenges(response), [challenge], message)
        self.assertEqual(response.body, b"unauthorized\n", message)
        self.assertEqual(len(w.backend.requests), before, f"the backend was called: {message}")
        return response


class ValidTokenTests(BearerTestCase):
    async def test_rs256(self) -> None:
        w = await bearer_world(self)
        token = w.token(key=w.idp.rsa_key)
        await self.assert_accepted(w, token)
        self.assertEqual(last_header(w.backend, b"X-User-Email"), b"alice@example.com")
        self.assertEqual(last_header(w.backend, b"X-User-Name"), b"Alice Example")
        self.assertEqual(last_header(w.backend, b"X-User-Groups"), b"admins")
        # Not a forwardAccessToken route: the client's Authorization stays here.
        self.assertIsNone(last_header(w.backend, b"Authorization"))
        self.assertEqual(w.idp.userinfo_requests, 0)

    async def test_es256(self) -> None:
        w = await bearer_world(self)
        await self.assert_accepted(w, w.token(key=w.idp.ec_key))
        self.assertEqual(last_header(w.backend, b"X-User-Groups"), b"admins")

    async def test_eddsa(self) -> None:
        w = await bearer_world(self)
        token = w.token(key=w.idp.ed_key)
        header = json.loads(_b64decode(token.split(".")[0]))
        self.assertEqual((header["alg"], header["kid"]), ("EdDSA", "ed-1"))
        await self.assert_accepted(w, token)
        self.assertEqual(last_header(w.backend, b"X-User-Email"), b"alice@example.com")

    async def test_scheme_in_any_case(self) -> None:
        w = await bearer_world(self)
        token = w.token()
        for scheme in ("bearer", "BEARER", "BeArEr"):
            response = await Browser().get(
                w.url("/api/x"), headers={"Authorization": f"{scheme} {token}"}
            )
            self.assertEqual(response.status, 200, scheme)

    async def test_forward_access_token_forwards_the_same_token(self) -> None:
        w = await bearer_world(self)
        token = w.token()
        await self.assert_accepted(w, token, "/fwd/x")
        self.assertEqual(last_header(w.backend, b"Authorization"), f"Bearer {token}".encode())

    async def test_client_authorization_is_never_forwarded_otherwise(self) -> None:
        w = await bearer_world(self)
        await self.assert_accepted(w, w.token(), "/api/x")
        self.assertIsNone(last_header(w.backend, b"Authorization"))
        # A public service route: a valid token makes a principal, an invalid one or
        # another scheme leaves the request anonymous; no credential goes through.
        for value, subject in (
            (f"Bearer {w.token()}", b"alice"),
            ("Basic dXNlcjpwYXNz", None),
            ("Bearer not-a-jwt", None),
            ("Bearer a$b", None),
        ):
            response = await Browser().get(w.url("/pub/x"), headers={"Authorization": value})
            self.assertEqual(response.status, 200, value)
            self.assertIsNone(last_header(w.backend, b"Authorization"), value)
            self.assertEqual(last_header(w.backend, b"X-User-Id"), subject, value)

    async def test_subject_claim(self) -> None:
        w = await bearer_world(self, identity_spec="    subjectClaim: preferred_username\n")
        token = w.token({"preferred_username": "alice.example"})
        await self.assert_accepted(w, token, subject=b"alice.example")

    async def test_a_token_naming_no_subject_is_refused(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        await self.assert_rejected(w, w.token(drop=["sub"]))
        await self.assert_rejected(w, w.token({"sub": ""}))

    async def test_idp_not_discovered_yet(self) -> None:
        idp = FakeIdP(key_algs=KEY_ALGS)
        await idp.start(self)
        token_key = idp.rsa_key
        await idp.stop()
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = BearerWorld(self, idp, backend)
        await w.start_bearer(wait=False)
        await self.assert_unavailable(w, w.token(key=token_key))
        await idp.restart()
        await w.ready()
        await self.assert_accepted(w, w.token(key=token_key))


class RejectionTests(BearerTestCase):
    async def test_bad_signature(self) -> None:
        w = await bearer_world(self)
        for key in (w.idp.rsa_key, w.idp.ec_key, w.idp.ed_key):
            token = w.token(key=key)
            await self.assert_rejected(w, spoil_signature(token))
            head, payload, signature = token.split(".")
            # The claims changed under a good signature: the same.
            claims = json.loads(_b64decode(payload))
            claims["sub"] = "mallory"
            forged = b64url(json.dumps(claims).encode())
            await self.assert_rejected(w, f"{head}.{forged}.{signature}")

    async def test_foreign_key_under_a_known_kid(self) -> None:
        w = await bearer_world(self)
        for kid, alg in (("rsa-1", "RS256"), ("ec-1", "ES256"), ("ed-1", "EdDSA")):
            foreign = SigningKey.generate(kid, alg)
            await self.assert_rejected(w, w.token(key=foreign))
            await self.assert_rejected(w, w.token(key=foreign, header={"kid": None}))

    async def test_unknown_kid_then_rotation_without_restart(self) -> None:
        w = await bearer_world(self)
        before = w.idp.jwks_requests
        rogue = SigningKey.generate("rogue-1", "RS256")
        await self.assert_rejected(w, w.token(key=rogue))
        self.assertEqual(w.idp.jwks_requests, before + 1)
        old = w.idp.rsa_key
        w.idp.rotate()
        new = w.token()
        self.assertIn('"kid":"rsa-2"', _b64decode(new.split(".")[0]).decode())
        # Within the refetch interval of the rogue kid's refetch: no new fetch yet.
        await self.assert_rejected(w, new)
        self.assertEqual(w.idp.jwks_requests, before + 1)
        w.clock.advance(11)
        await self.assert_accepted(w, new)
        self.assertEqual(w.idp.jwks_requests, before + 2)
        # The old keys are gone from the set.
        w.clock.advance(11)
        await self.assert_rejected(w, w.token(key=old))
        self.assertEqual(w.idp.jwks_requests, before + 3)

    async def test_rotation_is_picked_up_at_once(self) -> None:
        w = await bearer_world(self)
        await self.assert_accepted(w, w.token())
        before = w.idp.jwks_requests
        w.idp.rotate()
        for key in (w.idp.rsa_key, w.idp.ec_key, w.idp.ed_key):
            await self.assert_accepted(w, w.token(key=key))
        self.assertEqual(w.idp.jwks_requests, before + 1)

    async def test_wrong_issuer(self) -> None:
        w = await bearer_world(self)
        for iss in ("http://issuer.invalid", w.idp.issuer + "/", w.idp.issuer.upper(), "", 1):
            await self.assert_rejected(w, w.token({"iss": iss}))
        await self.assert_rejected(w, w.token(drop=["iss"]))

    async def test_wrong_audience(self) -> None:
        w = await bearer_world(self)
        for aud in ("api", "GW", "gw ", ["api"], [], None, {"gw": True}):
            await self.assert_rejected(w, w.token({"aud": aud}))
        await self.assert_rejected(w, w.token(drop=["aud"]))
        await self.assert_accepted(w, w.token({"aud": ["api", CLIENT_ID]}))

    async def test_bearer_audience(self) -> None:
        w = await bearer_world(self, idp_spec="  bearer: {audience: api}\n")
        await self.assert_accepted(w, w.token({"aud": "api"}))
        await self.assert_accepted(w, w.token({"aud": ["other", "api"]}))
        # Not the client id any more.
        await self.assert_rejected(w, w.token({"aud": CLIENT_ID}))

    async def test_audience_claim_override(self) -> None:
        w = await bearer_world(self, idp_spec="  bearer: {audienceClaim: client_id}\n")
        # The audience is read from client_id; aud says anything.
        await self.assert_accepted(w, w.token({"aud": "https://api.example", "client_id": "gw"}))
        await self.assert_accepted(w, w.token({"client_id": ["x", "gw"]}, drop=["aud"]))
        await self.assert_rejected(w, w.token({"aud": CLIENT_ID, "client_id": "another"}))
        await self.assert_rejected(w, w.token({"aud": CLIENT_ID}, drop=["client_id"]))

    async def test_audience_claim_with_bearer_audience(self) -> None:
        w = await bearer_world(
            self, idp_spec="  bearer: {audienceClaim: azp, audience: spa-client}\n"
        )
        await self.assert_accepted(w, w.token({"azp": "spa-client", "aud": "x"}))
        await self.assert_rejected(w, w.token({"azp": CLIENT_ID, "aud": CLIENT_ID}))

    async def test_expired(self) -> None:
        w = await bearer_world(self)
        now = w.now()
        await self.assert_rejected(w, w.token({"iat": now - 600, "exp": now - 10}))
        await self.assert_rejected(w, w.token({"iat": now - 600, "exp": now - 6}))
        # Within the 5 s leeway: still valid.
        await self.assert_accepted(w, w.token({"iat": now - 600, "exp": now - 2}))
        # exp is required, and must be a number.
        await self.assert_rejected(w, w.token(drop=["exp"]))
        await self.assert_rejected(w, w.token({"exp": str(now + 300)}))

    async def test_not_yet_valid(self) -> None:
        w = await bearer_world(self)
        now = w.now()
        await self.assert_rejected(w, w.token({"nbf": now + 60}))
        await self.assert_rejected(w, w.token({"nbf": now + 10}))
        await self.assert_accepted(w, w.token({"nbf": now + 2}))
        # Issued in the future, beyond the leeway.
        await self.assert_rejected(w, w.token({"iat": now + 60}))

    async def test_alg_none_in_its_spellings(self) -> None:
        w = await bearer_world(self)
        claims = w.idp.access_token_claims(user_claims=True) | {"aud": CLIENT_ID}
        signed = w.token()
        real_signature = signed.split(".")[2]
        for alg in ("none", "None", "NONE", "nOnE"):
            for kid in (None, "rsa-1"):
                header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
                if kid is not None:
                    header["kid"] = kid
                unsigned = compact_jws(header, claims, lambda _: b"")
                self.assertTrue(unsigned.endswith("."))
                await self.assert_rejected(w, unsigned)
                head, payload, _ = unsigned.split(".")
                await self.assert_rejected(w, f"{head}.{payload}.{real_signature}")
                await self.assert_rejected(w, f"{head}.{payload}.c2lnbmF0dXJl")

    async def test_hs256_signed_with_the_rsa_public_key(self) -> None:
        w = await bearer_world(self)
        claims = w.idp.access_token_claims(user_claims=True) | {"aud": CLIENT_ID}
        rsa = w.idp.rsa_key
        secrets_ = {
            "pem": rsa.public_pem,
            "pem without newline": rsa.public_pem.strip(),
            "jwk text": json.dumps(rsa.public_jwk()).encode(),
            "jwk text, compact": json.dumps(rsa.public_jwk(), separators=(",", ":")).encode(),
        }
        digests = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
        for what, secret in secrets_.items():
            for alg, digest in digests.items():
                for kid in ("rsa-1", None):
                    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
                    if kid is not None:
                        header["kid"] = kid
                    token = compact_jws(header, claims, hmac_signer(secret, digest))
                    await self.assert_rejected(w, token, message=f"{what} {alg} {kid}")

    def test_hmac_and_none_in_signing_algs_are_config_errors(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec:
              type: oidc
              verificationOnly: true
              issuer: "https://idp.example"
              clientID: c
              bearer: {signingAlgs: [HS256, none, rs256, RS256]}
            """,
        )
        accepted = "ES256, ES384, ES512, EdDSA, PS256, PS384, PS512, RS256, RS384, RS512"
        self.assertEqual(
            problems,
            [
                f'document 2, IdP "i": spec.bearer.signingAlgs[{index}]: "{alg}" is not '
                f"accepted: one of {accepted} (none and HMAC algorithms never are)"
                for index, alg in ((0, "HS256"), (1, "none"), (2, "rs256"))
            ],
        )

    async def test_hmac_refused_whatever_the_discovery_document_says(self) -> None:
        w = await bearer_world(self, configure=_algs("HS256", "RS256"))
        claims = w.idp.access_token_claims(user_claims=True) | {"aud": CLIENT_ID}
        secret = w.idp.rsa_key.public_pem
        token = compact_jws(
            {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims, hmac_signer(secret)
        )
        await self.assert_rejected(w, token)
        await self.assert_accepted(w, w.token())
        # Refused before any key is looked for: random kids cause no key-set fetch.
        before = w.idp.jwks_requests
        for alg in ("HS256", "none"):
            for _ in range(5):
                header = {"alg": alg, "kid": secrets.token_hex(8)}
                sign = hmac_signer(secret) if alg == "HS256" else (lambda _: b"sig")
                await self.assert_rejected(w, compact_jws(header, claims, sign))
        self.assertEqual(w.idp.jwks_requests, before)

    async def test_signing_algs_limits_the_algorithms(self) -> None:
        w = await bearer_world(self, idp_spec="  bearer: {signingAlgs: [ES256]}\n")
        await self.assert_accepted(w, w.token(key=w.idp.ec_key))
        await self.assert_rejected(w, w.token(key=w.idp.rsa_key))
        await self.assert_rejected(w, w.token(key=w.idp.ed_key))

    async def test_eddsa_needs_the_discovery_document_or_signing_algs(self) -> None:
        w = await bearer_world(self, configure=_algs("RS256", "ES256"))
        await self.assert_rejected(w, w.token(key=w.idp.ed_key))
        await self.assert_accepted(w, w.token(key=w.idp.rsa_key))

    async def test_algorithm_must_fit_the_key(self) -> None:
        w = await bearer_world(
            self, idp_spec="  bearer: {signingAlgs: [RS256, PS256, ES256, EdDSA]}\n"
        )
        rsa, ec, ed = w.idp.rsa_key, w.idp.ec_key, w.idp.ed_key
        # The RSA JWK says alg RS256: a PS256 signature by that very key is refused.
        await self.assert_rejected(w, w.token(key=rsa, alg="PS256"))
        # A token naming another key's kid than the one that signed it.
        await self.assert_rejected(w, w.token(key=ec, header={"kid": "rsa-1"}))
        await self.assert_rejected(w, w.token(key=rsa, header={"kid": "ec-1"}))
        await self.assert_rejected(w, w.token(key=ed, header={"kid": "ec-1"}))
        await self.assert_rejected(w, w.token(key=ec, header={"alg": "RS256"}))

    async def test_enc_use_key_is_never_used(self) -> None:
        enc = SigningKey.generate("enc-1", "RS256")
        ops = SigningKey.generate("ops-1", "RS256")

        def publish(idp: FakeIdP) -> None:
            idp.extra_jwks = [
                {**enc.public_jwk(), "use": "enc"},
                {**ops.public_jwk(), "key_ops": ["encrypt"]},
            ]

        w = await bearer_world(self, configure=publish)
        kids = [jwk["kid"] for jwk in (await Browser().get(w.idp.url("/jwks"))).json()["keys"]]
        self.assertIn("enc-1", kids)
        for key in (enc, ops):
            await self.assert_rejected(w, w.token(key=key))
            await self.assert_rejected(w, w.token(key=key, header={"kid": None}))
        await self.assert_accepted(w, w.token())

    async def test_jku_x5u_and_jwk_headers_are_never_followed(self) -> None:
        attacker = FakeIdP()
        await attacker.start(self)
        w = await bearer_world(self)
        evil = attacker.rsa_key  # kid rsa-1, like the real one
        evil_jwk = evil.public_jwk()
        attempts: list[dict[str, Any]] = [
            {"jku": attacker.url("/jwks")},
            {"jku": attacker.url("/jwks"), "kid": "attacker-1"},
            {"jku": attacker.url("/jwks"), "kid": None},
            {"x5u": attacker.url("/jwks")},
            {"x5u": attacker.url("/jwks"), "kid": None},
            {"jwk": evil_jwk},
            {"jwk": evil_jwk, "kid": None},
            {"jwk": {**evil_jwk, "kid": "attacker-1"}, "kid": "attacker-1"},
        ]
        for header in attempts:
            await self.assert_rejected(w, w.token(key=evil, header=header))
        self.assertEqual((attacker.discovery_requests, attacker.jwks_requests), (0, 0))
        # The same headers on a token the real key signed change nothing either way.
        await self.assert_accepted(w, w.token(header={"jku": attacker.url("/jwks")}))

    async def test_critical_header(self) -> None:
        w = await bearer_world(self)
        await self.assert_rejected(w, w.token(header={"crit": ["exp"], "exp": 1}))

    async def test_malformed_tokens(self) -> None:
        w = await bearer_world(self)
        good = w.token()
        head, payload, signature = good.split(".")
        for token in (
            "abc",
            "a.b",
            f"{head}.{payload}",
            f"{head}.{payload}.{signature}.x",
            f"{head}..{signature}",
            f"{head}.{payload}.{signature}==",
            "x" * 16000,
        ):
            await self.assert_rejected(w, token)


class IdTokenAsAccessToken(BearerTestCase):
    """
    An OIDC id_token or a Back-Channel Logout token is not an access token.
    """

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


class HugeExp(BearerTestCase):
    """
    An IdP-signed token with a huge integer C{exp} is answered, never a 500.
    """

    async def test_huge_integer_exp_is_not_a_500(self) -> None:
        w = await bearer_world(self)
        token = w.token({"exp": 10**400}, register=False)
        response = await w.call("/api/x", token)
        self.assertIn(response.status, (200, 401), "exp=10**400 made the gateway answer 500")


class ClaimHeaderName(BearerTestCase):
    """
    A claim name that is not a header token does not make its user's requests 500.
    """

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


class CredentialTests(BearerTestCase):
    async def test_no_credential(self) -> None:
        w = await bearer_world(self)
        await self.assert_rejected(w, challenge="Bearer")

    async def test_basic_credential_is_no_credential(self) -> None:
        w = await bearer_world(self)
        for value in ("Basic dXNlcjpwYXNz", "Digest username=x", "Bearerx abc"):
            await self.assert_rejected(w, headers={"Authorization": value}, challenge="Bearer")

    async def test_bearer_without_a_token(self) -> None:
        w = await bearer_world(self)
        # RFC 6750 (and docs/architecture.md): a Bearer credential without a token is a
        # malformed one, rejected as such; not the same as sending no credential. (The
        # server strips trailing spaces: "Bearer " arrives as "Bearer".)
        values = ("Bearer", "Bearer ", "bearer   ", "BEARER")
        seen = []
        for value in values:
            response = await w.call(headers={"Authorization": value})
            seen.append((value, response.status, challenges(response)))
        self.assertEqual(seen, [(value, 401, [INVALID_TOKEN]) for value in values])
        self.assertEqual(w.backend.requests, [])

    async def test_bearer_with_characters_outside_b64token(self) -> None:
        w = await bearer_world(self)
        good = w.token()
        for token in (
            good + "$",
            good.replace(".", ",", 1),
            f"{good} {good}",
            "a=b",
            "=",
            good + '"',
            "é" + good,
        ):
            await self.assert_rejected(
                w, headers={"Authorization": f"Bearer {token}"}, challenge=INVALID_TOKEN
            )

    async def test_two_authorization_headers(self) -> None:
        w = await bearer_world(self)
        good = w.token()
        for pair in (
            [("Authorization", f"Bearer {good}"), ("Authorization", f"Bearer {good}")],
            [("Authorization", f"Bearer {good}"), ("Authorization", "Basic dXNlcjpwYXNz")],
            [("Authorization", "Basic dXNlcjpwYXNz"), ("Authorization", f"Bearer {good}")],
        ):
            status, headers, body = await raw_get(w.port, "/api/x", pair)
            self.assertEqual(status, 401, pair)
            self.assertEqual(
                [value for name, value in headers if name == "www-authenticate"], [INVALID_TOKEN]
            )
            self.assertEqual(body, b"unauthorized\n")
        self.assertEqual(w.backend.requests, [])
        # One of them alone is fine.
        status, _, _ = await raw_get(w.port, "/api/x", [("Authorization", f"Bearer {good}")])
        self.assertEqual(status, 200)


class CookieAndAppRouteTests(TestCase):
    """
    Browser login and Bearer tokens on one gateway (tests/test_login.py's world).
    """

    def bob(self, w: LoginWorld) -> str:
        return w.idp.mint_access_token(
            {
                "sub": "bob",
                "aud": CLIENT_ID,
                "email": "bob@example.com",
                "name": "Bob Example",
                "given_name": "Bob",
                "family_name": "Example",
                "groups": ["cn=users,ou=groups,dc=example,dc=com"],
            }
        )

    async def test_the_session_cookie_wins(self) -> None:
        w = await world(self)
        bob = self.bob(w)
        alone = await Browser().get(w.url("/api/x"), headers={"Authorization": f"Bearer {bob}"})
        self.assertEqual(alone.status, 200)
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Id"), b"bob")
        await w.login()
        both = await w.browser.get(w.url("/api/x"), headers={"Authorization": f"Bearer {bob}"})
        self.assertEqual(both.status, 200)
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Id"), b"alice")
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Groups"), b"admins")
        # A cookie that is no session: the Bearer token decides.
        stale = Browser(cookies={"gw_session": "garbage"})
        response = await stale.get(w.url("/api/x"), headers={"Authorization": f"Bearer {bob}"})
        self.assertEqual(response.status, 200)
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Id"), b"bob")
        # ... and a rejected one gets invalid_token even with the stale cookie.
        response = await stale.get(w.url("/api/x"), headers={"Authorization": "Bearer x.y.z"})
        self.assertEqual((response.status, challenges(response)), (401, [INVALID_TOKEN]))

    async def test_a_valid_cookie_with_a_rejected_token(self) -> None:
        w = await world(self)
        await w.login()
        response = await w.browser.get(w.url("/api/x"), headers={"Authorization": "Bearer x.y.z"})
        self.assertEqual(response.status, 200)
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Id"), b"alice")

    async def test_app_routes_ignore_bearer_tokens(self) -> None:
        w = await world(self)
        checked = count_verifications(self)
        bob = self.bob(w)
        auth = {"Authorization": f"Bearer {bob}"}
        navigate = await Browser().get(w.url("/app/page?x=1"), headers=auth)
        self.assertEqual(navigate.status, 302)
        self.assertEqual(navigate.location, "/auth/login?return_to=%2Fapp%2Fpage%3Fx%3D1")
        self.assertEqual(navigate.header("WWW-Authenticate"), None)
        fetch = await Browser().get(w.url("/app/page"), headers={**auth, "Sec-Fetch-Mode": "cors"})
        self.assertEqual((fetch.status, challenges(fetch)), (401, ["Bearer"]))
        self.assertEqual(w.backend.requests, [])
        self.assertEqual(checked, [])
        # The same token on the service route works.
        api = await Browser().get(w.url("/api/x"), headers=auth)
        self.assertEqual(api.status, 200)
        self.assertEqual(checked, [bob])

    async def test_app_route_without_login_ignores_bearer_tokens(self) -> None:
        w = await bearer_world(self)
        checked = count_verifications(self)
        token = w.token()
        response = await w.call("/app/x", token)
        self.assertEqual((response.status, challenges(response)), (401, ["Bearer"]))
        response = await w.call("/app/x", token, {"Sec-Fetch-Mode": "navigate"})
        self.assertEqual((response.status, challenges(response)), (401, ["Bearer"]))
        self.assertEqual(w.backend.requests, [])
        self.assertEqual(checked, [])


class KeySetTests(BearerTestCase):
    async def test_jwks_uri_by_default(self) -> None:
        w = await bearer_world(self)
        self.assertEqual(w.idp.jwks_requests, 1)
        await self.assert_accepted(w, w.token())
        self.assertEqual((w.idp.jwks_requests, w.idp.access_jwks_requests), (1, 0))

    async def test_discovery_jwks_access_token_uri(self) -> None:
        at = SigningKey.generate("at-1", "RS256")

        def access_keys(idp: FakeIdP) -> None:
            idp.access_token_keys = [at]

        w = await bearer_world(self, configure=access_keys)
        document = (await Browser().get(w.idp.url("/.well-known/openid-configuration"))).json()
        self.assertEqual(document["jwks_access_token_uri"], w.idp.url("/access-jwks"))
        self.assertEqual(w.idp.access_jwks_requests, 1)
        await self.assert_accepted(w, w.token(key=at))
        # The id_token keys are not access-token keys.
        await self.assert_rejected(w, w.token(key=w.idp.rsa_key))
        self.assertEqual(w.idp.access_jwks_requests, 2)  # the unknown kid's refetch
        self.assertEqual(w.idp.jwks_requests, 1)

    async def test_bearer_jwks_url(self) -> None:
        at = SigningKey.generate("at-1", "RS256")

        def unannounced(idp: FakeIdP) -> None:
            idp.access_token_keys = [at]
            idp.announce_access_jwks = False

        w = await jwks_url_world(self, unannounced, "/access-jwks")
        await self.assert_accepted(w, w.token(key=at))
        await self.assert_rejected(w, w.token(key=w.idp.rsa_key))
        self.assertEqual(w.idp.access_jwks_requests, 2)

    async def test_bearer_jwks_url_wins_over_discovery(self) -> None:
        at = SigningKey.generate("at-1", "RS256")

        def announced(idp: FakeIdP) -> None:
            idp.access_token_keys = [at]

        w = await jwks_url_world(self, announced, "/jwks")
        await self.assert_accepted(w, w.token(key=w.idp.rsa_key))
        await self.assert_rejected(w, w.token(key=at))
        self.assertEqual(w.idp.access_jwks_requests, 0)

    async def test_a_flood_of_unknown_kids_refetches_once(self) -> None:
        w = await bearer_world(self)
        rogue = SigningKey.generate("rogue", "ES256")
        before = w.idp.jwks_requests
        tokens = [w.token(key=rogue, header={"kid": secrets.token_hex(8)}) for _ in range(50)]
        responses = await gatherResults(
            [Deferred.fromCoroutine(w.call("/api/x", token)) for token in tokens]
        )
        self.assertEqual([r.status for r in responses], [401] * 50)
        self.assertEqual({tuple(challenges(r)) for r in responses}, {(INVALID_TOKEN,)})
        self.assertEqual(w.idp.jwks_requests, before + 1)
        # One by one, still within the interval: no more fetches.
        for token in tokens[:10]:
            await self.assert_rejected(w, token)
        self.assertEqual(w.idp.jwks_requests, before + 1)
        # Good tokens are served all along.
        await self.assert_accepted(w, w.token())
        # A new interval: one more fetch for the next flood.
        w.clock.advance(11)
        responses = await gatherResults(
            [Deferred.fromCoroutine(w.call("/api/x", token)) for token in tokens[:20]]
        )
        self.assertEqual([r.status for r in responses], [401] * 20)
        self.assertEqual(w.idp.jwks_requests, before + 2)
        self.assertEqual(w.backend.requests[-1].header(b"X-User-Id"), b"alice")
        self.assertEqual(len(w.backend.requests), 1)


async def jwks_url_world(
    test: TestCase, configure: Callable[[FakeIdP], None], path: str
) -> BearerWorld:
    """
    A L{BearerWorld} whose C{bearer.jwksURL} is C{path} on its own IdP.
    """
    idp = FakeIdP(key_algs=KEY_ALGS)
    await idp.start(test)
    configure(idp)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = BearerWorld(test, idp, backend)
    await w.start_bearer(idp_spec=f'  bearer: {{jwksURL: "{idp.url(path)}"}}\n')
    return w


def spoil_signature(token: str) -> str:
    """
    C{token} with one bit of its signature flipped.
    """
    head, payload, signature = token.split(".")
    raw = bytearray(_b64decode(signature))
    raw[len(raw) // 2] ^= 0x01
    return f"{head}.{payload}.{b64url(bytes(raw))}"


def hmac_signer(secret: bytes, digest: Any = hashlib.sha256) -> Callable[[bytes], bytes]:
    """
    Signs a JWS signing input with HMAC keyed with C{secret}.
    """

    def sign(data: bytes) -> bytes:
        return hmac.new(secret, data, digest).digest()

    return sign


def _algs(*algs: str) -> Callable[[FakeIdP], None]:
    def configure(idp: FakeIdP) -> None:
        idp.signing_algs = list(algs)

    return configure


def _b64decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


class CacheTests(BearerTestCase):
    async def test_a_verified_token_is_not_verified_again(self) -> None:
        w = await bearer_world(self)
        checked = count_verifications(self)
        token = w.token()
        for _ in range(3):
            await self.assert_accepted(w, token)
        self.assertEqual(checked, [token])
        # Another token is verified on its own.
        other = w.token()
        await self.assert_accepted(w, other)
        self.assertEqual(checked, [token, other])

    async def test_concurrent_requests_share_one_verification(self) -> None:
        w = await bearer_world(self)
        checked = count_verifications(self)
        token = w.token(user_claims=False)  # userinfo too: the verification takes a while
        responses = await gatherResults(
            [Deferred.fromCoroutine(w.call("/api/x", token)) for _ in range(10)]
        )
        self.assertEqual([r.status for r in responses], [200] * 10)
        self.assertEqual(checked, [token])
        self.assertEqual(w.idp.userinfo_requests, 1)
        # A rejected one: every waiter gets the rejection.
        w.idp.userinfo_status = 401
        failing = w.token(user_claims=False)
        responses = await gatherResults(
            [Deferred.fromCoroutine(w.call("/api/x", failing)) for _ in range(10)]
        )
        self.assertEqual(
            [(r.status, challenges(r)) for r in responses], [(401, [INVALID_TOKEN])] * 10
        )
        # (Those arriving after the rejection verify it again: nothing is cached.)
        self.assertEqual(set(checked[1:]), {failing})
        self.assertEqual(len(w.backend.requests), 10)

    async def test_the_cache_expires_with_the_token(self) -> None:
        w = await bearer_world(self)
        checked = count_verifications(self)
        # The clock moves only when told: 59 s on is exactly 1 s before exp, however
        # long the requests take.
        now = w.clock.freeze()
        token = w.token({"exp": now + 60})
        await self.assert_accepted(w, token)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 1)
        w.clock.advance(59)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 1)
        # Past exp (within the leeway): verified again, not trusted from the cache.
        w.clock.advance(2)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 2)
        w.clock.advance(10)
        await self.assert_rejected(w, token)
        self.assertEqual(len(checked), 3)

    async def test_the_cache_is_bounded_in_bytes(self) -> None:
        """
        Entries count their token's bytes towards the cache's size bound: with room for
        one entry, a second token pushes out the least recently used one, which is then
        verified again.
        """
        w = await bearer_world(self)
        checked = count_verifications(self)
        first, second = w.token(), w.token()
        self.patch(bearer_module, "MAX_CACHED_BYTES", len(first) + len(first) // 2)
        await self.assert_accepted(w, first)
        await self.assert_accepted(w, first)
        self.assertEqual(checked, [first])
        await self.assert_accepted(w, second)
        await self.assert_accepted(w, second)
        self.assertEqual(checked, [first, second])
        await self.assert_accepted(w, first)
        self.assertEqual(checked, [first, second, first])

    def test_a_token_verified_again_replaces_its_entry(self) -> None:
        """
        A token whose entry lapsed and which is verified and cached again replaces its
        entry: the cache's byte count holds that entry once, however often it happens
        (it grew with each, and the cache then pushed out live entries for room).
        """
        clock = Clock()
        spec = IdpSpec(
            name="idp",
            issuer="https://idp.test",
            client_id="gw",
            verification_only=True,
            bearer=BearerSpec(cache_ttl=30.0),
        )
        provider = IdentityProvider(spec, cast(UpstreamAgent, None), clock)
        identity = IdentitySpec()
        verifier = BearerVerifier(provider, identity, GroupRenderer(identity.groups), clock)
        principal = Principal(subject="user-1", access_token="t" * 900)
        token = b"t" * 900
        for _ in range(5):
            verifier._cache(token, principal, None)
            self.assertIs(verifier.cached(token), principal)
            clock.advance(31)
            self.assertIsNone(verifier.cached(token))
        self.assertEqual(len(verifier._verified), 1)
        self.assertEqual(verifier._bytes, 900 + 900 + len("user-1"))

    async def test_the_cache_ttl(self) -> None:
        w = await bearer_world(self, idp_spec="  bearer: {cacheTTL: 30s}\n")
        checked = count_verifications(self)
        token = w.token({"exp": w.now() + 3600})
        await self.assert_accepted(w, token)
        w.clock.advance(29)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 1)
        w.clock.advance(2)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 2)
        await self.assert_accepted(w, token)
        self.assertEqual(len(checked), 2)

    async def test_cache_ttl_zero_verifies_every_request(self) -> None:
        w = await bearer_world(
            self, idp_spec="  bearer: {cacheTTL: 0s}\n", identity_spec="    userInfo: always\n"
        )
        checked = count_verifications(self)
        token = w.token()
        for _ in range(3):
            await self.assert_accepted(w, token)
        self.assertEqual(checked, [token] * 3)
        self.assertEqual(w.idp.userinfo_requests, 3)

    async def test_a_rejected_token_is_never_cached(self) -> None:
        w = await bearer_world(self)
        checked = count_verifications(self)
        # Signed by a key the IdP publishes only later.
        upcoming = SigningKey.generate("next-1", "RS256")
        token = w.token(key=upcoming)
        before = w.idp.jwks_requests
        await self.assert_rejected(w, token)
        self.assertEqual(w.idp.jwks_requests, before + 1)
        w.idp.keys.append(upcoming)
        w.clock.advance(11)
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.jwks_requests, before + 2)
        self.assertEqual(checked, [token] * 4)  # twice per attempt: before and after refetch
        # Rejected for a claim: each attempt is checked again.
        wrong = w.token({"aud": "api"})
        for _ in range(3):
            await self.assert_rejected(w, wrong)
        self.assertEqual(checked.count(wrong), 3)

    async def test_a_token_refused_by_userinfo_is_not_cached(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: always\n")
        token = w.token()
        w.idp.userinfo_status = 401
        await self.assert_rejected(w, token)
        await self.assert_rejected(w, token)
        w.idp.userinfo_status = 200
        w.clock.advance(REFUSAL_SECONDS)
        await self.assert_accepted(w, token)
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_requests, 2)


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
            # (scope: an access token's, with the default audience, the client's)
            return {"sub": "alice", "exp": 2_000_000, "name": name, "scope": "api"}

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


class UserInfoTests(BearerTestCase):
    async def test_auto_fetches_a_missing_claim_with_the_token(self) -> None:
        w = await bearer_world(self)
        token = w.token(user_claims=False)
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_tokens, [token])
        self.assertEqual(last_header(w.backend, b"X-User-Email"), b"alice@example.com")
        self.assertEqual(last_header(w.backend, b"X-User-Groups"), b"admins")
        # Once per token: the principal is cached with it.
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_requests, 1)

    async def test_auto_fetches_only_when_a_claim_is_missing(self) -> None:
        w = await bearer_world(self)
        await self.assert_accepted(w, w.token())
        self.assertEqual(w.idp.userinfo_requests, 0)
        # Only the group source missing.
        token = w.token(drop=["groups"])
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_tokens, [token])
        self.assertEqual(last_header(w.backend, b"X-User-Groups"), b"admins")

    async def test_always(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: always\n")
        w.idp.user["name"] = "Alice From Userinfo"
        token = w.token()
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_tokens, [token])
        self.assertEqual(last_header(w.backend, b"X-User-Name"), b"Alice From Userinfo")

    async def test_never(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        await self.assert_accepted(w, w.token(user_claims=False))
        self.assertEqual(w.idp.userinfo_requests, 0)
        self.assertIsNone(last_header(w.backend, b"X-User-Email"))

    async def test_userinfo_about_someone_else_is_ignored(self) -> None:
        w = await bearer_world(self)
        w.idp.user["email"] = "mallory@example.com"
        w.idp.user["sub"] = "mallory"
        token = w.token({"sub": "alice"}, user_claims=False)
        await self.assert_accepted(w, token)
        self.assertEqual(w.idp.userinfo_requests, 1)
        self.assertIsNone(last_header(w.backend, b"X-User-Email"))

    async def test_userinfo_failure_rejects_the_token(self) -> None:
        w = await bearer_world(self)
        # The IdP failing is not the token's fault: 503, the client keeps its token.
        for status in (500, 503):
            w.idp.userinfo_status = status
            await self.assert_unavailable(w, w.token({"jti": f"s{status}"}, user_claims=False))
        # Userinfo refusing the token: it is invalid.
        for status in (401, 403):
            w.idp.userinfo_status = status
            await self.assert_rejected(w, w.token({"jti": f"s{status}"}, user_claims=False))
        # A token the userinfo endpoint does not know.
        w.idp.userinfo_status = 200
        await self.assert_rejected(w, w.token(user_claims=False, register=False))

    async def test_userinfo_down_rejects_the_token(self) -> None:
        w = await bearer_world(self)
        token = w.token(user_claims=False)
        await w.idp.stop()
        await self.assert_unavailable(w, token)
        await w.idp.restart()
        # The outage is remembered for the token a few seconds (a replayed token must
        # not cost a userinfo call per request), then it is checked again.
        await self.assert_unavailable(w, token)
        w.clock.advance(REFUSAL_SECONDS)
        await self.assert_accepted(w, token)

    async def test_a_token_userinfo_refuses_costs_one_call_per_interval(self) -> None:
        w = await bearer_world(self)
        token = w.token(user_claims=False)
        w.idp.userinfo_status = 401
        for _ in range(20):
            await self.assert_rejected(w, token)
        self.assertEqual(w.idp.userinfo_requests, 1)
        w.clock.advance(REFUSAL_SECONDS)
        await self.assert_rejected(w, token)
        self.assertEqual(w.idp.userinfo_requests, 2)


class UserinfoAmplification(BearerTestCase):
    """
    A signature-valid token that userinfo refuses costs one userinfo call per
    interval, not one per request.
    """

    async def test_revoked_token_does_not_cost_a_userinfo_call_per_request(self) -> None:
        w = await bearer_world(self)
        # Signature, iss, aud, exp fine; the IdP no longer knows it (revoked): userinfo 401.
        token = w.token(user_claims=False, register=False)
        for _ in range(20):
            await self.assert_rejected(w, token)
        self.assertLessEqual(
            w.idp.userinfo_requests, 2, "each replay of a refused token called userinfo"
        )


class OutageIsNotInvalidToken(BearerTestCase):
    """
    An IdP outage is a 503, not C{invalid_token}.
    """

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


class VerificationOnlyConfigTests(SynchronousTestCase):
    def test_client_secret_and_redirect_url_are_errors(self) -> None:
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
              clientSecret: s
              redirectURL: "https://gw.example/auth/callback"
            """,
        )
        self.assertEqual(
            problems,
            [
                'document 2, IdP "i": spec.clientSecret: not allowed with verificationOnly: true',
                'document 2, IdP "i": spec.redirectURL: not allowed with verificationOnly: true',
            ],
        )

    def test_each_alone_is_an_error(self) -> None:
        for key, value in (("clientSecret", "s"), ("redirectURL", "https://gw.example/cb")):
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
                  {key}: "{value}"
                """,
            )
            self.assertEqual(
                problems,
                [f'document 2, IdP "i": spec.{key}: not allowed with verificationOnly: true'],
            )

    def test_a_session_is_an_error(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              listen: "127.0.0.1:0"
              session: {key: "0123456789abcdef0123456789abcdef"}
            ---
            kind: IdP
            metadata: {name: i}
            spec: {type: oidc, issuer: "https://idp.example", clientID: c, verificationOnly: true}
            """,
            gateway=False,
        )
        self.assertEqual(
            problems,
            [
                'document 1, Gateway "g": spec.session: a verificationOnly IdP cannot serve a '
                "configuration that has a session"
            ],
        )

    def test_issuer_and_client_id_are_enough(self) -> None:
        config = load_text(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec: {type: oidc, issuer: "https://idp.example", clientID: c, verificationOnly: true}
            """,
        )
        idp = config.idp
        assert idp is not None
        self.assertTrue(idp.verification_only)
        self.assertIsNone(idp.client_secret)
        self.assertIsNone(idp.redirect_url)
        self.assertIsNone(config.gateway.session)
        bearer = idp.bearer
        self.assertEqual(
            (bearer.jwks_url, bearer.audience_claim, bearer.audience, bearer.signing_algs),
            (None, "aud", None, None),
        )
        self.assertEqual(bearer.cache_ttl, 300.0)

    def test_issuer_and_client_id_are_required(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec: {type: oidc, verificationOnly: true}
            """,
        )
        self.assertEqual(
            problems,
            [
                'document 2, IdP "i": spec.issuer: required field is missing',
                'document 2, IdP "i": spec.clientID: required field is missing',
            ],
        )

    def test_bearer_block(self) -> None:
        config = load_text(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec:
              type: oidc
              issuer: "https://idp.example"
              clientID: c
              verificationOnly: true
              bearer:
                jwksURL: "https://idp.example/at-keys"
                audienceClaim: client_id
                audience: api
                signingAlgs: [ES256]
                cacheTTL: 0s
            """,
        )
        assert config.idp is not None
        bearer = config.idp.bearer
        self.assertEqual(
            (
                bearer.jwks_url,
                bearer.audience_claim,
                bearer.audience,
                bearer.signing_algs,
                bearer.cache_ttl,
            ),
            ("https://idp.example/at-keys", "client_id", "api", ("ES256",), 0.0),
        )


class JwksUrlDowngrade(SynchronousTestCase):
    """
    C{bearer.jwksURL} over plain http for an https issuer is refused.
    """

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


class SigningAlgsValidation(SynchronousTestCase):
    """
    C{bearer.signingAlgs} naming only refused algorithms is a configuration error.
    """

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


class VerificationOnlyEndpointTests(BearerTestCase):
    async def test_no_auth_endpoints(self) -> None:
        w = await bearer_world(self)
        self.assertEqual(w.gateway.auth_endpoints, ())
        browser = Browser()
        for method, path in (
            ("GET", "/auth/login"),
            ("GET", "/auth/login?return_to=/app/x"),
            ("GET", "/auth/callback?code=c&state=s"),
            ("POST", "/auth/logout"),
            ("GET", "/auth/logout"),
            ("GET", "/auth/session"),
        ):
            response = await browser.request(method, w.url(path))
            self.assertEqual(response.status, 404, (method, path))
            self.assertIsNone(response.header("Set-Cookie"), (method, path))
        self.assertEqual(browser.cookies, {})
        self.assertEqual(w.idp.authorize_requests, [])
        self.assertEqual(w.backend.requests, [])
        # Bearer service routes are served.
        await self.assert_accepted(w, w.token())

    async def test_auth_paths_go_to_a_catch_all_route(self) -> None:
        idp = FakeIdP(key_algs=KEY_ALGS)
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = BearerWorld(self, idp, backend)
        w.extra_routes = f"""\
---
kind: Route
metadata: {{name: all}}
spec:
  match: /
  type: service
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}
"""
        await w.start_bearer()
        for method, path in (
            ("GET", "/auth/login"),
            ("GET", "/auth/callback?code=c&state=s"),
            ("POST", "/auth/logout"),
            ("GET", "/auth/session"),
        ):
            response = await Browser().request(method, w.url(path), body=b"")
            self.assertEqual((response.status, response.body), (200, b"backend"), path)
            self.assertEqual(backend.requests[-1].uri, path.encode())
        self.assertEqual(idp.authorize_requests, [])


class LogTests(BearerTestCase):
    async def test_tokens_never_appear_in_the_logs(self) -> None:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        path = os.path.join(directory, "access.log")
        events: list[dict[str, Any]] = []
        observer = cast(ILogObserver, events.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        w = await bearer_world(self, gateway_spec=f'  accessLog: {{output: "{path}"}}\n')
        good = w.token()
        userinfo = w.token(user_claims=False)
        rogue = w.token(key=SigningKey.generate("rogue-1", "RS256"))
        bad_aud = w.token({"aud": "api"})
        bad_signature = spoil_signature(good)
        await self.assert_accepted(w, good)
        await self.assert_accepted(w, good, "/fwd/x")
        await self.assert_accepted(w, userinfo)
        for token in (rogue, bad_aud, bad_signature):
            await self.assert_rejected(w, token)
        await self.assert_rejected(w, headers={"Authorization": f"Bearer {good}$"})
        await self.assert_rejected(w, challenge="Bearer")
        w.idp.userinfo_status = 401
        failing = w.token(user_claims=False)
        await self.assert_rejected(w, failing)
        writer = w.gateway.access_log.writer
        assert writer is not None
        writer.close()
        with open(path, encoding="ascii") as stream:
            text = stream.read()
        lines = [json.loads(line) for line in text.splitlines()]
        self.assertEqual(
            [(line["path"], line["status"]) for line in lines],
            [("/api/x", 200), ("/fwd/x", 200), ("/api/x", 200)] + [("/api/x", 401)] * 6,
        )
        self.assertEqual(
            [line.get("auth") for line in lines],
            [
                None,
                None,
                None,
                "Bearer rejected: unknown key id",
                "Bearer rejected: wrong audience",
                "Bearer rejected: bad signature",
                "Bearer rejected: malformed Bearer credential",
                "no credential",
                "Bearer rejected: userinfo: userinfo answered 401",
            ],
        )
        logged = text + "\n".join(repr(event) for event in events)
        for token in (good, userinfo, rogue, bad_aud, bad_signature, failing):
            for part in token.split("."):
                self.assertNotIn(part, logged)
