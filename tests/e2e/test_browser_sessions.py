"""
Server-side sessions end to end (issue 17, point 5): two gateway processes (C{twistd -n
edgegw}) behind the same cookie, their sessions in a real redis-server, the real OpenID
provider issuing short-lived access tokens with rotated refresh tokens, and a real
headless Chromium using the app on both at once:

  - the access token is refreshed silently while the browser keeps going, exactly once
    per expiry at the provider, whichever process sees it due (a spent refresh token
    replayed would make the provider revoke the whole grant);
  - a back-channel logout from the provider (the user signs out there) ends the
    browser's session on both processes and closes its open EventSource.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from tests.e2e.browser import Chromium, log_in_at_provider, start_chromium
from tests.e2e.provider import RESOURCE, Provider, start_provider
from tests.e2e.test_browser import AppBackend
from tests.support.daemons import GatewayProcess, http_exchange, sleep
from tests.support.processes import free_port, listen_local, port_of
from tests.support.redis import RedisServer, redis_server

KEY = "fedcba9876543210fedcba9876543210"
BACKCHANNEL_PATH = "/auth/backchannel-logout"
TOKEN_SECONDS = 4
"""The provider's access-token lifetime; the gateways refresh 2 s before the end."""
USE_SECONDS = 9.0
"""How long the browser keeps using the app: about four expiries."""


def config(
    port: int, a_port: int, provider: Provider, redis: RedisServer, backend: int
) -> dict[str, str]:
    upstream = f"http://127.0.0.1:{backend}"
    text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{KEY}"}}
  stateProvider:
    type: kvstore
    refreshSkew: 2s
    config: {{address: "{redis.address}", timeout: 2s}}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "http://127.0.0.1:{a_port}/auth/callback"
  scopes: [openid, profile, email]
  resource: "{RESOURCE}"
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardAccessToken: true}}
---
kind: Route
metadata: {{name: events}}
spec:
  match: GET /events/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
"""
    return {"gateway.yaml": text}


# The app's polling loop: one fetch() every 100 ms, statuses recorded.
POLL = """
window.statuses = [];
window.poll = setInterval(() => {
  fetch('/app/poll', {credentials: 'same-origin', redirect: 'manual'})
    .then(r => window.statuses.push(r.status))
    .catch(() => window.statuses.push(-1));
}, 100);
"""


class TwoProcessSessionTests(TestCase):
    async def test_silent_refresh_and_backchannel_logout_across_two_processes(self) -> None:
        redis = await redis_server(self)
        a_port, b_port = free_port(), free_port()
        a_origin, b_origin = f"http://127.0.0.1:{a_port}", f"http://127.0.0.1:{b_port}"
        provider = await start_provider(
            self,
            [a_origin + "/auth/callback"],
            backchannel_logout_uri=a_origin + BACKCHANNEL_PATH,
            env={"E2E_OIDC_TTL_ACCESS_TOKEN": str(TOKEN_SECONDS)},
        )
        backend = AppBackend()
        listening = listen_local(Site(backend))
        self.addCleanup(listening.stopListening)
        a = GatewayProcess(self, config(a_port, a_port, provider, redis, port_of(listening)), "a")
        b = GatewayProcess(self, config(b_port, a_port, provider, redis, port_of(listening)), "b")
        await a.start()
        await b.start()
        for gateway in (a, b):
            await self.until_idp_ready(gateway)
        browser = await start_chromium(self)

        # Log in at A; the cookie (host 127.0.0.1, any port) is B's too.
        await browser.go(a_origin + "/app/a")
        await log_in_at_provider(browser, provider.issuer, "alice")
        await browser.until(
            "return location.href === arguments[0]", "not back at A", 15.0, a_origin + "/app/a"
        )
        tab_a = await browser.handle()
        tab_b = await browser.new_tab(b_origin + "/app/b")
        self.assertEqual(
            await browser.js("return document.getElementById('user').textContent"), "alice"
        )

        # Both tabs use the app at once, each on its own process, across several expiries.
        await browser.js(POLL)
        await browser.switch(tab_a)
        await browser.js(POLL)
        await sleep(USE_SECONDS)
        statuses = []
        for tab in (tab_a, tab_b):
            await browser.switch(tab)
            await browser.js("clearInterval(window.poll)")
            statuses.append(await browser.js("return window.statuses"))
        for tab_statuses in statuses:
            self.assertGreater(len(tab_statuses), USE_SECONDS * 3)
            self.assertEqual(set(tab_statuses), {200}, tab_statuses)

        tokens = [
            headers[b"authorization"]
            for headers in backend.seen(b"GET", b"/app/")
            if b"authorization" in headers
        ]
        distinct = len(set(tokens))
        refreshes = provider.stderr.count("grant refresh_token for edgegw")
        # Exactly one refresh per expiry: every refresh made a new token the backend saw,
        # and no token was refreshed twice (by both processes, or by two requests).
        self.assertGreaterEqual(refreshes, 2, provider.stderr[-2000:])
        self.assertEqual(refreshes, distinct - 1, provider.stderr[-2000:])
        self.assertNotIn("grant.error", provider.stderr)

        # An EventSource open at B; then the user signs out at the provider, which tells
        # A over the back channel.
        await browser.switch(tab_b)
        await browser.js(
            "window.events = []; window.ended = false;"
            "window.source = new EventSource('/events/feed');"
            "source.onmessage = e => window.events.push(e.data);"
            "source.onerror = () => { window.ended = true; };"
        )
        await browser.until("return window.events.length === 1", "no event at B")
        await browser.switch(tab_a)
        await browser.go(provider.issuer + "/session/end?client_id=" + provider.client_id)
        await browser.until(
            "return document.querySelector('button[name=logout]') !== null",
            "no sign-out confirmation at the provider",
        )
        await browser.submit("button[name=logout]")
        await self.until_logged_out(browser, provider, tab_b)
        self.assertIn("back-channel logout of alice", provider.stderr)

    async def until_logged_out(self, browser: Chromium, provider: Provider, tab: str) -> None:
        """
        The EventSource at B closes, and B answers the app's fetch() with 401.
        """
        await browser.switch(tab)
        await browser.until(
            # Closed by B (the stream's server waits 10 minutes before it reconnects).
            "return window.ended && window.source.readyState !== EventSource.OPEN",
            "the EventSource at B stayed open after the back-channel logout; provider log:\n"
            + provider.stderr[-1500:],
            10.0,
        )
        status = await browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "fetch('/app/after', {redirect: 'manual'}).then(r => done(r.status));"
        )
        self.assertEqual(status, 401)

    async def until_idp_ready(self, gateway: GatewayProcess) -> Any:
        for _ in range(200):
            if (await http_exchange(gateway.port, "GET", "/auth/login")).status != 503:
                return
            await sleep(0.05)
        self.fail(f"{gateway.name} never loaded the provider's discovery:\n{gateway.output}")
