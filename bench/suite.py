"""
C{python -m bench suite} (C{make bench}): every scenario in one interleaved run, with
nginx, Caddy and a minimal Twisted Agent proxy measured in the same run as anchors.

Each row is one URL on one process (some processes answer several rows): the nginx
backend itself, nginx, Caddy and the Agent proxy in front of it, edgegw's reverse proxy
(small and 64 KiB), a static file from edgegw and from Caddy (L{bench.caddy}), the api
fan-out to three backends (through treq), an app route with a session cookie and a
service route with a cached Bearer token (each beside the same route public), the
session route with one require and one Rego policy, the same
with Telemetry exporting every trace and with metrics on, a route with a request and a
response plugin, and one against two worker processes on one socket. Every round loads
every row in turn (C{wrk -t1 -cN --latency}); the rows marked c1 are loaded again at one
connection, where the latency a proxy adds is its own rather than queueing. Under the
tables, issue 39's table (nginx, Caddy, edgegw, the Agent proxy) and edgegw beside
Caddy against issue 39's targets. C{--only} loads only some rows.

The configurations are the feature benchmarks' own (L{bench.session},
L{bench.bearer}, L{bench.authz}, L{bench.plugins}, L{bench.metrics}, L{bench.api},
L{bench.workers}): those commands measure one feature in more depth.
"""

from __future__ import annotations

import datetime
import fnmatch
import http.client
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import (
    api,
    authz,
    bearer,
    caddy,
    gateway,
    metrics,
    plugins,
    report,
    session,
    variants,
    wrk,
)
from bench import workers as workers_bench
from bench.otlp_sink import Sink
from bench.processes import StartupError, peak_rss_bytes, scratch, warn_if_busy
from bench.rate_limit_rows import start_rate_limit_rows
from bench.rounds import say
from bench.targets import PAYLOADS, Target, start_targets
from bench.telemetry import start_sink
from bench.tools import ensure_tools, version
from tests.support.processes import free_port

SMALL, LARGE = PAYLOADS


@attrs.frozen
class Goal:
    """
    A target of the performance issue for one row.

    @ivar kind: C{ratio} (req/s over the baseline row's, same round, at least
        C{value}), C{cpu-share} (CPU µs/req over the baseline's, at most C{value}),
        C{cpu} (CPU µs/req at most C{value}), C{extra-cpu} (CPU µs/req over the
        baseline's, minus 1, at most C{value}), C{rps} (req/s at least C{value}),
        C{latency-share} (p50 added over the direct row at one connection, over the
        baseline's, at most C{value}).
    """

    kind: str
    value: float
    text: str


@attrs.define
class Row:
    """
    One URL measured: its process's target, its request, what it must answer, and what
    it is compared with.
    """

    key: str
    label: str
    target: Target
    path: str
    headers: tuple[tuple[str, str], ...] = ()
    status: int = 200
    body: bytes | None = None
    baseline: str | None = None
    goal: Goal | None = None
    low: bool = False
    samples: dict[int, list[dict[str, float]]] = attrs.Factory(dict)

    def url(self) -> wrk.Url:
        headers = [f"{name}: {value}" for name, value in self.headers]
        return wrk.Url(f"http://127.0.0.1:{self.target.port}{self.path}", headers)

    def check(self) -> str | None:
        """Ask once; L{None} if the answer is the expected one, else what was wrong."""
        connection = http.client.HTTPConnection("127.0.0.1", self.target.port, timeout=10)
        try:
            connection.request("GET", self.path, headers=dict(self.headers))
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as e:
            return f"GET {self.path} failed: {e}"
        finally:
            connection.close()
        if response.status != self.status or (self.body is not None and body != self.body):
            return f"GET {self.path} answered {response.status} with {len(body)} bytes"
        return None


def _row_for(target: Target, key: str, label: str, **kwargs: Any) -> Row:
    # Rows of one process share its port and pids but not their availability.
    return Row(key, label, attrs.evolve(target, key=key), **kwargs)


@attrs.frozen
class Settings:
    duration: int = 10
    connections: int = 50
    rounds: int = 3
    warmup: int = 1
    keep_tmp: bool = False
    only: tuple[str, ...] = ()


def select(rows: Sequence[Row], patterns: Sequence[str]) -> list[Row]:
    """
    The rows whose key matches one of C{patterns} (shell-style: C{caddy-*}), in round
    order; every row when there are none. Their processes were all started: this only
    chooses what is loaded.

    @raise ValueError: If a pattern matches no row.
    """
    if not patterns:
        return list(rows)
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(r.key, p) for r in rows)]
    if unmatched:
        keys = ", ".join(row.key for row in rows)
        raise ValueError(f"--only {','.join(unmatched)} matches no row (rows: {keys})")
    return [row for row in rows if any(fnmatch.fnmatchcase(row.key, p) for p in patterns)]


def start_rows(stack: ExitStack, tmp: Path, settings: Settings, wrk_path: str) -> list[Row]:
    """
    Start every process (stopped when C{stack} closes) and make the rows, in round
    order.

    @raise StartupError: If the backend itself does not start.
    """
    tools = ensure_tools()
    rows: list[Row] = []
    anchors = {t.key: t for t in start_targets(stack, tools, tmp, "abcde", settings.connections)}
    caddies = caddy.start(stack, tmp, anchors["a"].port, tmp / "www", settings.connections)
    for payload, tag in ((SMALL, "small"), (LARGE, "64k")):
        small = payload is SMALL
        rows += [
            _row_for(
                anchors["a"],
                f"direct-{tag}",
                f"direct nginx, {payload.name}",
                path=payload.path,
                body=payload.body,
                low=small,
            ),
            _row_for(
                anchors["b"],
                f"nginx-{tag}",
                f"nginx proxy, {payload.name}",
                path=payload.path,
                body=payload.body,
                low=small,
            ),
            _row_for(
                caddies[caddy.PROXY],
                f"caddy-{tag}",
                f"Caddy proxy, {payload.name}",
                path=payload.path,
                body=payload.body,
                low=small,
            ),
            _row_for(
                anchors["c"],
                f"agent-{tag}",
                f"Agent proxy, {payload.name}",
                path=payload.path,
                body=payload.body,
                low=small,
            ),
        ]
        goal = (
            Goal("cpu-share", 0.5, "CPU at most half the Agent proxy's")
            if small
            else Goal("rps", 5000, "at least 5,000 req/s")
        )
        rows.append(
            _row_for(
                anchors["d"],
                f"proxy-{tag}",
                f"edgegw proxy, {payload.name}",
                path=payload.path,
                body=payload.body,
                low=small,
                baseline=f"agent-{tag}",
                goal=goal,
            )
        )
    rows.append(
        _row_for(
            anchors["e"],
            "static",
            "edgegw static file, small-json",
            path=SMALL.path,
            body=SMALL.body,
        )
    )
    rows.append(
        _row_for(
            caddies[caddy.STATIC],
            "caddy-static",
            "Caddy file_server, small-json",
            path=SMALL.path,
            body=SMALL.body,
        )
    )
    rows += _api_rows(stack, tmp)
    rows += _identity_rows(stack, tmp, anchors["a"].port)
    rows += _plugin_rows(stack, tmp)
    rows += start_rate_limit_rows(stack, tmp, anchors["a"].port)
    rows += _worker_rows(stack, tmp)
    return rows


def _started(
    stack: ExitStack, tmp: Path, prefix: str, configs: Sequence[variants.Variant], path: str
) -> list[Target]:
    return variants.start(stack, tmp, configs, path, prefix)


def _api_rows(stack: ExitStack, tmp: Path) -> list[Row]:
    fan = api.fan_out(api.Settings())
    targets = {t.key: t for t in api.start(stack, tmp, fan, api.Settings())}
    edgegw = targets[api.EDGEGW]
    return [
        _row_for(
            edgegw,
            "api-fanout",
            "edgegw api fan-out to 3 backends (treq)",
            path=api.ROUTE_PATH,
            goal=Goal("cpu", 350, "at most 350 µs CPU/req"),
        )
    ]


def _identity_rows(stack: ExitStack, tmp: Path, backend_port: int) -> list[Row]:
    rows: list[Row] = []
    key = secrets.token_hex(16)
    spec = session.session_spec(key)
    cookies = {
        "b": session.make_cookie(spec, session.GROUPS),
        "c": session.make_cookie(spec, session.large_groups()),
    }
    public, with_session, _ = session.make_variants(key, cookies)
    require = gateway.require_policy("require-group", [session.GROUPS[0]])
    rego = gateway.rego_policy("no-deletes", authz.NO_DELETES)
    policed = attrs.evolve(
        with_session,
        key="p",
        routes=[
            attrs.evolve(r, authorize=("require-group", "no-deletes")) for r in with_session.routes
        ],
        resources=[*with_session.resources, require, rego],
    )
    sink_port = free_port()
    sink = Sink("http", sink_port, sink_port)
    start_sink(stack, tmp, sink)
    traced = attrs.evolve(
        policed,
        key="t",
        resources=[*policed.resources, gateway.telemetry("bench", sink.endpoint, sink.protocol)],
    )
    # Metrics live in a Telemetry resource, which records spans (for log correlation)
    # even without an export: their cost is measured against the same without metrics.
    unmeasured = attrs.evolve(
        policed, key="u", resources=[*policed.resources, metrics.telemetry(None)]
    )
    measured = attrs.evolve(
        policed, key="m", resources=[*policed.resources, metrics.telemetry(free_port())]
    )
    configs = [public, with_session, policed, traced, unmeasured, measured]
    started = _started(stack, tmp, "session", configs, session.ROUTE_PATH)
    labels = {
        "a": ("session-public", "app route public (no cookie)", None, None),
        "b": (
            "session",
            "app route, valid session cookie",
            "session-public",
            Goal("ratio", 0.9, "at least 0.9x public"),
        ),
        "p": (
            "policy",
            "session route + require + Rego policy",
            "session-public",
            Goal("ratio", 0.85, "at least 0.85x public"),
        ),
        "t": (
            "policy-traced",
            "policy route + Telemetry exporting every trace (OTLP)",
            "policy",
            None,
        ),
        "u": (
            "policy-telemetry",
            "policy route + Telemetry, no export, no metrics",
            "policy",
            None,
        ),
        "m": (
            "policy-metrics",
            "policy route + Telemetry with metrics (Prometheus)",
            "policy-telemetry",
            Goal("extra-cpu", 0.10, "at most +10 % CPU"),
        ),
    }
    for config, target in zip(configs, started, strict=True):
        row_key, label, baseline, goal = labels[config.key]
        rows.append(
            _row_for(
                target,
                row_key,
                label,
                path=session.ROUTE_PATH,
                headers=tuple(config.headers),
                body=config.body,
                baseline=baseline,
                goal=goal,
            )
        )
    jwk_key = bearer.make_key()
    issuer = bearer.StaticIssuer(jwk_key.public_jwk())
    issuer.start(stack)
    token = jwk_key.sign(bearer.token_claims(issuer.url, time.time()))
    bearer_public, cached, _ = bearer.make_variants(issuer.url, token)
    pair = [bearer_public, cached]
    started = _started(stack, tmp, "bearer", pair, bearer.ROUTE_PATH)
    for config, target in zip(pair, started, strict=True):
        bearer.wait_until_accepted(config, target, bearer.READY_WITHIN)
    rows.append(
        _row_for(
            started[0],
            "bearer-public",
            "service route public",
            path=bearer.ROUTE_PATH,
            body=bearer_public.body,
        )
    )
    rows.append(
        _row_for(
            started[1],
            "bearer",
            "service route, Bearer token (cached verification)",
            path=bearer.ROUTE_PATH,
            headers=tuple(cached.headers),
            body=cached.body,
            baseline="bearer-public",
            goal=Goal("ratio", 0.9, "at least 0.9x public"),
        )
    )
    return rows


def _plugin_rows(stack: ExitStack, tmp: Path) -> list[Row]:
    configs = plugins.make_variants()
    none, both = configs[0], configs[-1]
    started = _started(stack, tmp, "plugins", [none, both], plugins.ROUTE_PATH)
    return [
        _row_for(
            started[0],
            "plugins-none",
            "health route, no plugins",
            path=plugins.ROUTE_PATH,
            body=none.body,
        ),
        _row_for(
            started[1],
            "plugins",
            "health route, request and response plugins",
            path=plugins.ROUTE_PATH,
            body=both.body,
            baseline="plugins-none",
        ),
    ]


def _worker_rows(stack: ExitStack, tmp: Path) -> list[Row]:
    one, two = workers_bench.make_variants()
    rows = []
    for config, count, baseline, goal in (
        (one, 1, None, None),
        (two, 2, "workers-1", Goal("ratio", 1.8, "at least 1.8x one worker")),
    ):
        target, _ = workers_bench.start_workers(stack, tmp, config, count)
        rows.append(
            _row_for(
                target,
                f"workers-{count}",
                f"health route, {count} worker process(es)",
                path=workers_bench.ROUTE_PATH,
                body=config.body,
                baseline=baseline,
                goal=goal,
            )
        )
    return rows


def measure(rows: Sequence[Row], settings: Settings, wrk_path: str) -> None:
    """Warm up, then every round: every row at the main load, then c1 rows at 1."""
    for row in rows:
        if row.target.unavailable is None:
            row.target.unavailable = row.check()
    loads = [settings.connections, 1]
    ready = [row for row in rows if row.target.unavailable is None]
    if settings.warmup:
        say(f"warm-up: {settings.warmup}s per row")
        for row in ready:
            try:
                wrk.run(wrk_path, row.url(), settings.connections, settings.warmup)
            except wrk.WrkError as e:
                row.target.unavailable = f"wrk failed during warm-up: {e}"
    for round_ in range(1, settings.rounds + 1):
        for load in loads:
            for row in rows:
                if row.target.unavailable is not None or (load == 1 and not row.low):
                    continue
                try:
                    result, cpu = wrk.measure(
                        wrk_path, row.url(), load, settings.duration, row.target.pids
                    )
                except wrk.WrkError as e:
                    row.target.unavailable = f"wrk failed: {e}"
                    continue
                row.target.check_alive()
                wrong = row.check()
                if wrong is not None:
                    row.target.unavailable = f"after round {round_}: {wrong}"
                    continue
                done = max(result.requests, 1)
                figures = {
                    "rps": result.rps,
                    "p50": result.latency[50.0],
                    "p99": result.latency[99.0],
                    "cpu_us": cpu / done * 1e6,
                    "errors": float(result.errors),
                }
                row.samples.setdefault(load, []).append(figures)
                say(
                    f"round {round_}/{settings.rounds} c{load} {row.key:<16} "
                    f"{result.rps:>9,.0f} req/s  {figures['cpu_us']:7.1f} µs CPU/req"
                )


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _paired(
    row: Row,
    other: Row | None,
    load: int,
    combine: Callable[[dict[str, float], dict[str, float]], float],
) -> float | None:
    """The median over rounds of C{combine(row's, other's)}, same round."""
    if other is None:
        return None
    mine, theirs = row.samples.get(load, []), other.samples.get(load, [])
    return _median([combine(a, b) for a, b in zip(mine, theirs, strict=False)])


@attrs.frozen
class Line:
    """One row of the table, medians over rounds."""

    key: str
    label: str
    rps: float | None
    vs_direct: float | None
    vs_nginx: float | None
    p50: float | None
    p99: float | None
    cpu_us: float | None
    peak_rss_mib: float | None
    vs_baseline: float | None
    goal: str
    verdict: str
    unavailable: str | None


def summarize(rows: Sequence[Row], load: int) -> list[Line]:
    by_key = {row.key: row for row in rows}
    lines = []
    for row in rows:
        samples = row.samples.get(load, [])
        if load == 1 and not row.low:
            continue
        tag = "64k" if row.path == LARGE.path else "small"
        direct, nginx = by_key.get(f"direct-{tag}"), by_key.get(f"nginx-{tag}")
        baseline = by_key.get(row.baseline) if row.baseline else None

        def ratio(a: dict[str, float], b: dict[str, float]) -> float:
            return a["rps"] / b["rps"] if b["rps"] else 0.0

        vs_baseline = _paired(row, baseline, load, ratio)
        verdict, goal_text = "", ""
        if row.goal is not None and load != 1:
            goal_text = row.goal.text
            verdict = _verdict(row, baseline, load, row.goal)
        rss = None
        if row.target.pids and row.target.alive():
            try:
                rss = sum(peak_rss_bytes(pid) for pid in row.target.pids) / 2**20
            except OSError:
                rss = None
        lines.append(
            Line(
                row.key,
                row.label,
                _median([s["rps"] for s in samples]),
                _paired(row, direct, load, ratio),
                _paired(row, nginx, load, ratio),
                _median([s["p50"] for s in samples]),
                _median([s["p99"] for s in samples]),
                _median([s["cpu_us"] for s in samples]),
                rss,
                vs_baseline,
                goal_text,
                verdict,
                row.target.unavailable,
            )
        )
    return lines


def _verdict(row: Row, baseline: Row | None, load: int, goal: Goal) -> str:
    def cpu_share(a: dict[str, float], b: dict[str, float]) -> float:
        return a["cpu_us"] / b["cpu_us"] if b["cpu_us"] else 0.0

    value: float | None
    if goal.kind == "ratio":
        value = _paired(row, baseline, load, lambda a, b: a["rps"] / b["rps"] if b["rps"] else 0)
        ok = value is not None and value >= goal.value
        shown = f"{value:.2f}x" if value is not None else "-"
    elif goal.kind == "cpu-share":
        value = _paired(row, baseline, load, cpu_share)
        ok = value is not None and value <= goal.value
        shown = f"{value:.2f}x" if value is not None else "-"
    elif goal.kind == "extra-cpu":
        value = _paired(row, baseline, load, cpu_share)
        value = None if value is None else value - 1
        ok = value is not None and value <= goal.value
        shown = f"{value:+.1%}" if value is not None else "-"
    elif goal.kind == "cpu":
        value = _median([s["cpu_us"] for s in row.samples.get(load, [])])
        ok = value is not None and value <= goal.value
        shown = f"{value:.0f} µs" if value is not None else "-"
    else:  # rps
        value = _median([s["rps"] for s in row.samples.get(load, [])])
        ok = value is not None and value >= goal.value
        shown = f"{value:,.0f}" if value is not None else "-"
    return f"{shown} {'OK' if ok else 'MISSED'}"


def latency_line(rows: Sequence[Row]) -> str:
    """The p50 edgegw and the Agent proxy add over the backend at one connection."""
    by_key = {row.key: row for row in rows}

    def added(key: str) -> float | None:
        if key not in by_key or "direct-small" not in by_key:
            return None
        return _paired(by_key[key], by_key["direct-small"], 1, lambda a, b: a["p50"] - b["p50"])

    edgegw, agent = added("proxy-small"), added("agent-small")
    if edgegw is None or agent is None:
        return "c1 latency: not measured"
    share = edgegw / agent if agent > 0 else float("inf")
    verdict = "OK" if share <= 0.5 else "MISSED"
    return (
        f"c1 added p50 over direct: edgegw {edgegw * 1e6:.0f} µs, Agent proxy "
        f"{agent * 1e6:.0f} µs ({share:.2f}x; target at most 0.5x): {verdict}"
    )


def table(lines: Sequence[Line], load: int) -> str:
    header = (
        "row",
        "req/s",
        "vs direct",
        "vs nginx",
        "p50",
        "p99",
        "CPU µs/req",
        "peak RSS",
        "vs baseline",
        "target",
        "measured",
    )
    out: list[tuple[str, ...] | str] = []
    for line in lines:
        if line.unavailable is not None:
            out.append(f"{line.key}: unavailable: {line.unavailable.splitlines()[0][:160]}")
            continue

        def num(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        out.append(
            (
                line.key,
                num(line.rps, ",.0f"),
                "-" if line.vs_direct is None else f"{line.vs_direct:.3f}x",
                "-" if line.vs_nginx is None else f"{line.vs_nginx:.2f}x",
                "-" if line.p50 is None else report.format_duration(line.p50),
                "-" if line.p99 is None else report.format_duration(line.p99),
                num(line.cpu_us, ".1f"),
                "-" if line.peak_rss_mib is None else f"{line.peak_rss_mib:.0f} MiB",
                "-" if line.vs_baseline is None else f"{line.vs_baseline:.2f}x",
                line.goal or "-",
                line.verdict or "-",
            )
        )
    return f"c{load}\n" + report.render(header, out, left=1)


def run(settings: Settings) -> int:
    """Run the suite, print the tables and write the JSON and Markdown results."""
    tools = ensure_tools()
    busy = warn_if_busy()
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with scratch("edgegw-bench-suite-", settings.keep_tmp) as tmp, ExitStack() as stack:
        say(f"bench: starting every scenario in {tmp}")
        try:
            rows = select(start_rows(stack, tmp, settings, tools.wrk), settings.only)
        except (StartupError, ValueError) as e:
            say(f"bench: {e}")
            return 1
        measure(rows, settings, tools.wrk)
        main_lines = summarize(rows, settings.connections)
        low_lines = summarize(rows, 1)
    text = "\n\n".join(
        [
            table(main_lines, settings.connections),
            table(low_lines, 1),
            caddy.report({row.key: row.samples for row in rows}, settings.connections),
            latency_line(rows),
        ]
    )
    print()
    print(text)
    machine = report.machine()
    path = report.write_json(
        "suite",
        {
            "benchmark": "suite",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**machine, "busy_before_start": round(busy, 3)},
            "versions": {
                "wrk": version([tools.wrk, "-v"]),
                "nginx": version([tools.nginx, "-v"]),
                "caddy": caddy.caddy_version(),
            },
            "rows": [
                {
                    "key": row.key,
                    "label": row.label,
                    "path": row.path,
                    "headers": [name for name, _ in row.headers],
                    "baseline": row.baseline,
                    "samples": {f"c{load}": s for load, s in row.samples.items()},
                    "unavailable": row.target.unavailable,
                }
                for row in rows
            ],
            "summary": {
                f"c{settings.connections}": [attrs.asdict(line) for line in main_lines],
                "c1": [attrs.asdict(line) for line in low_lines],
                "caddy": [
                    {**attrs.asdict(c), "verdict": c.verdict}
                    for c in caddy.comparisons(
                        {row.key: row.samples for row in rows}, settings.connections
                    )
                ],
            },
        },
    )
    markdown = path.with_suffix(".md")
    markdown.write_text(
        f"# edgegw bench suite, {started_at}\n\n"
        f"`python -m bench suite --duration {settings.duration} --connections "
        f"{settings.connections} --rounds {settings.rounds}"
        + (f" --only {','.join(settings.only)}" if settings.only else "")
        + "` at "
        f"{machine.get('edgegw_commit', '?')} on {machine.get('cpu', '?')} "
        f"({machine.get('cpus', '?')} CPUs)\n\n```\n{text}\n```\n"
    )
    print(f"\nresults: {path} (and {markdown.name})")
    unavailable = [row for row in rows if row.target.unavailable is not None]
    return 1 if unavailable else 0


__all__ = ["Settings", "run"]
