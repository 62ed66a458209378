"""
The OpenID provider harness (tests/e2e/provider.mjs, node's oidc-provider) and its Python
helpers: discovery, a full authorization-code login with PKCE through the provider's own
forms, the token endpoint (JWT access tokens for urn:edgegw:api, refresh token rotation),
userinfo and back-channel logout, all without a browser.

Every test starts its own provider (well under a second) so that none shares sessions,
grants or keys with another; the redirect URI is a loopback port where nothing listens,
since only the Location the provider answers with matters.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import jwt
from twisted.trial.unittest import TestCase

from tests.e2e.provider import (
    CLIENT_ID,
    RESOURCE,
    USERS,
    CookieClient,
    LoginError,
    Provider,
    Reply,
    login_through_forms,
    parse_forms,
    start_provider,
    with_query,
)
from tests.support.backends import SiteBackend, answer
from tests.support.processes import refused_port

ALICE_GROUPS = [
    "CN=Admins,OU=Groups,DC=Example,DC=Com",
    "cn=Smith\\, John's Team,ou=groups,dc=example,dc=com",
]
SCOPE = "openid profile email groups api"


def pkce() -> tuple[str, str]:
    """
    A PKCE code verifier and its S256 challenge.
    """
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def query_of(url: str) -> dict[str, str]:
    """
    The query parameters of C{url} (the last value of each).
    """
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


def is_jwt(token: str) -> bool:
    return token.count(".") == 2


class ProviderCase(TestCase):
    """
    One provider per test, a cookie-keeping client, and the steps of a login.
    """

    provider: Provider
    client: CookieClient
    discovery: dict[str, Any]
    redirect_uri: str

    async def start(self, **kwargs: Any) -> Provider:
        self.redirect_uri = f"http://127.0.0.1:{await refused_port()}/oauth2/callback"
        self.provider = await start_provider(self, [self.redirect_uri], **kwargs)
        self.client = CookieClient()
        reply = await self.client.get(self.provider.discovery_url)
        self.assertEqual(reply.status, 200, reply.body)
        self.discovery = reply.json()
        return self.provider

    def authorization_url(self, challenge: str | None, **extra: str) -> str:
        params = {
            "client_id": CLIENT_ID,
            "response_type": "code",
            "scope": SCOPE,
            "redirect_uri": self.redirect_uri,
            "state": secrets.token_urlsafe(16),
            "nonce": secrets.token_urlsafe(16),
            **extra,
        }
        if challenge is not None:
            params.update(code_challenge=challenge, code_challenge_method="S256")
        return with_query(self.discovery["authorization_endpoint"], params)

    async def login(self, user: str, **extra: str) -> tuple[str, dict[str, str], str]:
        """
        Log C{user} in; the code verifier, the callback's query and the nonce sent.
        """
        verifier, challenge = pkce()
        url = self.authorization_url(challenge, **extra)
        sent = query_of(url)
        callback = await login_through_forms(self.client.get, self.client.post, url, user)
        self.assertTrue(callback.startswith(self.redirect_uri + "?"), callback)
        received = query_of(callback)
        self.assertEqual(received["state"], sent["state"])
        self.assertEqual(received["iss"], self.provider.issuer)
        self.assertIn("code", received)
        return verifier, received, sent["nonce"]

    async def authenticated(self, endpoint: str, **form: str) -> Reply:
        """
        POST C{form} to the discovery document's C{endpoint}, the client authenticated
        with client_secret_basic.
        """
        credentials = f"{self.provider.client_id}:{self.provider.client_secret}"
        basic = base64.b64encode(credentials.encode()).decode("ascii")
        return await self.client.request(
            "POST",
            self.discovery[endpoint],
            data=form,
            headers={"authorization": f"Basic {basic}"},
        )

    async def token(self, **form: str) -> Reply:
        return await self.authenticated("token_endpoint", **form)

    async def exchange(self, code: str, verifier: str, **extra: str) -> dict[str, Any]:
        reply = await self.token(
            grant_type="authorization_code",
            code=code,
            redirect_uri=self.redirect_uri,
            code_verifier=verifier,
            **extra,
        )
        self.assertEqual(reply.status, 200, reply.body)
        tokens: dict[str, Any] = reply.json()
        return tokens

    async def refresh(self, refresh_token: str, **extra: str) -> Reply:
        return await self.token(grant_type="refresh_token", refresh_token=refresh_token, **extra)

    async def userinfo(self, access_token: str) -> Reply:
        return await self.client.request(
            "GET",
            self.discovery["userinfo_endpoint"],
            headers={"authorization": f"Bearer {access_token}"},
        )

    async def verify(self, token: str, audience: str) -> dict[str, Any]:
        """
        The claims of a JWT the provider signed, checked against its JWKS.
        """
        jwks = (await self.client.get(self.discovery["jwks_uri"])).json()
        kid = jwt.get_unverified_header(token)["kid"]
        key = jwt.PyJWKSet.from_dict(jwks)[kid].key
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=["RS256"],
            audience=audience,
            issuer=self.provider.issuer,
        )
        return claims


class DiscoveryTests(ProviderCase):
    async def test_discovery(self) -> None:
        provider = await self.start()
        self.assertEqual(provider.client_id, "edgegw")
        self.assertTrue(provider.issuer.startswith("http://localhost:"), provider.issuer)
        self.assertEqual(provider.issuer, f"http://localhost:{provider.port}")
        found = self.discovery
        self.assertEqual(found["issuer"], provider.issuer)
        self.assertIn("S256", found["code_challenge_methods_supported"])
        self.assertIs(found["authorization_response_iss_parameter_supported"], True)
        self.assertIs(found["backchannel_logout_supported"], True)
        self.assertIs(found["backchannel_logout_session_supported"], True)
        self.assertIn("client_secret_basic", found["token_endpoint_auth_methods_supported"])
        self.assertIn("groups", found["scopes_supported"])
        self.assertIn("groups", found["claims_supported"])
        for endpoint in ("introspection_endpoint", "revocation_endpoint", "end_session_endpoint"):
            self.assertTrue(found[endpoint].startswith(provider.issuer), endpoint)


class CodeFlowTests(ProviderCase):
    async def test_code_flow_with_pkce_and_resource(self) -> None:
        await self.start()
        verifier, received, nonce = await self.login("alice", resource=RESOURCE)

        # PKCE is checked before the code is used up: a wrong verifier leaves it valid.
        wrong = await self.token(
            grant_type="authorization_code",
            code=received["code"],
            redirect_uri=self.redirect_uri,
            code_verifier=pkce()[0],
            resource=RESOURCE,
        )
        self.assertEqual((wrong.status, wrong.json()["error"]), (400, "invalid_grant"))

        tokens = await self.exchange(received["code"], verifier, resource=RESOURCE)
        self.assertEqual(tokens["token_type"], "Bearer")
        self.assertLessEqual(tokens["expires_in"], 120)
        self.assertIn("refresh_token", tokens)

        id_token = await self.verify(tokens["id_token"], CLIENT_ID)
        self.assertEqual(id_token["sub"], "alice")
        self.assertEqual(id_token["nonce"], nonce)
        # The access token is the resource's, useless at userinfo: so the id_token carries
        # every claim of the granted scopes (compare test_refresh_rotation_and_userinfo).
        self.assertEqual({k: id_token[k] for k in USERS["alice"]}, USERS["alice"])
        # sid only for clients with a back-channel logout URI (test_backchannel_logout).
        self.assertNotIn("sid", id_token)

        access = tokens["access_token"]
        self.assertTrue(is_jwt(access), access)
        self.assertEqual(jwt.get_unverified_header(access)["typ"], "at+jwt")
        claims = await self.verify(access, RESOURCE)
        self.assertEqual(claims["aud"], RESOURCE)
        self.assertEqual(claims["sub"], "alice")
        self.assertEqual(claims["client_id"], CLIENT_ID)
        self.assertEqual(claims["scope"], "api")
        self.assertLessEqual(claims["exp"] - claims["iat"], 120)

        # A JWT for the resource is not a userinfo token.
        self.assertEqual((await self.userinfo(access)).status, 401)

        # The code is single-use.
        again = await self.token(
            grant_type="authorization_code",
            code=received["code"],
            redirect_uri=self.redirect_uri,
            code_verifier=verifier,
        )
        self.assertEqual((again.status, again.json()["error"]), (400, "invalid_grant"))

    async def test_refresh_rotation_and_userinfo(self) -> None:
        await self.start()
        verifier, received, _ = await self.login("alice")
        # Without `resource` at the token endpoint: an opaque access token for userinfo.
        tokens = await self.exchange(received["code"], verifier)
        self.assertFalse(is_jwt(tokens["access_token"]), tokens["access_token"])
        # conformIdTokenClaims: with an access token for userinfo, the id_token holds sub
        # and the protocol claims only; the scopes' claims are userinfo's.
        id_token = await self.verify(tokens["id_token"], CLIENT_ID)
        self.assertEqual(id_token["sub"], "alice")
        for claim in USERS["alice"]:
            self.assertNotIn(claim, id_token)
        info = await self.userinfo(tokens["access_token"])
        self.assertEqual(info.status, 200, info.body)
        self.assertEqual(info.json(), {"sub": "alice", **USERS["alice"]})
        self.assertEqual(info.json()["groups"], ALICE_GROUPS)

        first = tokens["refresh_token"]
        rotated = await self.refresh(first)
        self.assertEqual(rotated.status, 200, rotated.body)
        second = rotated.json()["refresh_token"]
        self.assertNotEqual(second, first)
        self.assertEqual((await self.userinfo(rotated.json()["access_token"])).status, 200)

        # With `resource`: the resource's JWT, from the same refresh token chain.
        for_api = await self.refresh(second, resource=RESOURCE)
        self.assertEqual(for_api.status, 200, for_api.body)
        claims = await self.verify(for_api.json()["access_token"], RESOURCE)
        self.assertEqual(claims["sub"], "alice")
        third = for_api.json()["refresh_token"]

        # A used refresh token is refused, and replaying it revokes the whole grant.
        replay = await self.refresh(first)
        self.assertEqual((replay.status, replay.json()["error"]), (400, "invalid_grant"))
        revoked = await self.refresh(third)
        self.assertEqual((revoked.status, revoked.json()["error"]), (400, "invalid_grant"))

    async def test_default_resource(self) -> None:
        await self.start()
        # No `resource` in the authorization request: urn:edgegw:api is granted anyway.
        verifier, received, _ = await self.login("bob")
        tokens = await self.exchange(received["code"], verifier)
        info = await self.userinfo(tokens["access_token"])
        self.assertEqual(info.json()["groups"], ["cn=users,ou=groups,dc=example,dc=com"])
        self.assertEqual(info.json()["email"], "bob@example.com")
        for_api = await self.refresh(tokens["refresh_token"], resource=RESOURCE)
        self.assertEqual(for_api.status, 200, for_api.body)
        claims = await self.verify(for_api.json()["access_token"], RESOURCE)
        self.assertEqual((claims["sub"], claims["scope"]), ("bob", "api"))

        # Introspection knows opaque tokens; the resource's JWTs are to be verified locally.
        opaque = await self.authenticated("introspection_endpoint", token=tokens["access_token"])
        self.assertEqual(opaque.status, 200, opaque.body)
        self.assertEqual(
            {k: opaque.json()[k] for k in ("active", "sub", "client_id")},
            {"active": True, "sub": "bob", "client_id": CLIENT_ID},
        )
        structured = await self.authenticated(
            "introspection_endpoint", token=for_api.json()["access_token"]
        )
        self.assertEqual(
            (structured.status, structured.json()["error"]), (400, "unsupported_token_type")
        )

        # Another resource is refused.
        other = await self.refresh(for_api.json()["refresh_token"], resource="urn:other")
        self.assertEqual((other.status, other.json()["error"]), (400, "invalid_target"))

        # Revocation.
        latest = for_api.json()["refresh_token"]
        revoked = await self.authenticated("revocation_endpoint", token=latest)
        self.assertEqual(revoked.status, 200, revoked.body)
        after = await self.refresh(latest)
        self.assertEqual((after.status, after.json()["error"]), (400, "invalid_grant"))

    async def test_pkce_is_required(self) -> None:
        await self.start()
        url = self.authorization_url(None)
        reply = await self.client.get(url)
        self.assertIn(reply.status, (302, 303))
        location = reply.headers["location"]
        self.assertTrue(location.startswith(self.redirect_uri + "?"), location)
        error = query_of(location)
        self.assertEqual(error["error"], "invalid_request")
        self.assertIn("PKCE", error["error_description"])
        self.assertEqual(error["iss"], self.provider.issuer)

    async def test_unknown_user_is_refused(self) -> None:
        await self.start()
        url = self.authorization_url(pkce()[1])
        with self.assertRaises(LoginError) as raised:
            await login_through_forms(self.client.get, self.client.post, url, "mallory")
        self.assertIn("mallory", str(raised.exception))

    async def test_default_client_and_start_behind_a_redirect(self) -> None:
        await self.start()
        # A "gateway" URL that redirects to the authorization request; a fresh client.
        gateway = SiteBackend(
            answer(302, headers=[(b"location", self.authorization_url(pkce()[1]).encode())])
        ).start()
        self.addCleanup(gateway.stop)
        callback = await login_through_forms(
            None, None, f"http://127.0.0.1:{gateway.port}/login", "bob"
        )
        self.assertIn("code", query_of(callback))


class LogoutTests(ProviderCase):
    async def test_backchannel_logout(self) -> None:
        receiver = SiteBackend(answer(200)).start()
        self.addCleanup(receiver.stop)
        logged_out = f"http://127.0.0.1:{receiver.port}/logged-out"
        await self.start(
            backchannel_logout_uri=f"http://127.0.0.1:{receiver.port}/backchannel",
            env={"E2E_OIDC_POST_LOGOUT_REDIRECT_URIS": logged_out},
        )
        verifier, received, _ = await self.login("alice")
        tokens = await self.exchange(received["code"], verifier)
        id_token = await self.verify(tokens["id_token"], CLIENT_ID)

        # RP-initiated logout: the provider's confirmation form, then the logout.
        page = await self.client.get(
            self.discovery["end_session_endpoint"],
            {
                "id_token_hint": tokens["id_token"],
                "post_logout_redirect_uri": logged_out,
                "client_id": CLIENT_ID,
            },
        )
        self.assertEqual(page.status, 200, page.body)
        (form,) = parse_forms(page.body)
        self.assertIn(("logout", "yes"), form.buttons)
        done = await self.client.post(
            urljoin(self.discovery["end_session_endpoint"], form.action), form.submission()
        )
        self.assertIn(done.status, (302, 303), done.body)
        self.assertTrue(done.headers["location"].startswith(logged_out), done.headers)

        (request,) = [r for r in receiver.requests if r.uri == b"/backchannel"]
        self.assertEqual(request.method, b"POST")
        form_body = parse_qs(request.body.decode("ascii"))
        logout_token = form_body["logout_token"][0]
        self.assertEqual(jwt.get_unverified_header(logout_token)["typ"], "logout+jwt")
        claims = await self.verify(logout_token, CLIENT_ID)
        self.assertEqual(claims["sub"], "alice")
        self.assertEqual(claims["sid"], id_token["sid"])
        self.assertIn("http://schemas.openid.net/event/backchannel-logout", claims["events"])
        self.assertNotIn("nonce", claims)

        # The session is gone and, with it, the refresh token.
        after = await self.refresh(tokens["refresh_token"])
        self.assertEqual((after.status, after.json()["error"]), (400, "invalid_grant"))
