"""
C{python -m bench chain}: the Python CPU of one proxied request through edgegw's whole
chain, in process, without sockets.

The gateway is built from the same configuration as C{proxy}'s target d (a public
C{reverse-proxy} route C{match: /}, the JSON access log to a file) and driven by hand:
the client connection and the upstream connection are in-memory transports, the
request is wrk's (C{GET /small.json}, C{Host} only), and the upstream answers nginx's
head with the 100-byte JSON body in one read. Each request goes through everything
edgegw's own code and Twisted's HTTP server do for it (head parsing, the edge layers,
mux, recover, request id, access log, projection, the proxy handler, the upstream
client's encoding and parsing, the pool), with the reactor's timers handled after each
request as at the end of a reactor iteration (C{runUntilCurrent}); what it leaves out
is the kernel (system calls, wake-ups) and the reactor's event dispatch, so the figure
is lower than C{proxy}'s CPU per request.

With no sockets and no other process, the figure is steady to about 1 % between runs
on an idle machine (C{proxy}'s moves by ±5 % on two shared cores), which is what a
small change needs (the figure is the process's CPU time, so other load weighs on it
less than on wall time): C{--before REV} measures edgegw at that revision the same way, in
alternating fresh processes, and prints both. C{--profile} prints where the time goes
(cProfile, sorted by own time; cProfile's own overhead roughly triples the figure).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from bench import before, gateway
from bench.processes import StartupError
from bench.targets import PAYLOADS
from tests.support.processes import REPO_ROOT

WORKER = Path(__file__).with_name("chain_worker.py")


@attrs.frozen
class Settings:
    """
    @ivar requests: Requests per timed repeat.
    @ivar repeats: Timed repeats per process (the best is kept).
    @ivar processes: Fresh processes per tree (alternating with C{before}'s).
    @ivar before: A git revision to measure the same way, or L{None}.
    @ivar profile: Print a cProfile listing instead of timing.
    """

    requests: int = 20_000
    repeats: int = 5
    processes: int = 3
    before: str | None = None
    profile: bool = False


def _measured(directory: Path, settings: Settings, tree: Path, profile: bool = False) -> float:
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            str(WORKER),
            str(directory),
            str(settings.requests),
            str(settings.repeats),
            *(["--profile"] if profile else []),
        ],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=not profile,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise StartupError(f"bench chain failed:\n{(done.stderr or '').strip()}")
    if profile:
        return 0.0
    return float(json.loads(done.stdout)["us_per_request"])


def run(settings: Settings) -> int:
    """
    Measure, print the figures (and, with C{before}, the change), return 0; on a
    revision that is no commit, or a gateway that does not answer, say why and return 1.
    """
    try:
        return _run(settings)
    except StartupError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1


def _run(settings: Settings) -> int:
    with tempfile.TemporaryDirectory(prefix="edgegw-bench-chain-") as tmp:
        directory = gateway.write_config(
            Path(tmp) / "config",
            8080,
            [gateway.reverse_proxy("proxy", "/", "http://127.0.0.1:9")],
        )
        if settings.profile:
            _measured(directory, settings, REPO_ROOT, profile=True)
            return 0
        figures: dict[str, list[float]] = {"this tree": []}
        trees = {"this tree": REPO_ROOT}
        with contextlib.ExitStack() as stack:
            if settings.before is not None:
                checkout = stack.enter_context(before.worktree(Path(tmp), settings.before))
                name = f"before ({checkout.short})"
                trees[name] = checkout.path
                figures[name] = []
            for n in range(settings.processes):
                for name, tree in trees.items():
                    figures[name].append(_measured(directory, settings, tree))
                print(
                    f"process {n + 1}/{settings.processes}: "
                    + ", ".join(f"{name} {values[-1]:.1f} µs" for name, values in figures.items()),
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"\nPython CPU per proxied request ({PAYLOADS[0].name}), in process: best of "
        f"{settings.repeats} x {settings.requests:,} requests per process, median of "
        f"{settings.processes} processes"
    )
    medians = {name: sorted(values)[len(values) // 2] for name, values in figures.items()}
    for name, value in medians.items():
        print(f"  {name:<24} {value:7.1f} µs")
    if len(medians) == 2:
        now, then = medians.values()
        print(f"  {'change':<24} {(now / then - 1) * 100:+7.1f} %")
    return 0
