"""
Cookie tossing in a real browser (issue 36, point 1): Chromium, one gateway process over
https at C{app.example.test}, and a page of the attacker's on the sibling
C{evil.example.test} (a small https server in the test), both names mapped to 127.0.0.1
with C{--host-resolver-rules}; the real OpenID provider logs the users in.

Bob (the attacker: the provider knows alice and bob) logs in himself and keeps his
session cookie's value. Alice logs in. Bob's page then sets, for the parent domain
C{example.test}, every cookie that could carry Bob's session to the app: C{gw_session}
(at C{Path=/} and at a longer path, which browsers send first), C{gw_session.0},
C{__Host-gw_session} with a C{Domain} (which the browser must refuse), a nameless cookie
whose value is C{__Host-gw_session=...} (which a browser sends back as that bare pair;
RFC 6265bis has browsers refuse it: an attack of our own on the prefix),
C{__host-gw_session} in lower case. Alice's next visit to the app is still Alice's; and a
browser without a session, given the same cookies, is sent to the provider's login form
rather than logged in as Bob (login CSRF).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.ssl import PrivateCertificate
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from tests.e2e.browser import Chromium, log_in_at_provider, start_chromium
from tests.e2e.provider import Provider, start_provider
from tests.e2e.test_browser import AppBackend
from tests.support.certificates import CertificateAuthority
from tests.support.daemons import GatewayProcess, sleep
from tests.support.processes import free_port, listen_local, port_of
from tests.support.tls_client import client_context, get_request, handshake_now

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"
APP = "app.example.test"
EVIL = "evil.example.test"
PARENT = "example.test"


def config(port: int, provider: Provider, backend: int, cert: str, key: str) -> str:
    return f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  tls:
    certificates: [{{certFile: "{cert}", keyFile: "{key}"}}]
  session: {{key: "{KEY}"}}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "https://{APP}:{port}/auth/callback"
  scopes: [openid, profile, email]
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend}"}}
"""


class TossingPage(Resource):
    """
    The attacker's page on the sibling subdomain: sets the C{Set-Cookie} lines the test
    put in L{lines}, and says so.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def render_GET(self, request: Request) -> bytes:
        for line in self.lines:
            request.responseHeaders.addRawHeader(b"Set-Cookie", line.encode("ascii"))
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        return b'<!doctype html><html><body><p id="done">tossed</p></body></html>'


def tossed_lines(value: str) -> list[str]:
    """
    The cookies Bob's page sets for the parent domain, each carrying his session's
    sealed value (C{value}).
    """
    domain = f"; Domain={PARENT}; Secure; SameSite=Lax"
    return [
        f"gw_session={value}; Path=/{domain}",
        f"gw_session={value}; Path=/app/{domain}",
        f"gw_session.0={value}; Path=/{domain}",
        f"__Host-gw_session={value}; Path=/{domain}",
        f"__Host-gw_session.0={value}; Path=/{domain}",
        f"=__Host-gw_session={value}; Path=/{domain}",
        f"__host-gw_session={value}; Path=/{domain}",
    ]


class CookieTossingInChromium(TestCase):
    async def test_a_sibling_subdomain_cannot_swap_or_plant_a_session(self) -> None:
        port = free_port()
        app = f"https://{APP}:{port}"
        provider = await start_provider(self, [app + "/auth/callback"])
        backend = AppBackend()
        listening = listen_local(Site(backend))
        self.addCleanup(listening.stopListening)
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = CertificateAuthority()
        key, cert, _ = ca.issue(directory, [APP], stem="app")
        gateway = GatewayProcess(
            self, {"gateway.yaml": config(port, provider, port_of(listening), cert, key)}
        )
        await gateway.start()
        await self.until_ready(port, ca.root_pem)

        page = TossingPage()
        evil_key, evil_cert, _ = ca.issue(directory, [EVIL], stem="evil")
        with open(evil_key, "rb") as k, open(evil_cert, "rb") as c:
            evil_tls = PrivateCertificate.loadPEM(k.read() + c.read()).options()
        evil_listening = reactor.listenSSL(0, Site(page), evil_tls, interface="127.0.0.1")
        self.addCleanup(evil_listening.stopListening)
        evil = f"https://{EVIL}:{port_of(evil_listening)}"

        browser = await start_chromium(
            self,
            (
                f"--host-resolver-rules=MAP {APP} 127.0.0.1, MAP {EVIL} 127.0.0.1",
                "--ignore-certificate-errors",
            ),
        )

        # Bob logs in (in his own browser: the same one, its cookies cleared after).
        await self.log_in(browser, provider, app, "bob")
        cookies = await self.cookies(browser)
        [session] = [c for c in cookies if c["name"].endswith("gw_session")]
        self.assertEqual(session["name"], "__Host-gw_session")
        self.assertEqual((session["domain"], session["path"]), (APP, "/"))
        self.assertTrue(session["secure"] and session["httpOnly"])
        bob = session["value"]
        await self.clear_cookies(browser)

        # Alice logs in; Bob's page tosses its cookies for the parent domain.
        await self.log_in(browser, provider, app, "alice")
        page.lines = tossed_lines(bob)
        await browser.go(evil + "/toss")
        await browser.until("return document.getElementById('done')", "the page did not load")
        planted = {(c["name"], c.get("path")) for c in await self.cookies(browser)}
        # The toss is real: the unprefixed names were stored for the parent domain.
        self.assertIn(("gw_session", "/"), planted)
        self.assertIn(("gw_session.0", "/"), planted)
        # A __Host- cookie with a Domain, or a nameless one posing as one, is refused.
        self.assertNotIn(("__Host-gw_session", "/"), planted)
        self.assertNotIn(("", "/"), planted)

        await browser.go(app + "/app/after")
        await browser.until(
            "return document.readyState === 'complete' && document.getElementById('user')",
            "the app did not answer",
        )
        self.assertEqual(await browser.js("return location.href"), app + "/app/after")
        self.assertEqual(
            await browser.js("return document.getElementById('user').textContent"), "alice"
        )
        [headers] = backend.seen(b"GET", b"/app/after")
        self.assertEqual(headers[b"x-user-id"], b"alice")

        # A browser without a session, given the same cookies: not logged in as Bob.
        await self.clear_cookies(browser)
        await browser.go(evil + "/toss")
        await browser.until("return document.getElementById('done')", "the page did not load")
        await browser.go(app + "/app/planted")
        await browser.until(
            "return document.querySelector('input[name=login]') !== null",
            "a browser without a session, given Bob's cookies, was not asked to log in",
        )
        self.assertEqual(backend.seen(b"GET", b"/app/planted"), [])

    async def until_ready(self, port: int, root_pem: bytes) -> None:
        context = client_context(root_pem, alpn=["http/1.1"])
        context.check_hostname = False
        for _ in range(200):
            reply = await deferToThread(
                handshake_now, port, None, context, request=get_request("/auth/login")
            )
            if not reply.response.startswith(b"HTTP/1.1 503 "):
                return
            await sleep(0.05)
        self.fail("the gateway never loaded the provider's discovery")

    async def log_in(self, browser: Chromium, provider: Provider, app: str, user: str) -> None:
        target = f"{app}/app/{user}"
        await browser.go(target)
        await log_in_at_provider(browser, provider.issuer, user)
        await browser.until(
            "return location.href === arguments[0] && document.readyState === 'complete'",
            f"{user} not back on the app after the login",
            15.0,
            target,
        )
        self.assertEqual(
            await browser.js("return document.getElementById('user').textContent"), user
        )

    async def cookies(self, browser: Chromium) -> list[dict[str, Any]]:
        """
        The cookies the browser would send to the current page (HttpOnly ones too).
        """
        found: list[dict[str, Any]] = await browser.call(browser.driver.get_cookies)
        return found

    async def clear_cookies(self, browser: Chromium) -> None:
        """
        Every cookie of the browser gone (the provider's too: the next login asks).
        """
        await browser.call(browser.driver.execute_cdp_cmd, "Network.clearBrowserCookies", {})
