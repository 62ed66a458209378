"""
A real headless Chromium (tests/e2e/browser.py) against a real gateway process
(C{twistd -n edgegw} with a configuration written to disk), the real OpenID provider
(node's oidc-provider, tests/e2e/provider.mjs) and backends in the test process: the
walks a user of a single-page app takes (issue 17, point 2).

The gateway serves: C{GET /} a single-page app (static, with its fallback) whose script
shows the path it was loaded for; C{/app/} a logged-in app route proxied to a backend
page that shows the user the gateway named; C{/admin/} the same for members of the
C{Admins} group only (others are sent to C{/denied}, an app route); C{/events/} a
server-sent event stream and C{/ws/} a WebSocket echo, both for logged-in users.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.protocol import Factory
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from tests.e2e.browser import Chromium, log_in_at_provider, start_chromium
from tests.e2e.provider import Provider, start_provider
from tests.support.daemons import GatewayProcess
from tests.support.processes import free_port, listen_local, port_of
from tests.test_proxy import EchoWebSocket

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"

SPA_INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>spa</title></head>
<body><h1>spa</h1><p id="route"></p>
<script>document.getElementById("route").textContent = "route:" + location.pathname;</script>
</body></html>
"""


class AppBackend(Resource):
    """
    The backend behind C{/app/}, C{/admin/} and C{/events/}: an HTML page naming the
    user the gateway sent (C{X-User-Id}), and an event stream the test writes to.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[bytes, bytes, dict[bytes, bytes]]] = []
        self.streams: list[Request] = []

    def render(self, request: Request) -> bytes | int:
        headers = {
            name.lower(): values[0] for name, values in request.requestHeaders.getAllRawHeaders()
        }
        self.requests.append((request.method, request.path, headers))
        if request.path.startswith(b"/events/"):
            request.setHeader(b"Content-Type", b"text/event-stream")
            request.setHeader(b"Cache-Control", b"no-store")
            request.write(b"retry: 600000\n\ndata: first\n\n")
            self.streams.append(request)
            request.notifyFinish().addBoth(lambda _: self.streams.remove(request))
            return NOT_DONE_YET
        user = headers.get(b"x-user-id", b"").decode()
        page = (
            '<!doctype html><html><head><meta charset="utf-8"><title>app</title></head>'
            f'<body><p id="user">{html.escape(user)}</p>'
            f'<p id="path">{html.escape(request.path.decode())}</p></body></html>'
        )
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        return page.encode()

    def push(self, data: str) -> None:
        """
        Send one event on every open stream.
        """
        for stream in list(self.streams):
            stream.write(f"data: {data}\n\n".encode())

    def seen(self, method: bytes, prefix: bytes) -> list[dict[bytes, bytes]]:
        """
        The headers of the requests with C{method} whose path starts with C{prefix}.
        """
        return [h for m, p, h in self.requests if m == method and p.startswith(prefix)]


class AttackerPage(Resource):
    """
    A page on another origin that posts a form to the gateway as soon as it loads.
    """

    isLeaf = True

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        return (
            '<!doctype html><html><body><form id="f" method="post" '
            f'action="{html.escape(self.target)}"><input name="amount" value="1000"></form>'
            '<script>document.getElementById("f").submit();</script></body></html>'
        ).encode()


def gateway_config(port: int, provider: Provider, backend: int, ws: int, spa: str) -> str:
    upstream = f"http://127.0.0.1:{backend}"
    return f"""\
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
  redirectURL: "http://127.0.0.1:{port}/auth/callback"
  scopes: [openid, profile, email, groups]
---
kind: Policy
metadata: {{name: admins}}
spec: {{require: {{groups: [Admins]}}}}
---
kind: Route
metadata: {{name: spa}}
spec:
  match: /
  handler: {{type: static, dir: "{spa}", spaFallback: true}}
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
metadata: {{name: admin}}
spec:
  match: /admin/
  type: app
  access: {{auth: required, authorize: [admins], onDeny: {{redirect: /denied}}}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: events}}
spec:
  match: GET /events/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: ws}}
spec:
  match: GET /ws/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{ws}"}}
"""


class BrowserWalks(TestCase):
    """
    One gateway process, provider, backends and browser per test.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        port = free_port()
        self.origin = f"http://127.0.0.1:{port}"
        self.provider = await start_provider(
            self,
            [self.origin + "/auth/callback"],
            env={"E2E_OIDC_POST_LOGOUT_REDIRECT_URIS": self.origin + "/auth/logout"},
        )
        self.backend = AppBackend()
        backend = listen_local(Site(self.backend))
        self.addCleanup(backend.stopListening)
        echo = listen_local(Factory.forProtocol(EchoWebSocket))
        self.addCleanup(echo.stopListening)
        spa = os.path.abspath(self.mktemp())
        os.makedirs(spa)
        with open(os.path.join(spa, "index.html"), "w") as f:
            f.write(SPA_INDEX)
        config = gateway_config(port, self.provider, port_of(backend), port_of(echo), spa)
        self.gateway = GatewayProcess(self, {"gateway.yaml": config})
        await self.gateway.start()
        self.browser = await start_chromium(self)
        await self.until_idp_ready()

    async def until_idp_ready(self) -> None:
        """
        Wait until the gateway has the provider's discovery (its login answers 503
        before), without a browser.
        """
        from tests.support.daemons import http_exchange, sleep

        for _ in range(200):
            reply = await http_exchange(self.gateway.port, "GET", "/auth/login")
            if reply.status != 503:
                return
            await sleep(0.05)
        self.fail(f"the gateway never loaded the provider's discovery:\n{self.gateway.output}")

    async def log_in(self, user: str, browser: Chromium | None = None) -> None:
        """
        At the provider's login form (which the browser must be on), log C{user} in
        and consent; returns once the browser has left the provider.
        """
        await log_in_at_provider(browser or self.browser, self.provider.issuer, user)

    async def fetch(self, path: str, method: str = "GET") -> dict[str, Any]:
        """
        The page's own C{fetch()} of C{path} (credentials included, redirects not
        followed): its status, and its body as text.
        """
        result: dict[str, Any] = await self.browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: arguments[1], credentials: 'same-origin',"
            "                     redirect: 'manual'})"
            "  .then(r => r.text().then(t => done({status: r.status, type: r.type, body: t})))"
            "  .catch(e => done({status: -1, body: String(e)}));",
            path,
            method,
        )
        return result

    async def logged_in_at(self, path: str, user: str = "alice") -> None:
        """
        Visit C{path} (a logged-in route), log in, and check the browser is back on it.
        """
        await self.browser.go(self.origin + path)
        await self.log_in(user)
        await self.browser.until(
            "return location.href === arguments[0] && document.readyState === 'complete'",
            f"not back on {path} after the login",
            15.0,
            self.origin + path,
        )

    # -- the walks -----------------------------------------------------------------------

    async def test_spa_with_client_side_routes(self) -> None:
        await self.browser.go(self.origin + "/users/42?tab=orders")
        route = await self.browser.until(
            "return document.getElementById('route').textContent", "the app did not start"
        )
        self.assertEqual(route, "route:/users/42")
        self.assertEqual(await self.browser.url(), self.origin + "/users/42?tab=orders")

    async def test_login_lands_back_with_the_user_at_the_backend(self) -> None:
        start = "/app/reports/7?view=full"
        await self.browser.go(self.origin + start)
        # An anonymous visit ends on the provider's login form.
        url = await self.browser.url()
        self.assertTrue(url.startswith(self.provider.issuer + "/"), url)
        await self.log_in("alice")
        await self.browser.until(
            "return location.href === arguments[0]",
            "not back on the original URL",
            15.0,
            self.origin + start,
        )
        self.assertEqual(
            await self.browser.js("return document.getElementById('user').textContent"),
            "alice",
        )
        [headers] = self.backend.seen(b"GET", b"/app/reports/7")
        self.assertEqual(headers[b"x-user-id"], b"alice")
        self.assertEqual(headers[b"x-user-email"], b"alice@example.com")
        self.assertIn(b"Admins", headers[b"x-user-groups"])
        # Credentials never reach the backend.
        self.assertNotIn(b"cookie", headers)

    async def test_session_view_then_401_for_fetch_once_the_session_is_gone(self) -> None:
        await self.logged_in_at("/app/home")
        view = await self.fetch("/auth/session")
        self.assertEqual(view["status"], 200, view)
        session = json.loads(view["body"])
        self.assertEqual(session["subject"], "alice")
        self.assertEqual(session["passport"]["email"], "alice@example.com")
        data = await self.fetch("/app/data.json")
        self.assertEqual(data["status"], 200)
        # The session goes (the cookie with it), as when it expires.
        await self.browser.call(self.browser.driver.delete_all_cookies)
        gone = await self.fetch("/app/data.json")
        # The app's own fetch() gets 401, not a redirect to the login page.
        self.assertEqual(gone["status"], 401, gone)
        self.assertEqual((await self.fetch("/auth/session"))["status"], 401)

    async def test_user_outside_the_group_gets_the_on_deny_page(self) -> None:
        await self.browser.go(self.origin + "/admin/panel")
        await self.log_in("bob")
        await self.browser.until(
            "return location.pathname === '/denied' && document.getElementById('route')",
            "bob was not sent to the onDeny page",
        )
        self.assertEqual(self.backend.seen(b"GET", b"/admin/"), [])
        # alice, in Admins, gets through (in a browser of her own).
        alice = await start_chromium(self)
        await alice.go(self.origin + "/admin/panel")
        await self.log_in("alice", alice)
        await alice.until(
            "return document.getElementById('user') && "
            "document.getElementById('user').textContent === 'alice'",
            "alice did not reach the admin page",
        )

    async def test_event_source_receives_events_as_they_are_sent(self) -> None:
        await self.logged_in_at("/app/live")
        await self.browser.js(
            "window.events = [];"
            "window.source = new EventSource('/events/feed');"
            "source.onmessage = e => window.events.push(e.data);"
        )
        await self.browser.until(
            "return window.events.length === 1 && window.events[0] === 'first'",
            "the first event did not arrive",
        )
        for n in range(3):
            self.backend.push(f"tick {n}")
            await self.browser.until(
                "return window.events.length === arguments[0] + 2",
                f"event {n} was not delivered as it was sent",
                10.0,
                n,
            )
        events = await self.browser.js("return window.events")
        self.assertEqual(events, ["first", "tick 0", "tick 1", "tick 2"])
        await self.browser.js("window.source.close()")

    async def test_websocket_through_the_gateway_echoes(self) -> None:
        await self.logged_in_at("/app/chat")
        echoed = await self.browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "const ws = new WebSocket('ws://' + location.host + '/ws/echo');"
            "const got = [];"
            "ws.onopen = () => { ws.send('hello'); ws.send('world'); };"
            "ws.onmessage = e => { got.push(e.data); if (got.length === 2) {"
            "  ws.close(); done(got); } };"
            "ws.onerror = () => done('error');"
        )
        self.assertEqual(echoed, ["hello", "world"])

    async def test_logout_by_post_ends_the_session(self) -> None:
        await self.logged_in_at("/app/home")
        self.assertEqual((await self.fetch("/auth/session"))["status"], 200)
        # The app's logout button: a same-origin form POST.
        await self.browser.js(
            "const form = document.createElement('form');"
            "form.method = 'POST'; form.action = '/auth/logout';"
            "document.body.appendChild(form); form.submit();"
        )
        # The provider has an end-session endpoint: the logout goes on there (issue 36).
        await self.browser.until(
            "return document.querySelector('button[name=logout]') !== null",
            "no sign-out confirmation at the provider",
        )
        await self.browser.submit("button[name=logout]")
        await self.browser.until(
            "return location.pathname === '/' && document.readyState === 'complete'",
            "the logout did not land on the post-logout page",
        )
        self.assertEqual((await self.fetch("/auth/session"))["status"], 401)
        # The app's own requests are anonymous again.
        self.assertEqual((await self.fetch("/app/data.json"))["status"], 401)

    async def test_cross_origin_form_post_is_refused(self) -> None:
        await self.logged_in_at("/app/home")
        attacker = listen_local(Site(AttackerPage(self.origin + "/app/transfer")))
        self.addCleanup(attacker.stopListening)
        await self.browser.go(f"http://127.0.0.1:{port_of(attacker)}/evil")
        await self.browser.until(
            "return location.href === arguments[0] && document.readyState === 'complete'",
            "the form was not posted to the gateway",
            15.0,
            self.origin + "/app/transfer",
        )
        self.assertIn("cross-origin request", (await self.browser.text()).lower())
        self.assertEqual(self.backend.seen(b"POST", b"/app/transfer"), [])
        # The same post from the app's own page goes through.
        done = await self.fetch("/app/transfer", "POST")
        self.assertEqual(done["status"], 200, done)
        self.assertEqual(len(self.backend.seen(b"POST", b"/app/transfer")), 1)

    async def test_two_tabs_logging_in_at_once_land_where_they_started(self) -> None:
        await self.browser.go(self.origin + "/app/one")
        first = await self.browser.handle()
        await self.browser.until(
            "return document.querySelector('input[name=login]') !== null", "tab 1: no login"
        )
        second = await self.browser.new_tab(self.origin + "/app/two?x=2")
        await self.browser.until(
            "return document.querySelector('input[name=login]') !== null", "tab 2: no login"
        )
        # Both logins are under way; tab 1 finishes first, then tab 2.
        await self.browser.switch(first)
        await self.log_in("alice")
        await self.browser.until(
            "return location.href === arguments[0]",
            "tab 1 not back",
            15.0,
            self.origin + "/app/one",
        )
        await self.browser.switch(second)
        await self.log_in("alice")
        await self.browser.until(
            "return location.href === arguments[0]",
            "tab 2 not back",
            15.0,
            self.origin + "/app/two?x=2",
        )
        self.assertEqual(
            await self.browser.js("return document.getElementById('user').textContent"), "alice"
        )
