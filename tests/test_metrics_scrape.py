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
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from tests.support.backends import SiteBackend, answer
from tests.support.daemons import GatewayProcess, http_exchange, sleep
from tests.support.redis import free_port

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
