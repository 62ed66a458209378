"""
The signed identity hand-off end to end, between two gateway processes: gateway A logs
the user in through the real OpenID provider (node's oidc-provider) into its session
cookie and proxies with C{forwardIdentity} to gateway B, which accepts A's assertion
(with A's forwarded access token, verified against the same provider, or alone) and
hands the user to its own backend as C{X-User-*} headers.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from nacl.signing import SigningKey
from twisted.trial.unittest import TestCase

from tests.e2e.provider import RESOURCE, CookieClient, Provider, login_through_forms, start_provider
from tests.support.backends import SiteBackend, answer
from tests.support.daemons import GatewayProcess, sleep
from tests.support.processes import free_port

READY_DEADLINE = 20.0


def gateway_a(port: int, provider: Provider, b_port: int, seed: bytes, token: bool) -> str:
    """
    A: browser login (the resource's JWT as access token), C{/to-b/} proxied to B with
    the identity assertion (and the access token when C{token}).
    """
    key = base64.b64encode(seed).decode()
    return f"""\
kind: Gateway
metadata: {{name: gw-a}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{secrets.token_hex(16)}"}}
  identity:
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
    assertion:
      issue: {{name: gw-a, keyId: a-1, key: "{key}", audience: gw-b}}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "http://127.0.0.1:{port}/auth/callback"
  scopes: [openid, profile, email, groups]
  resource: "{RESOURCE}"
---
kind: Route
metadata: {{name: to-b}}
spec:
  match: /to-b/
  type: app
  access: {{auth: required}}
  handler:
    type: reverse-proxy
    upstream: "http://127.0.0.1:{b_port}"
    forwardIdentity: true
    forwardAccessToken: {str(token).lower()}
"""


def gateway_b(port: int, provider: Provider, backend_port: int, public: bytes, bearer: bool) -> str:
    """
    B: accepts A's assertions (with a verified Bearer token of the same subject when
    C{bearer}, else alone) on C{/to-b/}, proxied to its backend.
    """
    key = base64.b64encode(public).decode()
    return f"""\
kind: Gateway
metadata: {{name: gw-b}}
spec:
  listen: "127.0.0.1:{port}"
  identity:
    userInfo: never
    assertion:
      accept:
        issuer: gw-a
        audience: gw-b
        requireBearer: {str(bearer).lower()}
        keys: [{{keyId: a-1, publicKey: "{key}"}}]
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
metadata: {{name: svc}}
spec:
  match: /to-b/
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend_port}"}}
"""


class HandOffTests(TestCase):
    """
    A browser session at gateway A reaches gateway B's backend as that user.
    """

    async def hand_off(self, bearer: bool) -> SiteBackend:
        a_port, b_port = free_port(), free_port()
        provider = await start_provider(self, [f"http://127.0.0.1:{a_port}/auth/callback"])
        backend = SiteBackend(answer(body=b"b-backend")).start()
        self.addCleanup(backend.stop)
        seed = secrets.token_bytes(32)
        public = bytes(SigningKey(seed).verify_key)
        b = GatewayProcess(
            self, {"b.yaml": gateway_b(b_port, provider, backend.port, public, bearer)}, "b"
        )
        a = GatewayProcess(self, {"a.yaml": gateway_a(a_port, provider, b_port, seed, bearer)}, "a")
        await b.start()
        await a.start()

        browser = CookieClient()
        start = a.url("/to-b/page?x=1")
        callback = await self.login(browser, start, a)
        back = await browser.get(callback)
        self.assertEqual(back.status, 302, back.body[:300])
        self.assertEqual(back.headers.get("location"), "/to-b/page?x=1")
        page = await browser.get(start)
        self.assertEqual((page.status, page.body), (200, b"b-backend"), a.output + b.output)
        return backend

    async def login(self, browser: CookieClient, start: str, a: GatewayProcess) -> str:
        """
        Log alice in at A (once A has loaded the provider's discovery: 503 before).
        """
        # The route sends an anonymous browser to /auth/login at once; it is the login
        # endpoint that answers 503 until discovery (asked by a probe of its own, so
        # that the browser's cookies stay as they were).
        probe = CookieClient()
        waited = 0.0
        while True:
            first = await probe.get(a.url("/auth/login?return_to=/"))
            if first.status != 503 or waited >= READY_DEADLINE:
                break
            await sleep(0.1)
            waited += 0.1
        self.assertEqual(first.status, 302, a.output)
        return await login_through_forms(browser.get, browser.post, start, "alice")

    def assert_alice(self, backend: SiteBackend) -> Any:
        seen = backend.requests[-1]
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(seen.header(b"X-User-Email"), b"alice@example.com")
        groups = seen.header(b"X-User-Groups")
        assert groups is not None
        self.assertIn(b"Admins", groups)
        # The assertion is B's input, never passed on to its backend.
        self.assertIsNone(seen.header(b"X-Gw-Identity"))
        return seen

    async def test_assertion_with_the_forwarded_access_token(self) -> None:
        backend = await self.hand_off(bearer=True)
        seen = self.assert_alice(backend)
        self.assertIsNone(seen.header(b"Authorization"))

    async def test_assertion_alone(self) -> None:
        backend = await self.hand_off(bearer=False)
        self.assert_alice(backend)
