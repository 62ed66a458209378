"""
The fake OpenID provider (L{tests.support.fake_idp}) and the test browser
(L{tests.support.browser}), end to end over real sockets: the fakes the gateway's login
tests rely on must themselves behave as the specifications say.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlencode, urlsplit

import jwt
from twisted.internet.error import ConnectionRefusedError
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Request

from tests.support.backends import SiteBackend
from tests.support.browser import Browser, BrowserResponse, TooManyRedirectsError
from tests.support.fake_idp import (
    DEFAULT_USER,
    ID_TOKEN_MODES,
    OTHER_CLIENT,
    OTHER_ISSUER,
    FakeIdP,
    b64url,
    pkce_challenge,
)

REDIRECT_URI = "http://127.0.0.1:9/callback"


def query_of(url: str) -> dict[str, list[str]]:
    """
    The query of C{url}, decoded, every value kept.
    """
    return parse_qs(urlsplit(url).query, keep_blank_values=True)


def basic(client_id: str, secret: str) -> str:
    """
    An C{Authorization: Basic} value as RFC 6749 2.3.1 wants it (each part
    form-urlencoded first).
    """
    raw = f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def segments(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """
    The header, the claims and the raw signature of a compact JWS, unverified.
    """
    head, payload, signature = token.split(".")

    def decode(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    return json.loads(decode(head)), json.loads(decode(payload)), decode(signature)


class Flow:
    """
    One client's view of an authorization code flow against a L{FakeIdP}.
    """

    def __init__(self, idp: FakeIdP, browser: Browser, redirect_uri: str = REDIRECT_URI) -> None:
        self.idp = idp
        self.browser = browser
        self.redirect_uri = redirect_uri
        self.verifier = secrets.token_urlsafe(48)
        self.state = secrets.token_urlsafe(16)
        self.nonce = secrets.token_urlsafe(16)

    def authorize_url(self, **overrides: str | None) -> str:
        """
        A good authorization request URL, with C{overrides} (L{None}: leave it out).
        """
        params: dict[str, str | None] = {
            "client_id": self.idp.client_id,
            "response_type": "code",
            "redirect_uri": self.redirect_uri,
            "scope": "openid email profile",
            "state": self.state,
            "nonce": self.nonce,
            "code_challenge": pkce_challenge(self.verifier),
            "code_challenge_method": "S256",
            **overrides,
        }
        query = urlencode({name: value for name, value in params.items() if value is not None})
        return self.idp.url("/authorize?" + query)

    async def code(self) -> str:
        """
        Authorize and return the code the provider redirected with.
        """
        response = await self.browser.get(self.authorize_url())
        assert response.status == 302, (response.status, response.body)
        assert response.location is not None
        return query_of(response.location)["code"][0]

    async def exchange(
        self,
        code: str,
        auth: str = "basic",
        verifier: str | None = None,
        redirect_uri: str | None = None,
        secret: str | None = None,
    ) -> BrowserResponse:
        """
        POST the token request for C{code}, authenticating by C{auth} (C{basic},
        C{post}, C{both} or C{none}).
        """
        idp = self.idp
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri or self.redirect_uri,
            "code_verifier": verifier or self.verifier,
        }
        secret = idp.client_secret if secret is None else secret
        headers = {}
        if auth in ("basic", "both"):
            headers["Authorization"] = basic(idp.client_id, secret)
        if auth in ("post", "both"):
            form.update(client_id=idp.client_id, client_secret=secret)
        return await self.browser.post(idp.url("/token"), form, headers)

    async def tokens(self, auth: str = "basic") -> dict[str, Any]:
        """
        The whole flow: the token response's JSON.
        """
        response = await self.exchange(await self.code(), auth)
        assert response.status == 200, (response.status, response.body)
        tokens: dict[str, Any] = response.json()
        return tokens


class IdPTestCase(TestCase):
    """
    A started L{FakeIdP} with L{REDIRECT_URI} registered, and a browser.
    """

    async def start_idp(self, **kwargs: Any) -> FakeIdP:
        idp = FakeIdP(redirect_uris=[REDIRECT_URI], **kwargs)
        await idp.start(self)
        return idp

    async def keys(self, browser: Browser, idp: FakeIdP) -> dict[str, Any]:
        """
        The provider's public keys, as PyJWT key objects by kid, fetched from its JWKS.
        """
        response = await browser.get(idp.url("/jwks"))
        return {jwk["kid"]: jwt.PyJWK(jwk).key for jwk in response.json()["keys"]}


class DiscoveryTests(IdPTestCase):
    async def test_document(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        response = await browser.get(idp.url("/.well-known/openid-configuration"))
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header("Content-Type"), "application/json")
        document = response.json()
        issuer = f"http://127.0.0.1:{idp.port}"
        self.assertEqual(idp.issuer, issuer)
        self.assertEqual(document["issuer"], issuer)
        self.assertEqual(document["authorization_endpoint"], issuer + "/authorize")
        self.assertEqual(document["token_endpoint"], issuer + "/token")
        self.assertEqual(document["userinfo_endpoint"], issuer + "/userinfo")
        self.assertEqual(document["jwks_uri"], issuer + "/jwks")
        self.assertEqual(document["response_types_supported"], ["code"])
        self.assertEqual(document["subject_types_supported"], ["public"])
        self.assertEqual(document["id_token_signing_alg_values_supported"], ["RS256", "ES256"])
        self.assertEqual(document["code_challenge_methods_supported"], ["S256"])
        self.assertEqual(
            document["token_endpoint_auth_methods_supported"],
            ["client_secret_basic", "client_secret_post"],
        )
        self.assertIs(document["authorization_response_iss_parameter_supported"], True)
        self.assertEqual(idp.discovery_requests, 1)

    async def test_knobs(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        url = idp.url("/.well-known/openid-configuration")
        idp.discovery_issuer = "http://127.0.0.1:1"
        idp.token_auth_methods = ["client_secret_post"]
        document = (await browser.get(url)).json()
        self.assertEqual(document["issuer"], "http://127.0.0.1:1")
        self.assertEqual(document["token_endpoint"], idp.issuer + "/token")
        self.assertEqual(document["token_endpoint_auth_methods_supported"], ["client_secret_post"])

        idp.discovery_status = 503
        response = await browser.get(url)
        self.assertEqual(response.status, 503)
        self.assertNotIn("issuer", response.json())
        self.assertEqual(idp.discovery_requests, 2)

    async def test_unknown_paths_and_methods(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        self.assertEqual((await browser.get(idp.url("/nothing"))).status, 404)
        self.assertEqual((await browser.get(idp.url("/jwks/more"))).status, 404)
        response = await browser.get(idp.url("/token"))
        self.assertEqual(response.status, 405)
        self.assertEqual(response.header("Allow"), "POST")


class AuthorizeTests(IdPTestCase):
    async def test_grants_a_code(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        response = await flow.browser.get(flow.authorize_url())
        self.assertEqual(response.status, 302)
        assert response.location is not None
        self.assertTrue(response.location.startswith(REDIRECT_URI + "?"))
        query = query_of(response.location)
        self.assertEqual(sorted(query), ["code", "iss", "state"])
        self.assertEqual(query["state"], [flow.state])
        self.assertEqual(query["iss"], [idp.issuer])
        self.assertGreaterEqual(len(query["code"][0]), 20)
        self.assertEqual(len(idp.authorize_requests), 1)
        recorded = idp.authorize_requests[0]
        self.assertEqual(recorded["nonce"], flow.nonce)
        self.assertEqual(recorded["code_challenge"], pkce_challenge(flow.verifier))
        self.assertEqual(recorded["scope"], "openid email profile")

    async def test_codes_differ(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        self.assertNotEqual(await flow.code(), await flow.code())

    async def test_iss_knobs(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        idp.send_iss = False
        location = (await flow.browser.get(flow.authorize_url())).location
        assert location is not None
        self.assertNotIn("iss", query_of(location))
        idp.send_iss = True
        idp.iss_override = "http://evil.example"
        location = (await flow.browser.get(flow.authorize_url())).location
        assert location is not None
        self.assertEqual(query_of(location)["iss"], ["http://evil.example"])

    async def test_redirect_uris_registered_later_and_with_a_query(self) -> None:
        idp = await self.start_idp()
        late = "http://127.0.0.1:9/late?tenant=a"
        flow = Flow(idp, Browser(), redirect_uri=late)
        self.assertEqual((await flow.browser.get(flow.authorize_url())).status, 400)
        idp.redirect_uris.append(late)
        response = await flow.browser.get(flow.authorize_url())
        self.assertEqual(response.status, 302)
        assert response.location is not None
        self.assertTrue(response.location.startswith(late + "&code="))
        self.assertEqual(query_of(response.location)["tenant"], ["a"])

    async def test_authorize_error(self) -> None:
        idp = await self.start_idp()
        idp.authorize_error = "access_denied"
        flow = Flow(idp, Browser())
        response = await flow.browser.get(flow.authorize_url())
        self.assertEqual(response.status, 302)
        assert response.location is not None
        self.assertEqual(
            query_of(response.location),
            {"error": ["access_denied"], "state": [flow.state], "iss": [idp.issuer]},
        )

    async def test_bad_requests_are_not_redirected(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        challenge = pkce_challenge(flow.verifier)
        cases: dict[str, dict[str, str | None]] = {
            "unknown client": {"client_id": "other"},
            "unregistered redirect_uri": {"redirect_uri": REDIRECT_URI + "/x"},
            "redirect_uri prefix only": {"redirect_uri": "http://127.0.0.1:9/"},
            "no redirect_uri": {"redirect_uri": None},
            "implicit flow": {"response_type": "id_token"},
            "no openid scope": {"scope": "email profile"},
            "openid only as a prefix": {"scope": "openidx email"},
            "no challenge": {"code_challenge": None, "code_challenge_method": None},
            "no challenge method": {"code_challenge_method": None},
            "plain challenge": {"code_challenge_method": "plain"},
            "padded challenge": {"code_challenge": challenge + "="},
            "short challenge": {"code_challenge": challenge[:-1]},
            "no state": {"state": None},
            "empty state": {"state": ""},
            "no nonce": {"nonce": None},
        }
        for name, overrides in cases.items():
            response = await flow.browser.get(flow.authorize_url(**overrides))
            self.assertEqual(response.status, 400, name)
            self.assertIsNone(response.location, name)
            self.assertIn("error", response.json(), name)
        repeated = flow.authorize_url() + "&state=again"
        self.assertEqual((await flow.browser.get(repeated)).status, 400)
        self.assertEqual(len(idp.authorize_requests), len(cases) + 1)
        self.assertEqual(idp.authorize_requests[0]["client_id"], "other")


class TokenTests(IdPTestCase):
    async def test_basic_authentication(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        flow = Flow(idp, browser)
        code = await flow.code()
        response = await flow.exchange(code, "basic")
        self.assertEqual(response.status, 200, response.body)
        self.assertEqual(response.header("Cache-Control"), "no-store")
        tokens = response.json()
        self.assertEqual(tokens["token_type"], "Bearer")
        self.assertEqual(tokens["expires_in"], 300)
        self.assertTrue(tokens["refresh_token"])
        request = idp.token_requests[-1]
        self.assertEqual(request["auth_method"], "client_secret_basic")
        self.assertEqual(request["code"], code)
        self.assertEqual(request["code_verifier"], flow.verifier)
        self.assertNotIn("client_secret", request)

        keys = await self.keys(browser, idp)
        now = time.time()
        id_token = jwt.decode(
            tokens["id_token"],
            keys["rsa-1"],
            algorithms=["RS256"],
            audience="gw",
            issuer=idp.issuer,
        )
        self.assertEqual(jwt.get_unverified_header(tokens["id_token"])["kid"], "rsa-1")
        self.assertEqual(id_token["nonce"], flow.nonce)
        self.assertEqual(id_token["azp"], "gw")
        self.assertEqual(id_token["sub"], "alice")
        for claim in ("email", "name", "groups"):
            self.assertEqual(id_token[claim], DEFAULT_USER[claim])
        self.assertEqual(id_token["exp"] - id_token["iat"], 300)
        self.assertLess(abs(id_token["iat"] - now), 5)

        access = jwt.decode(
            tokens["access_token"],
            keys["rsa-1"],
            algorithms=["RS256"],
            audience="api",
            issuer=idp.issuer,
        )
        self.assertEqual(access["client_id"], "gw")
        self.assertEqual(access["sub"], "alice")
        self.assertEqual(access["scope"], "openid email profile")
        self.assertEqual(access["exp"] - access["iat"], 300)

    async def test_post_authentication(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        response = await flow.exchange(await flow.code(), "post")
        self.assertEqual(response.status, 200, response.body)
        self.assertEqual(idp.token_requests[-1]["auth_method"], "client_secret_post")
        self.assertEqual(idp.token_requests[-1]["client_id"], "gw")

    async def test_basic_credentials_are_form_urlencoded(self) -> None:
        idp = FakeIdP("gw:1 é", "s p&c%+:", [REDIRECT_URI])
        await idp.start(self)
        flow = Flow(idp, Browser())
        self.assertEqual((await flow.exchange(await flow.code(), "basic")).status, 200)
        # Not encoded: "gw:1 é" splits at its own colon.
        raw = base64.b64encode(f"{idp.client_id}:{idp.client_secret}".encode()).decode()
        response = await flow.browser.post(
            idp.url("/token"),
            {
                "grant_type": "authorization_code",
                "code": await flow.code(),
                "redirect_uri": REDIRECT_URI,
                "code_verifier": flow.verifier,
            },
            {"Authorization": "Basic " + raw},
        )
        self.assertEqual(response.status, 401)
        self.assertEqual(response.json()["error"], "invalid_client")

    async def test_client_authentication_failures(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        code = await flow.code()
        for auth in ("basic", "post"):
            response = await flow.exchange(code, auth, secret="wrong")
            self.assertEqual(response.status, 401, auth)
            self.assertEqual(response.json()["error"], "invalid_client")
        response = await flow.exchange(code, "none")
        self.assertEqual(response.status, 401)
        self.assertEqual(response.header("WWW-Authenticate"), 'Basic realm="fake-idp"')
        response = await flow.exchange(code, "both")
        self.assertEqual(response.status, 400)
        self.assertEqual(idp.token_requests[-1]["auth_method"], "basic+post")

        idp.token_auth_methods = ["client_secret_post"]
        response = await flow.exchange(code, "basic")
        self.assertEqual(response.status, 401)
        self.assertEqual(response.json()["error"], "invalid_client")
        idp.token_auth_methods = ["client_secret_basic"]
        self.assertEqual((await flow.exchange(code, "post")).status, 401)
        # None of those failures used the code up.
        self.assertEqual((await flow.exchange(code, "basic")).status, 200)

    async def test_code_is_single_use(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        code = await flow.code()
        first = await flow.exchange(code)
        self.assertEqual(first.status, 200)
        access_token = first.json()["access_token"]
        bearer = {"Authorization": "Bearer " + access_token}
        self.assertEqual((await flow.browser.get(idp.url("/userinfo"), bearer)).status, 200)

        replay = await flow.exchange(code)
        self.assertEqual(replay.status, 400)
        self.assertEqual(replay.json()["error"], "invalid_grant")
        self.assertEqual(idp.replayed_codes, [code])
        # RFC 6749 10.5: what the code bought is revoked.
        self.assertEqual((await flow.browser.get(idp.url("/userinfo"), bearer)).status, 401)

    async def test_pkce_mismatch(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        code = await flow.code()
        response = await flow.exchange(code, verifier=secrets.token_urlsafe(48))
        self.assertEqual(response.status, 400)
        self.assertEqual(response.json()["error"], "invalid_grant")
        # The challenge itself is not a verifier for itself.
        response = await flow.exchange(code, verifier=pkce_challenge(flow.verifier))
        self.assertEqual(response.status, 400)
        response = await flow.exchange(code, verifier="short")
        self.assertEqual(response.status, 400)
        self.assertEqual(response.json()["error"], "invalid_request")
        self.assertEqual((await flow.exchange(code)).status, 200)

    async def test_redirect_uri_must_match(self) -> None:
        idp = await self.start_idp()
        other = "http://127.0.0.1:9/other"
        idp.redirect_uris.append(other)
        flow = Flow(idp, Browser())
        code = await flow.code()
        response = await flow.exchange(code, redirect_uri=other)
        self.assertEqual(response.status, 400)
        self.assertEqual(response.json()["error"], "invalid_grant")

    async def test_unknown_code_grant_type_and_expiry(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        response = await flow.exchange("no-such-code")
        self.assertEqual((response.status, response.json()["error"]), (400, "invalid_grant"))
        response = await flow.browser.post(
            idp.url("/token"),
            {"grant_type": "password", "username": "alice", "password": "x"},
            {"Authorization": basic("gw", "gw-secret")},
        )
        self.assertEqual(response.json()["error"], "unsupported_grant_type")
        code = await flow.code()
        idp.clock = lambda: time.time() + idp.code_lifetime + 1
        response = await flow.exchange(code)
        self.assertEqual((response.status, response.json()["error"]), (400, "invalid_grant"))

    async def test_token_status(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        code = await flow.code()
        idp.token_status = 500
        response = await flow.exchange(code)
        self.assertEqual(response.status, 500)
        self.assertNotIn("id_token", response.json())
        self.assertEqual(len(idp.token_requests), 1)
        idp.token_status = 200
        self.assertEqual((await flow.exchange(code)).status, 200)


class UserinfoTests(IdPTestCase):
    async def test_userinfo(self) -> None:
        idp = await self.start_idp()
        idp.user["phone_number"] = "+1 555 0100"
        idp.userinfo_only = {"groups", "phone_number"}
        flow = Flow(idp, Browser())
        tokens = await flow.tokens()
        claims = segments(tokens["id_token"])[1]
        self.assertNotIn("groups", claims)
        self.assertNotIn("phone_number", claims)
        self.assertEqual(claims["email"], "alice@example.com")

        url = idp.url("/userinfo")
        response = await flow.browser.get(
            url, {"Authorization": "Bearer " + tokens["access_token"]}
        )
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json(), {**DEFAULT_USER, "phone_number": "+1 555 0100"})

        for authorization in (
            None,
            "Bearer nope",
            "Bearer " + tokens["id_token"],
            "Basic " + tokens["access_token"],
        ):
            headers = {} if authorization is None else {"Authorization": authorization}
            response = await flow.browser.get(url, headers)
            self.assertEqual(response.status, 401, authorization)
            self.assertEqual(response.header("WWW-Authenticate"), 'Bearer error="invalid_token"')
        self.assertEqual(idp.userinfo_requests, 5)

    async def test_expired_access_token(self) -> None:
        idp = await self.start_idp()
        flow = Flow(idp, Browser())
        tokens = await flow.tokens()
        idp.clock = lambda: time.time() + 301
        response = await flow.browser.get(
            idp.url("/userinfo"), {"Authorization": "Bearer " + tokens["access_token"]}
        )
        self.assertEqual(response.status, 401)

    async def test_id_token_claims_override(self) -> None:
        idp = await self.start_idp()
        idp.id_token_claims_from_user = {"email": "other@example.com", "sub": "mallory"}
        flow = Flow(idp, Browser())
        claims = segments((await flow.tokens())["id_token"])[1]
        self.assertEqual(claims["email"], "other@example.com")
        self.assertEqual(claims["sub"], "alice")  # the standard claims win
        self.assertNotIn("name", claims)
        idp.id_token_claims_from_user = None
        self.assertEqual(segments((await flow.tokens())["id_token"])[1]["name"], "Alice Example")


class KeyTests(IdPTestCase):
    async def test_jwks(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        response = await browser.get(idp.url("/jwks"))
        self.assertEqual(response.status, 200)
        keys = {jwk["kid"]: jwk for jwk in response.json()["keys"]}
        self.assertEqual(sorted(keys), ["ec-1", "rsa-1"])
        rsa, ec = keys["rsa-1"], keys["ec-1"]
        self.assertEqual((rsa["kty"], rsa["alg"], rsa["use"]), ("RSA", "RS256", "sig"))
        self.assertEqual(
            (ec["kty"], ec["alg"], ec["use"], ec["crv"]), ("EC", "ES256", "sig", "P-256")
        )
        self.assertEqual(len(base64.urlsafe_b64decode(rsa["n"] + "==")), 256)  # 2048 bits
        for jwk in keys.values():
            self.assertFalse({"d", "p", "q", "dp", "dq", "qi"} & set(jwk))
        self.assertEqual(idp.jwks_requests, 1)

    async def test_ec_signing(self) -> None:
        idp = await self.start_idp()
        idp.signing_kid = "ec-1"
        browser = Browser()
        flow = Flow(idp, browser)
        tokens = await flow.tokens()
        keys = await self.keys(browser, idp)
        for token, audience in ((tokens["id_token"], "gw"), (tokens["access_token"], "api")):
            self.assertEqual(jwt.get_unverified_header(token)["kid"], "ec-1")
            claims = jwt.decode(token, keys["ec-1"], algorithms=["ES256"], audience=audience)
            self.assertEqual(claims["iss"], idp.issuer)
            self.assertEqual(jwt.get_unverified_header(token)["alg"], "ES256")
            self.assertEqual(len(segments(token)[2]), 64)  # r || s, not DER

    async def test_rotate(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        flow = Flow(idp, browser)
        before = (await flow.tokens())["id_token"]
        old_keys = await self.keys(browser, idp)
        idp.rotate()
        new_keys = await self.keys(browser, idp)
        self.assertEqual(sorted(new_keys), ["ec-2", "rsa-2"])
        self.assertEqual(idp.signing_kid, "rsa-2")
        after = (await flow.tokens())["id_token"]
        self.assertEqual(jwt.get_unverified_header(after)["kid"], "rsa-2")
        jwt.decode(after, new_keys["rsa-2"], algorithms=["RS256"], audience="gw")
        with self.assertRaises(jwt.InvalidSignatureError):
            jwt.decode(before, new_keys["rsa-2"], algorithms=["RS256"], audience="gw")
        jwt.decode(before, old_keys["rsa-1"], algorithms=["RS256"], audience="gw")
        idp.signing_kid = "ec-2"
        idp.rotate()
        self.assertEqual(idp.signing_kid, "ec-3")
        self.assertEqual(sorted(await self.keys(browser, idp)), ["ec-3", "rsa-3"])


class LifecycleTests(IdPTestCase):
    async def test_stop_and_restart_on_the_same_port(self) -> None:
        idp = await self.start_idp()
        browser = Browser()
        port, issuer = idp.port, idp.issuer
        url = idp.url("/.well-known/openid-configuration")
        self.assertEqual((await browser.get(url)).status, 200)
        await idp.stop()
        self.assertFalse(idp.running)
        with self.assertRaises(ConnectionRefusedError):
            await browser.get(url)
        self.assertEqual(idp.issuer, issuer)
        await idp.restart()
        self.assertTrue(idp.running)
        self.assertEqual(idp.port, port)
        response = await browser.get(url)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json()["issuer"], issuer)
        await idp.restart()  # while listening: stops first
        self.assertEqual((await browser.get(url)).status, 200)

    async def test_stop_drops_open_connections(self) -> None:
        """
        A client holding a connection (as the gateway's pool does) sees it closed.
        """
        from twisted.internet import reactor
        from twisted.web.client import Agent, HTTPConnectionPool, readBody

        idp = await self.start_idp()
        pool = HTTPConnectionPool(reactor, persistent=True)
        self.addCleanup(pool.closeCachedConnections)
        agent = Agent(reactor, pool=pool)
        response = await agent.request(b"GET", idp.url("/jwks").encode())
        await readBody(response)
        self.assertEqual(idp.open_connections, 1)
        await idp.stop()
        self.assertEqual(idp.open_connections, 0)


class IdTokenModeTests(IdPTestCase):
    """
    Each L{FakeIdP.id_token_mode} spoils the ID token in its way, and only in it.
    """

    async def id_token(self, mode: str | None) -> tuple[str, FakeIdP, Flow, dict[str, Any]]:
        idp = await self.start_idp()
        idp.id_token_mode = mode
        browser = Browser()
        flow = Flow(idp, browser)
        token: str = (await flow.tokens())["id_token"]
        return token, idp, flow, await self.keys(browser, idp)

    def verify(self, token: str, idp: FakeIdP, key: Any, **options: Any) -> dict[str, Any]:
        """
        Verify C{token} as a relying party would (a good one passes).
        """
        checks: Any = {"require": ["exp", "iat", "iss", "aud", "sub"], **options}
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=["RS256", "ES256"],
            audience=idp.client_id,
            issuer=idp.issuer,
            options=checks,
        )
        return claims

    def unverified(self, token: str, idp: FakeIdP, **options: Any) -> dict[str, Any]:
        """
        Every check but the signature's.
        """
        return self.verify(token, idp, None, verify_signature=False, **options)

    def test_modes_are_all_tested(self) -> None:
        tested = {name[len("test_") :] for name in dir(self) if name.startswith("test_")}
        self.assertEqual(set(ID_TOKEN_MODES) - tested, set())

    async def test_good(self) -> None:
        token, idp, flow, keys = await self.id_token(None)
        claims = self.verify(token, idp, keys["rsa-1"])
        self.assertEqual((claims["nonce"], claims["azp"]), (flow.nonce, "gw"))

    async def test_bad_signature(self) -> None:
        token, idp, flow, keys = await self.id_token("bad_signature")
        with self.assertRaises(jwt.InvalidSignatureError):
            self.verify(token, idp, keys["rsa-1"])
        claims = self.unverified(token, idp)
        self.assertEqual(claims["nonce"], flow.nonce)
        self.assertEqual(segments(token)[0]["kid"], "rsa-1")
        self.assertEqual(len(segments(token)[2]), 256)

    async def test_bad_signature_ec(self) -> None:
        idp = await self.start_idp()
        idp.signing_kid = "ec-1"
        idp.id_token_mode = "bad_signature"
        browser = Browser()
        token = (await Flow(idp, browser).tokens())["id_token"]
        keys = await self.keys(browser, idp)
        self.assertEqual(segments(token)[0]["alg"], "ES256")
        with self.assertRaises(jwt.InvalidSignatureError):
            self.verify(token, idp, keys["ec-1"])

    async def test_wrong_nonce(self) -> None:
        token, idp, flow, keys = await self.id_token("wrong_nonce")
        claims = self.verify(token, idp, keys["rsa-1"])
        self.assertNotEqual(claims["nonce"], flow.nonce)
        self.assertTrue(claims["nonce"])

    async def test_wrong_aud(self) -> None:
        token, idp, _, keys = await self.id_token("wrong_aud")
        with self.assertRaises(jwt.InvalidAudienceError):
            self.verify(token, idp, keys["rsa-1"])
        self.assertEqual(self.unverified(token, idp, verify_aud=False)["aud"], OTHER_CLIENT)

    async def test_wrong_iss(self) -> None:
        token, idp, _, keys = await self.id_token("wrong_iss")
        with self.assertRaises(jwt.InvalidIssuerError):
            self.verify(token, idp, keys["rsa-1"])
        self.assertEqual(segments(token)[1]["iss"], OTHER_ISSUER)

    async def test_expired(self) -> None:
        token, idp, flow, keys = await self.id_token("expired")
        with self.assertRaises(jwt.ExpiredSignatureError):
            self.verify(token, idp, keys["rsa-1"])
        claims = self.verify(token, idp, keys["rsa-1"], verify_exp=False)
        self.assertLess(abs(time.time() - claims["exp"] - 60), 5)
        self.assertEqual(claims["nonce"], flow.nonce)

    async def test_alg_none(self) -> None:
        token, idp, flow, keys = await self.id_token("alg_none")
        header, _, signature = segments(token)
        self.assertEqual(header, {"alg": "none", "typ": "JWT"})
        self.assertEqual(signature, b"")
        self.assertTrue(token.endswith("."))
        with self.assertRaises(jwt.InvalidAlgorithmError):
            self.verify(token, idp, keys["rsa-1"])
        self.assertEqual(self.unverified(token, idp)["nonce"], flow.nonce)

    async def test_hs256_public(self) -> None:
        token, idp, flow, keys = await self.id_token("hs256_public")
        header, claims, signature = segments(token)
        self.assertEqual(header, {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"})
        # Keyed with the PEM of the public key a verifier would hold...
        pem = idp.key("rsa-1").public_pem
        signing_input = token.rsplit(".", 1)[0].encode()
        self.assertEqual(signature, hmac.new(pem, signing_input, hashlib.sha256).digest())
        # ...which an RS256-only verifier refuses.
        with self.assertRaises(jwt.InvalidAlgorithmError):
            jwt.decode(token, keys["rsa-1"], algorithms=["RS256"], audience="gw")
        self.assertEqual(claims["nonce"], flow.nonce)

    async def test_unknown_kid(self) -> None:
        token, idp, flow, keys = await self.id_token("unknown_kid")
        header = segments(token)[0]
        self.assertNotIn(header["kid"], keys)
        self.assertEqual(header["alg"], "RS256")
        with self.assertRaises(jwt.InvalidSignatureError):
            self.verify(token, idp, keys["rsa-1"])
        self.assertEqual(self.unverified(token, idp)["nonce"], flow.nonce)

    async def test_future_iat(self) -> None:
        token, idp, _, keys = await self.id_token("future_iat")
        with self.assertRaises(jwt.ImmatureSignatureError):
            self.verify(token, idp, keys["rsa-1"])
        claims = self.verify(token, idp, keys["rsa-1"], verify_iat=False)
        self.assertLess(abs(claims["iat"] - time.time() - 60), 5)
        self.assertGreater(claims["exp"], claims["iat"])

    async def test_wrong_azp(self) -> None:
        token, idp, _, keys = await self.id_token("wrong_azp")
        claims = self.verify(token, idp, keys["rsa-1"])
        self.assertEqual(claims["azp"], OTHER_CLIENT)
        self.assertEqual(claims["aud"], "gw")

    async def test_unknown_mode(self) -> None:
        idp = FakeIdP()
        idp.id_token_mode = "sideways"
        with self.assertRaises(ValueError):
            idp.make_id_token("n")


class BrowserTests(TestCase):
    """
    The browser's cookie jar, redirects and connection handling, against a backend.
    """

    def setUp(self) -> None:
        self.backend = SiteBackend(self.respond).start()
        self.addCleanup(self.backend.stop)
        self.base = f"http://127.0.0.1:{self.backend.port}"

    def respond(self, request: Request) -> bytes:
        path = request.path
        if path == b"/set":
            for line in (
                b"sid=abc; Path=/; HttpOnly; Secure; SameSite=Lax",
                b"theme=dark; Domain=example.com; Path=/x",
                b"gone=soon",
            ):
                request.responseHeaders.addRawHeader(b"Set-Cookie", line)
        elif path == b"/clear":
            for line in (
                b"sid=; Max-Age=0",
                b"theme=; Expires=Thu, 01 Jan 1970 00:00:00 GMT",
                b"gone=; Max-Age=-1",
                b"kept=1; Max-Age=60; Expires=Thu, 01 Jan 1970 00:00:00 GMT",
            ):
                request.responseHeaders.addRawHeader(b"Set-Cookie", line)
        elif path.startswith(b"/hop/"):
            left = int(path.rsplit(b"/", 1)[1])
            request.setResponseCode(302 if left % 2 else 303)
            request.setHeader(b"Location", b"%d" % (left - 1) if left > 1 else b"/done#frag")
        elif path == b"/absolute":
            request.setResponseCode(307)
            request.setHeader(b"Location", f"{self.base}/hop/1".encode())
        elif path == b"/loop":
            request.setResponseCode(301)
            request.setHeader(b"Location", b"/loop")
        elif path == b"/post":
            assert request.content is not None
            request.content.seek(0)
            return json.dumps(
                {
                    "type": request.getHeader("Content-Type"),
                    "body": request.content.read().decode(),
                }
            ).encode()
        return json.dumps(
            {
                "cookie": request.getHeader("Cookie"),
                "agent": request.getHeader("User-Agent"),
                "connection": request.getHeader("Connection"),
            }
        ).encode()

    async def test_cookies(self) -> None:
        browser = Browser()
        first = await browser.get(self.base + "/echo")
        self.assertEqual(first.json()["cookie"], None)
        self.assertEqual(browser.set_cookie_lines, [])

        await browser.get(self.base + "/set")
        self.assertEqual(browser.cookies, {"sid": "abc", "theme": "dark", "gone": "soon"})
        self.assertEqual(len(browser.set_cookie_lines), 3)
        self.assertEqual(
            browser.set_cookie("sid"), "sid=abc; Path=/; HttpOnly; Secure; SameSite=Lax"
        )
        self.assertIsNone(browser.set_cookie("nope"))

        echoed = (await browser.get(self.base + "/anywhere/else")).json()
        self.assertEqual(echoed["cookie"], "sid=abc; theme=dark; gone=soon")
        self.assertEqual(browser.set_cookie_lines, [])
        self.assertIsNone((await browser.get(self.base + "/x", cookies=False)).json()["cookie"])
        explicit = await browser.get(self.base + "/x", {"Cookie": "mine=1"})
        self.assertEqual(explicit.json()["cookie"], "mine=1")

        await browser.get(self.base + "/clear")
        self.assertEqual(browser.cookies, {"kept": "1"})

    async def test_defaults(self) -> None:
        browser = Browser()
        echoed = (await browser.get(self.base + "/echo")).json()
        self.assertEqual(echoed["agent"], "edgegw-tests")
        self.assertEqual(echoed["connection"], "close")
        agent = (await browser.get(self.base + "/echo", {"User-Agent": "other"})).json()["agent"]
        self.assertEqual(agent, "other")
        self.assertEqual(browser._connections.open, [])

    async def test_post_form(self) -> None:
        browser = Browser()
        response = await browser.post(self.base + "/post", {"a": "1 2", "b": "&="})
        self.assertEqual(
            response.json(),
            {"type": "application/x-www-form-urlencoded", "body": "a=1+2&b=%26%3D"},
        )

    async def test_redirects_are_not_followed_by_get(self) -> None:
        browser = Browser()
        response = await browser.get(self.base + "/hop/2")
        self.assertEqual(response.status, 303)
        self.assertEqual(response.location, "1")
        self.assertEqual(response.absolute_location, self.base + "/hop/1")

    async def test_follow(self) -> None:
        browser = Browser()
        response = await browser.follow(self.base + "/absolute")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.url, self.base + "/done")
        self.assertEqual(
            browser.history,
            [self.base + "/absolute", self.base + "/hop/1", self.base + "/done"],
        )
        response = await browser.follow(self.base + "/hop/3", max_hops=3)
        self.assertEqual(response.status, 200)
        self.assertEqual(len(browser.history), 4)
        with self.assertRaises(TooManyRedirectsError):
            await browser.follow(self.base + "/hop/3", max_hops=2)
        with self.assertRaises(TooManyRedirectsError):
            await browser.follow(self.base + "/loop")
        self.assertEqual(len(browser.history), 11)

    async def test_follow_a_login_through_the_idp(self) -> None:
        """
        The browser follows the provider's redirect to a client's callback.
        """
        idp = FakeIdP()
        await idp.start(self)
        callback = self.base + "/callback"
        idp.redirect_uris.append(callback)
        flow = Flow(idp, Browser(), redirect_uri=callback)
        response = await flow.browser.follow(flow.authorize_url())
        self.assertEqual(response.status, 200)
        self.assertEqual(len(flow.browser.history), 2)
        self.assertTrue(flow.browser.history[1].startswith(callback + "?code="))
        self.assertEqual(query_of(response.url)["state"], [flow.state])
        code = query_of(response.url)["code"][0]
        self.assertEqual((await flow.exchange(code)).status, 200)


class HelperTests(SynchronousTestCase):
    def test_pkce_challenge(self) -> None:
        """
        The example of RFC 7636 appendix B.
        """
        verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
        self.assertEqual(pkce_challenge(verifier), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        self.assertEqual(b64url(b"\xff\xfe"), "__4")
