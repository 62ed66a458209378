"""
C{python -m bench workers}: one edgegw process against two worker processes sharing one
listening socket, as systemd/edgegw@.service runs them (the socket passed in as systemd
passes it: descriptor 3, C{LISTEN_FDS}, C{LISTEN_PID}).

  - a. C{1-worker}: one process on the socket.
  - b. C{2-workers}: two processes on one socket; the kernel spreads the connections.

Both serve the same C{health} route C{GET /x}, loaded with wrk in interleaved rounds
(L{bench.variants}); CPU per request is that of all the variant's processes. The target
is b at least 1.8x a's requests per second, which needs a core per worker besides
wrk's: on a 2-core machine wrk and the workers share the cores, and the figure shows
that sharing rather than the gateway's scaling.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from bench import gateway, variants
from bench.processes import Process, StartupError, started, tail
from bench.targets import Target
from bench.tools import ensure_wrk
from edgegw.handlers.health import BODY as HEALTH_BODY
from tests.support.processes import edgegw_twistd_args, venv_bin

ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
SYSTEMD_LISTEN = "systemd:domain=INET:index=0"


def make_variants() -> list[variants.Variant]:
    """The two variants, in round order."""
    route = [gateway.health("x", ROUTE_MATCH)]
    return [
        variants.Variant("a", "1-worker", "one edgegw process", route, body=HEALTH_BODY),
        variants.Variant(
            "b", "2-workers", "two edgegw processes on one socket", route, body=HEALTH_BODY
        ),
    ]


def start_workers(
    stack: ExitStack, tmp: Path, variant: variants.Variant, count: int
) -> tuple[Target, list[Process]]:
    """
    A listening socket and C{count} edgegw processes serving it (stopped when C{stack}
    closes), each one's own start awaited: the socket accepts before any process
    serves it, and a worker that failed would leave the others to take all the load.
    """
    target = variant.target()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", target.port))
    listener.listen(4096)
    stack.callback(listener.close)
    directory = gateway.write_config(tmp / f"workers-{variant.key}", target.port, variant.routes)
    config = directory / "gateway.yaml"
    config.write_text(config.read_text().replace(f"127.0.0.1:{target.port}", SYSTEMD_LISTEN, 1))
    fd = listener.fileno()
    os.set_inheritable(fd, True)
    env = {**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "edgegw"}
    workers: list[Process] = []
    for index in range(count):
        # As systemd starts a unit: the socket at descriptor 3, LISTEN_PID its own pid.
        argv = [
            "/bin/sh",
            "-c",
            f'exec 3<&{fd}; export LISTEN_PID=$$; exec "$0" "$@"',
            venv_bin("twistd"),
            *edgegw_twistd_args(directory),
        ]
        process = stack.enter_context(
            started(
                Process(
                    f"worker {variant.key}{index}",
                    argv,
                    tmp / f"workers-{variant.key}{index}.log",
                    env,
                    pass_fds=(fd,),
                )
            )
        )
        target.pids.append(process.pid)
        target.process = process
        workers.append(process)
    try:
        for worker in workers:
            wait_for_listening(worker)
    except StartupError as e:
        target.unavailable = f"did not start: {e}"
    if target.unavailable is None:
        target.unavailable = variant.expect(target.port, ROUTE_PATH)
    return target, workers


def wait_for_listening(worker: Process, timeout: float = 20.0) -> None:
    """
    Wait until C{worker} logs that it listens (on the socket passed in).

    @raise StartupError: If it exits first or C{timeout} passes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.running():
            raise StartupError(f"{worker.name} exited:\n{tail(worker.log)}")
        if "edgegw listening on" in worker.log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise StartupError(f"{worker.name} did not listen within {timeout:.0f}s:\n{tail(worker.log)}")


def check_alive(target: Target, workers: list[Process]) -> variants.AfterRun:
    """
    After each run: how many workers are still running; a dead one ends the variant
    (its figures would be those of fewer processes).
    """

    def after(result: object) -> dict[str, str]:
        alive = sum(worker.running() for worker in workers)
        if alive < len(workers):
            target.unavailable = f"{len(workers) - alive} of {len(workers)} workers exited"
        return {"alive": f"{alive}/{len(workers)}"}

    return after


def notes(settings: variants.Settings) -> list[str]:
    """How to read this run's numbers."""
    return [
        f"Both variants serve the same health route {ROUTE_MATCH} from the socket the "
        "harness passes in as systemd does; b runs two processes on it. vs a is the "
        "scaling (target: at least 1.8x), which needs a core per worker besides wrk's "
        f"(this machine has {os.cpu_count()}).",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Run the benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured.
    """
    wrk_path = ensure_wrk()
    configs = make_variants()

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        started_ = [
            start_workers(stack, tmp, variant, count)
            for variant, count in zip(configs, (1, 2), strict=True)
        ]
        targets = [target for target, _ in started_]
        after = {
            variant.key: check_alive(target, workers)
            for variant, (target, workers) in zip(configs, started_, strict=True)
        }
        return configs, targets, after

    done = variants.measure("workers", settings, wrk_path, ROUTE_PATH, prepare)
    if done is None:
        return 1
    variants.print_results(done, (), (), notes(settings))
    variants.write_results(
        "workers", done, settings, wrk_path, configs, notes(settings), {}, {"route": ROUTE_MATCH}
    )
    return variants.exit_status(done)
