"""
Headless Chromium loading `make run`'s app (examples/spa, served by the example
configuration etc/edgegw) through a real gateway process: its script
(C{/assets/app.js}) arrives compressed on the fly, Chromium decodes it, and the app still
works (issue 34, point 6). Over plain HTTP on the example as it is, over HTTPS with
HTTP/2 (the example with a C{tls} block added), and with a precompressed C{app.js.br}
beside the script (the example's static routes serve sidecars). The app is served from
a copy of examples/spa, so that sidecars a local build left there change nothing.

What Chromium offers in C{Accept-Encoding} is read by a small recording server in the
test process that the browser visits first (same host, same scheme: the gateway's
upstream calls replace the header, so no backend behind it could show it); the coding
it got is read from the script's resource-timing entry (C{contentEncoding}, where
Chromium has it) and from the headers of the page's own C{fetch()} of the script.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import brotli  # type: ignore[import-untyped]
from twisted.internet import reactor as _reactor
from twisted.internet.ssl import DefaultOpenSSLContextFactory
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from tests.e2e.browser import Chromium, start_chromium
from tests.support.certificates import CertificateAuthority
from tests.support.daemons import DAEMON_ENV, spawn_twistd
from tests.support.processes import REPO_ROOT, kill, listen_local, port_of

reactor: Any = _reactor

EXAMPLE = REPO_ROOT / "etc" / "edgegw"
SPA = REPO_ROOT / "examples" / "spa"
SCRIPT = (SPA / "assets" / "app.js").read_bytes()

GATEWAY_PREFERENCE = ("zstd", "br", "gzip")
"""The example's C{compression.encodings} (the default): the gateway's order."""

MIN_SIZE = 1024
"""The example's C{compression.minSize} (the default): a smaller script goes as it is."""


class AcceptEncodingRecorder(Resource):
    """
    A page that records the C{Accept-Encoding} of every request for it.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[str] = []

    def render_GET(self, request: Request) -> bytes:
        self.offered.append((request.getHeader(b"accept-encoding") or b"").decode())
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        return b"<!doctype html><title>recorder</title><p>recorded</p>"


def expected_coding(offered: str) -> str:
    """
    The coding the gateway should pick for C{offered} (Chromium lists plain tokens, no
    q-values): the first of the gateway's preference the browser names.
    """
    tokens = {token.strip().lower() for token in offered.split(",")}
    return next(name for name in GATEWAY_PREFERENCE if name in tokens)


def https_example(directory: str, cert: str, key: str) -> str:
    """
    A copy of the example configuration in C{directory}, its listener serving TLS.
    """
    copy = shutil.copytree(EXAMPLE, os.path.join(directory, "edgegw"))
    path = os.path.join(copy, "00-gateway.yaml")
    with open(path) as stream:
        text = stream.read()
    listen = "  listen: ${EDGEGW_LISTEN:-127.0.0.1:8080}\n"
    assert listen in text, "the example's listen line has changed"
    tls = f'  tls:\n    certificates: [{{certFile: "{cert}", keyFile: "{key}"}}]\n'
    with open(path, "w") as stream:
        stream.write(text.replace(listen, listen + tls))
    return str(copy)


class CompressedExampleApp(TestCase):
    """
    The example's gateway process and a Chromium per test.
    """

    async def start_example(self, config: str, spa: str) -> int:
        """
        Run the gateway on C{config} (the example or a copy of it) as `make run` does,
        on a port of its own, serving the app from C{spa}; return the port. Its demo
        backend, provider and Redis are not started: the app's routes do not need them.
        """
        env = {
            **DAEMON_ENV,
            "EDGEGW_LISTEN": "127.0.0.1:0",
            "EDGEGW_SPA_DIR": spa,
        }
        log = os.path.abspath(self.mktemp()) + "-gateway.log"
        protocol, process = spawn_twistd(config, env=env, log_path=log)
        self.addCleanup(lambda: protocol.ended)
        self.addCleanup(kill, process)
        port: int = await protocol.listening
        return port

    def spa_copy(self) -> str:
        """
        A copy of examples/spa without any sidecar file a local build may have left
        there (the tests decide which sidecars exist).
        """
        copy = os.path.join(os.path.abspath(self.mktemp()), "spa")
        shutil.copytree(SPA, copy, ignore=shutil.ignore_patterns("*.br", "*.zst", "*.gz"))
        return copy

    def assert_coding(self, measured: dict[str, Any], coding: str, offered: str) -> None:
        """
        The script came in C{coding}: as the page's fetch saw it, and as its
        resource-timing entry says where Chromium has C{contentEncoding}.
        """
        self.assertEqual(measured["fetched"]["coding"], coding, (offered, measured))
        if measured["timing"]["coding"] is not None:
            self.assertEqual(measured["timing"]["coding"], coding, (offered, measured))

    async def offered_encodings(self, browser: Chromium, url: str, recorder: Any) -> str:
        """
        Visit the recording page at C{url}; the C{Accept-Encoding} Chromium sent.
        """
        await browser.go(url)
        self.assertTrue(recorder.offered, "the recorder saw no request")
        offered: str = recorder.offered[-1]
        return offered

    async def check_app(self, browser: Chromium, origin: str) -> dict[str, Any]:
        """
        Load the app at a client-side route, check that it runs, and that its script
        came compressed and decoded to the file's bytes; return what was measured.
        """
        await browser.go(origin + "/users/42")
        heading = await browser.until(
            "const h = document.querySelector('#view h2'); return h && h.textContent",
            "the app did not render its route",
        )
        self.assertEqual(heading, "User 42")
        # The app's own fetch of /healthz (JSON, compressed or not) reaches it.
        health = await browser.until(
            "const s = document.getElementById('health').textContent;return s !== 'checking…' && s",
            "the app's health check did not finish",
        )
        self.assertEqual(health, "ok")
        # A client-side navigation, handled by the script.
        await browser.click("a[href='/about']")
        about = await browser.until(
            "return location.pathname === '/about' &&"
            " document.querySelector('#view h2').textContent",
            "the app's link did not navigate",
        )
        self.assertEqual(about, "About")

        timing: dict[str, Any] = await browser.js(
            "const [e] = performance.getEntriesByName(location.origin + '/assets/app.js');"
            "return e && {encoded: e.encodedBodySize, decoded: e.decodedBodySize,"
            "  transfer: e.transferSize, protocol: e.nextHopProtocol,"
            "  coding: e.contentEncoding === undefined ? null : e.contentEncoding};"
        )
        self.assertIsNotNone(timing, "no resource-timing entry for the script")
        # From the network (a fresh profile), decoded to the file's length, and fewer
        # bytes on the wire than that.
        self.assertGreater(timing["transfer"], 0, timing)
        self.assertEqual(timing["decoded"], len(SCRIPT), timing)
        self.assertLess(timing["encoded"], timing["decoded"], timing)
        self.assertGreater(timing["encoded"], 0, timing)

        # The page's own fetch of the script (past the cache): its coding and its text.
        fetched: dict[str, Any] = await browser.js_async(
            "const done = arguments[arguments.length - 1];"
            "fetch('/assets/app.js', {cache: 'no-store'})"
            "  .then(r => r.text().then(t => done({status: r.status, text: t,"
            "    coding: r.headers.get('content-encoding'), vary: r.headers.get('vary'),"
            "    type: r.headers.get('content-type')})))"
            "  .catch(e => done({status: -1, text: String(e)}));"
        )
        self.assertEqual(fetched["status"], 200, fetched)
        self.assertEqual(fetched["text"].encode(), SCRIPT)
        self.assertIn("accept-encoding", (fetched["vary"] or "").lower())
        self.assertTrue(fetched["type"].startswith(("text/javascript", "application/javascript")))
        return {"timing": timing, "fetched": fetched}

    def test_script_is_over_min_size(self) -> None:
        # Else the gateway rightly sends it as it is, and the walks below fail.
        self.assertGreater(len(SCRIPT), MIN_SIZE)

    async def test_script_compressed_over_http(self) -> None:
        recorder = AcceptEncodingRecorder()
        listening = listen_local(Site(recorder))
        self.addCleanup(listening.stopListening)
        port = await self.start_example(str(EXAMPLE), self.spa_copy())
        browser = await start_chromium(self)

        offered = await self.offered_encodings(
            browser, f"http://127.0.0.1:{port_of(listening)}/record", recorder
        )
        measured = await self.check_app(browser, f"http://127.0.0.1:{port}")
        self.assert_coding(measured, expected_coding(offered), offered)

    async def test_script_compressed_over_https_h2(self) -> None:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key, cert, _ = CertificateAuthority().issue(directory, ["localhost"])
        recorder = AcceptEncodingRecorder()
        listening = reactor.listenSSL(
            0, Site(recorder), DefaultOpenSSLContextFactory(key, cert), interface="127.0.0.1"
        )
        self.addCleanup(listening.stopListening)
        config = https_example(directory, cert, key)
        port = await self.start_example(config, self.spa_copy())
        browser = await start_chromium(self, ("--ignore-certificate-errors",))

        offered = await self.offered_encodings(
            browser, f"https://127.0.0.1:{port_of(listening)}/record", recorder
        )
        measured = await self.check_app(browser, f"https://127.0.0.1:{port}")
        self.assertEqual(measured["timing"]["protocol"], "h2", measured)
        self.assert_coding(measured, expected_coding(offered), offered)

    async def test_precompressed_script_from_the_example_static_route(self) -> None:
        # The build's app.js.br beside app.js (newer than it): served as it is, where
        # on the fly the gateway would have chosen zstd.
        spa = self.spa_copy()
        sidecar = brotli.compress(SCRIPT, quality=11)
        with open(os.path.join(spa, "assets", "app.js.br"), "wb") as stream:
            stream.write(sidecar)
        recorder = AcceptEncodingRecorder()
        listening = listen_local(Site(recorder))
        self.addCleanup(listening.stopListening)
        port = await self.start_example(str(EXAMPLE), spa)
        browser = await start_chromium(self)

        offered = await self.offered_encodings(
            browser, f"http://127.0.0.1:{port_of(listening)}/record", recorder
        )
        self.assertIn("br", {token.strip() for token in offered.split(",")}, offered)
        measured = await self.check_app(browser, f"http://127.0.0.1:{port}")
        self.assert_coding(measured, "br", offered)
        self.assertEqual(measured["timing"]["encoded"], len(sidecar), measured)
