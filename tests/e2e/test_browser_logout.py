"""
Logout at the provider in a real headless Chromium (issue 36, point 3): a real gateway
process, the real OpenID provider (node's oidc-provider, tests/e2e/provider.mjs, with
the gateway's logout path registered as the client's post-logout redirect URI), and a
backend in the test process.

The user logs in, presses the app's logout button (a same-origin form POST); the gateway
ends its session and sends the browser to the provider's end-session endpoint, whose
confirmation page the user accepts; the provider sends the browser back to the gateway,
which checks the state and lands it on C{/}. Opening the app then asks for credentials
again: the provider's session is over too (before, the provider logged the user in
again silently). Both with the session in the cookie and in Redis (a state provider).
"""

from __future__ import annotations

import html
from typing import Any

from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from tests.e2e.browser import Chromium, log_in_at_provider, start_chromium
from tests.e2e.provider import Provider, start_provider
from tests.support.daemons import GatewayProcess, http_exchange, sleep
from tests.support.processes import free_port, listen_local, port_of
from tests.support.redis import redis_server

KEY = "0123456789abcdef0123456789abcdef"


class UserPage(Resource):
    """
    The backend: a page naming the user the gateway sent (C{X-User-Id}).
    """

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        user = (request.getHeader(b"x-user-id") or b"").decode()
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        return (
            '<!doctype html><html><head><meta charset="utf-8"><title>app</title></head>'
            f'<body><p id="user">{html.escape(user)}</p>'
            '<form id="logout" method="post" action="/auth/logout">'
            '<button id="logout-button" type="submit">Log out</button></form>'
            "</body></html>"
        ).encode()


def gateway_config(port: int, provider: Provider, backend: int, redis: str | None) -> str:
    state = (
        f"""
  stateProvider:
    type: kvstore
    config: {{address: "{redis}"}}"""
        if redis is not None
        else ""
    )
    upstream = f"http://127.0.0.1:{backend}"
    return f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{KEY}"}}{state}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "http://127.0.0.1:{port}/auth/callback"
  scopes: [openid, profile, email]
---
kind: Route
metadata: {{name: home}}
spec:
  match: /
  type: app
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
"""


class BrowserLogoutTests(TestCase):
    async def walk(self, redis: str | None) -> None:
        port = free_port()
        origin = f"http://127.0.0.1:{port}"
        provider = await start_provider(
            self,
            [origin + "/auth/callback"],
            env={"E2E_OIDC_POST_LOGOUT_REDIRECT_URIS": origin + "/auth/logout"},
        )
        backend = listen_local(Site(UserPage()))
        self.addCleanup(backend.stopListening)
        gateway = GatewayProcess(
            self, {"gateway.yaml": gateway_config(port, provider, port_of(backend), redis)}
        )
        await gateway.start()
        await self.until_idp_ready(gateway)
        browser = await start_chromium(self)

        await browser.go(origin + "/app/home")
        await log_in_at_provider(browser, provider.issuer, "alice")
        await self.until_user(browser, "alice", "not logged in at the app")

        # The app's logout button; then the provider's confirmation page.
        await browser.submit("#logout-button")
        await browser.until(
            "return document.querySelector('button[name=logout]') !== null",
            "no sign-out confirmation at the provider (gateway log:\n"
            + gateway.output[-1500:]
            + ")",
        )
        self.assertTrue((await browser.url()).startswith(provider.issuer + "/session/end"))
        await browser.submit("button[name=logout]")
        # Back at the gateway, state checked, on the post-logout page.
        await browser.until(
            "return location.href === arguments[0] && document.readyState === 'complete'",
            "the provider's return did not land on the gateway's post-logout page",
            15.0,
            origin + "/",
        )
        self.assertEqual(await browser.js("return document.getElementById('user').textContent"), "")
        self.assertNotIn("did not begin", gateway.output)
        self.assertNotIn("end_session.error", provider.stderr)

        # The app asks for credentials again: no silent login at the provider.
        await browser.go(origin + "/app/again")
        await browser.until(
            "return document.querySelector('input[name=login]') !== null"
            " || document.getElementById('user') !== null",
            "neither the provider's login form nor the app",
        )
        self.assertTrue(
            (await browser.url()).startswith(provider.issuer),
            "the app was opened without a login: " + await browser.url(),
        )
        self.assertIsNone(await browser.js("return document.getElementById('user')"))
        # Logging in again works, as bob this time.
        await log_in_at_provider(browser, provider.issuer, "bob")
        await self.until_user(browser, "bob", "the second login did not complete")

    async def test_logout_ends_the_provider_session_cookie_mode(self) -> None:
        await self.walk(None)

    async def test_logout_ends_the_provider_session_with_redis(self) -> None:
        redis = await redis_server(self)
        await self.walk(redis.address)

    async def until_user(self, browser: Chromium, user: str, message: str) -> Any:
        return await browser.until(
            "const p = document.getElementById('user');"
            "return p !== null && p.textContent === arguments[0];",
            message,
            15.0,
            user,
        )

    async def until_idp_ready(self, gateway: GatewayProcess) -> None:
        for _ in range(200):
            if (await http_exchange(gateway.port, "GET", "/auth/login")).status != 503:
                return
            await sleep(0.05)
        self.fail(f"the gateway never loaded the provider's discovery:\n{gateway.output}")
