"""
C{python -m bench reload}: what reloads cost the requests under way.

One edgegw process serves a reverse-proxy route (C{GET /api/small.json} from an nginx
static backend, as in the suite). Each round loads it twice for C{--duration} seconds,
in this order: C{steady} (no reload) and C{reloading} (a SIGHUP every
C{1/--reloads-per-second} seconds, each into a configuration with another set of
routes, so that every reload builds, warms up and switches a new configuration). wrk
(keep-alive, C{--connections}) gives the requests per second and the p99 latency; beside
it one client opens a new connection for every request (50 a second,
L{tests.support.steady_load}), so that connections accepted around a switch are counted
too. Reported per mode: req/s, p99, and the failures — wrk's socket errors and non-2xx
answers plus the connection-per-request client's failed requests and 5xx (target: 0 in
both modes).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import median
from typing import Any

import attrs

from bench import gateway, nginx, report, wrk
from bench.processes import scratch
from bench.rounds import say
from bench.targets import Target, start_edgegw
from bench.tools import ensure_tools
from tests.support.processes import free_port
from tests.support.steady_load import SteadyClient

PATH = "/api/small.json"
BODY = b'{"ok": true, "items": [1, 2, 3]}\n'
MODES = ("steady", "reloading")


@attrs.frozen
class Settings:
    """
    @ivar duration: Seconds of load per mode and round.
    @ivar connections: wrk's keep-alive connections.
    @ivar rounds: Rounds (each: steady, then reloading).
    @ivar reloads_per_second: SIGHUPs a second while reloading.
    @ivar keep_tmp: Keep the temporary directory (configuration and log).
    """

    duration: int = 30
    connections: int = 32
    rounds: int = 1
    reloads_per_second: float = 1.0
    keep_tmp: bool = False


class Reloader:
    """
    Sends the gateway a SIGHUP at a steady rate from a thread, each time after writing
    a configuration file with one more route.
    """

    def __init__(self, pid: int, directory: Path, rate: float) -> None:
        self.pid = pid
        self.path = directory / "zz-reload.yaml"
        self.interval = 1.0 / rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Reloader:
        """Start sending."""
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop; how many SIGHUPs were sent."""
        self._stop.set()
        self._thread.join()
        return self.sent

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sent += 1
            routes = "".join(
                "---\nkind: Route\n"
                f"metadata: {{name: extra-{n}}}\n"
                f"spec: {{match: /extra-{n}, access: {{auth: public}}, "
                "handler: {type: health}}\n"
                for n in range(self.sent % 20 + 1)
            )
            self.path.write_text(routes)
            os.kill(self.pid, signal.SIGHUP)


def _measure(
    wrk_path: str, target: Target, directory: Path, settings: Settings, mode: str
) -> dict[str, Any]:
    assert target.process is not None
    url = f"http://127.0.0.1:{target.port}{PATH}"
    client = SteadyClient(target.port, PATH, "close", rate=50).start()
    reloader = None
    if mode == "reloading":
        reloader = Reloader(target.process.pid, directory, settings.reloads_per_second).start()
    try:
        result = wrk.run(wrk_path, url, settings.connections, settings.duration)
    finally:
        reloads = reloader.stop() if reloader is not None else 0
        load = client.stop()
    failures = result.errors + len(load.failures) + load.server_errors
    say(
        f"  {mode}: {result.rps:,.0f} req/s, p99 {result.latency[99.0] * 1e3:.2f} ms, "
        f"{reloads} reloads, failures {failures} (wrk {result.errors}, one connection per "
        f"request: {len(load.failures)} failed and {load.server_errors} 5xx of {load.requests})"
    )
    return {
        "mode": mode,
        "rps": round(result.rps, 1),
        "p99_ms": round(result.latency[99.0] * 1e3, 3),
        "p50_ms": round(result.latency[50.0] * 1e3, 3),
        "reloads": reloads,
        "wrk_errors": result.errors,
        "close_client_requests": load.requests,
        "close_client_failures": load.failures[:20],
        "close_client_5xx": load.server_errors,
        "failures": failures,
    }


def run(settings: Settings) -> int:
    """
    Run the benchmark, print the figures and write the JSON results.

    @return: 0, or 1 when a request failed or the gateway could not be measured.
    """
    tools = ensure_tools()
    wrk_path = tools.wrk
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    records: list[dict[str, Any]] = []
    with scratch("edgegw-bench-reload-", settings.keep_tmp) as tmp, ExitStack() as stack:
        www = tmp / "www"
        (www / "api").mkdir(parents=True)
        (www / "api" / "small.json").write_bytes(BODY)
        backend_port = free_port()
        nginx.start_backend(stack, tools.nginx, tmp, www, backend_port)
        target = Target("a", "edgegw", "one edgegw process", port=free_port())
        routes = [gateway.reverse_proxy("api", "/api/", f"http://127.0.0.1:{backend_port}")]
        start_edgegw(stack, tmp, "reload", target, routes)
        if target.unavailable is not None:
            say(f"bench: edgegw unavailable: {target.unavailable}")
            return 1
        for number in range(1, settings.rounds + 1):
            say(f"round {number}/{settings.rounds}")
            for mode in MODES:
                records.append(
                    {"round": number} | _measure(wrk_path, target, tmp / "reload", settings, mode)
                )
            if not target.alive():
                target.check_alive()
                say(f"bench: {target.unavailable}")
                return 1
        assert target.process is not None
        log = target.process.log.read_text(errors="replace")
        reloaded = log.count("configuration reloaded from")
    summary = {
        mode: {
            "rps": median(r["rps"] for r in records if r["mode"] == mode),
            "p99_ms": median(r["p99_ms"] for r in records if r["mode"] == mode),
            "failures": sum(r["failures"] for r in records if r["mode"] == mode),
        }
        for mode in MODES
    }
    steady, reloading = summary["steady"], summary["reloading"]
    failures = steady["failures"] + reloading["failures"]
    print()
    print(
        f"reload: {settings.rounds} round(s) of {settings.duration} s per mode, "
        f"wrk -c{settings.connections}"
    )
    for mode in MODES:
        figures = summary[mode]
        print(
            f"  {mode:9} {figures['rps']:>10,.0f} req/s  p99 {figures['p99_ms']:7.2f} ms  "
            f"failures {figures['failures']}"
        )
    ratio = reloading["rps"] / steady["rps"] if steady["rps"] else 0.0
    print(
        f"  reloading/steady req/s {ratio:.2f}; {reloaded} reloads done; failures "
        f"{failures} (target 0): " + ("OK" if failures == 0 else "MISSED")
    )
    path = report.write_json(
        "reload",
        {
            "benchmark": "reload",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": report.machine(),
            "runs": records,
            "summary": summary,
            "reloads_done": reloaded,
        },
    )
    say(f"results: {path}")
    return 0 if failures == 0 else 1
