"""
The measuring process of C{python -m bench chain}: builds the gateway of a configuration
directory over in-memory transports and times requests through it.

Run as C{python -P bench/chain_worker.py CONFIG REQUESTS REPEATS [--profile]} with
C{PYTHONPATH} naming the edgegw tree to measure (C{-P}: this directory, which holds
modules named like the standard library's C{profile}, is not put on the path). It
imports edgegw and Twisted only, so that it runs against an older tree's edgegw too.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQUEST = b"GET /small.json HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
"""What wrk sends for the small payload (C{wrk -t1}: the request line and C{Host})."""

BODY = (
    b'{"id":4242,"name":"edgegw","ok":true,"tags":["bench","small"],'
    b'"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}\n'
)
"""A 100-byte JSON document, as the bench's small payload."""

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 17:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n"
    b"Last-Modified: Fri, 27 Nov 2026 16:00:00 GMT\r\nConnection: keep-alive\r\n"
    b'ETag: "6929-64"\r\nAccept-Ranges: bytes\r\n\r\n' % len(BODY)
) + BODY
"""What the bench's nginx backend answers for it, in one read."""


def build(directory: Path) -> Callable[[], bytes]:
    """
    Build the gateway of C{directory}'s configuration over in-memory transports, and
    return a function that sends one request and returns what the client received.
    """
    from twisted.internet import reactor
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    from edgegw.config.parse import load_config
    from edgegw.upstream.pool import UpstreamClient

    try:
        from edgegw.assembly.assemble import build_gateway
    except ImportError:
        # A --before tree from before edgegw/gateway.py became the assembly package.
        build_gateway = importlib.import_module("edgegw.gateway").build_gateway

    class Connector:
        def __init__(self, address: IPv4Address) -> None:
            self.address = address

        def getDestination(self) -> IPv4Address:
            return self.address

        def stopConnecting(self) -> None:
            pass

        def disconnect(self) -> None:
            pass

    class Reactor:
        """The real reactor's timers; connections made in memory, by hand."""

        def __init__(self) -> None:
            self.connecting: list[Any] = []
            # Bound here, not found through __getattr__ on each call: the pool asks for
            # the time with every connection it takes back, which would otherwise cost
            # the figure ~0.6 µs the real reactor does not.
            self.seconds = reactor.seconds
            self.callLater = reactor.callLater

        def connectTCP(
            self, host: str, port: int, factory: Any, timeout: float = 30, bindAddress: Any = None
        ) -> Connector:
            self.connecting.append(factory)
            return Connector(IPv4Address("TCP", host, port))

        def __getattr__(self, name: str) -> Any:
            return getattr(reactor, name)

    fake = Reactor()
    client = UpstreamClient(fake)
    built = build_gateway(load_config(str(directory), {}), reactor, client)
    writer = built.access_log.writer
    if writer is not None:
        writer.open()
    here = IPv4Address("TCP", "127.0.0.1", 8080)
    peer = IPv4Address("TCP", "127.0.0.1", 40000)
    channel = built.site.buildProtocol(peer)
    downstream = StringTransport(hostAddress=here, peerAddress=peer)
    channel.makeConnection(downstream)
    upstreams: list[tuple[Any, StringTransport]] = []
    backend = IPv4Address("TCP", "127.0.0.1", 9)
    run_timers = reactor.runUntilCurrent  # type: ignore[attr-defined]

    def one() -> bytes:
        channel.dataReceived(REQUEST)
        while fake.connecting:
            protocol = fake.connecting.pop().buildProtocol(backend)
            transport = StringTransport(hostAddress=peer, peerAddress=backend)
            protocol.makeConnection(transport)
            upstreams.append((protocol, transport))
        for protocol, transport in upstreams:
            if transport.value():
                transport.clear()
                protocol.dataReceived(RESPONSE)
        # What the reactor does at each iteration's end: timers made are put on its heap,
        # cancelled ones cleared out, due ones run.
        run_timers()
        out = downstream.value()
        downstream.clear()
        return bytes(out)

    return one


def measure(directory: Path, requests: int, repeats: int, profile: bool) -> float | None:
    """
    Return the best microseconds per request over C{repeats} runs of C{requests} (after
    a warm-up) through the gateway of C{directory}, or print a profile (and return
    L{None}).

    @raise SystemExit: The gateway does not answer 200 with the body.
    """
    one = build(directory)
    for _ in range(2_000):
        answer = one()
    if not answer.startswith(b"HTTP/1.1 200 ") or not answer.endswith(BODY):
        raise SystemExit(f"the gateway answered {answer[:300]!r}")
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(lambda: [one() for _ in range(requests)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
        return None
    best = float("inf")
    for _ in range(repeats):
        # CPU time, not wall time: other processes' load does not count.
        started = time.process_time()
        for _ in range(requests):
            answer = one()
        best = min(best, (time.process_time() - started) / requests * 1e6)
        if not answer.startswith(b"HTTP/1.1 200 ") or not answer.endswith(BODY):
            raise SystemExit(f"the gateway answered {answer[:300]!r}")
    return best


if __name__ == "__main__":
    figure = measure(
        Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), profile="--profile" in sys.argv
    )
    if figure is not None:
        print(json.dumps({"us_per_request": figure}))
