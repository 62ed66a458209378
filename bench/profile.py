"""
C{python -m bench profile}: where edgegw's CPU goes under load, sampled with py-spy.

One edgegw process serves one scenario's route (the same configurations the other
benchmarks measure) while wrk loads it (over TLS for C{tls}; C{h2} is loaded with
C{h2load -c10 -m5} over HTTP/2, as C{python -m bench tls} does); py-spy samples the
process's Python stacks (C{py-spy record --format raw}, the collapsed stacks flame
graphs are drawn from) for the whole run. The summary lists the functions with the most
samples, on their own (self) and with what they call (inclusive), as shares of all
samples; the raw stacks are kept beside the JSON results for a flame graph
(C{flamegraph.pl}, speedscope) or a closer look.

py-spy is installed into the virtualenv from PyPI when missing (C{pip install py-spy});
it reads the process's memory, so it needs root or C{ptrace} rights over it
(C{kernel.yama.ptrace_scope=0}).
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, h2load, tls_servers, wrk
from bench.processes import StartupError, scratch
from bench.rounds import say
from bench.targets import PAYLOADS, Target, start_backend, start_edgegw
from bench.tools import ensure, ensure_tools
from tests.support.processes import REPO_ROOT, free_port, venv_bin

SMALL, LARGE = PAYLOADS

RESULTS = REPO_ROOT / "bench" / "results"


@attrs.frozen
class Scenario:
    """
    What is profiled: edgegw's routes and other resources, and the path wrk asks for.

    @ivar routes: Made from the backend's origin (C{http://127.0.0.1:PORT}) and the
        directory the backend serves.
    @ivar load: C{http} (wrk), C{https} (wrk over TLS: the Gateway gets C{spec.tls}
        with a certificate made for the run) or C{h2} (the same, loaded with h2load
        over HTTP/2).
    """

    name: str
    description: str
    path: str
    routes: Callable[[str, Path], Sequence[gateway.RouteConfig]]
    resources: Sequence[Mapping[str, Any]] = ()
    load: str = "http"


SCENARIOS = {
    "proxy": Scenario(
        "proxy",
        "a reverse-proxy route (its whole chain, JSON access log) to the nginx backend",
        SMALL.path,
        lambda origin, _: [gateway.reverse_proxy("p", "/", origin)],
    ),
    "proxy-64k": Scenario(
        "proxy-64k",
        "proxy's route, the 64 KiB file",
        LARGE.path,
        lambda origin, _: [gateway.reverse_proxy("p", "/", origin)],
    ),
    "static": Scenario(
        "static",
        "a static route serving the backend's files from disk",
        SMALL.path,
        lambda _, www: [gateway.static("s", "/", www)],
    ),
    "tls": Scenario(
        "tls",
        "proxy's route over HTTP/1.1 with TLS (Gateway.spec.tls), wrk https",
        SMALL.path,
        lambda origin, _: [gateway.reverse_proxy("p", "/", origin)],
        load="https",
    ),
    "h2": Scenario(
        "h2",
        "proxy's route over HTTP/2 (Gateway.spec.tls), h2load -c10 -m5",
        SMALL.path,
        lambda origin, _: [gateway.reverse_proxy("p", "/", origin)],
        load="h2",
    ),
}

H2_CLIENTS, H2_STREAMS = 10, 5
"""h2load's connections and streams per connection in the C{h2} scenario (as C{bench tls})."""


@attrs.frozen
class Settings:
    """
    @ivar scenario: A key of L{SCENARIOS}.
    @ivar duration: Seconds of load (and of sampling).
    @ivar connections: wrk's connections.
    @ivar rate: py-spy's samples per second.
    @ivar nonblocking: Sample without pausing the process (C{--nonblocking}): less
        perturbation, but stacks read while the process runs come back inconsistent
        (about half cut short here, and their innermost frames misattributed, see
        L{run}).
    @ivar top: How many functions each list shows.
    """

    scenario: str = "proxy"
    duration: int = 15
    connections: int = 50
    rate: int = 499
    top: int = 30
    keep_tmp: bool = False
    nonblocking: bool = False


def py_spy() -> str:
    """
    The py-spy program of the virtualenv, installed from PyPI when missing.
    """
    found = shutil.which("py-spy", path=str(Path(venv_bin("python")).parent))
    if found is None:
        say("bench: installing py-spy into the virtualenv (pip install py-spy) ...")
        subprocess.run([venv_bin("python"), "-m", "pip", "install", "-q", "py-spy"], check=True)
        found = venv_bin("py-spy")
    return found


def frames(stack: str) -> list[str]:
    """
    The frames of one collapsed stack line's stack (outermost first), each
    C{function (file:line)} made C{function (file)}: lines split one function apart.
    """
    out = []
    for frame in stack.split(";"):
        name, _, where = frame.partition(" (")
        path = where.rsplit(":", 1)[0] if where else ""
        for marker in ("site-packages/", "lib/python3"):
            if marker in path:
                path = path.split(marker, 1)[1]
        out.append(f"{name} ({path.removeprefix(str(REPO_ROOT) + '/')})")
    return out


def summarise(raw: str) -> tuple[int, Counter[str], Counter[str]]:
    """
    Total samples, and samples per function on its own (the innermost frame) and
    inclusive (anywhere in the stack, once per stack).
    """
    total = 0
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        stack_frames = frames(stack)
        if stack_frames:
            own[stack_frames[-1]] += count
        for frame in set(stack_frames):
            inclusive[frame] += count
    return total, own, inclusive


def table(title: str, counts: Counter[str], total: int, top: int) -> str:
    lines = [title, "-" * len(title)]
    for name, count in counts.most_common(top):
        lines.append(f"{100 * count / total:6.1f}%  {name}")
    return "\n".join(lines)


def run(settings: Settings) -> int:
    """
    Profile one scenario; print the summary and write the raw stacks.

    @return: The exit status.
    """
    scenario = SCENARIOS[settings.scenario]
    tools = ensure_tools()
    spy = py_spy()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw_path = RESULTS / f"profile-{scenario.name}-{stamp}.txt"
    with ExitStack() as stack:
        tmp = stack.enter_context(scratch("edgegw-profile-", settings.keep_tmp))
        try:
            backend = start_backend(stack, tools, tmp)
        except StartupError as e:
            say(f"bench: {e}")
            return 1
        origin = f"http://127.0.0.1:{backend.port}"
        target = Target("p", "edgegw", scenario.description, port=free_port())
        routes = scenario.routes(origin, tmp / "www")
        resources = list(scenario.resources)
        scheme = "http"
        if scenario.load != "http":
            cert = tls_servers.certificate(tmp / "certificate", "localhost")
            resources.append(gateway.gateway_fields(tls_servers.edgegw_tls_fields(cert)))
            scheme = "https"
        start_edgegw(stack, tmp, "edgegw", target, routes, resources)
        if target.unavailable is not None:
            say(f"bench: edgegw unavailable: {target.unavailable}")
            return 1
        url = wrk.Url(f"{scheme}://127.0.0.1:{target.port}{scenario.path}")
        h2 = ensure(("h2load",))["h2load"] if scenario.load == "h2" else ""

        def load(duration: int) -> tuple[float, int, float]:
            # req/s, requests, the CPU seconds of edgegw over the run
            if scenario.load == "h2":
                done, used = h2load.measure(h2, url, H2_CLIENTS, H2_STREAMS, duration, target.pids)
                if done.protocol != "h2":
                    raise h2load.H2loadError(f"h2load negotiated {done.protocol or 'nothing'}")
                return done.rps, done.requests, used
            result, used = wrk.measure(tools.wrk, url, settings.connections, duration, target.pids)
            return result.rps, result.requests, used

        # Warm up before sampling: imports, first connections, caches.
        try:
            load(2)
        except (wrk.WrkError, h2load.H2loadError) as e:
            say(f"bench: the load failed: {e}")
            return 1
        spying = subprocess.Popen(
            [
                spy,
                "record",
                "--format",
                "raw",
                "--rate",
                str(settings.rate),
                "--pid",
                str(target.pids[0]),
                "--duration",
                str(settings.duration),
                "--output",
                str(raw_path),
                # Paused for each sample by default: read while the process runs, half
                # the stacks came back cut short and ~20 % of the samples landed on
                # coroutine await lines and the upstream head parser that paused
                # samples never show there.
                *(["--nonblocking"] if settings.nonblocking else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)
        rps, requests, cpu = load(settings.duration)
        _, errors = spying.communicate(timeout=settings.duration + 60)
        if spying.returncode != 0 or not raw_path.exists():
            say(f"bench: py-spy failed ({spying.returncode}): {errors.strip()}")
            return 1
    total, own, inclusive = summarise(raw_path.read_text(errors="replace"))
    print(f"PROFILE {scenario.name}: {scenario.description}")
    generator = (
        f"h2load -c{H2_CLIENTS} -m{H2_STREAMS}"
        if scenario.load == "h2"
        else f"wrk -c{settings.connections}"
    )
    print(
        f"{generator} {settings.duration}s: {rps:,.0f} req/s, "
        f"{cpu / max(1, requests) * 1e6:.1f} µs CPU/req; py-spy {settings.rate}/s: "
        f"{total} samples"
    )
    print()
    print(table("SELF (the innermost frame)", own, total, settings.top))
    print()
    print(table("INCLUSIVE (anywhere in the stack)", inclusive, total, settings.top))
    print()
    print(f"raw stacks: {raw_path}")
    return 0
