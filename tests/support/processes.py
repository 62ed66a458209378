"""
Small helpers for tests that listen on sockets or spawn processes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from twisted.internet.error import ProcessExitedAlready


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
