"""
An id_token is never a Bearer token (issue 36, point 2), against a real certified
OpenID provider (node's oidc-provider, tests/e2e/provider.mjs): the gateway logs users in
through it (clientID C{edgegw}) and takes Bearer tokens on a service route with the
default audience, the clientID. An id_token of that provider for that client, from an
authorization request without a nonce (oidc-provider then issues it without one, and the
refresh grant's id_token carries the login's nonce, so none either), is signed by the
provider's key with the right issuer and audience: it is refused (401), as a Bearer
token and on a route forwarding it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.e2e.provider import (
    CLIENT_ID,
    RESOURCE,
    CookieClient,
    Provider,
    login_through_forms,
    start_provider,
    with_query,
)
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser
from tests.support.configs import write_tree
from tests.support.processes import free_port

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"
INVALID_TOKEN = 'Bearer error="invalid_token"'


class IdTokenAsBearer(TestCase):
    provider: Provider
    origin: str
    backend: SiteBackend

    async def serve(self, bearer: str = "") -> None:
        """
        The provider, and a gateway logging users in through it, with a service route
        C{/api/} (auth required) and C{/fwd/} (the same, forwarding the access token);
        C{bearer}: the IdP's C{bearer} block (default: none, the clientID as audience).
        """
        port = free_port()
        self.origin = f"http://127.0.0.1:{port}"
        self.provider = await start_provider(self, [self.origin + "/auth/callback"])
        self.backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(self.backend.stop)
        upstream = f"http://127.0.0.1:{self.backend.port}"
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{KEY}"}}
  identity:
    userInfo: never
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{self.provider.issuer}"
  clientID: "{self.provider.client_id}"
  clientSecret: "{self.provider.client_secret}"
  redirectURL: "{self.origin}/auth/callback"
  scopes: [openid, profile, email, groups]
{bearer}---
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
"""
        root = write_tree(self.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        gateway: Gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = reactor.listenTCP(port, gateway.site, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        self.addCleanup(client.close)
        idp = gateway.idp
        assert idp is not None
        idp.startService()
        self.addCleanup(idp.stopService)
        for _ in range(250):
            if idp.ready:
                break
            await deferLater(reactor, 0.02, lambda: None)
        self.assertTrue(idp.ready, idp.last_error)

    async def tokens(self, **token_form: str) -> tuple[dict[str, Any], CookieClient]:
        """
        Log alice in at the provider for the gateway's client with an authorization
        request that has no nonce, and exchange the code as the gateway would (PKCE,
        client_secret_basic): the token response.
        """
        verifier = secrets.token_urlsafe(48)
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
            .rstrip(b"=")
            .decode()
        )
        client = CookieClient()
        discovery = (await client.get(self.provider.discovery_url)).json()
        redirect_uri = self.origin + "/auth/callback"
        url = with_query(
            discovery["authorization_endpoint"],
            {
                "client_id": CLIENT_ID,
                "response_type": "code",
                "scope": "openid profile email groups",
                "redirect_uri": redirect_uri,
                "state": secrets.token_urlsafe(16),
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            },
        )
        callback = await login_through_forms(client.get, client.post, url, "alice")
        self.assertTrue(callback.startswith(redirect_uri + "?"), callback)
        code = parse_qs(urlsplit(callback).query)["code"][0]
        answer = await self.token_request(
            client,
            discovery,
            grant_type="authorization_code",
            code=code,
            redirect_uri=redirect_uri,
            code_verifier=verifier,
            **token_form,
        )
        return answer, client

    async def token_request(
        self, client: CookieClient, discovery: dict[str, Any], **form: str
    ) -> dict[str, Any]:
        provider = self.provider
        basic = base64.b64encode(f"{provider.client_id}:{provider.client_secret}".encode())
        reply = await client.request(
            "POST",
            discovery["token_endpoint"],
            data=form,
            headers={"authorization": f"Basic {basic.decode()}"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        answer: dict[str, Any] = reply.json()
        return answer

    async def genuine_id_token(self, token: str) -> dict[str, Any]:
        """
        Check C{token} is the provider's id_token for the client, signed by its key,
        without a nonce or any other id_token marker: the claims.
        """
        client = CookieClient()
        discovery = (await client.get(self.provider.discovery_url)).json()
        jwks = (await client.get(discovery["jwks_uri"])).json()
        header = jwt.get_unverified_header(token)
        key = jwt.PyJWKSet.from_dict(jwks)[header["kid"]].key
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[header["alg"]],
            audience=CLIENT_ID,
            issuer=self.provider.issuer,
        )
        self.assertEqual(claims["sub"], "alice")
        self.assertNotIn(str(header.get("typ", "")).lower(), ("at+jwt", "application/at+jwt"))
        for name in ("nonce", "at_hash", "c_hash", "s_hash", "scope", "scp", "client_id"):
            self.assertNotIn(name, claims)
        return claims

    async def assert_refused(self, token: str) -> None:
        for path in ("/api/x", "/fwd/x"):
            response = await Browser().get(
                self.origin + path, headers={"Authorization": f"Bearer {token}"}
            )
            self.assertEqual(response.status, 401, f"{path}: the id_token was taken")
            self.assertEqual(
                response.headers.getRawHeaders("WWW-Authenticate"), [INVALID_TOKEN], path
            )
        self.assertEqual(self.backend.requests, [], "the backend was called with an id_token")

    async def test_a_nonce_less_id_token_is_refused(self) -> None:
        await self.serve()
        answer, client = await self.tokens()
        id_token = answer["id_token"]
        await self.genuine_id_token(id_token)
        await self.assert_refused(id_token)
        # The refresh grant's id_token (the login's nonce: none) likewise.
        discovery = (await client.get(self.provider.discovery_url)).json()
        refreshed = await self.token_request(
            client, discovery, grant_type="refresh_token", refresh_token=answer["refresh_token"]
        )
        # (Within the same second it may be the very same token: its claims are those of
        # the first one, and RS256 signatures are deterministic.)
        await self.genuine_id_token(refreshed["id_token"])
        await self.assert_refused(refreshed["id_token"])

    async def test_the_api_audience_takes_the_providers_access_token(self) -> None:
        """
        With C{bearer.audience} the API's, the provider's access token for it (an RFC
        9068 JWT: typ at+jwt, scope, client_id) is accepted, and the id_token of the
        same login still refused.
        """
        await self.serve(f'  bearer: {{audience: "{RESOURCE}"}}\n')
        answer, _ = await self.tokens(resource=RESOURCE)
        await self.genuine_id_token(answer["id_token"])
        await self.assert_refused(answer["id_token"])
        response = await Browser().get(
            self.origin + "/api/x", headers={"Authorization": f"Bearer {answer['access_token']}"}
        )
        self.assertEqual((response.status, response.body), (200, b"backend"))
        self.assertEqual(self.backend.requests[-1].header(b"X-User-Id"), b"alice")
