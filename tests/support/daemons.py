"""
Real gateway processes for tests: C{twistd -n edgegw --config DIR} spawned from the test
process, as an operator runs several instances side by side; plus the small clients such
tests need around them (one raw HTTP exchange, one Redis command).

Each L{GatewayProcess} is SIGKILLed and awaited when its test ends; its output (logs and
access log) is written to C{gateway.log} in its configuration directory as it arrives,
for a look after a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any

from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol, Protocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.configs import write_tree
from tests.support.rawclient import connect

reactor: Any = _global_reactor

__all__ = [
    "GatewayProcess",
    "HttpAnswer",
    "http_exchange",
    "redis_command",
    "sleep",
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
START_TIMEOUT = 30.0


async def sleep(seconds: float) -> None:
    """
    Let the reactor run for C{seconds}.
    """
    await deferLater(reactor, seconds, lambda: None)


class _Output(ProcessProtocol):
    """
    Collects a twistd child's output (also into a file); fires C{listening} with the
    port it bound and C{ended} when it exits.
    """

    def __init__(self, log_path: str) -> None:
        self.output = b""
        self.log = open(log_path, "ab")  # noqa: SIM115 (closed when the process ends)
        self.listening: Deferred[int] = Deferred()
        self.ended: Deferred[None] = Deferred()
        self.exited = False

    def outReceived(self, data: bytes) -> None:
        self.output += data
        self.log.write(data)
        self.log.flush()
        found = re.search(rb"edgegw listening on .*?port=(\d+)", self.output)
        if found and not self.listening.called:
            self.listening.callback(int(found.group(1)))

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self.exited = True
        self.log.close()
        if not self.listening.called:
            self.listening.errback(
                RuntimeError("the gateway exited:\n" + self.output.decode(errors="replace"))
            )
        self.ended.callback(None)


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
        self._protocol: _Output | None = None
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
        protocol = _Output(os.path.join(self.directory, "gateway.log"))
        self._protocol = protocol
        self._process = reactor.spawnProcess(
            protocol,
            TWISTD,
            ["twistd", "-n", "--pidfile=", "edgegw", "--config", self.directory],
            env={**os.environ, "PYTHONPATH": ROOT},
            path=ROOT,
        )
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
            with contextlib.suppress(ProcessExitedAlready):
                process.signalProcess("KILL")
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


class _IncompleteError(Exception):
    pass


def _parse_resp(data: bytes, at: int = 0) -> tuple[Any, int]:
    """
    One RESP2 value at C{data[at:]}, and where the next begins.

    @raise _IncompleteError: More bytes are needed.
    """
    end = data.find(b"\r\n", at)
    if end < 0:
        raise _IncompleteError
    kind, line = data[at : at + 1], data[at + 1 : end]
    after = end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return RuntimeError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(data) < after + size + 2:
            raise _IncompleteError
        return data[after : after + size], after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = _parse_resp(data, after)
            items.append(item)
        return items, after
    raise ValueError(f"not RESP: {data[at:]!r}")


class _RedisCommand(Protocol):
    def __init__(self, command: bytes) -> None:
        self.command = command
        self.buffer = b""
        self.reply: Deferred[Any] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.command)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        try:
            value, _ = _parse_resp(self.buffer)
        except _IncompleteError:
            return
        if not self.reply.called:
            self.reply.callback(value)
        assert self.transport is not None
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.reply.called:
            self.reply.errback(ConnectionError("redis closed the connection"))


async def redis_command(port: int, *args: str | bytes) -> Any:
    """
    Send one command to the Redis server on 127.0.0.1:C{port} (plaintext, no AUTH) over
    a connection of its own; its reply (bytes, int, list, None or a RuntimeError).
    """
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    command = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    protocol = _RedisCommand(command)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=2), protocol)
    reply = await protocol.reply.addTimeout(5, reactor)
    # Let the connection finish closing before the caller goes on.
    await sleep(0)
    return reply
