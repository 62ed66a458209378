"""
C{python -m bench pageload}: how long a real single-page app (L{bench.spa}) takes to
load in headless Chromium over HTTPS through an emulated link (L{bench.link}: 100 ms
round trip, 10 Mbit/s down shared by all the page's connections), served by edgegw,
nginx and Caddy.

Every server serves the same files with a single-page app's fallback, over TLS with the
same certificate, one serving process each (edgegw one process, nginx
C{worker_processes 1}, Caddy C{GOMAXPROCS=1}), behind a relay of its own. Every round
loads the app once from each server in turn, each time in a new Chromium (a fresh
profile: no cache, no connection, no TLS session kept; the cache is also disabled
through the DevTools protocol). The browser reaches the relay as C{app.test} (the
certificate's name, mapped with C{--host-resolver-rules}) and trusts the certificate by
its key (C{--ignore-certificate-errors-spki-list}).

Measured from the navigation's start: the load event (C{loadEventStart}), the app's
first render (the first element in its mount point, seen by a C{MutationObserver}), the
first contentful paint; and what the Performance API says of the protocol
(C{nextHopProtocol}), the resources and their bytes, and how many connections the relay
saw; from Chromium's DevTools events, which C{Content-Encoding} each response came in.
Medians over rounds; C{vs caddy-gzip} and C{vs nginx-gzip} are medians of same-round
ratios of load times. The target (issue 34): edgegw, compressing by default over HTTP/2,
loads the app in at most the compressing Caddy's and nginx's time, in the same run.
"""

from __future__ import annotations

import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, report, spa, tls_servers
from bench.processes import Process, StartupError, scratch, started, warn_if_busy
from bench.rounds import say
from bench.targets import Target
from bench.tools import MissingToolsError, ensure, version
from edgegw.compression.codings import BROTLI_QUALITY, GZIP_LEVEL, ZSTD_LEVEL
from tests.support.processes import free_port

HOSTNAME = "app.test"
"""The name the browser uses for every server (the certificate's)."""

SERVERS = {
    "edgegw": (
        "edgegw",
        "static route, Gateway.spec.tls (ALPN h2, http/1.1), compression at its defaults",
        True,
    ),
    "edgegw-nocache": (
        "edgegw",
        "the same with compression.staticCacheSize: 0 (each file compressed per request)",
        True,
    ),
    "edgegw-br": ("edgegw", "the same with compression.encodings: [br, gzip]", True),
    "edgegw-plain": ("edgegw", "the same with compression.enabled: false", False),
    "edgegw-ssl": (
        "edgegw",
        "static route, listen as an ssl: endpoint string, compression at its defaults",
        True,
    ),
    "nginx": ("nginx", "listen ssl http2", False),
    "nginx-gzip": ("nginx", "listen ssl http2, gzip on", True),
    "nginx-h1": ("nginx", "listen ssl (no http2)", False),
    "nginx-h1-gzip": ("nginx", "listen ssl (no http2), gzip on", True),
    "caddy": ("caddy", "file_server, protocols h1 h2", False),
    "caddy-gzip": ("caddy", "file_server, encode zstd gzip", True),
}
"""Every server C{--servers} can name: (program, configuration, compresses), in round
order."""

TARGET_SERVER = "edgegw"
"""The server the issue's target is about: edgegw as configured by default (h2,
compressing)."""
COMPARED = ("caddy-gzip", "nginx-gzip")
"""The servers its load time must be at most (issue 34): the compressing Caddy and nginx."""

# Run in every document before its own scripts: it records, once, what the page load
# measured into sessionStorage (which survives the app's own navigations, if any).
_RECORDER = """
(() => {
  if (location.hostname !== %(host)s) return;
  performance.setResourceTimingBufferSize(5000);
  let mounted = null;
  const watch = () => {
    const mount = document.querySelector(%(mount)s);
    if (mount && mount.firstElementChild && mounted === null) mounted = performance.now();
    return mounted !== null;
  };
  const observer = new MutationObserver(() => { if (watch()) observer.disconnect(); });
  observer.observe(document, {childList: true, subtree: true});
  addEventListener('load', () => setTimeout(() => {
    try {
      if (sessionStorage.getItem('__bench')) return;
      const nav = performance.getEntriesByType('navigation')[0];
      const resources = performance.getEntriesByType('resource');
      const protocols = {};
      let transfer = nav.transferSize, encoded = nav.encodedBodySize,
          decoded = nav.decodedBodySize;
      for (const e of resources) {
        protocols[e.nextHopProtocol || '?'] = (protocols[e.nextHopProtocol || '?'] || 0) + 1;
        transfer += e.transferSize; encoded += e.encodedBodySize; decoded += e.decodedBodySize;
      }
      const paint = () => performance.getEntriesByName('first-contentful-paint')[0];
      const record = (app, fcp) => sessionStorage.setItem('__bench', JSON.stringify({
        load: nav.loadEventStart, dcl: nav.domContentLoadedEventEnd, ttfb: nav.responseStart,
        protocol: nav.nextHopProtocol, resources: resources.length, protocols,
        transfer, encoded, decoded, fcp: fcp ? fcp.startTime : null, app,
        failed: resources.filter(e => e.responseStatus >= 400).length,
      }));
      // The first render and paint may come after the load event: wait for them a while.
      const started = performance.now();
      const wait = () => {
        const done = watch() && paint();
        if (done || performance.now() - started > 30000) record(mounted, paint());
        else setTimeout(wait, 50);
      };
      wait();
    } catch (e) {
      sessionStorage.setItem('__bench', JSON.stringify({error: String(e)}));
    }
  }, 0));
})();
"""


@attrs.frozen
class Settings:
    """
    The options of one run.

    @ivar rounds: Loads per server (interleaved).
    @ivar delay_ms: The link's delay each way (half the round trip).
    @ivar down_mbit: The link's rate from server to browser, shared by all connections.
    @ivar up_mbit: Its rate from browser to server.
    @ivar servers: Which servers (keys of L{SERVERS}), in round order.
    @ivar timeout: Seconds a load may take before it counts as failed.
    @ivar keep_tmp: Keep the temporary directory (configurations, logs).
    @ivar screenshots: A directory to save each load's page in, as a PNG taken once the
        figures are recorded (L{None}: none).
    """

    rounds: int = 3
    delay_ms: float = 50.0
    down_mbit: float = 10.0
    up_mbit: float = 10.0
    servers: tuple[str, ...] = tuple(SERVERS)
    timeout: int = 180
    keep_tmp: bool = False
    screenshots: str | None = None


@attrs.define
class Server:
    """
    One server of the app behind its relay.

    @ivar key: Its name (a key of L{SERVERS}).
    @ivar target: Its port and processes.
    @ivar relay_port: Where its relay listens (the browser's port).
    @ivar relay: The relay's process.
    @ivar alpn: What it picks when offered h2 and http/1.1.
    @ivar samples: Each load's figures, by round.
    """

    key: str
    target: Target
    relay_port: int = 0
    relay: Process | None = None
    alpn: str = ""
    samples: list[dict[str, Any]] = attrs.Factory(list)

    @property
    def compresses(self) -> bool:
        return SERVERS[self.key][2]

    def url(self) -> str:
        return f"https://{HOSTNAME}:{self.relay_port}/"


def start_servers(
    stack: ExitStack,
    tmp: Path,
    tools: dict[str, str],
    root: Path,
    cert: tls_servers.Certificate,
    settings: Settings,
) -> list[Server]:
    """
    Start every selected server and its relay; a server that cannot run is returned
    with C{target.unavailable} set.
    """
    route = gateway.RouteConfig(
        "app", "/", {"type": "static", "dir": str(root), "spaFallback": True}
    )

    def edgegw(fields: dict[str, Any]) -> Callable[[Target], None]:
        def start(target: Target) -> None:
            tls_servers.edgegw(stack, tmp, target.key, target, route, fields)

        return start

    def nginx(http2: bool, gzip: bool) -> Callable[[Target], None]:
        def start(target: Target) -> None:
            process = tls_servers.nginx_static(
                stack, tools["nginx"], tmp / target.key, cert, target.port, root, http2, gzip
            )
            target.process = process
            target.pids = tls_servers.nginx_worker(process)

        return start

    def caddy(encode: bool) -> Callable[[Target], None]:
        def start(target: Target) -> None:
            process = tls_servers.caddy_static(
                stack, tools["caddy"], tmp / target.key, cert, target.port, root, encode
            )
            target.process = process
            target.pids = [process.pid]

        return start

    starters: dict[str, Callable[[Target], None]] = {
        "edgegw": edgegw(tls_servers.edgegw_tls_fields(cert)),
        "edgegw-nocache": edgegw(
            {**tls_servers.edgegw_tls_fields(cert), "compression": {"staticCacheSize": 0}}
        ),
        "edgegw-br": edgegw(
            {**tls_servers.edgegw_tls_fields(cert), "compression": {"encodings": ["br", "gzip"]}}
        ),
        "edgegw-plain": edgegw(
            {**tls_servers.edgegw_tls_fields(cert), "compression": {"enabled": False}}
        ),
        "nginx": nginx(True, False),
        "nginx-gzip": nginx(True, True),
        "nginx-h1": nginx(False, False),
        "nginx-h1-gzip": nginx(False, True),
        "caddy": caddy(False),
        "caddy-gzip": caddy(True),
    }
    servers = []
    for key in settings.servers:
        program, description, _ = SERVERS[key]
        target = Target(key, key, f"{program}: {description}", port=free_port())
        try:
            if key == "edgegw-ssl":
                edgegw({"listen": tls_servers.ssl_endpoint(target.port, cert)})(target)
            else:
                starters[key](target)
        except StartupError as e:
            target.unavailable = f"did not start: {e}"
        server = Server(key, target)
        if target.unavailable is None:
            target.unavailable = tls_servers.expect_https(
                target.port, "/", 200, (root / "index.html").read_bytes()
            ) or tls_servers.expect_https(target.port, "/some/app/route", 200, None)
        if target.unavailable is None:
            server.alpn = tls_servers.negotiated(target.port, HOSTNAME)
            server.relay_port = free_port()
            argv = [
                sys.executable,
                "-m",
                "bench.link",
                "--port",
                str(server.relay_port),
                "--upstream-port",
                str(target.port),
                "--delay-ms",
                f"{settings.delay_ms:g}",
                "--down-mbit",
                f"{settings.down_mbit:g}",
                "--up-mbit",
                f"{settings.up_mbit:g}",
            ]
            relay = Process(f"link {key}", argv, tmp / f"link-{key}.log")
            server.relay = stack.enter_context(started(relay))
            try:
                server.relay.wait_for_port(server.relay_port)
            except StartupError as e:
                target.unavailable = f"its relay did not start: {e}"
        servers.append(server)
    return servers


def _opened(relay: Process) -> int:
    """How many connections the relay has opened so far (its C{open N} lines)."""
    try:
        text = relay.log.read_text()
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if line.startswith("open "))


def _chromium(tools: dict[str, str], cert: tls_servers.Certificate, profile: Path) -> Any:
    """A new headless Chromium through Debian's chromium-driver, with a fresh profile."""
    import os

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = tools["chromium"]
    options.page_load_strategy = "none"
    # The DevTools events of the load, from which the responses' Content-Encoding is read
    # (the Performance API does not say which coding a response came in).
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--password-store=basic",
        f"--user-data-dir={profile}",
        "--window-size=1280,800",
        # Every server is app.test (the certificate's name), reached at its relay's
        # port on loopback; any other name fails at once rather than waiting on DNS.
        f"--host-resolver-rules=MAP {HOSTNAME} 127.0.0.1, MAP * ~NOTFOUND",
        # Trust the certificate made for this run, by its key, as if a CA had signed it.
        f"--ignore-certificate-errors-spki-list={cert.spki}",
    ):
        options.add_argument(argument)
    # Selenium Manager (which downloads drivers) is not run: the driver's path is given.
    os.environ.setdefault("SE_OFFLINE", "true")
    service = Service(executable_path=tools["chromedriver"])
    return webdriver.Chrome(service=service, options=options)


def _responses(entries: Sequence[dict[str, Any]]) -> tuple[dict[str, int], list[str]]:
    """
    From Chromium's DevTools events of one load: how many of the app's responses came in
    each C{Content-Encoding} (C{identity}: none; C{Network.responseReceived}), and the
    app's requests that failed (C{Network.loadingFailed}, other than a cancelled
    C{net::ERR_ABORTED}), each as C{"ERROR URL"}.
    """
    counts: dict[str, int] = {}
    urls: dict[str, str] = {}
    failures: list[str] = []
    for entry in entries:
        try:
            message = json.loads(entry["message"])["message"]
        except (KeyError, TypeError, ValueError):
            continue
        method = message.get("method")
        params = message.get("params", {})
        if method == "Network.requestWillBeSent":
            urls[params.get("requestId", "")] = str(params.get("request", {}).get("url", ""))
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            if not str(response.get("url", "")).startswith(f"https://{HOSTNAME}:"):
                continue
            headers = {str(k).lower(): str(v) for k, v in response.get("headers", {}).items()}
            coding = headers.get("content-encoding", "").strip().lower() or "identity"
            counts[coding] = counts.get(coding, 0) + 1
        elif method == "Network.loadingFailed":
            url = urls.get(params.get("requestId", ""), "")
            error = str(params.get("errorText", ""))
            if url.startswith(f"https://{HOSTNAME}:") and error != "net::ERR_ABORTED":
                failures.append(f"{error} {url}")
    return counts, failures


def load(
    server: Server,
    tools: dict[str, str],
    cert: tls_servers.Certificate,
    timeout: int,
    screenshot: Path | None = None,
) -> dict[str, Any]:
    """
    Load the app from C{server} once in a new Chromium; the figures the page recorded
    (and the page saved as the PNG C{screenshot}, when given).

    @raise RuntimeError: If it did not load within C{timeout} seconds, or loaded
        something else.
    """
    assert server.relay is not None
    profile = Path(tempfile.mkdtemp(prefix="edgegw-bench-chromium-"))
    driver = _chromium(tools, cert, profile)
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
        source = _RECORDER % {
            "host": json.dumps(HOSTNAME),
            "mount": json.dumps(spa.MOUNT),
        }
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})
        before = _opened(server.relay)
        driver.get(server.url())
        deadline = time.monotonic() + timeout
        recorded = None
        while time.monotonic() < deadline:
            time.sleep(0.25)
            try:
                recorded = driver.execute_script(
                    "return location.hostname === arguments[0] ? "
                    "sessionStorage.getItem('__bench') : null",
                    HOSTNAME,
                )
            except Exception:  # the page is between documents
                recorded = None
            if recorded:
                break
        if not recorded:
            raise RuntimeError(f"no load event within {timeout}s at {driver.current_url}")
        figures: dict[str, Any] = json.loads(recorded)
        if "error" in figures:
            raise RuntimeError(f"the page's recorder failed: {figures['error']}")
        figures["connections"] = _opened(server.relay) - before
        figures["encodings"], failures = _responses(driver.get_log("performance"))
        if failures:
            # A load missing some of its files is not a load of the app: its time (short,
            # with the modules that failed and everything they import left out) says
            # nothing about the server's speed.
            raise RuntimeError(
                f"{len(failures)} of the app's requests failed: " + "; ".join(failures[:3])
            )
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
        return figures
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def measure(
    servers: Sequence[Server], tools: dict[str, str], cert: tls_servers.Certificate, s: Settings
) -> None:
    """Every round loads the app once from each server still available."""
    for round_ in range(1, s.rounds + 1):
        for server in servers:
            if server.target.unavailable is not None:
                continue
            try:
                shot = None
                if s.screenshots is not None:
                    shot = Path(s.screenshots) / f"{server.key}-round{round_}.png"
                figures = load(server, tools, cert, s.timeout, shot)
            except Exception as e:
                server.target.unavailable = f"round {round_}: {type(e).__name__}: {e}"
                say(f"round {round_}/{s.rounds} {server.key:<14} failed: {e}")
                continue
            figures["round"] = round_
            server.samples.append(figures)
            app = "-" if figures["app"] is None else f"{figures['app'] / 1000:.2f}s"
            say(
                f"round {round_}/{s.rounds} {server.key:<14} load {figures['load'] / 1000:5.2f}s "
                f"app {app}  {figures['protocol']}  {figures['resources']} resources, "
                f"{figures['transfer'] / 1e6:.2f} MB, {figures['connections']} connections, "
                f"{_encoding_text(figures['encodings'])}"
            )


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@attrs.frozen
class Line:
    """One row of the table: medians over rounds (times in seconds)."""

    key: str
    description: str
    alpn: str
    protocol: str
    load: float | None
    load_min: float | None
    load_max: float | None
    app: float | None
    fcp: float | None
    resources: float | None
    encodings: str
    transfer_mb: float | None
    encoded_mb: float | None
    decoded_mb: float | None
    connections: float | None
    vs: dict[str, float | None]
    unavailable: str | None


def _encoding_text(counts: dict[str, int]) -> str:
    """C{429 zstd}: the responses in each coding, identity left out (C{none})."""
    coded = sorted(((n, name) for name, n in counts.items() if name != "identity"), reverse=True)
    return ", ".join(f"{n} {name}" for n, name in coded) or "none"


def _ratios(samples: Sequence[dict[str, Any]], reference: dict[int, dict[str, Any]]) -> list[float]:
    """Same-round ratios of load times of C{samples} over C{reference}'s (by round)."""
    return [
        s["load"] / reference[s["round"]]["load"]
        for s in samples
        if s["round"] in reference and reference[s["round"]]["load"] > 0
    ]


def summarize(servers: Sequence[Server]) -> list[Line]:
    """
    Medians over rounds; C{vs}: for each of L{COMPARED}, the median of same-round
    ratios of load times.
    """
    references = {
        key: {s["round"]: s for server in servers if server.key == key for s in server.samples}
        for key in COMPARED
    }
    lines = []
    for server in servers:
        samples = server.samples
        loads = [s["load"] / 1000 for s in samples]
        vs = {
            key: None if key == server.key else _median(_ratios(samples, reference))
            for key, reference in references.items()
        }
        protocols = sorted({s["protocol"] for s in samples})
        lines.append(
            Line(
                server.key,
                f"{SERVERS[server.key][0]}: {SERVERS[server.key][1]}",
                server.alpn,
                ",".join(protocols),
                _median(loads),
                min(loads) if loads else None,
                max(loads) if loads else None,
                _median([s["app"] / 1000 for s in samples if s["app"] is not None]),
                _median([s["fcp"] / 1000 for s in samples if s["fcp"] is not None]),
                _median([s["resources"] for s in samples]),
                _encoding_text(samples[-1].get("encodings", {})) if samples else "-",
                _median([s["transfer"] / 1e6 for s in samples]),
                _median([s["encoded"] / 1e6 for s in samples]),
                _median([s["decoded"] / 1e6 for s in samples]),
                _median([s["connections"] for s in samples]),
                vs,
                server.target.unavailable,
            )
        )
    return lines


def table(lines: Sequence[Line]) -> str:
    """The results as a text table; unavailable servers say why."""
    header = (
        "server",
        "nextHopProtocol",
        "load",
        "(min-max)",
        "app render",
        "FCP",
        "resources",
        "compressed responses",
        "transferred",
        "encoded",
        "connections",
        *(f"vs {key}" for key in COMPARED),
    )
    out: list[tuple[str, ...] | str] = []

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}s"

    def megabytes(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} MB"

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    for line in lines:
        if line.unavailable is not None and line.load is None:
            out.append(f"{line.key}: unavailable: {line.unavailable.splitlines()[0][:200]}")
            continue
        out.append(
            (
                line.key,
                line.protocol,
                seconds(line.load),
                f"({seconds(line.load_min)}-{seconds(line.load_max)})",
                seconds(line.app),
                seconds(line.fcp),
                "-" if line.resources is None else f"{line.resources:.0f}",
                line.encodings,
                megabytes(line.transfer_mb),
                megabytes(line.encoded_mb),
                "-" if line.connections is None else f"{line.connections:.0f}",
                *(ratio(line.vs.get(key)) for key in COMPARED),
            )
        )
    return report.render(header, out, left=2)


def verdict(lines: Sequence[Line]) -> list[str]:
    """
    The issue's target, under the table: L{TARGET_SERVER}'s load at most each of
    L{COMPARED}'s in the same run (the median of same-round ratios at most 1), with the
    medians and bytes transferred; the same for the other compressing edgegw servers run,
    for reference. Empty when no edgegw server was run.
    """
    by_key = {line.key: line for line in lines}
    out: list[str] = []
    for key, (program, _, compresses) in SERVERS.items():
        mine = by_key.get(key)
        if program != "edgegw" or not compresses or mine is None:
            continue
        if not out:
            out.append(
                f"TARGET (issue 34): {TARGET_SERVER}'s load at most "
                + " and ".join(COMPARED)
                + "'s, same run (median of same-round ratios)"
            )
        if mine.load is None:
            reason = (mine.unavailable or "no load").splitlines()[0][:160]
            missed = "MISSED, " if key == TARGET_SERVER else ""
            out.append(f"  {key}: {missed}not measured: {reason}")
            continue
        for other_key in COMPARED:
            other = by_key.get(other_key)
            if other is None or other.load is None:
                out.append(f"  {key} vs {other_key}: {other_key} not measured in this run")
                continue
            share = mine.vs.get(other_key)
            state = "-" if share is None else ("OK" if share <= 1.0 else "MISSED")
            if key != TARGET_SERVER:
                state += " (for reference)"
            out.append(
                f"  {key} vs {other_key}: {'-' if share is None else f'{share:.3f}x'} ({key} "
                f"{mine.load:.2f}s, {mine.transfer_mb or 0:.2f} MB transferred; {other_key} "
                f"{other.load:.2f}s, {other.transfer_mb or 0:.2f} MB): {state}"
            )
    return out


def notes(settings: Settings, files: int, size: int) -> list[str]:
    """How to read the table; printed under it and saved with the results."""
    return [
        f"The app: {spa.PACKAGE}@{spa.VERSION} from npm ({files} files, {size / 1e6:.1f} MB "
        "in all; what a first load asks for is in the table), served at / with a "
        "single-page app's fallback to index.html.",
        f"The link (bench/link.py, below the browser): {2 * settings.delay_ms:g} ms round "
        f"trip, {settings.down_mbit:g} Mbit/s down and {settings.up_mbit:g} Mbit/s up, each "
        "shared by all of a page's connections; a new connection pays one round trip "
        "before its first bytes (TCP's handshake); no loss, no slow start.",
        "load: the load event (loadEventStart) from the navigation's start; app render: the "
        f"first element in the app's mount point ({spa.MOUNT}); FCP: first contentful "
        "paint; medians over rounds, (min-max) of the load. nextHopProtocol: the "
        "navigation's, from the Performance API. transferred: the page's and its "
        "resources' transferSize (headers and bodies as received, compressed where the "
        "server compressed); encoded: the bodies alone as received (encodedBodySize); "
        "compressed responses: how many responses came with each Content-Encoding "
        "(Chromium's DevTools events; Chromium offers gzip, deflate, br, zstd over HTTPS). "
        "connections: TCP connections the relay saw during the load.",
        f"Each load in a new headless Chromium (fresh profile, cache disabled); rounds "
        f"interleave the servers; {settings.rounds} round(s). One serving process each: "
        "edgegw one process, nginx worker_processes 1, Caddy GOMAXPROCS=1. nginx-gzip "
        f"and nginx-h1-gzip compress {tls_servers.GZIP_TYPES} (gzip_comp_level 5); "
        "caddy-gzip compresses with encode zstd gzip (Caddy's default types and levels: "
        "zstd's default, gzip 5); edgegw and edgegw-ssl compress at edgegw's defaults "
        f"(zstd {ZSTD_LEVEL}, br {BROTLI_QUALITY}, gzip {GZIP_LEVEL}, on the fly: the app "
        "has no precompressed files; each file compressed once per process and coding, "
        "kept in the static cache: round 1 compresses, later rounds are served from it), "
        "edgegw-nocache the same compressing every file on every request "
        "(staticCacheSize: 0), "
        "edgegw-br the same without zstd (Chromium then gets br); "
        "edgegw-plain, nginx, nginx-h1 and caddy send files as they are.",
        "vs caddy-gzip, vs nginx-gzip: the load time over that server's in the same "
        "round, median over rounds.",
    ]


def run(settings: Settings) -> int:
    """Run the benchmark, print the table and write the JSON and Markdown results."""
    tools = ensure(("nginx", "caddy", "chromium", "chromedriver", "npm"))
    try:
        import selenium  # noqa: F401
    except ImportError as e:
        raise MissingToolsError(
            f"bench: selenium is not installed ({e}): run `make venv` (the test extra)"
        ) from e
    try:
        root = spa.root(tools["npm"])
    except spa.SpaError as e:
        say(f"bench: {e}")
        return 1
    files, size = spa.summary(root)
    busy = warn_if_busy()
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with scratch("edgegw-bench-pageload-", settings.keep_tmp) as tmp, ExitStack() as stack:
        cert = tls_servers.certificate(tmp / "certificate", HOSTNAME)
        say(f"bench: starting the servers and their relays in {tmp}")
        servers = start_servers(stack, tmp, tools, root, cert, settings)
        for server in servers:
            state = server.target.unavailable
            ready = f"ready (ALPN: {server.alpn})" if state is None else state.splitlines()[0]
            say(f"  {server.key:<14} {ready}")
        measure(servers, tools, cert, settings)
        lines = summarize(servers)
    text = table(lines)
    target = verdict(lines)
    print()
    print(text)
    if target:
        print()
        print("\n".join(target))
    print()
    for note in notes(settings, files, size):
        print(f"* {note}")
    machine = report.machine()
    versions = {
        "chromium": version([tools["chromium"], "--version"]),
        "nginx": version([tools["nginx"], "-v"]),
        "caddy": "caddy " + version([tools["caddy"], "version"]),
        "app": f"{spa.PACKAGE}@{spa.VERSION}",
    }
    path = report.write_json(
        "pageload",
        {
            "benchmark": "pageload",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**machine, "busy_before_start": round(busy, 3)},
            "versions": versions,
            "servers": [
                {
                    "key": server.key,
                    "description": server.target.description,
                    "alpn": server.alpn,
                    "samples": server.samples,
                    "unavailable": server.target.unavailable,
                }
                for server in servers
            ],
            "summary": [attrs.asdict(line) for line in lines],
            "target": target,
            "notes": notes(settings, files, size),
        },
    )
    markdown = path.with_suffix(".md")
    markdown.write_text(
        f"# edgegw bench pageload, {started_at}\n\n"
        f"`python -m bench pageload --rounds {settings.rounds} --servers "
        f"{','.join(settings.servers)}` at "
        f"{machine.get('edgegw_commit', '?')} on {machine.get('cpu', '?')} "
        f"({machine.get('cpus', '?')} CPUs); "
        + ", ".join(versions.values())
        + f"\n\n```\n{text}\n```\n\n"
        + ("```\n" + "\n".join(target) + "\n```\n\n" if target else "")
        + "".join(f"* {note}\n" for note in notes(settings, files, size))
    )
    print(f"\nresults: {path} (and {markdown.name})", file=sys.stderr)
    return 1 if any(server.target.unavailable is not None for server in servers) else 0


__all__ = ["SERVERS", "Settings", "run"]
