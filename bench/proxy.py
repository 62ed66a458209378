"""
C{python -m bench proxy}: proxy throughput, latency and CPU per request, side by side.

Every target is started once; then each round loads, for each payload, every target in
turn (a, b, c, d, e) with the same wrk settings, so that the targets are interleaved and
slow drifts of the machine hit them all alike. The report gives medians over the rounds.

With C{--before REV}, target f is edgegw at git revision REV with d's configuration,
measured right after d in every round, and the report compares d's CPU per request with
f's (the issue's limit: no more than L{MAX_CPU_GROWTH} worse).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import attrs

from bench import report, wrk
from bench.before import Checkout, worktree
from bench.processes import BUSY_WARNING, StartupError, scratch, warn_if_busy
from bench.report import Sample
from bench.targets import BEFORE, PAYLOADS, TARGETS, Target, announce, start_targets
from bench.tools import Tools, ensure_tools, version

EDGEGW = "d"
"""The letter of edgegw's whole-chain reverse-proxy target, which C{--before} compares."""
MAX_CPU_GROWTH = 0.05
"""How much more CPU per request d may use than f (the issue's limit): 5%."""


@attrs.frozen
class Settings:
    """
    The options of one proxy benchmark run.

    @ivar duration: Seconds per wrk run.
    @ivar connections: wrk's concurrent connections (and the proxies' pool sizes).
    @ivar rounds: How many times each target and payload is measured.
    @ivar warmup: Seconds of unrecorded load per target and payload before round 1.
    @ivar targets: The letters of the targets to run.
    @ivar keep_tmp: Keep the temporary directory (configurations and logs).
    @ivar before: A git revision of edgegw to run as target f, with d's configuration
        (L{None}: no target f).
    """

    duration: int = 10
    connections: int = 50
    rounds: int = 3
    warmup: int = 1
    targets: str = "abcde"
    keep_tmp: bool = False
    before: str | None = None


def notes(settings: Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    cpus = os.cpu_count() or 0
    return [
        f"No CPU pinning: wrk (1 thread), the process under test and, for proxies, the "
        f"backend nginx all share this machine's {cpus} core(s), so they compete for CPU; "
        "compare targets within a run, not across machines.",
        "Both nginx instances run with worker_processes 1 (one serving process each, as "
        "edgegw and the Agent proxy are one process each).",
        "CPU µs/req: utime+stime of the process under test over the wrk run (nginx: its "
        "worker; the direct row: the backend's worker), divided by the requests wrk "
        "completed. A proxy's figure excludes the backend's CPU.",
        f"Medians over {settings.rounds} round(s) of {settings.duration}s at "
        f"{settings.connections} connections; ratios are medians of per-round ratios "
        "against the same round's run of a (direct) and b (nginx proxy).",
        "edgegw logs one JSON access-log line per request (part of its chain) to a file; "
        "nginx and the Agent proxy log nothing.",
        *(
            [
                f"f edgegw-before: edgegw at --before {settings.before} (a git worktree, "
                "PYTHONPATH set to it) with d's configuration, right after d in every round. "
                "change: the median over rounds of d's CPU µs/req over f's in the same round "
                f"and payload, minus 1; the issue's limit is +{MAX_CPU_GROWTH:.0%}.",
            ]
            if settings.before is not None
            else []
        ),
    ]


@attrs.frozen
class BeforeAfter:
    """
    edgegw's whole-chain CPU per request (d) against the same at C{--before} (f).

    @ivar payload: The payload's name.
    @ivar after: d's CPU µs per request, median over rounds.
    @ivar before: f's, likewise.
    @ivar ratio: d's over f's in the same round, median over rounds.
    """

    payload: str
    after: float | None
    before: float | None
    ratio: float | None

    @property
    def within_limit(self) -> bool | None:
        """Whether d uses no more than L{MAX_CPU_GROWTH} more than f."""
        return None if self.ratio is None else self.ratio <= 1 + MAX_CPU_GROWTH


def before_after(
    samples: Sequence[Sample], summaries: Sequence[report.Summary]
) -> list[BeforeAfter]:
    """d against f for every payload both were measured at."""

    def cpu(key: str, payload: str) -> float | None:
        found = [s for s in summaries if s.target == key and s.payload == payload]
        return found[0].cpu_us_per_request if found else None

    return [
        BeforeAfter(
            payload.name,
            cpu(EDGEGW, payload.name),
            cpu(BEFORE, payload.name),
            report.cpu_ratio(samples, EDGEGW, BEFORE, payload.name),
        )
        for payload in PAYLOADS
    ]


def before_after_table(checkout: Checkout, comparisons: Sequence[BeforeAfter]) -> str:
    """The before/after comparison of CPU µs per request as a titled text table."""
    header = (
        "payload",
        f"{EDGEGW} edgegw-proxy",
        f"{BEFORE} edgegw-before",
        "after vs before",
        f"(<= +{MAX_CPU_GROWTH:.0%})",
    )
    rows: list[tuple[str, ...] | str] = []
    for c in comparisons:
        rows.append(
            (
                c.payload,
                "-" if c.after is None else f"{c.after:.1f}",
                "-" if c.before is None else f"{c.before:.1f}",
                report.format_change(c.ratio),
                {None: "-", True: "OK", False: "OVER"}[c.within_limit],
            )
        )
    title = (
        f"CPU µs PER REQUEST, WHOLE CHAIN, BEFORE/AFTER: this tree ({EDGEGW}) vs --before "
        f"{checkout.rev} = {checkout.short} ({BEFORE}), same run and configuration "
        "(medians; change: median of same-round ratios)"
    )
    return title + "\n" + report.render(header, rows, left=1)


def _measure(
    tools: Tools, target: Target, url: str, settings: Settings
) -> tuple[wrk.WrkResult, float]:
    return wrk.measure(tools.wrk, url, settings.connections, settings.duration, target.pids)


def run_rounds(
    tools: Tools, targets: list[Target], settings: Settings, progress: bool = True
) -> list[Sample]:
    """
    Warm every target up, then measure every (round, payload, target) in interleaved
    order; a target that fails is marked unavailable and skipped from then on.
    """
    samples = []

    def say(text: str) -> None:
        if progress:
            print(text, file=sys.stderr, flush=True)

    if settings.warmup > 0:
        say(f"warm-up: {settings.warmup}s per target and payload")
        for payload in PAYLOADS:
            for target in targets:
                if target.unavailable is None:
                    try:
                        wrk.run(
                            tools.wrk, target.url(payload), settings.connections, settings.warmup
                        )
                    except wrk.WrkError as e:
                        target.unavailable = f"wrk failed during warm-up: {e}"
                    target.check_alive()
    for round_ in range(1, settings.rounds + 1):
        for payload in PAYLOADS:
            for target in targets:
                if target.unavailable is not None:
                    continue
                try:
                    result, cpu = _measure(tools, target, target.url(payload), settings)
                except wrk.WrkError as e:
                    target.unavailable = f"wrk failed: {e}"
                    continue
                target.check_alive()
                sample = Sample.of(round_, target.key, payload.name, result, cpu)
                samples.append(sample)
                say(
                    f"round {round_}/{settings.rounds} {payload.name:<10} {target.key} "
                    f"{target.name:<14} {sample.progress()}"
                )
    return samples


def run(settings: Settings) -> int:
    """
    Run the whole benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if the backend could not be started.
    """
    tools = ensure_tools()
    busy = warn_if_busy(BUSY_WARNING)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    checkout: Checkout | None = None
    with scratch("edgegw-bench-proxy-", settings.keep_tmp) as tmp, ExitStack() as stack:
        print(f"bench: starting targets in {tmp}", file=sys.stderr, flush=True)
        try:
            if settings.before is not None:
                checkout = stack.enter_context(worktree(tmp, settings.before))
            targets = start_targets(
                stack, tools, tmp, settings.targets, settings.connections, checkout
            )
        except StartupError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 1
        announce(targets)
        samples = run_rounds(tools, targets, settings)
    summaries = report.summarize(samples)
    names = {target.key: target.name for target in targets}
    unavailable = {
        target.key: target.unavailable.splitlines()[0]
        for target in targets
        if target.unavailable is not None
    }
    payloads = [payload.name for payload in PAYLOADS]
    print()
    print(report.table(summaries, names, unavailable, payloads))
    print()
    comparisons = before_after(samples, summaries) if checkout is not None else []
    if checkout is not None:
        print(before_after_table(checkout, comparisons))
        print()
    for note in notes(settings):
        print(f"* {note}")
    path = report.write_json(
        "proxy",
        {
            "benchmark": "proxy",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**report.machine(), "busy_before_start": round(busy, 3)},
            "versions": {
                "wrk": version([tools.wrk, "-v"]),
                "nginx": version([tools.nginx, "-v"]),
            },
            "targets": [
                {
                    "key": target.key,
                    "name": target.name,
                    "description": target.description,
                    "unavailable": target.unavailable,
                }
                for target in targets
            ],
            "payloads": {payload.name: len(payload.body) for payload in PAYLOADS},
            "samples": [
                {**attrs.asdict(sample), "cpu_us_per_request": sample.cpu_us_per_request}
                for sample in samples
            ],
            "summary": [attrs.asdict(summary) for summary in summaries],
            "before": None if checkout is None else before_json(checkout, comparisons),
            "notes": notes(settings),
        },
    )
    print(f"\nresults: {path}")
    return 0


def before_json(checkout: Checkout, comparisons: Sequence[BeforeAfter]) -> dict[str, Any]:
    """C{--before}'s revision and the comparison, for the JSON results."""
    return {
        "rev": checkout.rev,
        "commit": checkout.commit,
        "target": BEFORE,
        "compared_with": EDGEGW,
        "max_cpu_growth": MAX_CPU_GROWTH,
        "cpu_us_per_request": [
            {**attrs.asdict(c), "within_limit": c.within_limit} for c in comparisons
        ],
    }


def target_letters(text: str) -> str:
    """
    Validate a C{--targets} value such as C{abce}; returns the letters in round order.

    @raise ValueError: On a letter that names no target.
    """
    letters = "".join(sorted(set(text.replace(",", "").lower())))
    unknown = [letter for letter in letters if letter not in TARGETS]
    if unknown or not letters:
        raise ValueError(f"targets are letters among {''.join(TARGETS)}, got {text!r}")
    return letters
