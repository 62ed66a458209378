"""
C{python -m bench metrics}: what the gateway's metrics cost per proxied request.

Two edgegw processes, one per variant, each with the same public C{reverse-proxy} route
C{/} to the nginx backend of C{bench proxy} (L{bench.targets.start_backend}) and the same
Telemetry resource, on which wrk loads the 100-byte C{/small.json} in interleaved rounds
(L{bench.variants}):

  - a. C{metrics-off}: the Telemetry resource without a C{metrics} block.
  - b. C{metrics-on}: the same with C{metrics.prometheus} on a port of its own.

After each of b's runs the harness scrapes its metrics, as Prometheus would, before the
CPU reading (so that rendering them is charged to the run), and reports how many
requests the duration histogram counted against those wrk completed. The target: b at
most +10 % CPU per request over a.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import gateway, variants, wrk
from bench.rounds import say
from bench.targets import PAYLOADS, Target, fetch, start_backend
from bench.tools import ensure_tools, version
from tests.support.processes import free_port

PAYLOAD = PAYLOADS[0]
"""The 100-byte JSON document every run asks for."""
SCRAPE_PATH = "/metrics"
_COUNT = re.compile(rb"^http_server_request_duration_seconds_count\{[^}]*\} (\d+)$", re.M)


def telemetry(metrics_port: int | None) -> dict[str, Any]:
    """
    The Telemetry resource: no export; with C{metrics_port}, a metrics block serving
    Prometheus on it.
    """
    spec: dict[str, Any] = {"service": {"name": "bench"}}
    if metrics_port is not None:
        spec["metrics"] = {"prometheus": {"listen": f"127.0.0.1:{metrics_port}"}}
    return gateway.resource("Telemetry", "telemetry", spec)


def make_variants(upstream: str, metrics_port: int) -> list[variants.Variant]:
    """The two variants, in round order."""
    routes = [gateway.reverse_proxy("backend", "/", upstream)]
    return [
        variants.Variant(
            "a",
            "metrics-off",
            "reverse-proxy route to nginx, Telemetry without metrics",
            routes,
            [telemetry(None)],
            body=PAYLOAD.body,
        ),
        variants.Variant(
            "b",
            "metrics-on",
            f"+ metrics, Prometheus on 127.0.0.1:{metrics_port}",
            routes,
            [telemetry(metrics_port)],
            body=PAYLOAD.body,
        ),
    ]


class Scraper:
    """
    Scrapes variant b's metrics after each run: the requests its duration histogram
    counted since the previous scrape.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.mark = 0

    def counted(self) -> int:
        """
        The requests counted so far (all series of the duration histogram).

        @raise OSError: If the listener cannot be reached.
        """
        status, _, body = fetch(self.port, SCRAPE_PATH)
        if status != 200:
            raise OSError(f"the scrape answered {status}")
        return sum(int(count) for count in _COUNT.findall(body))

    def after(self, result: wrk.WrkResult) -> dict[str, Any]:
        """The L{variants.AfterRun} of b: scrape, and compare with wrk's count."""
        try:
            total = self.counted()
        except OSError as e:
            say(f"bench: cannot scrape the metrics: {e}")
            return {"counted": None, "completed": result.requests}
        counted, self.mark = total - self.mark, total
        return {"counted": counted, "completed": result.requests}


def notes(settings: variants.Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Both variants proxy GET {PAYLOAD.path} ({len(PAYLOAD.body)} bytes) to one nginx "
        "backend (1 worker, keepalive; its CPU is not counted) with the same Telemetry "
        "resource (spans recorded, none exported); only b's metrics block differs. "
        "+CPU µs/req is what the metrics cost per request: the server duration, body "
        "sizes and in-flight count, the upstream call's duration, and one scrape per run "
        "(its rendering is charged to the run).",
        "counted/completed (b): the requests b's duration histogram counted in the run's "
        "scrape against those wrk completed (a little over 100%: the warm-up's and the "
        "check's requests, or requests still in flight when wrk stopped); fewer in any "
        "run is reported as WRONG and the command exits 1.",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Run the benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured.
    """
    tools = ensure_tools()
    metrics_port = free_port()
    scraper = Scraper(metrics_port)
    configs: list[variants.Variant] = []

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        backend = start_backend(stack, tools, tmp)
        configs.extend(make_variants(f"http://127.0.0.1:{backend.port}", metrics_port))
        targets = variants.start(stack, tmp, configs, PAYLOAD.path, "edgegw")
        return configs, targets, {"b": scraper.after}

    done = variants.measure("metrics", settings, tools.wrk, PAYLOAD.path, prepare)
    if done is None:
        return 1
    figures = done.runner.figures("b")
    counted = sum(f["counted"] or 0 for f in figures)
    completed = sum(f["completed"] for f in figures)
    share = f"{counted / completed:.1%}" if completed else "-"
    columns: list[variants.Column] = [
        ("counted", lambda key: share if key == "b" else "-"),
    ]
    variants.print_results(done, columns, (), notes(settings))
    variants.write_results(
        "metrics",
        done,
        settings,
        tools.wrk,
        configs,
        notes(settings),
        {"nginx": version([tools.nginx, "-v"])},
        {
            "payload": {"path": PAYLOAD.path, "bytes": len(PAYLOAD.body)},
            "scrape": {"counted": counted, "completed": completed},
        },
    )
    short = [f for f in figures if f["counted"] is None or f["counted"] < f["completed"]]
    if short:
        # The histogram lost requests (or could not be read): the figures mean nothing.
        say(f"bench: WRONG: b's scrape counted fewer requests than wrk completed: {short}")
        return 1
    return variants.exit_status(done)
