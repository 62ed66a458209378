"""
Real gateway processes for tests: C{twistd -n edgegw --config DIR} spawned from the test
process, as an operator runs it (L{spawn_twistd}), as systemd starts it on a socket it
holds (L{spawn_socket_activated}), or several instances side by side
(L{GatewayProcess}); plus the small client such tests need around them (one raw HTTP
exchange; one Redis command is L{tests.support.redis.redis_command}).

Each L{GatewayProcess} is SIGKILLed and awaited when its test ends; its output (logs and
access log) is written to C{gateway.log} in its configuration directory as it arrives,
for a look after a failure.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from typing import Any

from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.configs import write_tree
from tests.support.processes import (
    REPO_ROOT,
    ProcessOutput,
    edgegw_twistd_args,
    kill,
    venv_bin,
)
from tests.support.rawclient import connect

reactor: Any = _global_reactor

__all__ = [
    "DAEMON_ENV",
    "JOURNAL_LOGGER",
    "GatewayProcess",
    "HttpAnswer",
    "TwistdOutput",
    "http_exchange",
    "sleep",
    "spawn_socket_activated",
    "spawn_twistd",
]

START_TIMEOUT = 30.0

# The example's session key comes from the environment (make run makes a random one),
# and its metrics listener gets a port of its own (9464 may be taken by `make run`).
DAEMON_ENV: dict[str, str] = {
    **os.environ,
    "PYTHONPATH": str(REPO_ROOT),
    "EDGEGW_SESSION_KEY": "k" * 32,
    "EDGEGW_METRICS_LISTEN": "127.0.0.1:0",
}
"""
The environment of the daemons L{spawn_twistd} and L{spawn_socket_activated} start:
this process's, with the repository first on the import path and what the example
configuration (C{etc/edgegw}) reads from the environment.
"""

JOURNAL_LOGGER = "--logger=edgegw.journal.observer"
"""
The twistd option the systemd units run the daemon with: its log as JSON lines for
journald.
"""


async def sleep(seconds: float) -> None:
    """
    Let the reactor run for C{seconds}.
    """
    await deferLater(reactor, seconds, lambda: None)


class TwistdOutput(ProcessOutput):
    """
    Collects a twistd child's output (also into a file when C{log_path} is given);
    fires C{listening} with the port it bound (or fails it with the output if the
    process exits first) and C{ended} when it exits.
    """

    def __init__(self, log_path: str | None = None) -> None:
        super().__init__(log_path)
        self.listening: Deferred[int] = Deferred()

    def outReceived(self, data: bytes) -> None:
        super().outReceived(data)
        found = re.search(rb"edgegw listening on .*?port=(\d+)", self.output)
        if found and not self.listening.called:
            self.listening.callback(int(found.group(1)))

    def processEnded(self, reason: Failure) -> None:
        if not self.listening.called:
            self.listening.errback(
                RuntimeError("the gateway exited:\n" + self.output.decode(errors="replace"))
            )
        super().processEnded(reason)


def spawn_twistd(
    config: str,
    *twistd_options: str,
    env: dict[str, str] | None = None,
    log_path: str | None = None,
) -> tuple[TwistdOutput, Any]:
    """
    Spawn C{twistd -n --pidfile= [TWISTD_OPTIONS] edgegw --config CONFIG} from the
    repository root, as operators run the daemon.

    @param env: The child's environment; L{DAEMON_ENV} when not given.
    @param log_path: A file the child's output is also appended to.
    @return: The protocol collecting its output, and the process.
    """
    protocol = TwistdOutput(log_path)
    process = reactor.spawnProcess(
        protocol,
        venv_bin("twistd"),
        ["twistd", *edgegw_twistd_args(config, *twistd_options)],
        env=DAEMON_ENV if env is None else env,
        path=str(REPO_ROOT),
    )
    return protocol, process


def spawn_socket_activated(
    listener: socket.socket | Sequence[socket.socket],
    config: str,
    fd_name: str,
    *twistd_options: str,
) -> tuple[TwistdOutput, Any]:
    """
    Spawn the daemon as L{spawn_twistd} does, but as systemd starts a socket-activated
    unit: C{listener} at descriptor 3 (several: 3, 4, ... as a unit with several
    C{ListenStream=} lines), C{LISTEN_FDS} their count, C{LISTEN_FDNAMES=fd_name} (one
    name for each, joined by C{:}) and C{LISTEN_PID} the daemon's own pid (a shell
    exports it, then execs twistd).

    @return: The protocol collecting its output, and the process.
    """
    listeners = [listener] if isinstance(listener, socket.socket) else list(listener)
    inherited = {3 + index: sock.fileno() for index, sock in enumerate(listeners)}
    protocol = TwistdOutput()
    process = reactor.spawnProcess(
        protocol,
        "/bin/sh",
        [
            "sh",
            "-c",
            'export LISTEN_PID=$$; exec "$0" "$@"',
            venv_bin("twistd"),
            *edgegw_twistd_args(config, *twistd_options),
        ],
        env={**DAEMON_ENV, "LISTEN_FDS": str(len(listeners)), "LISTEN_FDNAMES": fd_name},
        path=str(REPO_ROOT),
        childFDs={0: "w", 1: "r", 2: "r", **inherited},
    )
    return protocol, process


class GatewayProcess:
    """
    One gateway process serving the configuration C{files} (name -> YAML text), written
    to a fresh directory of C{test}.

    @ivar port: The port it listens on, once L{start} returned.
    """

    def __init__(self, test: TestCase, files: dict[str, str], name: str = "gateway") -> None:
        self.test = test
        self.name = name
        self.directory = write_tree(test.mktemp(), files)
        self.port = 0
        self._protocol: TwistdOutput | None = None
        self._process: Any = None

    @property
    def origin(self) -> str:
        """
        C{http://127.0.0.1:<port>}.
        """
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """
        The absolute URL of C{path} on this gateway.
        """
        return self.origin + path

    @property
    def pid(self) -> int:
        """
        The process id (once started).
        """
        return int(self._process.pid)

    @property
    def output(self) -> str:
        """
        Everything the process has printed so far.
        """
        return "" if self._protocol is None else self._protocol.output.decode(errors="replace")

    async def start(self) -> int:
        """
        Spawn C{twistd -n edgegw --config DIR} and wait until it listens; it is killed
        when the test ends.

        @return: Its port.
        """
        protocol, self._process = spawn_twistd(
            self.directory,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            log_path=os.path.join(self.directory, "gateway.log"),
        )
        self._protocol = protocol
        self.test.addCleanup(self.stop)
        self.port = await protocol.listening.addTimeout(START_TIMEOUT, reactor)
        return self.port

    async def stop(self) -> None:
        """
        SIGKILL the process (unless it has exited) and wait until it is gone.
        """
        protocol, process = self._protocol, self._process
        if protocol is None:
            return
        if not protocol.exited:
            kill(process)
        await protocol.ended


class HttpAnswer:
    """
    A whole HTTP/1.1 response as received: status, headers (names lowercased), body
    (undecoded: chunked stays chunked).
    """

    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ")
        self.status = int(status_line[1]) if len(status_line) > 1 else 0
        self.headers: dict[bytes, list[bytes]] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers.setdefault(name.strip().lower(), []).append(value.strip())
        self.raw = raw

    def header(self, name: bytes) -> bytes | None:
        """
        The first value of header C{name}, or L{None}.
        """
        values = self.headers.get(name.lower())
        return values[0] if values else None


async def http_exchange(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> HttpAnswer:
    """
    One request on a connection of its own (C{Connection: close}) to 127.0.0.1:C{port};
    the response once the server has closed the connection.
    """
    client = await connect(port)
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    client.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await client.closed
    return HttpAnswer(client.received)
