"""
The metrics of a real gateway process (C{twistd -n edgegw}), scraped over HTTP from its
scrape listener as Prometheus would after traffic (issue 18): the server series with
their counts, the scrape listener apart from the public one, and reloads.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from typing import Any

import attrs
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.metrics.instruments import Registry
from edgegw.metrics.serve import scrape_root
from edgegw.server import scrape_site
from edgegw.server.scrape_site import SCRAPE_LIMITS
from tests.support.backends import SiteBackend, answer
from tests.support.daemons import GatewayProcess, http_exchange, sleep
from tests.support.processes import free_port, listen_local, raw_exchange

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def parse(text: str) -> dict[str, float]:
    """
    The samples of a Prometheus text exposition: C{name{labels}} (as written) -> value.
    """
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        assert found is not None, line
        key = found.group(1) + (found.group(2) or "")
        assert key not in samples, f"{key} twice"
        samples[key] = float(found.group(3))
    return samples


def config(
    backend_port: int,
    scrape_port: int,
    extra_route: str = "",
    path: str = "/metrics",
    service: str = "edge-test",
) -> dict[str, str]:
    text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
---
kind: Telemetry
metadata: {{name: t}}
spec:
  service: {{name: {service}}}
  metrics:
    prometheus: {{listen: "127.0.0.1:{scrape_port}", path: "{path}"}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: "GET /api/{{id}}"
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend_port}"}}
---
kind: Route
metadata: {{name: health}}
spec:
  match: /healthz
  handler: {{type: health}}
{extra_route}"""
    return {"gateway.yaml": text}


DURATION = "http_server_request_duration_seconds"
ACTIVE = 'http_server_active_requests{http_request_method="GET"}'
API_OK = '{http_route="GET /api/{id}",http_request_method="GET",http_response_status_class="2xx"}'


class ScrapeTests(TestCase):
    async def start(self) -> tuple[GatewayProcess, int, SiteBackend]:
        quick = answer(body=b'{"ok":true}')

        def responder(request: Request) -> bytes | int:
            if request.path != b"/api/slow":
                return quick(request)

            def late() -> None:
                request.write(b'{"ok":true}')
                request.finish()

            reactor.callLater(1.0, late)
            return NOT_DONE_YET

        backend = SiteBackend(responder).start()
        self.addCleanup(backend.stop)
        scrape = free_port()
        gateway = GatewayProcess(self, config(backend.port, scrape))
        await gateway.start()
        return gateway, scrape, backend

    async def scrape(self, port: int, path: str = "/metrics") -> tuple[int, dict[str, float]]:
        reply = await http_exchange(port, "GET", path)
        if reply.status != 200:
            return reply.status, {}
        content_type = reply.header(b"Content-Type")
        self.assertEqual(content_type, b"text/plain; version=0.0.4; charset=utf-8")
        return reply.status, parse(reply.body.decode())

    async def until_scraped(self, port: int, path: str = "/metrics") -> dict[str, float]:
        for _ in range(100):
            try:
                status, samples = await self.scrape(port, path)
            except ConnectionError:
                status, samples = 0, {}
            if status == 200:
                return samples
            await sleep(0.05)
        self.fail(f"no scrape answered on port {port}")

    async def test_series_after_traffic(self) -> None:
        gateway, scrape, _ = await self.start()
        for path in ("/api/1", "/api/1", "/api/2", "/api/3?secret=x", "/api/4"):
            reply = await http_exchange(gateway.port, "GET", path)
            self.assertEqual(reply.status, 200)
        self.assertEqual((await http_exchange(gateway.port, "POST", "/api/1")).status, 405)
        self.assertEqual((await http_exchange(gateway.port, "GET", "/nowhere")).status, 404)
        self.assertEqual((await http_exchange(gateway.port, "GET", "/healthz")).status, 200)

        samples = await self.until_scraped(scrape)
        [info] = [key for key in samples if key.startswith("target_info{")]
        self.assertIn('service_name="edge-test"', info)
        self.assertIn('telemetry_sdk_language="python"', info)
        self.assertEqual(samples[info], 1)
        self.assertEqual(samples[f"{DURATION}_count{API_OK}"], 5)
        self.assertEqual(samples[DURATION + "_bucket" + API_OK[:-1] + ',le="+Inf"}'], 5)
        self.assertGreater(samples[f"{DURATION}_sum{API_OK}"], 0)
        self.assertEqual(
            samples[
                f'{DURATION}_count{{http_route="/healthz",http_request_method="GET",'
                'http_response_status_class="2xx"}'
            ],
            1,
        )
        # The mux's own answers: no route.
        unmatched = {
            key: value
            for key, value in samples.items()
            if key.startswith(f"{DURATION}_count") and 'http_route=""' in key
        }
        self.assertEqual(sum(unmatched.values()), 2)
        self.assertIn('http_response_status_class="4xx"', "".join(unmatched))
        self.assertEqual(
            samples[f"http_server_response_body_size_bytes_sum{API_OK}"], 5 * len(b'{"ok":true}')
        )
        self.assertEqual(samples['http_server_active_requests{http_request_method="GET"}'], 0)
        # Never a raw path or a query string.
        listed = "".join(samples)
        self.assertNotIn("/api/1", listed)
        self.assertNotIn("secret", listed)

        # Only the scrape path, only on the scrape listener.
        self.assertEqual((await self.scrape(scrape, "/other"))[0], 404)
        self.assertEqual((await http_exchange(gateway.port, "GET", "/metrics")).status, 404)

    async def test_reload_counts_on_and_a_moved_listener_is_refused(self) -> None:
        """
        A reload keeps the series (a request in flight across it is counted) and takes
        a new scrape path and service name; a moved scrape listener is refused.
        """
        gateway, scrape, backend = await self.start()
        await http_exchange(gateway.port, "GET", "/api/1")
        samples = await self.until_scraped(scrape)
        self.assertEqual(samples[f"{DURATION}_count{API_OK}"], 1)

        path = os.path.join(gateway.directory, "gateway.yaml")
        moved = config(backend.port, free_port())["gateway.yaml"]
        with open(path, "w") as f:
            f.write(moved)
        os.kill(gateway.pid, signal.SIGHUP)
        await self.until_output(gateway, "reload refused")
        self.assertIn("spec.metrics.prometheus.listen: changed from", gateway.output)
        samples = await self.until_scraped(scrape)
        self.assertEqual(samples[f"{DURATION}_count{API_OK}"], 1)  # the old one serves on

        slow = ensureDeferred(http_exchange(gateway.port, "GET", "/api/slow"))
        for _ in range(100):
            if len(backend.requests) == 2:
                break
            await sleep(0.02)
        samples = await self.until_scraped(scrape)
        self.assertEqual(samples[ACTIVE], 1)
        extra = (
            "---\nkind: Route\nmetadata: {name: more}\nspec:\n  match: /more\n"
            "  handler: {type: health}\n"
        )
        with open(path, "w") as f:
            f.write(config(backend.port, scrape, extra, "/m2", "renamed")["gateway.yaml"])
        os.kill(gateway.pid, signal.SIGHUP)
        await self.until_output(gateway, "configuration reloaded")
        self.assertEqual((await slow).status, 200)
        await http_exchange(gateway.port, "GET", "/more")
        samples = await self.until_scraped(scrape, "/m2")
        # Counted on: the request before, and the one in flight across the reload.
        self.assertEqual(samples[f"{DURATION}_count{API_OK}"], 2)
        self.assertEqual(samples[ACTIVE], 0)
        more = (
            f'{DURATION}_count{{http_route="/more",http_request_method="GET",'
            'http_response_status_class="2xx"}'
        )
        self.assertEqual(samples[more], 1)
        [info] = [key for key in samples if key.startswith("target_info{")]
        self.assertIn('service_name="renamed"', info)
        self.assertEqual((await self.scrape(scrape))[0], 404)

    async def test_scrape_listener_is_capped_and_quiet(self) -> None:
        """
        Connections that never finish a request cannot pile up on the scrape port (32
        at most), and scrapes write no line to the daemon's log.
        """
        gateway, scrape, _ = await self.start()
        held = []
        for _ in range(40):
            client = socket.create_connection(("127.0.0.1", scrape))
            client.sendall(b"GET /metr")
            held.append(client)
        for client in held:
            self.addCleanup(client.close)
        await sleep(0.3)
        closed = 0
        for client in held:
            client.setblocking(False)
            try:
                closed += client.recv(1) == b""
            except BlockingIOError:
                pass  # still open
            except ConnectionResetError:
                closed += 1
        self.assertEqual(closed, 8)
        for client in held:
            client.close()
        for _ in range(3):
            await self.until_scraped(scrape)
        self.assertNotIn("GET /metrics", gateway.output)

    async def until_output(self, gateway: GatewayProcess, text: str) -> Any:
        for _ in range(200):
            if text in gateway.output:
                return
            await sleep(0.05)
        self.fail(f"{text!r} never logged:\n{gateway.output}")


def _slow_read(port: int, pause: float) -> tuple[int, int]:
    """
    GET /metrics on C{port} through a small receive window, C{READ} bytes every
    C{pause} seconds until the end: (the declared length, the body bytes received).
    """
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    with client:
        client.settimeout(10)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while True:
            try:
                data = client.recv(READ)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
            time.sleep(pause)
    head, _, body = received.partition(b"\r\n\r\n")
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    return (int(found.group(1)) if found else -1), len(body)


READ = 65536
PADDING = "x" * 60


class SlowScraperTests(TestCase):
    def serve(self, series: int, send_timeout: float) -> int:
        """
        A scrape site on a free port for a registry of C{series} series of about 100
        bytes each, with this send timeout; its port.
        """
        registry = Registry()
        for n in range(series // 2000):
            counter = registry.counter(f"c{n}", "{x}", "d", ("label",))
            for value in range(2000):
                counter.add(1, (f"value-{value:08d}-{PADDING}",))
        limits = attrs.evolve(SCRAPE_LIMITS, send_timeout=send_timeout)
        self.patch(scrape_site, "SCRAPE_LIMITS", limits)
        site = scrape_site.ScrapeSite(scrape_root(registry, "/metrics", {}), reactor)
        port = listen_local(site)
        self.addCleanup(port.stopListening)
        # Accepted sockets inherit the listener's send buffer: the page cannot hide in
        # the kernel, so it reaches the client at the pace the client reads.
        port.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        return int(port.getHost().port)

    async def test_a_slow_but_steady_scraper_gets_a_big_page(self) -> None:
        """
        The scrape site's send timeout cuts a scraper that reads nothing, not one that
        reads a page bigger than the buffers slowly: every chunk it reads counts.
        """
        port = self.serve(40_000, send_timeout=1.0)
        # Read in about 2.5 s at 64 KiB per 50 ms: more than the send timeout in all.
        declared, received = await deferToThread(_slow_read, port, 0.05)
        self.assertGreater(declared, 3_000_000)
        self.assertEqual(received, declared)

    async def test_head_answers_the_length_quietly(self) -> None:
        """
        HEAD answers the page's length without its bytes, and Twisted logs nothing about
        a HEAD that returned a body.
        """
        port = self.serve(2000, send_timeout=30.0)
        logged: list[str] = []
        observer: Any = lambda event: logged.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        head = await raw_exchange(
            port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        top, _, body = head.partition(b"\r\n\r\n")
        got = await http_exchange(port, "GET", "/metrics")
        self.assertIn(b"\r\nContent-Length: %d\r\n" % len(got.body), top + b"\r\n")
        self.assertEqual(body, b"")
        self.assertEqual([line for line in logged if "HEAD" in line], [])

    async def test_a_scraper_that_reads_nothing_is_cut(self) -> None:
        port = self.serve(2000, send_timeout=0.3)
        # Reads once, then nothing for far longer than the send timeout.
        declared, received = await deferToThread(_slow_read, port, 1.0)
        self.assertGreater(declared, 100_000)
        self.assertLess(received, declared)
