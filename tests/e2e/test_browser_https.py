"""
The browser walk over HTTPS: the SPA, login, a fetch, server-sent events and a WebSocket
through one gateway process serving Gateway.spec.tls, with Chromium on HTTP/2 (its
navigation and fetches report C{nextHopProtocol} C{h2}); the WebSocket on HTTP/1.1.
"""

from __future__ import annotations

import os

from twisted.internet.protocol import Factory
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from tests.e2e.browser import log_in_at_provider, start_chromium
from tests.e2e.provider import start_provider
from tests.e2e.test_browser import SPA_INDEX, AppBackend, gateway_config
from tests.support.certificates import CertificateAuthority
from tests.support.daemons import GatewayProcess, sleep
from tests.support.processes import free_port, listen_local, port_of
from tests.support.tls_client import client_context, get_request, handshake_now
from tests.test_proxy import EchoWebSocket


def https_config(plain: str, port: int, cert: str, key: str) -> str:
    """
    C{plain} (test_browser's configuration) served over TLS on C{port}, with the
    provider calling back over https.
    """
    return plain.replace(
        f'  listen: "127.0.0.1:{port}"\n',
        f'  listen: "127.0.0.1:{port}"\n'
        f'  tls:\n    certificates: [{{certFile: "{cert}", keyFile: "{key}"}}]\n',
    ).replace(f"http://127.0.0.1:{port}/auth/callback", f"https://127.0.0.1:{port}/auth/callback")


class BrowserWalkOverHTTPS(TestCase):
    """
    One gateway process over HTTPS, a provider, backends and Chromium.
    """

    async def test_spa_login_events_and_websocket_over_h2(self) -> None:
        port = free_port()
        origin = f"https://127.0.0.1:{port}"
        provider = await start_provider(self, [origin + "/auth/callback"])
        backend = AppBackend()
        listening = listen_local(Site(backend))
        self.addCleanup(listening.stopListening)
        echo = listen_local(Factory.forProtocol(EchoWebSocket))
        self.addCleanup(echo.stopListening)
        directory = os.path.abspath(self.mktemp())
        spa = os.path.join(directory, "spa")
        os.makedirs(spa)
        with open(os.path.join(spa, "index.html"), "w") as f:
            f.write(SPA_INDEX)
        ca = CertificateAuthority()
        key, cert, _ = ca.issue(directory, ["localhost"])
        plain = gateway_config(port, provider, port_of(listening), port_of(echo), spa)
        gateway = GatewayProcess(self, {"gateway.yaml": https_config(plain, port, cert, key)})
        await gateway.start()
        context = client_context(ca.root_pem, alpn=["http/1.1"])
        context.check_hostname = False
        for _ in range(200):
            reply = await deferToThread(
                handshake_now, port, None, context, request=get_request("/auth/login")
            )
            if not reply.response.startswith(b"HTTP/1.1 503 "):
                break
            await sleep(0.05)
        browser = await start_chromium(self, ("--ignore-certificate-errors",))

        # The SPA, on HTTP/2.
        await browser.go(origin + "/users/42")
        route = await browser.until(
            "return document.getElementById('route').textContent", "the app did not start"
        )
        self.assertEqual(route, "route:/users/42")
        protocol = await browser.js(
            "return performance.getEntriesByType('navigation')[0].nextHopProtocol"
        )
        self.assertEqual(protocol, "h2")

        # Login through the provider, back on the app.
        await browser.go(origin + "/app/live")
        await log_in_at_provider(browser, provider.issuer, "alice")
        await browser.until(
            "return location.href === arguments[0] && document.readyState === 'complete'",
            "not back on /app/live after the login",
            15.0,
            origin + "/app/live",
        )
        self.assertEqual(
            await browser.js("return document.getElementById('user').textContent"), "alice"
        )
        fetched = await browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "fetch('/app/data.json', {credentials: 'same-origin'}).then(r => r.text())"
            ".then(() => done(performance.getEntriesByName(location.origin +"
            " '/app/data.json')[0].nextHopProtocol))"
            ".catch(e => done(String(e)));"
        )
        self.assertEqual(fetched, "h2")

        # Server-sent events, each delivered as the backend sends it.
        await browser.js(
            "window.events = [];"
            "window.source = new EventSource('/events/feed');"
            "source.onmessage = e => window.events.push(e.data);"
        )
        await browser.until(
            "return window.events.length === 1 && window.events[0] === 'first'",
            "the first event did not arrive",
        )
        for n in range(2):
            backend.push(f"tick {n}")
            await browser.until(
                "return window.events.length === arguments[0] + 2",
                f"event {n} was not delivered as it was sent",
                10.0,
                n,
            )
        await browser.js("window.source.close()")

        # A WebSocket: over its own HTTP/1.1 connection.
        echoed = await browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "const ws = new WebSocket('wss://' + location.host + '/ws/echo');"
            "const got = [];"
            "ws.onopen = () => { ws.send('hello'); };"
            "ws.onmessage = e => { got.push(e.data); ws.close(); done(got); };"
            "ws.onerror = () => done('error');"
        )
        self.assertEqual(echoed, ["hello"])
        [headers] = backend.seen(b"GET", b"/app/live")
        self.assertEqual(headers[b"x-user-id"], b"alice")
