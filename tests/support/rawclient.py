"""
A raw TCP client for tests that need exact control over bytes and timing: send anything,
wait until the bytes received satisfy a condition, close whenever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure


class RawClient(Protocol):
    """
    Collects everything received; L{until} waits for a condition on it.
    """

    def __init__(self) -> None:
        self.received = b""
        self.closed: Deferred[None] = Deferred()
        self._waiting: list[tuple[Callable[[bytes], bool], Deferred[bytes]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        self._check()

    def connectionLost(self, reason: Failure | None = None) -> None:
        waiting, self._waiting = self._waiting, []
        for condition, waiter in waiting:
            if condition(self.received):
                waiter.callback(self.received)
            else:
                waiter.errback(ConnectionError(f"closed; received {self.received[-300:]!r}"))
        self.closed.callback(None)

    def _check(self) -> None:
        still = []
        for condition, waiter in self._waiting:
            if condition(self.received):
                waiter.callback(self.received)
            else:
                still.append((condition, waiter))
        self._waiting = still

    def until(self, condition: Callable[[bytes], bool] | bytes) -> Deferred[bytes]:
        """
        Fire with all bytes received once C{condition} holds (a callable, or bytes that
        must appear).
        """
        if isinstance(condition, bytes):
            needle = condition
            condition = lambda data: needle in data  # noqa: E731
        waiter: Deferred[bytes] = Deferred()
        if condition(self.received):
            waiter.callback(self.received)
        else:
            self._waiting.append((condition, waiter))
        return waiter

    def send(self, data: bytes) -> None:
        """
        Write raw bytes.
        """
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> Deferred[None]:
        """
        Close the connection; fire once it is closed.
        """
        assert self.transport is not None
        self.transport.loseConnection()
        return self.closed


async def connect(port: int) -> RawClient:
    """
    A connected L{RawClient} to 127.0.0.1:C{port}.
    """
    client = RawClient()
    endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    await connectProtocol(endpoint, client)
    return client


def response_complete(data: bytes) -> bool:
    """
    Whether C{data} holds one complete response with a Content-Length or chunked body.
    """
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        return body.endswith(b"0\r\n\r\n")
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True
