"""
The gateway's browser login against a real certified OpenID provider (node's
oidc-provider, tests/e2e/provider.mjs): discovery, the authorization request with PKCE,
RFC 9207 C{iss} on the callback, the token exchange (client_secret_basic), id_token
verification against the provider's own keys, userinfo, and the identity the backend
receives — with and without a resource indicator (RFC 8707), which decides whether the
provider issues a JWT access token for the API or an opaque one for userinfo.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.e2e.provider import RESOURCE, CookieClient, login_through_forms, start_provider
from tests.support.backends import SiteBackend, answer
from tests.support.configs import write_tree
from tests.support.processes import free_port

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"


class ProviderGateway(TestCase):
    """
    A gateway with browser login against the real provider (no tests of its own).
    """

    async def serve(self, idp_extra: str = "") -> tuple[str, SiteBackend, Any]:
        port = free_port()
        origin = f"http://127.0.0.1:{port}"
        provider = await start_provider(self, [origin + "/auth/callback"])
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{KEY}"}}
  identity:
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "{origin}/auth/callback"
  scopes: [openid, profile, email, groups]
{idp_extra}
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler:
    type: reverse-proxy
    upstream: "http://127.0.0.1:{backend.port}"
    forwardAccessToken: true
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
        return origin, backend, provider

    async def login(self, origin: str, user: str) -> Any:
        browser = CookieClient()
        callback = await login_through_forms(
            browser.get, browser.post, origin + "/app/page?x=1", user
        )
        self.assertTrue(callback.startswith(origin + "/auth/callback?"), callback)
        self.assertIn("iss=", callback)
        back = await browser.get(callback)
        self.assertEqual(back.status, 302, back.body[:300])
        self.assertEqual(back.headers.get("location"), "/app/page?x=1")
        page = await browser.get(origin + "/app/page?x=1")
        self.assertEqual((page.status, page.body), (200, b"backend"))
        view = await browser.get(origin + "/auth/session")
        self.assertEqual(view.status, 200)
        return view.json()


class RealProviderLoginTests(ProviderGateway):
    async def test_login_with_userinfo_and_an_opaque_access_token(self) -> None:
        origin, backend, _ = await self.serve()
        view = await self.login(origin, "alice")
        seen = backend.requests[-1]
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(seen.header(b"X-User-Email"), b"alice@example.com")
        self.assertEqual(seen.header(b"X-User-Name"), b"Alice Example")
        # Upper-case attribute names and an escaped comma, rendered as cn and
        # percent-encoded where a comma would split the list.
        self.assertEqual(seen.header(b"X-User-Groups"), b"Admins,Smith%2C John's Team")
        token = seen.header(b"Authorization")
        assert token is not None
        self.assertTrue(token.startswith(b"Bearer "))
        self.assertEqual(view["subject"], "alice")
        self.assertEqual(view["groups"], ["Admins", "Smith, John's Team"])

    async def test_login_with_a_resource_indicator(self) -> None:
        origin, backend, _ = await self.serve(f"  resource: {RESOURCE}\n")
        view = await self.login(origin, "bob")
        seen = backend.requests[-1]
        self.assertEqual(seen.header(b"X-User-Id"), b"bob")
        self.assertEqual(seen.header(b"X-User-Groups"), b"users")
        token = seen.header(b"Authorization")
        assert token is not None
        # A JWT access token for the API (three dot-separated parts).
        self.assertEqual(token.count(b"."), 2, token[:40])
        self.assertEqual(view["passport"]["email"], "bob@example.com")


class RealProviderBearerTests(ProviderGateway):
    """
    A verification-only gateway accepting the real provider's JWT access tokens (RFC 9068
    `at+jwt`, audience the resource indicator), obtained through a browser login at a
    first gateway that forwards them to its backend.
    """

    async def test_access_token_from_the_login_is_accepted_by_a_verifying_gateway(self) -> None:
        origin, backend, provider = await self.serve(f"  resource: {RESOURCE}\n")
        await self.login(origin, "alice")
        forwarded = backend.requests[-1].header(b"Authorization")
        assert forwarded is not None
        api = SiteBackend(answer(body=b"api")).start()
        self.addCleanup(api.stop)
        text = f"""\
kind: Gateway
metadata: {{name: api-gw}}
spec:
  listen: "127.0.0.1:0"
  identity:
    userInfo: never
    claims: []
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  verificationOnly: true
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  bearer: {{audience: "{RESOURCE}"}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{api.port}"}}
"""
        root = write_tree(self.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = reactor.listenTCP(0, gateway.site, interface="127.0.0.1")
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
        url = f"http://127.0.0.1:{listening.getHost().port}/api/x"
        caller = CookieClient()
        accepted = await caller.request("GET", url, headers={"Authorization": forwarded.decode()})
        self.assertEqual((accepted.status, accepted.body), (200, b"api"))
        self.assertEqual(api.requests[-1].header(b"X-User-Id"), b"alice")
        tampered = forwarded[:-4] + (b"AAAA" if not forwarded.endswith(b"AAAA") else b"BBBB")
        refused = await caller.request("GET", url, headers={"Authorization": tampered.decode()})
        self.assertEqual(refused.status, 401)
        self.assertEqual(refused.headers.get("www-authenticate"), 'Bearer error="invalid_token"')
        anonymous = await caller.request("GET", url)
        self.assertEqual(anonymous.status, 401)
