"""
Side-by-side runs of edgegw variants: one edgegw process per variant (configurations
that differ in one feature), each serving the same URL, loaded with wrk in interleaved
rounds. Used by C{python -m bench authz}, C{python -m bench telemetry} and
C{python -m bench session}.

Variant C{a} is the baseline: every other variant's req/s is compared with C{a}'s in the
same round (C{vs a}), and so is its CPU per request (C{+CPU µs/req}: what the feature
costs the gateway per request).
"""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, report, wrk
from bench.processes import StartupError, scratch, warn_if_busy
from bench.report import Sample, Summary
from bench.rounds import InterleavedRunner, say
from bench.targets import Target, announce, start_edgegw
from bench.tools import version
from tests.support.processes import free_port

BASELINE = "a"
"""The key of the variant the others are compared with."""


@attrs.frozen
class Settings:
    """
    The options shared by variant benchmarks.

    @ivar duration: Seconds per wrk run.
    @ivar connections: wrk's concurrent connections.
    @ivar rounds: How many times each variant is measured.
    @ivar warmup: Seconds of unrecorded load per variant before round 1.
    @ivar keep_tmp: Keep the temporary directory (configurations and logs).
    """

    duration: int = 10
    connections: int = 50
    rounds: int = 3
    warmup: int = 1
    keep_tmp: bool = False


@attrs.frozen
class Variant:
    """
    One edgegw configuration under test.

    @ivar key: Its letter, also its position in each round (C{a}: the baseline).
    @ivar name: Its short name.
    @ivar description: One line saying what it is.
    @ivar routes: Its routes (every variant serves the same URL).
    @ivar resources: Its other configuration documents (Policies, a Telemetry).
    @ivar status: The status every request is expected to get.
    @ivar body: The body every request is expected to get.
    @ivar headers: Request headers (C{(name, value)}) sent with every request, the
        check's and wrk's (a session cookie, the User-Agent it is bound to).
    @ivar recheck: Ask for the URL once more after each recorded run (after its CPU
        reading) and, when the answer is no longer the expected one, drop the run and
        mark the variant unavailable: for an answer that rests on state that could lapse
        during the run (a session), which wrk alone would not notice (it counts a
        redirect as a success).
    """

    key: str
    name: str
    description: str
    routes: Sequence[gateway.RouteConfig]
    resources: Sequence[Mapping[str, Any]] = ()
    status: int = 200
    body: bytes = b""
    headers: Sequence[tuple[str, str]] = ()
    recheck: bool = False

    def target(self) -> Target:
        """A target for it, on a free port, not started yet."""
        return Target(self.key, self.name, self.description, port=free_port())

    def expect(self, port: int, path: str) -> str | None:
        """
        C{GET path} from 127.0.0.1:C{port} once, with L{headers}.

        @return: L{None} if it answered L{status} with exactly L{body}, else what was
            wrong (with where a redirect pointed).
        """
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", path, headers=dict(self.headers))
            response = connection.getresponse()
            got = response.read()
        except (OSError, http.client.HTTPException) as e:
            return f"GET {path} failed: {e}"
        finally:
            connection.close()
        if response.status == self.status and got == self.body:
            return None
        location = response.getheader("Location")
        to = f" to {location}" if location else ""
        shown = f" {got[:100]!r}" if response.status != self.status else ""
        return (
            f"GET {path} answered {response.status}{to} with {len(got)} bytes{shown} "
            f"(expected {self.status} with {len(self.body)} bytes)"
        )


def start(
    stack: ExitStack, tmp: Path, variants: Sequence[Variant], path: str, prefix: str
) -> list[Target]:
    """
    Check and start one edgegw per variant (stopped when C{stack} closes; configuration
    in C{tmp/PREFIX-KEY}), and ask each for C{path} once: a variant that edgegw refuses,
    that does not start or that answers otherwise than expected is returned with
    C{unavailable} set.
    """
    targets = []
    for variant in variants:
        target = variant.target()
        start_edgegw(
            stack, tmp, f"{prefix}-{variant.key}", target, variant.routes, variant.resources
        )
        if target.unavailable is None:
            target.unavailable = variant.expect(target.port, path)
        targets.append(target)
    return targets


def unexpected(result: wrk.WrkResult, status: int) -> int:
    """
    wrk's errors for a run whose every response should have C{status}: socket errors,
    plus the responses of the other class (non-2xx/3xx ones when C{status} is 2xx/3xx;
    when an error status is expected, the responses that were not errors).
    """
    if status < 400:
        return result.errors
    return sum(result.socket_errors.values()) + max(0, result.requests - result.non_2xx_3xx)


AfterRun = Callable[[wrk.WrkResult], dict[str, Any]]
"""
Called after each wrk run of a variant, before its CPU time is read again (so that work
the run left behind, such as spans still queued for export, is charged to the run):
returns figures to record with the run's sample.
"""


@attrs.frozen
class Record:
    """
    One recorded wrk run: its sample and the figures its L{AfterRun} returned.
    """

    sample: Sample
    figures: dict[str, Any]


class Runner(InterleavedRunner):
    """
    Runs every (round, variant) with wrk in interleaved order, at one load; a variant
    that fails is marked unavailable and skipped from then on.

    @ivar records: One per recorded wrk run.
    """

    def __init__(
        self,
        wrk_path: str,
        variants: Sequence[Variant],
        targets: Sequence[Target],
        path: str,
        settings: Settings,
        after: Mapping[str, AfterRun] | None = None,
    ) -> None:
        super().__init__(
            wrk_path, targets, settings.rounds, settings.warmup, [settings.connections]
        )
        self.variants = {variant.key: variant for variant in variants}
        self.path = path
        self.settings = settings
        self.after = dict(after or {})
        self.records: list[Record] = []

    def url(self, target: Target) -> str:
        """The URL wrk loads on C{target}, with the variant's request headers."""
        headers = [f"{name}: {value}" for name, value in self.variants[target.key].headers]
        return wrk.Url(f"http://127.0.0.1:{target.port}{self.path}", headers)

    def warmed(self, target: Target, result: wrk.WrkResult) -> None:
        """Run the variant's L{AfterRun}, if any, on its warm-up too (figures unused)."""
        after = self.after.get(target.key)
        if after is not None:
            after(result)

    def measure(self, round_: int, load: int, target: Target) -> None:
        """One recorded wrk run of C{target}, its L{AfterRun} before the CPU reading."""
        figures: dict[str, Any] = {}
        after = self.after.get(target.key)

        def settle(result: wrk.WrkResult) -> None:
            if after is not None:
                figures.update(after(result))

        measured = self.load(target, load, self.settings.duration, settle)
        if measured is None:
            return
        variant = self.variants[target.key]
        if variant.recheck:
            wrong = variant.expect(target.port, self.path)
            if wrong is not None:
                target.unavailable = f"after round {round_}'s run: {wrong}"
                return
        result, cpu = measured
        sample = Sample.of(round_, target.key, f"c{load}", result, cpu)
        sample = attrs.evolve(sample, errors=unexpected(result, variant.status))
        self.records.append(Record(sample, figures))
        extra = "".join(f"  {key} {value}" for key, value in figures.items())
        say(
            f"round {round_}/{self.rounds} {target.key} {target.name:<16} "
            f"{sample.progress()}{extra}"
        )

    @property
    def samples(self) -> list[Sample]:
        """The samples of every recorded run."""
        return [record.sample for record in self.records]

    def figures(self, key: str) -> list[dict[str, Any]]:
        """The figures recorded for variant C{key}, one per round."""
        return [record.figures for record in self.records if record.sample.target == key]


@attrs.frozen
class Run:
    """
    A finished run: what was measured, and when.

    @ivar started: UTC start time (ISO 8601).
    @ivar busy: How busy the CPUs were before it started (0 to 1).
    @ivar targets: The variants' targets, unavailable ones included.
    @ivar runner: The runner, with every recorded wrk run.
    @ivar summaries: Medians over the rounds, per variant.
    """

    started: str
    busy: float
    targets: list[Target]
    runner: Runner
    summaries: list[Summary]

    def extra_cpu(self, key: str) -> float | None:
        """
        Variant C{key}'s CPU µs/req minus the baseline's, same round, median over rounds.
        """
        samples = self.runner.samples
        mine = [s for s in samples if s.target == key]

        def difference(sample: Sample, baseline: Sample) -> float | None:
            mine_cpu, base_cpu = sample.cpu_us_per_request, baseline.cpu_us_per_request
            return None if mine_cpu is None or base_cpu is None else mine_cpu - base_cpu

        return report.per_round(mine, samples, BASELINE, difference)


Prepare = Callable[[ExitStack, Path], tuple[list[Variant], list[Target], Mapping[str, AfterRun]]]
"""
Starts a benchmark's processes (stopped when the stack closes) in the temporary
directory: returns the variants, their targets and the L{AfterRun} of each variant that
has one.
"""


def measure(
    name: str, settings: Settings, wrk_path: str, path: str, prepare: Prepare
) -> Run | None:
    """
    Prepare the variants, load them in interleaved rounds and summarize.

    @return: The run, or L{None} if C{prepare} raised L{StartupError} (said on stderr).
    """
    busy = warn_if_busy()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with scratch(f"edgegw-bench-{name}-", settings.keep_tmp) as tmp, ExitStack() as stack:
        say(f"bench: starting the variants in {tmp}")
        try:
            variants, targets, after = prepare(stack, tmp)
        except StartupError as e:
            say(f"bench: {e}")
            return None
        announce(targets)
        runner = Runner(wrk_path, variants, targets, path, settings, after)
        runner.run()
    summaries = report.summarize(runner.samples, direct=BASELINE, nginx=BASELINE)
    return Run(started, busy, targets, runner, summaries)


Column = tuple[str, Callable[[str], str]]
"""An extra table column: its header, and its cell for a variant's key."""


def table(run: Run, columns: Sequence[Column] = ()) -> str:
    """
    The results as a text table, one row per variant; unavailable variants get a row
    saying why. C{columns} are added after the common ones.
    """
    header = (
        "variant",
        "req/s",
        f"vs {BASELINE}",
        "p50",
        "p99",
        "CPU µs/req",
        "+CPU µs/req",
        "errors",
        *(title for title, _ in columns),
    )
    width = max(len(header[0]), *(len(f"{t.key} {t.name}") for t in run.targets))
    summaries = {summary.target: summary for summary in run.summaries}
    rows: list[tuple[str, ...] | str] = []
    for target in run.targets:
        label = f"{target.key} {target.name}"
        s = summaries.get(target.key)
        if target.unavailable is not None:
            rows.append(report.unavailable_row((label,), (width,), target.unavailable))
        if target.unavailable is not None or s is None:
            continue
        extra = None if target.key == BASELINE else run.extra_cpu(target.key)
        rows.append(
            (
                label,
                f"{s.rps:,.0f}",
                "-" if s.vs_direct is None or target.key == BASELINE else f"{s.vs_direct:.2f}x",
                report.format_duration(s.p50),
                report.format_duration(s.p99),
                "-" if s.cpu_us_per_request is None else f"{s.cpu_us_per_request:.1f}",
                "-" if extra is None else f"{extra:+.1f}",
                str(s.errors),
                *(cell(target.key) for _, cell in columns),
            )
        )
    return report.render(header, rows, left=1)


def common_notes(settings: Settings) -> list[str]:
    """The notes every variant benchmark prints under its table."""
    cpus = os.cpu_count() or 0
    return [
        f"Medians over {settings.rounds} round(s) of {settings.duration}s at "
        f"{settings.connections} connections (wrk -t1 --latency); the variants are "
        "interleaved in every round, one edgegw process each, with its whole chain and a "
        "JSON access log to a file.",
        f"vs {BASELINE}: req/s over variant {BASELINE}'s in the same round; +CPU µs/req: "
        f"CPU µs/req minus {BASELINE}'s in the same round (medians over rounds): what the "
        "variant's feature costs the gateway per request.",
        "CPU µs/req: the edgegw process's utime+stime (all its threads) over the wrk run, "
        "divided by the requests wrk completed.",
        f"No CPU pinning: wrk and the processes under test share this machine's {cpus} "
        "core(s); compare variants within a run, not across machines.",
    ]


def print_results(
    run: Run, columns: Sequence[Column], lines: Sequence[str], notes: Sequence[str]
) -> None:
    """Print the table, then C{lines} (the benchmark's own figures), then the notes."""
    print()
    print(table(run, columns))
    if lines:
        print()
        for line in lines:
            print(line)
    print()
    for note in notes:
        print(f"* {note}")


def write_results(
    name: str,
    run: Run,
    settings: Settings,
    wrk_path: str,
    variants: Sequence[Variant],
    notes: Sequence[str],
    versions: Mapping[str, str],
    extra: Mapping[str, Any],
) -> Path:
    """
    Write the run to C{bench/results/NAME-<timestamp>.json}, with the C{versions} of
    programs other than wrk and the benchmark's own C{extra} members, and say where.
    """
    by_key = {variant.key: variant for variant in variants}
    path = report.write_json(
        name,
        {
            "benchmark": name,
            "started": run.started,
            "settings": attrs.asdict(settings),
            "machine": {**report.machine(), "busy_before_start": round(run.busy, 3)},
            "versions": {"wrk": version([wrk_path, "-v"]), **versions},
            "url_path": run.runner.path,
            "variants": [
                {
                    "key": target.key,
                    "name": target.name,
                    "description": target.description,
                    "expected_status": by_key[target.key].status,
                    "request_headers": [name for name, _ in by_key[target.key].headers],
                    "routes": [attrs.asdict(route) for route in by_key[target.key].routes],
                    "resources": [dict(document) for document in by_key[target.key].resources],
                    "unavailable": target.unavailable,
                }
                for target in run.targets
            ],
            "samples": [
                report.as_load(
                    {
                        **attrs.asdict(record.sample),
                        "cpu_us_per_request": record.sample.cpu_us_per_request,
                        **record.figures,
                    }
                )
                for record in run.runner.records
            ],
            "summary": [
                {
                    key: value
                    for key, value in report.as_load(attrs.asdict(summary)).items()
                    if key not in ("vs_direct", "vs_nginx")
                }
                | {
                    f"vs_{BASELINE}": summary.vs_direct,
                    "extra_cpu_us_per_request": run.extra_cpu(summary.target),
                }
                for summary in run.summaries
            ],
            **extra,
            "notes": list(notes),
        },
    )
    print(f"\nresults: {path}")
    return path


def exit_status(run: Run) -> int:
    """0 when every variant was measured, else 1."""
    return 0 if all(target.unavailable is None for target in run.targets) else 1


def target_verdict(
    run: Run, label: str, target: float
) -> tuple[float | None, bool | None, list[str]]:
    """
    Variant b's req/s over a's (median of same-round ratios), whether it reaches
    C{target}, and the lines saying so (C{label} names the pair, e.g. C{"b session vs a
    public"}).
    """
    summaries = {summary.target: summary for summary in run.summaries}
    a, b = summaries.get("a"), summaries.get("b")
    if a is None or b is None or b.vs_direct is None:
        return None, None, [f"{label}: not measured (target: at least {target:g}x)"]
    ratio = b.vs_direct
    reached = ratio >= target
    lines = [
        f"{label}: {ratio:.2f}x a's req/s (target: at least {target:g}x): "
        + ("OK" if reached else "BELOW TARGET")
    ]
    if a.cpu_us_per_request and b.cpu_us_per_request:
        lines.append(
            f"  CPU µs/req a/b: {a.cpu_us_per_request / b.cpu_us_per_request:.2f}x "
            "(the req/s ratio the gateway's own CPU alone would give)"
        )
    return ratio, reached, lines
