"""
An emulated network link for C{python -m bench pageload}: a TCP relay between the
browser and a server that delays and paces the bytes, below the browser (so the
browser's own network stack, HTTP/2 included, runs as it would on a real link).

  - Each direction is one shared link for every connection through the relay: bytes
    are serialised in the order they arrive at C{--down-mbit} (server to browser) or
    C{--up-mbit} (browser to server), as behind one bottleneck, then delivered
    C{--delay-ms} later (half the round trip).
  - A new connection's first bytes toward the server wait one round trip more: the TCP
    handshake the loopback connection did not pay.
  - At most C{--queue-kib} of a connection's bytes wait in the relay for the link in
    each direction; past that the relay stops reading that connection until half has
    gone, so a server's socket fills up as behind a real bottleneck, and one connection
    cannot put more than that ahead of the others.
  - Payload bytes are paced (no TCP/IP header overhead), in pieces of at most 4 KiB;
    there is no loss and no slow start.

Each connection opened is logged as one line (C{open N}) on stdout, which the harness
counts per page load. Run as C{python -m bench.link --port P --upstream-port S}.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

PIECE = 4096
"""Bytes paced as one unit on the link (a few packets)."""


class Direction:
    """
    One direction of the link, shared by every connection: a FIFO serialised at C{rate}
    bits per second, each piece delivered C{delay} seconds after its last bit left.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float, delay: float) -> None:
        self.loop = loop
        self.rate = rate
        self.delay = delay
        self.free_at = 0.0

    def schedule(self, size: int) -> tuple[float, float]:
        """
        Queue C{size} bytes: when they will have left the link and when they arrive.
        """
        start = max(self.loop.time(), self.free_at)
        end = start + size * 8 / self.rate
        self.free_at = end
        return end, end + self.delay


class Side(asyncio.BufferedProtocol):
    """
    One end of a relayed connection (the browser's or the server's), reading into a
    buffer of one piece at a time.
    """

    def __init__(self, relayed: Relayed, name: str) -> None:
        self.relayed = relayed
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray(PIECE)
        self.queued = 0
        self.paused = False
        self.last_arrival = 0.0
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        for data in self.pending:
            transport.write(data)
        self.pending.clear()
        self.relayed.made(self)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.relayed.forward(self, bytes(self.buffer[:nbytes]))

    def eof_received(self) -> bool:
        self.relayed.ended(self)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relayed.ended(self)

    def write(self, data: bytes) -> None:
        """Deliver C{data} to this end (kept until it is connected)."""
        if self.transport is None:
            self.pending.append(data)
        elif not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        """Close this end once what was written to it has gone."""
        if self.transport is not None:
            self.transport.close()


class Relayed:
    """
    One connection through the relay: the browser's end, the server's, and the link
    between them.
    """

    def __init__(self, relay: Relay, number: int) -> None:
        self.relay = relay
        self.loop = relay.loop
        self.number = number
        self.client = Side(self, "client")
        self.server = Side(self, "server")
        # The browser's first bytes reach the server one round trip late: the TCP
        # handshake that the loopback connection to the relay did not pay.
        self.ready_at = self.loop.time() + 2 * relay.up.delay
        self.closing = False

    def made(self, side: Side) -> None:
        if side is self.client:
            print(f"open {self.number}", flush=True)
            self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await self.loop.create_connection(
                lambda: self.server, "127.0.0.1", self.relay.upstream_port
            )
        except OSError as e:
            print(f"connection {self.number}: upstream refused: {e}", flush=True)
            self.client.close()

    def forward(self, source: Side, data: bytes) -> None:
        """Put C{data}, read from C{source}, on the link toward the other end."""
        downstream = source is self.server
        direction = self.relay.down if downstream else self.relay.up
        target = self.client if downstream else self.server
        for start in range(0, len(data), PIECE):
            piece = data[start : start + PIECE]
            left, arrival = direction.schedule(len(piece))
            if not downstream:
                arrival = max(arrival, self.ready_at + direction.delay)
            arrival = max(arrival, source.last_arrival)
            source.last_arrival = arrival
            source.queued += len(piece)
            self.loop.call_at(left, self._left, source, len(piece))
            self.loop.call_at(arrival, target.write, piece)
        if source.queued > self.relay.queue_limit and not source.paused:
            assert source.transport is not None
            source.transport.pause_reading()
            source.paused = True

    def _left(self, source: Side, size: int) -> None:
        source.queued -= size
        if source.paused and source.queued <= self.relay.queue_limit // 2:
            source.paused = False
            if source.transport is not None and not source.transport.is_closing():
                source.transport.resume_reading()

    def ended(self, source: Side) -> None:
        """C{source} closed: close the other end once everything before has arrived."""
        if self.closing:
            return
        self.closing = True
        other = self.client if source is self.server else self.server
        direction = self.relay.down if source is self.server else self.relay.up
        when = max(source.last_arrival, self.loop.time() + direction.delay)
        self.loop.call_at(when, other.close)


class Relay:
    """
    The relay's listening side: each accepted connection is relayed to the upstream
    port over the shared link.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        upstream_port: int,
        delay: float,
        down_rate: float,
        up_rate: float,
        queue_limit: int,
    ) -> None:
        self.loop = loop
        self.upstream_port = upstream_port
        self.down = Direction(loop, down_rate, delay)
        self.up = Direction(loop, up_rate, delay)
        self.queue_limit = queue_limit
        self.opened = 0

    def accept(self) -> Side:
        self.opened += 1
        return Relayed(self, self.opened).client


async def serve(arguments: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    relay = Relay(
        loop,
        arguments.upstream_port,
        arguments.delay_ms / 1000,
        arguments.down_mbit * 1e6,
        arguments.up_mbit * 1e6,
        arguments.queue_kib * 1024,
    )
    server = await loop.create_server(relay.accept, "127.0.0.1", arguments.port, backlog=1024)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(
        f"relaying 127.0.0.1:{arguments.port} to 127.0.0.1:{arguments.upstream_port}: "
        f"{arguments.delay_ms:g} ms each way, {arguments.down_mbit:g} Mbit/s down, "
        f"{arguments.up_mbit:g} Mbit/s up, {arguments.queue_kib} KiB queued per connection",
        flush=True,
    )
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and relay until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.link", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="where the browser connects")
    parser.add_argument("--upstream-port", type=int, required=True, help="the server's port")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="one way (default 50)")
    parser.add_argument("--down-mbit", type=float, default=10.0, help="server to browser")
    parser.add_argument("--up-mbit", type=float, default=10.0, help="browser to server")
    parser.add_argument("--queue-kib", type=int, default=64, help="per connection and way")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
