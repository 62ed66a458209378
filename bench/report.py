"""
Turning wrk runs into the proxy benchmark's table and JSON results.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench.wrk import WrkResult

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where result files go (git-ignored)."""


@attrs.frozen
class Sample:
    """
    One wrk run against one target and payload.

    @ivar round: 1-based round number.
    @ivar target: The target's letter.
    @ivar payload: The payload's name.
    @ivar requests: Requests wrk completed.
    @ivar rps: Requests per second.
    @ivar p50: Median latency in seconds.
    @ivar p99: 99th-percentile latency in seconds.
    @ivar cpu_seconds: utime+stime of the target's processes over the run.
    @ivar errors: wrk's socket errors plus non-2xx/3xx responses.
    """

    round: int
    target: str
    payload: str
    requests: int
    rps: float
    p50: float
    p99: float
    cpu_seconds: float
    errors: int

    @classmethod
    def of(
        cls, round: int, target: str, payload: str, result: WrkResult, cpu_seconds: float
    ) -> Sample:
        """
        The sample of one wrk run (C{result}) over which the target used C{cpu_seconds}.
        """
        return cls(
            round=round,
            target=target,
            payload=payload,
            requests=result.requests,
            rps=result.rps,
            p50=result.latency[50.0],
            p99=result.latency[99.0],
            cpu_seconds=cpu_seconds,
            errors=result.errors,
        )

    @property
    def cpu_us_per_request(self) -> float | None:
        """CPU microseconds per completed request."""
        return self.cpu_seconds / self.requests * 1e6 if self.requests else None

    def progress(self) -> str:
        """
        Its figures on one line, for the progress printed while a benchmark runs.
        """
        cpu = self.cpu_us_per_request
        cpu_text = "-" if cpu is None else f"{cpu:.1f}µs CPU/req"
        errors = f"  {self.errors} errors" if self.errors else ""
        return (
            f"{self.rps:>10,.0f} req/s  p50 {format_duration(self.p50)}  "
            f"p99 {format_duration(self.p99)}  {cpu_text}{errors}"
        )


@attrs.frozen
class Summary:
    """
    Medians over the rounds for one target and payload.

    Ratios are the medians of per-round ratios (each against the same round's run of
    the reference), so that drift between rounds cancels out.
    """

    target: str
    payload: str
    rounds: int
    rps: float
    vs_direct: float | None
    vs_nginx: float | None
    p50: float
    p99: float
    cpu_us_per_request: float | None
    errors: int


def per_round(
    samples: Sequence[Sample],
    all_samples: Sequence[Sample],
    ref: str,
    combine: Callable[[Sample, Sample], float | None],
) -> float | None:
    """
    The median over C{samples} of C{combine(sample, reference)}, the reference being the
    sample of target C{ref} in C{all_samples} from the same round and payload; pairs
    without a reference, or for which C{combine} gives L{None}, are left out.
    """
    values = []
    for sample in samples:
        for other in all_samples:
            if (
                other.target == ref
                and other.payload == sample.payload
                and other.round == sample.round
            ):
                value = combine(sample, other)
                if value is not None:
                    values.append(value)
    return statistics.median(values) if values else None


def cpu_ratio(samples: Sequence[Sample], target: str, ref: str, payload: str) -> float | None:
    """
    The median over rounds of C{target}'s CPU µs per request over C{ref}'s in the same
    round, at C{payload} (a payload, or an api load); L{None} without a pair.
    """

    def ratio(mine: Sample, other: Sample) -> float | None:
        cpu, ref_cpu = mine.cpu_us_per_request, other.cpu_us_per_request
        if cpu is None or ref_cpu is None or ref_cpu <= 0:
            return None
        return round(cpu / ref_cpu, 4)

    mine = [s for s in samples if s.target == target and s.payload == payload]
    return per_round(mine, samples, ref, ratio)


def format_change(ratio: float | None) -> str:
    """A ratio as a signed change in percent (C{1.026}: C{+2.6%}), C{-} for L{None}."""
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def _ratio(samples: Sequence[Sample], all_samples: Sequence[Sample], ref: str) -> float | None:
    return per_round(
        samples,
        all_samples,
        ref,
        lambda sample, other: sample.rps / other.rps if other.rps > 0 else None,
    )


def summarize(samples: Sequence[Sample], direct: str = "a", nginx: str = "b") -> list[Summary]:
    """
    One L{Summary} per (target, payload), in the order the samples first appear.
    """
    keys: dict[tuple[str, str], None] = {}
    for sample in samples:
        keys[(sample.target, sample.payload)] = None
    summaries = []
    for target, payload in keys:
        mine = [s for s in samples if s.target == target and s.payload == payload]
        cpu = [s.cpu_us_per_request for s in mine if s.cpu_us_per_request is not None]
        summaries.append(
            Summary(
                target=target,
                payload=payload,
                rounds=len(mine),
                rps=statistics.median(s.rps for s in mine),
                vs_direct=_ratio(mine, samples, direct),
                vs_nginx=_ratio(mine, samples, nginx),
                p50=statistics.median(s.p50 for s in mine),
                p99=statistics.median(s.p99 for s in mine),
                cpu_us_per_request=statistics.median(cpu) if cpu else None,
                errors=sum(s.errors for s in mine),
            )
        )
    return summaries


def as_load(record: dict[str, Any]) -> dict[str, Any]:
    """
    A L{Sample} or L{Summary} as a dict (C{attrs.asdict}), its C{payload} called C{load}:
    for benchmarks whose rows differ in load, not in payload.
    """
    return {"load" if key == "payload" else key: value for key, value in record.items()}


def format_duration(seconds: float) -> str:
    """A latency in µs below a millisecond, in ms below a second, else in s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds:.2f}s"


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.3f}x"


def table(
    summaries: Sequence[Summary],
    names: dict[str, str],
    unavailable: dict[str, str],
    payloads: Sequence[str],
) -> str:
    """
    The results as a text table: one block of rows per payload, one row per target;
    unavailable targets get a row saying why.
    """
    header = (
        "payload",
        "target",
        "req/s",
        "vs direct",
        "vs nginx",
        "p50",
        "p99",
        "CPU µs/req",
        "errors",
    )
    rows: list[tuple[str, ...] | str] = []
    for payload in payloads:
        for key, name in names.items():
            label = f"{key} {name}"
            if key in unavailable:
                rows.append(unavailable_row((payload, label), (10, 16), unavailable[key]))
                continue
            found = [s for s in summaries if s.target == key and s.payload == payload]
            if not found:
                continue
            s = found[0]
            cpu = "-" if s.cpu_us_per_request is None else f"{s.cpu_us_per_request:.1f}"
            rows.append(
                (
                    payload,
                    label,
                    f"{s.rps:,.0f}",
                    _ratio_text(s.vs_direct),
                    _ratio_text(s.vs_nginx),
                    format_duration(s.p50),
                    format_duration(s.p99),
                    cpu,
                    str(s.errors),
                )
            )
    return render(header, rows)


def unavailable_row(cells: Sequence[str], widths: Sequence[int], reason: str) -> str:
    """
    A table row for a target that was not measured: its first C{cells}, each padded to
    its width, then C{unavailable:} and the first line of C{reason}.
    """
    padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=True)]
    return "  ".join([*padded, f"unavailable: {reason.splitlines()[0]}"])


def render(header: Sequence[str], rows: Sequence[Sequence[str] | str], left: int = 2) -> str:
    """
    A text table: C{header}, a rule, then C{rows}, columns two spaces apart, the first
    C{left} columns aligned left and the others right. A row given as one string is
    printed as it is (a note across the columns, such as why a target is unavailable).
    """
    cells = [header, *(row for row in rows if not isinstance(row, str))]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        if isinstance(row, str):
            lines.append(row)
            continue
        parts = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "edgegw_commit": _commit(),
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def _commit() -> str:
    """The repository's HEAD commit (the working tree may hold changes on top of it)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=RESULTS_DIR.parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def write_json(kind: str, data: dict[str, Any]) -> Path:
    """
    Write C{data} to C{bench/results/KIND-<UTC timestamp>.json}.
    """
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = RESULTS_DIR / f"{kind}-{stamp}.json"
    serial = 1
    while path.exists():
        serial += 1
        path = RESULTS_DIR / f"{kind}-{stamp}-{serial}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path
