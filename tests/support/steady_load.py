"""
HTTP/1.1 clients that send requests at a steady rate from threads of their own and
record how each one ended, for what must hold under load (no request lost across
reloads and restarts) and for the reload benchmark.

Two kinds of client (L{SteadyClient}): C{close} opens a new connection for every request
(C{Connection: close}); C{keep-alive} sends every request on one connection, opening a
new one only when the gateway said C{Connection: close} (or, with C{retry}, when a
reused connection closed before any byte of a response: what RFC 9112 section 9.3.1
allows a client for an idempotent request, and browsers do). Plain blocking sockets: no
reactor, so that a test's reactor thread (sending signals, serving a backend) is not
what paces them.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence

__all__ = ["LoadResult", "SteadyClient", "run_clients"]

TIMEOUT = 10.0
"""Seconds a client waits for a connection or a response before it counts a failure."""


class _ClosedError(Exception):
    """The connection closed (or was reset) before a whole response arrived."""

    def __init__(self, received: bytes) -> None:
        super().__init__(f"closed after {len(received)} bytes: {received[:120]!r}")
        self.received = received


class LoadResult:
    """
    What one client saw.

    @ivar statuses: How many responses had each status.
    @ivar failures: One line for each request that got no whole response.
    @ivar latencies: Seconds from sending each answered request to its whole response.
    @ivar retries: Requests sent again on a new connection after a reused one closed
        before any byte of their response.
    """

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.retries = 0

    @property
    def requests(self) -> int:
        """
        Requests that got a whole response.
        """
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        """
        Responses with a 5xx status.
        """
        return sum(count for status, count in self.statuses.items() if status >= 500)

    def merge(self, other: LoadResult) -> None:
        """
        Add C{other}'s counts to these.
        """
        self.statuses.update(other.statuses)
        self.failures += other.failures
        self.latencies += other.latencies
        self.retries += other.retries


def _read_response(sock: socket.socket, buffered: bytes) -> tuple[int, bool, bytes]:
    """
    Read one whole response (C{Content-Length} or chunked body, or until the close).

    @return: Its status, whether it closes the connection, and bytes read past it.
    @raise _ClosedError: The connection ended first.
    """
    data = buffered
    while b"\r\n\r\n" not in data:
        data = _more(sock, data)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    closes = fields.get(b"connection") == b"close"
    if b"content-length" in fields:
        length = int(fields[b"content-length"])
        while len(rest) < length:
            rest = _more(sock, rest)
        return status, closes, rest[length:]
    if fields.get(b"transfer-encoding") == b"chunked":
        while b"0\r\n\r\n" not in rest:
            rest = _more(sock, rest)
        return status, closes, rest[rest.index(b"0\r\n\r\n") + 5 :]
    if status in (204, 304) or 100 <= status < 200:
        return status, closes, rest
    while True:
        try:
            rest = _more(sock, rest)
        except _ClosedError:
            return status, True, b""


def _more(sock: socket.socket, data: bytes) -> bytes:
    try:
        chunk = sock.recv(65536)
    except OSError as e:
        raise _ClosedError(data) from e
    if not chunk:
        raise _ClosedError(data)
    return data + chunk


class SteadyClient:
    """
    Sends GET requests for C{path} to 127.0.0.1:C{port} at C{rate} a second until
    stopped (see the module docstring for C{mode} and C{retry}).
    """

    def __init__(
        self,
        port: int,
        path: str = "/",
        mode: str = "close",
        rate: float = 50.0,
        retry: bool = False,
    ) -> None:
        if mode not in ("close", "keep-alive"):
            raise ValueError(mode)
        self.port = port
        self.path = path
        self.mode = mode
        self.interval = 1.0 / rate
        self.retry = retry
        self.result = LoadResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sock: socket.socket | None = None
        self._buffered = b""

    def start(self) -> SteadyClient:
        """
        Start sending.
        """
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        """
        Stop after the request in progress; what was seen.
        """
        self._stop.set()
        self._thread.join(TIMEOUT * 3)
        self._drop()
        return self.result

    def _request(self) -> bytes:
        closing = "Connection: close\r\n" if self.mode == "close" else ""
        return f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{closing}\r\n".encode()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        self._buffered = b""
        if sock is not None:
            sock.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._one()
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.monotonic()

    def _one(self) -> None:
        started = time.monotonic()
        try:
            status, closes = self._exchange()
        except (OSError, _ClosedError, ValueError, IndexError) as e:
            self.result.failures.append(f"{time.time():.3f} {type(e).__name__}: {e}")
            self._drop()
            return
        self.result.latencies.append(time.monotonic() - started)
        self.result.statuses[status] += 1
        if closes or self.mode == "close":
            self._drop()

    def _exchange(self) -> tuple[int, bool]:
        reused = self._sock is not None
        if self._sock is None:
            self._sock = self._connect()
        sock = self._sock
        try:
            sock.sendall(self._request())
            status, closes, self._buffered = _read_response(sock, self._buffered)
        except (OSError, _ClosedError) as e:
            nothing = not isinstance(e, _ClosedError) or not e.received
            if not (self.retry and reused and nothing):
                raise
            # A reused connection the server had closed before it read this request.
            self.result.retries += 1
            self._drop()
            self._sock = sock = self._connect()
            sock.sendall(self._request())
            status, closes, self._buffered = _read_response(sock, b"")
        return status, closes


def run_clients(clients: Sequence[SteadyClient]) -> LoadResult:
    """
    Stop C{clients} and add up what they saw.
    """
    total = LoadResult()
    for client in clients:
        total.merge(client.stop())
    return total
