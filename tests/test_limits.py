"""
Slow clients and floods (issue 10, point 5): C{Gateway.spec.limits}. Deadlines run on a
test clock; connections are real sockets to a whole gateway whose backend records what
reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.config.model import LimitsSpec
from edgegw.gateway import Gateway
from edgegw.server.request import GatewayChannel
from tests.support.backends import RawBackend, RawConnection, RawRequest
from tests.support.configs import GATEWAY, load_text, problems_of
from tests.support.gateways import start_gateway
from tests.support.rawclient import RawClient, connect
from tests.test_request import Collector, Fixture, Outcome, head, ok

TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class ObservedChannel(GatewayChannel):
    """
    A gateway connection that reports each read it has handled, so that a test moves its
    clock only once the bytes it sent are in.
    """

    reads: list[Deferred[GatewayChannel]]

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        waiting, self.reads[:] = self.reads[:], []
        for waiter in waiting:
            waiter.callback(self)


def observe(gateway: Gateway) -> Callable[[], Deferred[GatewayChannel]]:
    """
    Make C{gateway}'s connections observed; return what gives the next read.
    """
    reads: list[Deferred[GatewayChannel]] = []

    class Channel(ObservedChannel):
        pass

    Channel.reads = reads
    gateway.site.protocol = Channel  # type: ignore[assignment]

    def next_read() -> Deferred[GatewayChannel]:
        read: Deferred[GatewayChannel] = Deferred()
        reads.append(read)
        return read

    return next_read


def hold(request: RawRequest, connection: RawConnection) -> None:
    """
    A backend that never answers.
    """


class DeadlineTests(TestCase):
    """
    A request head has a fixed deadline from its first byte; a body, a bound on the gap
    between two reads.
    """

    def start(self, gateway_spec: str = "") -> tuple[Clock, Callable[[], Any], int]:
        self.backend = RawBackend(hold).start()
        self.addCleanup(lambda: ensureDeferred(self.backend.stop()))
        clock = Clock()
        gateway, port = start_gateway(
            self, f"http://127.0.0.1:{self.backend.port}", gateway_spec, clock=clock
        )
        return clock, observe(gateway), port

    async def send(self, client: RawClient, data: bytes, next_read: Callable[[], Any]) -> Any:
        """
        Send C{data}; fire with the gateway's channel once it has read it.
        """
        read = next_read()
        client.send(data)
        return await read

    async def test_slow_header_client_cut_at_the_deadline(self) -> None:
        clock, next_read, port = self.start()
        client = await connect(port)
        channel = await self.send(client, b"GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: ", next_read)
        # One byte every 10 seconds: each would renew a timer that reads restart.
        for _ in range(5):
            clock.advance(10)
            await self.send(client, b"a", next_read)
        clock.advance(9.9)
        self.assertFalse(channel.transport.disconnecting)
        clock.advance(0.1)
        # 60 seconds after the head's first byte, however recent the last one.
        self.assertTrue(channel.transport.disconnecting)
        await client.closed
        self.assertEqual(client.received, TIMED_OUT)
        self.assertEqual(self.backend.connections, [])

    async def test_configured_header_deadline(self) -> None:
        clock, next_read, port = self.start("limits: {headerTimeout: 5s}\n")
        client = await connect(port)
        channel = await self.send(client, b"G", next_read)
        clock.advance(4.9)
        await self.send(client, b"ET /x HTTP/1.1\r\n", next_read)
        clock.advance(0.1)
        self.assertTrue(channel.transport.disconnecting)
        await client.closed
        self.assertEqual(client.received, TIMED_OUT)
        self.assertEqual(self.backend.connections, [])

    async def test_body_gap_deadline(self) -> None:
        clock, next_read, port = self.start("limits: {bodyTimeout: 30s}\n")
        client = await connect(port)
        channel = await self.send(
            client, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", next_read
        )
        # Each body read renews the gap's timer...
        for _ in range(3):
            clock.advance(29.9)
            await self.send(client, b"d", next_read)
        self.assertFalse(channel.transport.disconnecting)
        # ... a gap of 30 seconds ends the request.
        clock.advance(30)
        self.assertTrue(channel.transport.disconnecting)
        await client.closed
        self.assertEqual(client.received, TIMED_OUT)
        # The backend had the head and part of the body, never a whole request, and the
        # gateway dropped its connection.
        [upstream] = self.backend.connections
        await self.backend.all_lost()
        self.assertEqual(upstream.requests, [])
        self.assertTrue(upstream.received.startswith(b"POST /x HTTP/1.1\r\n"))


class ChannelTimerTests(Fixture, SynchronousTestCase):
    """
    Which timer runs when, on one connection in memory.
    """

    def connect_limited(self, answer: Any = ok) -> Any:
        conn, handler = self.connect(answer, timeout=75)
        conn.channel.headerTimeout = 60
        conn.channel.bodyTimeout = 30
        return conn, handler

    def test_idle_until_the_first_byte(self) -> None:
        conn, _ = self.connect_limited()
        self.clock.advance(74.9)
        self.assertFalse(conn.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(conn.transport.disconnecting)
        # An idle connection is closed without an answer.
        self.assertEqual(conn.transport.value(), b"")

    def test_each_request_head_gets_its_own_deadline(self) -> None:
        conn, _ = self.connect_limited()
        conn.send(head("GET"))
        self.assertEqual(len(conn.responses()), 1)
        # Idle again: the idle timeout, from the end of the response.
        self.clock.advance(70)
        conn.send(b"GET /two HTTP/1.1\r\n")
        self.clock.advance(59.9)
        conn.send(b"Host: x\r\n")
        self.assertFalse(conn.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(conn.transport.value().count(b"HTTP/1.1 408 "), 1)

    def test_no_timer_while_answering(self) -> None:
        conn, handler = self.connect_limited(answer=lambda request: 1)  # NOT_DONE_YET
        conn.send(head("GET"))
        self.clock.advance(1000)
        self.assertFalse(conn.transport.disconnecting)
        handler.requests[0].finish()
        self.clock.advance(75)
        self.assertTrue(conn.transport.disconnecting)

    def test_body_timeout_fails_the_request_at_once(self) -> None:
        conn, handler = self.connect_limited(answer=lambda request: 1)
        conn.send(head(length=10) + b"abc")
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        produced = Outcome(request.body.startProducing(Collector()))
        self.clock.advance(30)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(conn.transport.value(), TIMED_OUT)
        assert finished.failure is not None and produced.failure is not None
        self.assertTrue(request._disconnected)

    def test_pipelined_head_deadline_starts_when_read(self) -> None:
        # A request read ahead while the previous one is answered: its deadline starts
        # when the gateway turns to it, not when it arrived.
        conn, handler = self.connect_limited(answer=lambda request: 1)
        conn.send(head("GET", "/one") + b"GET /two HTTP/1.1\r\n")
        self.clock.advance(100)
        handler.requests[0].finish()
        self.clock.advance(59.9)
        self.assertFalse(conn.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(conn.transport.disconnecting)


class LimitsConfigTests(TestCase):
    """
    C{Gateway.spec.limits}: defaults, values, and errors naming file, resource and field.
    """

    def test_defaults(self) -> None:
        config = load_text(self.mktemp(), "", gateway=True)
        self.assertEqual(config.gateway.limits, LimitsSpec())
        self.assertEqual(
            (config.gateway.limits.header_timeout, config.gateway.limits.body_timeout),
            (60.0, 60.0),
        )

    def test_values(self) -> None:
        root = self.mktemp()
        config = load_gateway(root, "limits: {headerTimeout: 10s, bodyTimeout: 1m30s}")
        self.assertEqual(config.gateway.limits, LimitsSpec(header_timeout=10, body_timeout=90))

    def test_errors(self) -> None:
        self.assertEqual(
            gateway_problems(
                self.mktemp(), "limits: {headerTimeout: 0s, bodyTimeout: 30, headerTimout: 1s}"
            ),
            [
                'document 1, Gateway "gw": spec.limits.headerTimeout: must be greater than 0, '
                'got "0s"',
                'document 1, Gateway "gw": spec.limits.bodyTimeout: expected a duration string '
                'such as "30s" or "1h30m", got an integer',
                'document 1, Gateway "gw": spec.limits.headerTimout: unknown field; '
                'did you mean "headerTimeout"?',
            ],
        )


GATEWAY_HEAD = GATEWAY


def load_gateway(root: str, spec_line: str) -> Any:
    """
    Load a configuration that is a Gateway with C{spec_line} in its spec.
    """
    return load_text(root, GATEWAY_HEAD + "  " + spec_line + "\n", gateway=False)


def gateway_problems(root: str, spec_line: str) -> list[str]:
    """
    The problems loading a Gateway with C{spec_line} in its spec reports.
    """
    return problems_of(root, GATEWAY_HEAD + "  " + spec_line + "\n", gateway=False)
