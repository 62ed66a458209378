"""
Processes and ports: the helpers the tests and the benchmarks (C{bench/}) share.

What needs no reactor comes first (the repository root, the virtualenv's scripts, a
free port or a held one, the gateway's twistd command line), so that the benchmark
harness, which runs no reactor, imports it too; then the reactor-side helpers of tests
that listen on sockets or spawn processes.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
"""The repository root: the working directory of the processes tests and benchmarks
start."""


def venv_bin(name: str) -> str:
    """
    The path of a console script installed next to the running interpreter (C{twistd},
    C{edgegw}).
    """
    return str(Path(sys.executable).parent / name)


def free_port() -> int:
    """
    A TCP port on 127.0.0.1 that is free right now (the kernel picks it), for a process
    that must be told its port before it starts.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening_socket() -> socket.socket:
    """
    A socket listening on 127.0.0.1 on a free port, held until it is closed: the one
    systemd's C{edgegw.socket} holds and passes to the gateway, or a port a gateway
    then fails to bind.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return listener


def edgegw_twistd_args(config: str | Path, *twistd_options: str) -> list[str]:
    """
    What follows the program name in the command line that runs the gateway as
    operators do, in the foreground and without a pid file, on the configuration
    C{config}: C{twistd -n --pidfile= [TWISTD_OPTIONS] edgegw --config CONFIG}.

    @param twistd_options: twistd's own options besides C{-n --pidfile=}, such as
        C{--reactor=poll} or C{--logger=edgegw.journal.observer}.
    """
    return ["-n", "--pidfile=", *twistd_options, "edgegw", "--config", str(config)]


class ProcessOutput(ProcessProtocol):
    """
    Collects a child's output (stdout and stderr together in L{output}, also appended
    to the file C{log_path} as it arrives when one is given); C{ended} fires once it
    has exited, and C{reason} then says how (a L{twisted.internet.error.ProcessDone} or
    L{twisted.internet.error.ProcessTerminated}).
    """

    def __init__(self, log_path: str | None = None) -> None:
        self.output = b""
        self.log = None if log_path is None else open(log_path, "ab")  # noqa: SIM115 (closed at exit)
        self.ended: Deferred[None] = Deferred()
        self.exited = False
        self.reason: BaseException | None = None

    def outReceived(self, data: bytes) -> None:
        self.output += data
        if self.log is not None:
            self.log.write(data)
            self.log.flush()

    def errReceived(self, data: bytes) -> None:
        self.outReceived(data)

    def processEnded(self, reason: Failure) -> None:
        self.exited = True
        self.reason = reason.value
        if self.log is not None:
            self.log.close()
        self.ended.callback(None)


def port_of(listening: Any) -> int:
    """
    The TCP port number a listening port (or a service holding one) is bound to.
    """
    port = listening if hasattr(listening, "getHost") else listening.port
    return int(port.getHost().port)


def kill(process: Any) -> None:
    """
    SIGKILL C{process} unless it has already exited.
    """
    with contextlib.suppress(ProcessExitedAlready):
        process.signalProcess("KILL")


def http_client(agent_factory: Any = None) -> Any:
    """
    A treq client whose connections close after each response, so that tests leave no
    connection (and no server-side idle timer) behind.
    """
    from treq.client import HTTPClient
    from twisted.internet import reactor
    from twisted.web.client import Agent, HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=False)
    if agent_factory is None:
        return HTTPClient(Agent(reactor, pool=pool))
    return HTTPClient(agent_factory(pool))


def http_get(url: str, **kwargs: Any) -> Any:
    """
    C{treq.get} over a non-persistent connection.
    """
    return http_client().get(url, **kwargs)


def raw_exchange(port: int, data: bytes) -> Any:
    """
    Send C{data} to 127.0.0.1:C{port} and fire with everything received until the server
    closes the connection.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
    from twisted.internet.protocol import Protocol

    done: Deferred[bytes] = Deferred()

    class Collect(Protocol):
        received = b""

        def connectionMade(self) -> None:
            self.transport.write(data)  # type: ignore[union-attr]

        def dataReceived(self, chunk: bytes) -> None:
            self.received += chunk

        def connectionLost(self, reason: Any = None) -> None:
            done.callback(self.received)

    connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Collect())
    return done


async def connections_closed(timeout: float = 5.0) -> None:
    """
    Wait until the reactor has no TCP or TLS connection left (closing a TLS connection
    takes a few reactor turns after the client has gone).
    """
    from twisted.internet import reactor, task

    deadline = reactor.seconds() + timeout
    while reactor.seconds() < deadline:
        live = [
            s
            for s in reactor.getReaders() + reactor.getWriters()
            if type(s).__name__ in ("Server", "Client", "BufferingTLSTransport")
            or "Channel" in type(s).__name__
        ]
        if not live:
            return
        await task.deferLater(reactor, 0.01, lambda: None)


def listen_local(factory: Any) -> Any:
    """
    Listen C{factory} on 127.0.0.1 on a free port; return the listening port.
    """
    from twisted.internet import reactor

    return reactor.listenTCP(0, factory, interface="127.0.0.1")


async def refused_port() -> int:
    """
    A loopback port that was just free and now refuses connections (nothing listens).
    """
    from twisted.internet.protocol import Factory, Protocol

    listening = listen_local(Factory.forProtocol(Protocol))
    port = port_of(listening)
    await listening.stopListening()
    return port
