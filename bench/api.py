"""
C{python -m bench api}: the latency edgegw's C{api} fan-out adds over its slowest backend.

One backend process (L{bench.backends}' C{json} server: asyncio, keep-alive) answers a
small JSON document on three paths, each after a fixed delay (by default C{/a/{id}} at
0 ms, C{/b} at 2 ms, C{/c} at 5 ms). edgegw's route C{GET /dash/{id}} fans each request
out to the three concurrently and merges the answers into C{{"a": .., "b": .., "c": ..}}.
At each load (a low concurrency, then the default), every round runs, in turn:

  1. C{slowest-direct}: wrk on the slowest path directly: the floor for the fan-out.
  2. C{edgegw-api}: wrk on the fan-out route, same connections.
  3. C{edgegw-before} (with C{--before REV} only): the same route and configuration on
     edgegw at git revision REV (L{bench.before}).
  4. C{treq-agent-api}: the same fan-out on stock treq over Twisted's Agent
     (L{bench.treq_fanout}), same connections.
  5. C{backend-capacity}: wrk on the fastest path at three times the connections (a
     fan-out holds up to three backend calls per client connection): what the backend
     can serve, so that the report shows it is not what limits rows 2 to 4.

The latency added by a fan-out is its p50 (p99) minus row 1's in the same round and
load; the report gives medians over the rounds, and the CPU per fan-out request of rows
2 to 4 side by side: edgegw's before and after, and how many times cheaper than stock
treq edgegw is.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import backends, gateway, report, treq_fanout
from bench.before import Checkout, worktree
from bench.processes import Process, StartupError, cpu_seconds, scratch, started, warn_if_busy
from bench.report import Sample
from bench.rounds import InterleavedRunner, say
from bench.targets import Target, announce, fetch, start_edgegw
from bench.tools import ensure_wrk, version
from tests.support.processes import free_port

ROUTE_MATCH = "GET /dash/{id}"
"""The fan-out route's pattern (also L{bench.treq_fanout}'s only route)."""
ROUTE_PATH = "/dash/42"
"""The URL path wrk loads through edgegw."""
IDENTIFIER = "42"
"""The C{{id}} wildcard's value in L{ROUTE_PATH}, filled into backend a's path."""
FAN_OUT = 3
"""Backend calls per request: backend-capacity runs at this many times the connections."""

DIRECT, EDGEGW, BEFORE, TREQ, CAPACITY = "1", "2", "3", "4", "5"
TARGETS = {
    DIRECT: ("slowest-direct", "the slowest backend path, called directly (the floor)"),
    EDGEGW: ("edgegw-api", f"edgegw api route {ROUTE_MATCH} fanning out to 3 paths"),
    BEFORE: ("edgegw-before", "edgegw-api's configuration on edgegw at --before"),
    TREQ: ("treq-agent-api", f"stock treq over Agent fanning {ROUTE_MATCH} out to 3 paths"),
    CAPACITY: ("backend-capacity", f"the fastest backend path at {FAN_OUT}x the connections"),
}
"""Key to (name, description) of every target, in round order (L{BEFORE}: C{--before} only)."""
FAN_OUTS = (EDGEGW, BEFORE, TREQ)
"""The targets that load the fan-out route."""
MIN_TREQ_RATIO = 2.0
"""How many times cheaper in CPU per request than stock treq edgegw's fan-out must be."""


@attrs.frozen
class Settings:
    """
    The options of one api benchmark run.

    @ivar duration: Seconds per wrk run.
    @ivar connections: wrk's connections at the default load.
    @ivar low_connections: wrk's connections at the low load, where the added latency
        is the gateway's own rather than queueing.
    @ivar rounds: How many times each target and load is measured.
    @ivar warmup: Seconds of unrecorded load per target and load before round 1.
    @ivar delays: The backend's delays in milliseconds for groups a, b and c.
    @ivar keep_tmp: Keep the temporary directory (configuration and logs).
    @ivar before: A git revision of edgegw to run as target 3 with edgegw-api's
        configuration (L{None}: no target 3).
    """

    duration: int = 10
    connections: int = 50
    low_connections: int = 1
    rounds: int = 3
    warmup: int = 1
    delays: tuple[float, float, float] = (0.0, 2.0, 5.0)
    keep_tmp: bool = False
    before: str | None = None

    @property
    def loads(self) -> list[int]:
        """The connection counts measured, lowest first."""
        return sorted({self.low_connections, self.connections})

    @property
    def pool_size(self) -> int:
        """
        treq-agent-api's persistent pool per host: every backend call in flight at the
        highest load (all three paths are on one host), as agent_proxy's pool holds
        every call its connections make.
        """
        return FAN_OUT * max(self.loads)


def load_label(connections: int) -> str:
    """How a load appears in the table and the JSON: C{c1}, C{c50}."""
    return f"c{connections}"


@attrs.frozen
class Backend:
    """
    One of the fan-out's backends: a group of the route and a path of the backend.

    @ivar group: The member of the merged answer (and the path's prefix).
    @ivar template: The path as the route configures it (C{/a/{id}}).
    @ivar delay_ms: How long the backend waits before answering it.
    """

    group: str
    template: str
    delay_ms: float

    @property
    def prefix(self) -> str:
        """The backend's path prefix for this group."""
        return f"/{self.group}"

    @property
    def path(self) -> str:
        """The path requested for L{ROUTE_PATH} (the template, C{{id}} filled in)."""
        return self.template.replace("{id}", IDENTIFIER)

    def document(self) -> dict[str, Any]:
        """What the backend answers on L{path}."""
        return backends.json_document(self.path, self.delay_ms)


def fan_out(settings: Settings) -> list[Backend]:
    """The three backends, with the delays of C{settings}."""
    templates = ("/a/{id}", "/b", "/c")
    return [
        Backend(template.split("/")[1], template, delay)
        for template, delay in zip(templates, settings.delays, strict=True)
    ]


def slowest(fan: Sequence[Backend]) -> Backend:
    """The backend with the longest delay (the last of equals)."""
    return max(reversed(fan), key=lambda backend: backend.delay_ms)


def fastest(fan: Sequence[Backend]) -> Backend:
    """The backend with the shortest delay (the first of equals)."""
    return min(fan, key=lambda backend: backend.delay_ms)


def notes(settings: Settings, fan: Sequence[Backend]) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    cpus = os.cpu_count() or 0
    delays = ", ".join(f"{b.group} {b.path} {b.delay_ms:g} ms" for b in fan)
    return [
        "Backend: one asyncio process (bench/backends.py json), keep-alive, answering a "
        f"~30-byte JSON document after a fixed delay per path ({delays}). Its timers fire "
        "at, or a little after, the delay; row 1 measures the real floor, so that cancels "
        "out.",
        "added p50/p99: a fan-out's percentile minus slowest-direct's, same round and "
        "load, median over rounds: what the gateway adds to its slowest backend call "
        "(parsing, three concurrent pooled upstream calls, JSON decode, merge and encode, "
        "the access log). A difference of percentiles, not a percentile of per-request "
        "overheads.",
        "treq-agent-api: bench/treq_fanout.py, one process: a Twisted Site whose leaf "
        "resource makes the same three calls with a stock treq.HTTPClient over Agent on "
        f"a persistent HTTPConnectionPool ({settings.pool_size} per host), "
        "treq.json_content, merge, json.dumps; no access log, no routing, no timeout. "
        "treq / edgegw: its CPU µs/req over edgegw-api's in the same round and load, "
        f"median over rounds (the issue: at least {MIN_TREQ_RATIO:g}x).",
        *(
            [
                f"edgegw-before: edgegw at --before {settings.before} (a git worktree, "
                "PYTHONPATH set to it) with edgegw-api's configuration, right after it in "
                "every round. after vs before: the median over rounds of edgegw-api's CPU "
                "µs/req over edgegw-before's in the same round and load, minus 1.",
            ]
            if settings.before is not None
            else []
        ),
        f"At {load_label(settings.low_connections)} the added latency is the gateway's "
        f"own; at {load_label(settings.connections)} it also holds queueing inside the one "
        "edgegw process (and in the backend for row 1): there it follows throughput.",
        "CPU µs/req: utime+stime of the process under test over the wrk run, divided by "
        "the requests wrk completed: the fan-out process's own CPU for rows 2 to 4 (each "
        f"of its requests makes {FAN_OUT} backend calls, whose CPU is not included); the "
        "backend's for rows 1 and 5.",
        "backend CPU: the backend process's utime+stime over the run divided by wrk's "
        "duration, in % of one core; near 100% the backend would be the limit. Row 5 is "
        f"its capacity, at {FAN_OUT}x the connections on the fastest path; headroom = that "
        f"req/s over {FAN_OUT}x edgegw-api's req/s (the backend calls edgegw made), same "
        "round.",
        f"No CPU pinning: wrk (1 thread), the fan-out process and the backend share this "
        f"machine's {cpus} core(s); compare rows within a run, not across machines.",
        f"Medians over {settings.rounds} round(s) of {settings.duration}s; the targets are "
        "interleaved in every round. edgegw logs one JSON access-log line per request to a "
        "file (part of its chain).",
    ]


def _json_status(port: int, path: str, expected: Any) -> str | None:
    """
    L{None} when C{GET path} answers 200 with C{application/json} equal to C{expected},
    otherwise what was wrong.
    """
    try:
        status, headers, body = fetch(port, path)
    except (OSError, http.client.HTTPException) as e:
        return f"GET {path} failed: {e}"
    content_type = headers.get("content-type", "")
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if status != 200 or not content_type.startswith("application/json") or document != expected:
        shown = body[:200].decode("utf-8", "replace")
        return (
            f"GET {path} answered {status} ({content_type or 'no content-type'}) {shown!r}; "
            f"expected 200 with {json.dumps(expected, separators=(',', ':'))}"
        )
    return None


def start(
    stack: ExitStack,
    tmp: Path,
    fan: Sequence[Backend],
    settings: Settings,
    checkout: Checkout | None = None,
) -> list[Target]:
    """
    Start the backend, edgegw, edgegw at C{checkout} (if given) and the treq fan-out
    (stopped when C{stack} closes), check that each answers as expected, and return the
    targets in round order. A fan-out is returned with C{unavailable} set when its
    check, its start or its answer fails.

    @raise StartupError: If the backend does not start or answers wrongly.
    """
    port = free_port()
    process = stack.enter_context(
        started(
            backends.start("json", port, tmp / "backend.log", [(b.prefix, b.delay_ms) for b in fan])
        )
    )
    process.wait_for_port(port)
    for backend in fan:
        wrong = _json_status(port, backend.path, backend.document())
        if wrong is not None:
            raise StartupError(f"the json backend answers wrongly: {wrong}")
    targets = {
        key: Target(key, *TARGETS[key], port=port, pids=[process.pid], process=process)
        for key in (DIRECT, CAPACITY)
    }
    upstream = f"http://127.0.0.1:{port}"
    route = gateway.api(
        "dash",
        ROUTE_MATCH,
        [{"group": b.group, "upstream": upstream, "path": b.template} for b in fan],
    )
    edgegw = targets[EDGEGW] = Target(EDGEGW, *TARGETS[EDGEGW], port=free_port())
    start_edgegw(stack, tmp, "edgegw", edgegw, [route])
    if checkout is not None:
        description = (
            f"edgegw at {checkout.short} (--before {checkout.rev}), edgegw-api's configuration"
        )
        before = targets[BEFORE] = Target(BEFORE, TARGETS[BEFORE][0], description, port=free_port())
        start_edgegw(stack, tmp, "edgegw-before", before, [route], checkout=checkout)
    targets[TREQ] = _start_treq(stack, tmp, fan, upstream, settings.pool_size)
    merged = {b.group: b.document() for b in fan}
    for key in FAN_OUTS:
        target = targets.get(key)
        if target is not None and target.unavailable is None:
            target.unavailable = _json_status(target.port, ROUTE_PATH, merged)
    return [targets[key] for key in TARGETS if key in targets]


def _start_treq(
    stack: ExitStack, tmp: Path, fan: Sequence[Backend], upstream: str, pool_size: int
) -> Target:
    """Start L{bench.treq_fanout} (treq-agent-api) on the backend's paths."""
    target = Target(TREQ, *TARGETS[TREQ], port=free_port())
    argv = [
        sys.executable,
        "-m",
        treq_fanout.__name__,
        "--port",
        str(target.port),
        "--backend",
        upstream,
        *(f"--path={b.group}={b.template}" for b in fan),
        "--pool-size",
        str(pool_size),
    ]
    try:
        process = stack.enter_context(started(Process("treq fan-out", argv, tmp / "treq.log")))
        target.process = process
        process.wait_for_port(target.port)
    except StartupError as e:
        target.unavailable = f"did not start: {e}"
        return target
    target.pids = [process.pid]
    return target


@attrs.frozen
class BackendLoad:
    """
    The backend's CPU use during one wrk run (of any target).

    @ivar round: 1-based round number.
    @ivar target: The target's key.
    @ivar load: The load's label.
    @ivar cpu_seconds: The backend's utime+stime over the run.
    @ivar seconds: wrk's measured duration.
    """

    round: int
    target: str
    load: str
    cpu_seconds: float
    seconds: float

    @property
    def busy(self) -> float:
        """The backend's CPU time over the run's duration (1.0: one core, all the time)."""
        return round(self.cpu_seconds / self.seconds, 4) if self.seconds > 0 else 0.0


class Runner(InterleavedRunner):
    """
    Runs every (round, load, target) with wrk in interleaved order; a target that fails
    is marked unavailable and skipped from then on.

    @ivar samples: One per wrk run.
    @ivar backend_loads: The backend's CPU use during each of those runs.
    """

    def __init__(
        self,
        wrk_path: str,
        targets: Sequence[Target],
        fan: Sequence[Backend],
        settings: Settings,
    ) -> None:
        super().__init__(wrk_path, targets, settings.rounds, settings.warmup, settings.loads)
        self.settings = settings
        self.paths = {
            DIRECT: slowest(fan).path,
            **dict.fromkeys(FAN_OUTS, ROUTE_PATH),
            CAPACITY: fastest(fan).path,
        }
        self.backend_pids = next(t.pids for t in targets if t.key == DIRECT)
        self.samples: list[Sample] = []
        self.backend_loads: list[BackendLoad] = []

    def connections(self, target: Target, load: int) -> int:
        """wrk's connections for C{target} at C{load}."""
        return load * FAN_OUT if target.key == CAPACITY else load

    def url(self, target: Target) -> str:
        """The URL wrk loads on C{target}."""
        return f"http://127.0.0.1:{target.port}{self.paths[target.key]}"

    def measure(self, round_: int, load: int, target: Target) -> None:
        """One recorded wrk run of C{target} at C{load}, with the backend's CPU use."""
        label = load_label(load)
        backend_before = cpu_seconds(self.backend_pids)
        measured = self.load(target, load, self.settings.duration)
        if measured is None:
            return
        result, cpu = measured
        backend_cpu = cpu_seconds(self.backend_pids) - backend_before
        sample = Sample.of(round_, target.key, label, result, cpu)
        self.samples.append(sample)
        backend = BackendLoad(round_, target.key, label, backend_cpu, result.seconds)
        self.backend_loads.append(backend)
        say(
            f"round {round_}/{self.settings.rounds} {label:<5} {target.key} "
            f"{target.name:<16} {sample.progress()}  backend CPU {backend.busy:.0%}"
        )


@attrs.frozen
class LoadSummary:
    """
    The figures of one load that compare targets, medians of per-round values.

    @ivar load: The load's label.
    @ivar added_p50: Each fan-out target's p50 minus slowest-direct's, in seconds, by key.
    @ivar added_p99: The same for p99.
    @ivar backend_headroom: backend-capacity's req/s over L{FAN_OUT} times edgegw-api's.
    @ivar treq_ratio: treq-agent-api's CPU per request over edgegw-api's: how many times
        cheaper edgegw's fan-out is.
    @ivar before_ratio: edgegw-api's CPU per request over edgegw-before's (after over
        before).
    """

    load: str
    added_p50: dict[str, float | None]
    added_p99: dict[str, float | None]
    backend_headroom: float | None
    treq_ratio: float | None = None
    before_ratio: float | None = None


def summarize_load(samples: Sequence[Sample], load: str) -> LoadSummary:
    """The added latencies, the backend's headroom and the CPU ratios at C{load}."""

    def paired(
        target: str, ref: str, combine: Callable[[Sample, Sample], float | None]
    ) -> float | None:
        mine = [s for s in samples if s.target == target and s.payload == load]
        return report.per_round(mine, samples, ref, combine)

    return LoadSummary(
        load=load,
        added_p50={
            key: paired(key, DIRECT, lambda mine, ref: round(mine.p50 - ref.p50, 9))
            for key in FAN_OUTS
        },
        added_p99={
            key: paired(key, DIRECT, lambda mine, ref: round(mine.p99 - ref.p99, 9))
            for key in FAN_OUTS
        },
        backend_headroom=paired(
            CAPACITY,
            EDGEGW,
            lambda mine, ref: round(mine.rps / (FAN_OUT * ref.rps), 3) if ref.rps > 0 else None,
        ),
        treq_ratio=report.cpu_ratio(samples, TREQ, EDGEGW, load),
        before_ratio=report.cpu_ratio(samples, EDGEGW, BEFORE, load),
    )


def median_busy(loads: Sequence[BackendLoad], target: str, load: str) -> float | None:
    """The backend's median CPU use during C{target}'s runs at C{load}."""
    busy = [b.busy for b in loads if b.target == target and b.load == load]
    return statistics.median(busy) if busy else None


def _signed_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else "+"
    return sign + report.format_duration(abs(seconds))


def table(runner: Runner, summaries: Sequence[report.Summary], loads: Sequence[LoadSummary]) -> str:
    """
    The results of C{runner} as a text table: one block of rows per load, one row per
    target, the added latency on the fan-outs' rows; unavailable targets get a row saying
    why.
    """
    header = (
        "load",
        "target",
        "conns",
        "req/s",
        "p50",
        "p99",
        "added p50",
        "added p99",
        "CPU µs/req",
        "backend CPU",
        "errors",
    )
    rows: list[tuple[str, ...] | str] = []
    # Unavailable rows line up with the first two columns.
    widths = (
        max(len(header[0]), *(len(load_label(load)) for load in runner.settings.loads)),
        max(len(header[1]), *(len(f"{t.key} {t.name}") for t in runner.targets)),
    )
    for load in runner.settings.loads:
        label = load_label(load)
        summary = next(s for s in loads if s.load == label)
        for target in runner.targets:
            name = f"{target.key} {target.name}"
            if target.unavailable is not None:
                rows.append(report.unavailable_row((label, name), widths, target.unavailable))
                continue
            found = [s for s in summaries if s.target == target.key and s.payload == label]
            if not found:
                continue
            s = found[0]
            added = target.key in FAN_OUTS
            busy = median_busy(runner.backend_loads, target.key, label)
            rows.append(
                (
                    label,
                    name,
                    str(runner.connections(target, load)),
                    f"{s.rps:,.0f}",
                    report.format_duration(s.p50),
                    report.format_duration(s.p99),
                    _signed_duration(summary.added_p50.get(target.key)) if added else "-",
                    _signed_duration(summary.added_p99.get(target.key)) if added else "-",
                    "-" if s.cpu_us_per_request is None else f"{s.cpu_us_per_request:.1f}",
                    "-" if busy is None else f"{busy:.0%}",
                    str(s.errors),
                )
            )
    return report.render(header, rows)


def cpu_table(
    runner: Runner,
    summaries: Sequence[report.Summary],
    loads: Sequence[LoadSummary],
    checkout: Checkout | None,
) -> str:
    """
    CPU µs per fan-out request side by side, by load: edgegw-api, edgegw-before (with
    C{--before}) and the change, treq-agent-api and how many times cheaper edgegw is.
    """
    names = {target.key: f"{target.key} {target.name}" for target in runner.targets}

    def cpu(key: str, load: str) -> str:
        found = [s for s in summaries if s.target == key and s.payload == load]
        value = found[0].cpu_us_per_request if found else None
        return "-" if value is None else f"{value:.1f}"

    header: tuple[str, ...] = ("load", names[EDGEGW])
    if checkout is not None:
        header += (names[BEFORE], "after vs before")
    header += (names[TREQ], "treq / edgegw", f"(>= {MIN_TREQ_RATIO:g}x)")
    rows: list[tuple[str, ...] | str] = []
    for summary in loads:
        row: tuple[str, ...] = (summary.load, cpu(EDGEGW, summary.load))
        if checkout is not None:
            row += (cpu(BEFORE, summary.load), report.format_change(summary.before_ratio))
        ratio = summary.treq_ratio
        verdict = "-" if ratio is None else "OK" if ratio >= MIN_TREQ_RATIO else "UNDER"
        row += (
            cpu(TREQ, summary.load),
            "-" if ratio is None else f"{ratio:.2f}x",
            verdict,
        )
        rows.append(row)
    title = "CPU µs PER FAN-OUT REQUEST, same run (medians; ratios: medians of same-round ratios)"
    if checkout is not None:
        title += f"; before: --before {checkout.rev} = {checkout.short}"
    return title + "\n" + report.render(header, rows, left=1)


def headroom_line(loads: Sequence[LoadSummary]) -> str:
    """One line with the backend's headroom at each load."""
    parts = [
        f"{s.load} {s.backend_headroom:.1f}x"
        for s in loads
        if s.backend_headroom is not None and math.isfinite(s.backend_headroom)
    ]
    return f"backend headroom (capacity req/s / ({FAN_OUT} x edgegw-api req/s), same round): " + (
        ", ".join(parts) or "-"
    )


def run(settings: Settings) -> int:
    """
    Run the whole benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if the backend could not be started or edgegw
        could not be measured.
    """
    wrk_path = ensure_wrk()
    busy = warn_if_busy()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    fan = fan_out(settings)
    checkout: Checkout | None = None
    with scratch("edgegw-bench-api-", settings.keep_tmp) as tmp, ExitStack() as stack:
        say(f"bench: starting the backend, edgegw and the treq fan-out in {tmp}")
        try:
            if settings.before is not None:
                checkout = stack.enter_context(worktree(tmp, settings.before))
            targets = start(stack, tmp, fan, settings, checkout)
        except StartupError as e:
            say(f"bench: {e}")
            return 1
        announce(targets)
        runner = Runner(wrk_path, targets, fan, settings)
        runner.run()
    samples = runner.samples
    summaries = report.summarize(samples)
    loads = [summarize_load(samples, load_label(load)) for load in settings.loads]
    print()
    print(table(runner, summaries, loads))
    print()
    print(cpu_table(runner, summaries, loads, checkout))
    print()
    print(headroom_line(loads))
    print()
    for note in notes(settings, fan):
        print(f"* {note}")
    path = report.write_json(
        "api",
        {
            "benchmark": "api",
            "started": started_at,
            "settings": {**attrs.asdict(settings), "loads": settings.loads},
            "machine": {**report.machine(), "busy_before_start": round(busy, 3)},
            "versions": {"wrk": version([wrk_path, "-v"])},
            "backends": [
                {**attrs.asdict(b), "path": b.path, "document": b.document()} for b in fan
            ],
            "route": {"match": ROUTE_MATCH, "path": ROUTE_PATH},
            "targets": [
                {
                    "key": target.key,
                    "name": target.name,
                    "description": target.description,
                    "url": runner.url(target),
                    "connections": {
                        load_label(load): runner.connections(target, load)
                        for load in settings.loads
                    },
                    "unavailable": target.unavailable,
                }
                for target in targets
            ],
            "samples": [
                report.as_load({**attrs.asdict(s), "cpu_us_per_request": s.cpu_us_per_request})
                for s in samples
            ],
            "backend_cpu": [{**attrs.asdict(b), "busy": b.busy} for b in runner.backend_loads],
            "summary": [
                {
                    key: value
                    for key, value in report.as_load(attrs.asdict(s)).items()
                    if key not in ("vs_direct", "vs_nginx")
                }
                | {"backend_busy": median_busy(runner.backend_loads, s.target, s.payload)}
                for s in summaries
            ],
            "added": [attrs.asdict(s) for s in loads],
            "min_treq_ratio": MIN_TREQ_RATIO,
            "before": None
            if checkout is None
            else {"rev": checkout.rev, "commit": checkout.commit, "target": BEFORE},
            "notes": notes(settings, fan),
        },
    )
    print(f"\nresults: {path}")
    return 0 if all(target.unavailable is None for target in targets) else 1
