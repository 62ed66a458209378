"""
The targets of C{python -m bench proxy}: what runs behind each URL that wrk loads.

  - a. C{direct}: the nginx backend itself, serving two static files.
  - b. C{nginx-proxy}: nginx as a keepalive reverse proxy in front of the backend.
  - c. C{agent-proxy}: L{bench.agent_proxy}, a minimal Twisted Agent reverse proxy.
  - d. C{edgegw-proxy}: edgegw's C{reverse-proxy} route, with its whole per-route chain.
  - e. C{edgegw-static}: edgegw's C{static} route serving the same two files.
  - f. C{edgegw-before} (with C{--before REV} only): d's configuration on edgegw at
    revision REV (L{bench.before}), measured right after d in every round.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, nginx
from bench.before import Checkout
from bench.processes import Process, StartupError, children, started, tail
from bench.tools import Tools
from tests.support.processes import REPO_ROOT, free_port


@attrs.frozen
class Payload:
    """
    One of the files every target serves.

    @ivar name: Its label in reports.
    @ivar path: Its URL path.
    @ivar body: Its exact content.
    """

    name: str
    path: str
    body: bytes


def _small_json() -> bytes:
    document = {"id": 4242, "name": "edgegw", "ok": True, "tags": ["bench", "small"]}
    body = json.dumps(document, separators=(",", ":"))
    # Pad to exactly 100 bytes with a string field so that it stays valid JSON.
    padding = 100 - len(body) - len(',"pad":""') - 1
    return (body[:-1] + ',"pad":"' + "x" * padding + '"}\n').encode()


PAYLOADS = (
    Payload("small-json", "/small.json", _small_json()),
    Payload("64KiB", "/64k.bin", bytes(range(256)) * 256),
)
"""The two payloads: a 100-byte JSON document and a 64 KiB file."""


@attrs.define
class Target:
    """
    One thing being measured.

    @ivar key: Its letter (C{a} to C{e}), also its position in each round.
    @ivar name: Its short name.
    @ivar description: One line saying what it is.
    @ivar port: Where it listens on 127.0.0.1.
    @ivar pids: The processes whose CPU time is charged to it (nginx's worker; the one
        Python process otherwise).
    @ivar unavailable: Why it cannot be measured, or L{None} when it can.
    @ivar process: The process started for it (nginx: the master), once started.
    """

    key: str
    name: str
    description: str
    port: int = 0
    pids: list[int] = attrs.Factory(list)
    unavailable: str | None = None
    process: Process | None = None

    def url(self, payload: Payload) -> str:
        """The URL of C{payload} on this target."""
        return f"http://127.0.0.1:{self.port}{payload.path}"

    def alive(self) -> bool:
        """Whether its process is still running."""
        return self.process is None or self.process.running()

    def check_alive(self) -> None:
        """
        Mark it unavailable, with the tail of its log, if its process has exited.
        """
        if not self.alive() and self.unavailable is None:
            assert self.process is not None
            self.unavailable = f"exited during the run:\n{tail(self.process.log)}"


def announce(targets: Sequence[Target]) -> None:
    """
    Print each target's letter, name and description, and whether it is ready or why
    not, on stderr.
    """
    width = max([14, *(len(target.name) for target in targets)])
    for target in targets:
        state = "ready" if target.unavailable is None else target.unavailable
        print(
            f"  {target.key} {target.name:<{width}} {target.description}: {state}",
            file=sys.stderr,
            flush=True,
        )


TARGETS = {
    "a": ("direct", "nginx backend serving the files directly (1 worker)"),
    "b": ("nginx-proxy", "nginx reverse proxy -> backend (1 worker, upstream keepalive)"),
    "c": ("agent-proxy", "minimal twisted.web.client.Agent reverse proxy (1 process)"),
    "d": ("edgegw-proxy", "edgegw reverse-proxy route, full per-route chain (1 process)"),
    "e": ("edgegw-static", "edgegw static route serving the same files (1 process)"),
}
"""Letter to (name, description) of every target C{--targets} can name, in round order."""

BEFORE = "f"
"""The letter of C{--before}'s target: d's configuration on another revision of edgegw."""
ROUND_ORDER = "abcdfe"
"""The order of the targets in a round: with C{--before}, f right after d."""


def before_target(checkout: Checkout) -> tuple[str, str]:
    """The name and description of C{--before}'s target, edgegw at C{checkout}."""
    return (
        "edgegw-before",
        f"edgegw at {checkout.short} (--before {checkout.rev}), d's route and chain (1 process)",
    )


def write_payloads(www: Path) -> None:
    """
    Write the payload files into C{www}, readable by nginx's worker.
    """
    www.mkdir(parents=True, exist_ok=True)
    for payload in PAYLOADS:
        (www / payload.path.lstrip("/")).write_bytes(payload.body)


def verify(target: Target) -> str | None:
    """
    Fetch every payload once through C{target}.

    @return: L{None} if each came back C{200} with the exact body, else what was wrong.
    """
    for payload in PAYLOADS:
        wrong = expect(target.port, payload.path, 200, payload.body)
        if wrong is not None:
            return wrong
    return None


def expect(port: int, path: str, status: int, body: bytes) -> str | None:
    """
    C{GET path} from 127.0.0.1:C{port} once.

    @return: L{None} if it answered C{status} with exactly C{body}, else what was wrong.
    """
    try:
        got_status, _, got = fetch(port, path)
    except (OSError, http.client.HTTPException) as e:
        return f"GET {path} failed: {e}"
    if got_status != status or got != body:
        shown = f" {got[:100]!r}" if got_status != status else ""
        return (
            f"GET {path} answered {got_status} with {len(got)} bytes{shown} "
            f"(expected {status} with {len(body)} bytes)"
        )
    return None


def fetch(port: int, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
    """
    C{GET path} from 127.0.0.1:C{port} once, on a connection of its own.

    @return: The status, the response headers and the whole body.
    @raise OSError: On a connection failure or a timeout (10 s).
    @raise http.client.HTTPException: On a malformed response.
    """
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def _nginx_workers(process: Process) -> list[int]:
    """
    The worker processes of an nginx master (one, with C{worker_processes 1}).
    """
    workers = children(process.pid)
    if not workers:
        raise StartupError(f"{process.name} has no worker process")
    return workers


def start_backend(stack: ExitStack, tools: Tools, tmp: Path) -> Target:
    """
    Start target a, the nginx backend serving the payloads from C{tmp/www} (stopped when
    C{stack} closes), and check that it serves them.

    @raise StartupError: If it does not start or serves them wrongly.
    """
    www = tmp / "www"
    write_payloads(www)
    backend = Target("a", *TARGETS["a"], port=free_port())
    backend.process = nginx.start_backend(stack, tools.nginx, tmp, www, backend.port)
    backend.pids = _nginx_workers(backend.process)
    wrong = verify(backend)
    if wrong is not None:
        raise StartupError(f"the nginx backend does not serve the payloads: {wrong}")
    return backend


def start_edgegw(
    stack: ExitStack,
    tmp: Path,
    label: str,
    target: Target,
    routes: Sequence[gateway.RouteConfig],
    resources: Sequence[Mapping[str, Any]] = (),
    checkout: Checkout | None = None,
) -> None:
    """
    Write an edgegw configuration for C{target} (C{routes} and C{resources} in
    C{tmp/label}), check it with C{edgegw check}, and start edgegw on C{target.port}
    (its log in C{tmp/label.log}; stopped when C{stack} closes). When the check refuses
    the configuration or edgegw does not start, C{target.unavailable} says why instead.

    @param checkout: Another revision of edgegw to check and run the configuration
        with (C{--before}), instead of the working tree's.
    """
    directory = gateway.write_config(tmp / label, target.port, routes, resources)
    env = None if checkout is None else checkout.env
    cwd = REPO_ROOT if checkout is None else checkout.path
    target.unavailable = gateway.check(directory, env, cwd)
    if target.unavailable is not None:
        return
    try:
        process = stack.enter_context(
            started(gateway.start(directory, tmp / f"{label}.log", label, env, cwd))
        )
        target.process = process
        process.wait_for_port(target.port)
    except StartupError as e:
        target.unavailable = f"did not start: {e}"
        return
    target.pids = [process.pid]


def start_targets(
    stack: ExitStack,
    tools: Tools,
    tmp: Path,
    keys: str,
    connections: int,
    checkout: Checkout | None = None,
) -> list[Target]:
    """
    Start the backend and the selected targets (letters in C{keys}; with a C{checkout},
    also L{BEFORE}, edgegw at that revision with d's configuration), in round order;
    every process is stopped when C{stack} closes. A target that cannot run is returned
    with C{unavailable} set instead of raising.

    @raise StartupError: If the backend itself does not start: nothing can be measured.
    """
    backend = start_backend(stack, tools, tmp)
    upstream = f"http://127.0.0.1:{backend.port}"

    def nginx_proxy(target: Target) -> None:
        prefix = tmp / "nginx-proxy"
        prefix.mkdir()
        keepalive = max(64, connections)
        config = nginx.proxy_config(prefix, target.port, backend.port, keepalive)
        process = stack.enter_context(
            started(nginx.start(tools.nginx, "nginx proxy", prefix, config))
        )
        target.process = process
        process.wait_for_port(target.port)
        target.pids = _nginx_workers(process)

    def agent_proxy(target: Target) -> None:
        argv = [
            sys.executable,
            "-m",
            "bench.agent_proxy",
            "--port",
            str(target.port),
            "--upstream",
            upstream,
            "--pool-size",
            str(connections),
        ]
        process = stack.enter_context(
            started(Process("agent proxy", argv, tmp / "agent-proxy.log"))
        )
        target.process = process
        process.wait_for_port(target.port)
        target.pids = [process.pid]

    def edgegw(
        route: gateway.RouteConfig, label: str, at: Checkout | None = None
    ) -> Callable[[Target], None]:
        def start(target: Target) -> None:
            start_edgegw(stack, tmp, label, target, [route], checkout=at)

        return start

    proxy_route = gateway.reverse_proxy("backend", "/", upstream)
    starters: dict[str, Callable[[Target], None]] = {
        "b": nginx_proxy,
        "c": agent_proxy,
        "d": edgegw(proxy_route, "edgegw-proxy"),
        "e": edgegw(gateway.static("files", "/", tmp / "www"), "edgegw-static"),
    }
    names = dict(TARGETS)
    if checkout is not None:
        starters[BEFORE] = edgegw(proxy_route, "edgegw-before", checkout)
        names[BEFORE] = before_target(checkout)
    targets = []
    for key in ROUND_ORDER:
        if key not in keys and not (key == BEFORE and checkout is not None):
            continue
        if key == "a":
            targets.append(backend)
            continue
        target = Target(key, *names[key], port=free_port())
        try:
            starters[key](target)
        except StartupError as e:
            target.unavailable = f"did not start: {e}"
        if target.unavailable is None:
            target.unavailable = verify(target)
        targets.append(target)
    return targets
