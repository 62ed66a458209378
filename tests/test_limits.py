"""
Slow clients and floods (issue 10, point 5): C{Gateway.spec.limits}. Deadlines run on a
test clock; connections are real sockets to a whole gateway whose backend records what
reaches it.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any, cast

from twisted.internet import reactor as _reactor
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, Logger
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from wsproto import ConnectionType, WSConnection
from wsproto.events import CloseConnection
from wsproto.events import Request as WSRequest

from edgegw.assembly.assemble import Gateway
from edgegw.config.model import LimitsSpec
from edgegw.config.parse import load_config
from edgegw.server.channel import GatewayChannel
from edgegw.server.gateway_site import (
    DESCRIPTOR_RESERVE,
    REFUSAL_LOG_INTERVAL,
    ClientConnections,
    LimitedSite,
    fit_descriptor_limit,
)
from edgegw.service import build_service
from edgegw.upstream.pool import UpstreamClient, UpstreamUnavailableError
from edgegw.upstream.upstreams import Upstream
from tests.support.backends import RawBackend, RawConnection, RawRequest
from tests.support.configs import GATEWAY, load_text, problems_of, write_tree
from tests.support.gateways import answer_ok, start_gateway
from tests.support.memory import parse_responses
from tests.support.processes import listen_local, port_of
from tests.support.rawclient import RawClient, connect, response_complete
from tests.test_daemon import HeldBackend, stop_if_running
from tests.test_proxy import EchoWebSocket
from tests.test_request import Collector, Fixture, Outcome, head, ok

reactor: Any = _reactor

TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class ObservedChannel(GatewayChannel):
    """
    A gateway connection that reports each read it has handled, so that a test moves its
    clock only once the bytes it sent are in, and its end.
    """

    observer: Observer

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        self.observer.fire(self.observer.reads, self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.observer.fire(self.observer.gone, self)


class Observer:
    """
    Waits for what a gateway's connections do (see L{ObservedChannel}).
    """

    def __init__(self, gateway: Gateway) -> None:
        self.reads: list[Deferred[GatewayChannel]] = []
        self.gone: list[Deferred[GatewayChannel]] = []

        class Channel(ObservedChannel):
            observer = self

        gateway.site.protocol = Channel

    def next_read(self) -> Deferred[GatewayChannel]:
        """
        Fires with the channel once a connection has handled its next read.
        """
        read: Deferred[GatewayChannel] = Deferred()
        self.reads.append(read)
        return read

    def next_gone(self) -> Deferred[GatewayChannel]:
        """
        Fires with the channel once the next connection is gone.
        """
        gone: Deferred[GatewayChannel] = Deferred()
        self.gone.append(gone)
        return gone

    @staticmethod
    def fire(waiters: list[Deferred[GatewayChannel]], channel: GatewayChannel) -> None:
        waiting, waiters[:] = waiters[:], []
        for waiter in waiting:
            waiter.callback(channel)


def observe(gateway: Gateway) -> Callable[[], Deferred[GatewayChannel]]:
    """
    Make C{gateway}'s connections observed; return what gives the next read.
    """
    return Observer(gateway).next_read


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

    async def test_no_body_deadline_while_the_gateway_holds_back_100_continue(self) -> None:
        clock, next_read, port = self.start(
            "limits: {maxConnectionsPerUpstream: 1, upstreamQueueTimeout: 300s, bodyTimeout: 30s}\n"
        )
        first = await connect(port)
        self.addCleanup(abort, first)
        await self.send(first, b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n", next_read)
        client = await connect(port)
        self.addCleanup(abort, client)
        channel = await self.send(
            client,
            b"POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
            next_read,
        )
        # The client rightly waits for 100 Continue, which the gateway sends once it
        # has an upstream connection to send the body on: not a slow body.
        clock.advance(60)
        self.assertFalse(cast(Any, channel.transport).disconnecting)
        self.assertEqual(client.received, b"")
        # (The queue's own deadline, on the upstream client's clock, would answer 503.)
        abort(client)

    async def test_body_deadline_starts_with_100_continue(self) -> None:
        clock, next_read, port = self.start("limits: {bodyTimeout: 30s}\n")
        client = await connect(port)
        channel = await self.send(
            client,
            b"POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
            next_read,
        )
        await client.until(b"HTTP/1.1 100 Continue\r\n\r\n")
        # Asked for the body, the client has the body's gap to send it.
        clock.advance(29.9)
        self.assertFalse(channel.transport.disconnecting)
        clock.advance(0.1)
        self.assertTrue(channel.transport.disconnecting)
        await client.closed

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


async def connect_from(port: int, host: str) -> RawClient:
    """
    A connected L{RawClient} to 127.0.0.1:C{port} from the loopback address C{host}.
    """
    client = RawClient()
    endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port, bindAddress=(host, 0))
    await connectProtocol(endpoint, client)
    return client


HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
HEALTH_CLOSE = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
PROXIED = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def healthy(client: RawClient, request: bytes = HEALTH_CLOSE) -> int:
    """
    Send a health check on C{client}; the status of its complete response.
    """
    start = len(client.received)
    client.send(request)
    await client.until(lambda data: response_complete(data[start:]))
    [response] = parse_responses(client.received[start:])
    return response.status


class ConnectionCapTests(TestCase):
    """
    Connections beyond the caps are closed at once and nothing of them is read, while
    /healthz keeps answering.
    """

    def start(self, gateway_spec: str) -> tuple[Gateway, Clock, Observer, int]:
        self.backend = RawBackend(answer_ok, on_head=True).start()
        self.addCleanup(lambda: ensureDeferred(self.backend.stop()))
        clock = Clock()
        gateway, port = start_gateway(
            self, f"http://127.0.0.1:{self.backend.port}", gateway_spec, clock=clock
        )
        return gateway, clock, Observer(gateway), port

    async def slow_client(self, port: int, observer: Observer, host: str = "127.0.0.1") -> Any:
        """
        A client that has sent part of a request head, holding its connection.
        """
        client = await connect_from(port, host)
        read = observer.next_read()
        client.send(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        await read
        self.addCleanup(client.close)
        return client

    async def assert_refused(self, port: int, host: str = "127.0.0.1") -> None:
        client = await connect_from(port, host)
        client.send(PROXIED)
        await client.closed
        self.assertEqual(client.received, b"")

    async def test_per_address_cap(self) -> None:
        gateway, _, observer, port = self.start("limits: {maxConnectionsPerAddress: 2}\n")
        connections = gateway.site.connections
        slow = [await self.slow_client(port, observer) for _ in range(2)]
        await self.assert_refused(port)
        # Another client is served meanwhile.
        other = await connect_from(port, "127.0.0.2")
        self.assertEqual(await healthy(other), 200)
        await other.closed
        self.assertEqual(self.backend.connections, [])
        self.assertEqual((connections.refused_over_address, connections.refused_over_total), (1, 0))
        # A connection of that address gone: it may open another.
        gone = observer.next_gone()
        await slow[0].close()
        await gone
        again = await connect_from(port, "127.0.0.1")
        self.assertEqual(await healthy(again), 200)
        await again.closed

    async def test_process_cap(self) -> None:
        gateway, clock, observer, port = self.start(
            "limits: {maxConnections: 3, maxConnectionsPerAddress: 0}\n"
        )
        connections = gateway.site.connections
        checker = await connect(port)
        self.addCleanup(checker.close)
        self.assertEqual(await healthy(checker, HEALTH), 200)
        await self.slow_client(port, observer, "127.0.0.2")
        await self.slow_client(port, observer, "127.0.0.3")
        await self.assert_refused(port, "127.0.0.4")
        self.assertEqual((connections.refused_over_total, connections.count), (1, 3))
        # The health checker's open connection is still answered.
        self.assertEqual(await healthy(checker, HEALTH), 200)
        self.assertEqual(self.backend.connections, [])
        # The slow clients reach their head deadline: room again.
        gone = [observer.next_gone(), observer.next_gone()]
        clock.advance(60)
        for each in gone:
            await each
        fresh = await connect_from(port, "127.0.0.4")
        self.assertEqual(await healthy(fresh), 200)
        await fresh.closed

    async def test_tunnel_counts_until_it_ends(self) -> None:
        ws_port = listen_local(Factory.forProtocol(EchoWebSocket))
        self.addCleanup(ws_port.stopListening)
        clock = Clock()
        gateway, port = start_gateway(
            self,
            f"http://127.0.0.1:{port_of(ws_port)}",
            "limits: {maxConnections: 1}\n",
            clock=clock,
        )
        connections = gateway.site.connections
        client = await connect(port)
        ws = WSConnection(ConnectionType.CLIENT)
        client.send(ws.send(WSRequest(host="gateway.test", target="/ws")))
        await client.until(b"\r\n\r\n")
        self.assertTrue(client.received.startswith(b"HTTP/1.1 101 "), client.received)
        ws.receive_data(client.received)
        list(ws.events())
        # The tunnel holds the one connection allowed.
        await self.assert_refused(port)
        client.send(ws.send(CloseConnection(code=1000)))
        await client.closed
        while connections.count:
            await deferLater(reactor, 0.01, lambda: None)
        fresh = await connect(port)
        self.assertEqual(await healthy(fresh), 200)
        await fresh.closed


def abort(client: RawClient) -> None:
    """
    Drop a test client's connection at once (a cleanup).
    """
    transport: Any = client.transport
    if transport is not None:
        transport.abortConnection()


async def eventually(condition: Callable[[], bool]) -> None:
    """
    Wait until C{condition} holds (checked every few milliseconds).
    """
    while not condition():
        await deferLater(reactor, 0.005, lambda: None)


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


async def response_of(client: RawClient) -> Any:
    await client.closed
    [response] = parse_responses(client.received)
    return response


class UpstreamBoundTests(TestCase):
    """
    At most C{maxConnectionsPerUpstream} connections to one upstream: requests beyond it
    wait for one, at most the route's timeout (else C{upstreamQueueTimeout}), then 503.
    """

    def start(self, gateway_spec: str) -> tuple[HeldBackend, Gateway, int, Upstream]:
        backend = HeldBackend(self)
        # /short/ goes to the same upstream with a route timeout of its own.
        short = (
            "---\nkind: Route\nmetadata: {name: short}\nspec:\n  match: /short/\n"
            f"  handler: {{type: reverse-proxy, upstream: '{backend.url}', timeout: 300ms}}\n"
        )
        gateway, port = start_gateway(
            self, backend.url, "limits: {" + gateway_spec + "}\n", clock=reactor, routes=short
        )
        return backend, gateway, port, Upstream.from_url(backend.url)

    async def hold_the_connection(self, backend: HeldBackend, port: int) -> tuple[Any, RawClient]:
        """
        A request the backend holds, on the upstream's one connection.
        """
        arrived = backend.arrival()
        client = await connect(port)
        client.send(get("/held"))
        return await arrived, client

    async def test_waits_for_a_free_connection(self) -> None:
        backend, gateway, port, upstream = self.start("maxConnectionsPerUpstream: 1")
        pool = gateway.upstream_client
        held, first = await self.hold_the_connection(backend, port)
        second = await connect(port)
        second.send(get("/next"))
        await eventually(lambda: pool.queued(upstream) == 1)
        self.assertEqual(backend.site.connections, 1)
        self.assertEqual([r.uri for r in backend.site.requests], [b"/held"])
        arrived = backend.arrival()
        HeldBackend.answer(held, b"first")
        self.assertEqual((await response_of(first)).body, b"first")
        # The connection freed goes to the request that waited.
        HeldBackend.answer(await arrived, b"second")
        response = await response_of(second)
        self.assertEqual((response.status, response.body), (200, b"second"))
        self.assertEqual(backend.site.connections, 1)

    async def test_route_timeout_then_503(self) -> None:
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        backend, gateway, port, upstream = self.start("maxConnectionsPerUpstream: 1")
        held, first = await self.hold_the_connection(backend, port)
        waiting = await connect(port)
        waiting.send(get("/short/x"))
        response = await response_of(waiting)
        self.assertEqual((response.status, response.body), (503, b"service unavailable\n"))
        self.assertEqual(gateway.upstream_client.queued(upstream), 0)
        # It never reached the backend; the request holding the connection is unharmed.
        self.assertEqual(backend.site.connections, 1)
        HeldBackend.answer(held, b"first")
        self.assertEqual((await response_of(first)).status, 200)
        self.assertEqual(gateway.upstream_client.unavailable, 1)
        # The access log says no connection could be had, not that the upstream said 503.
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        refused = [r for r in records if r["status"] == 503]
        [call] = refused[0]["upstream_calls"]
        self.assertEqual(
            (call["status"], call["error"]), (None, "no upstream connection available")
        )

    async def test_queue_timeout_without_route_timeout(self) -> None:
        backend, _, port, _ = self.start(
            "maxConnectionsPerUpstream: 1, upstreamQueueTimeout: 300ms"
        )
        held, first = await self.hold_the_connection(backend, port)
        waiting = await connect(port)
        waiting.send(get("/x"))
        self.assertEqual((await response_of(waiting)).status, 503)
        self.assertEqual(backend.site.connections, 1)
        HeldBackend.answer(held, b"first")
        self.assertEqual((await response_of(first)).status, 200)

    async def test_client_gone_leaves_the_queue(self) -> None:
        backend, gateway, port, upstream = self.start("maxConnectionsPerUpstream: 1")
        pool = gateway.upstream_client
        held, first = await self.hold_the_connection(backend, port)
        leaving = await connect(port)
        leaving.send(get("/never"))
        await eventually(lambda: pool.queued(upstream) == 1)
        await leaving.close()
        await eventually(lambda: pool.queued(upstream) == 0)
        HeldBackend.answer(held, b"first")
        self.assertEqual((await response_of(first)).status, 200)
        await eventually(lambda: pool.idle_connections(upstream) == 1)
        self.assertEqual([r.uri for r in backend.site.requests], [b"/held"])

    async def test_health_answers_while_the_upstream_is_full(self) -> None:
        backend, _, port, _ = self.start("maxConnectionsPerUpstream: 1")
        held, first = await self.hold_the_connection(backend, port)
        checker = await connect(port)
        self.assertEqual(await healthy(checker), 200)
        HeldBackend.answer(held, b"first")
        await response_of(first)


class PoolQueueTests(TestCase):
    """
    The bound in the pool itself.
    """

    def setUp(self) -> None:
        self.backend = RawBackend(answer_ok).start()
        self.addCleanup(lambda: ensureDeferred(self.backend.stop()))
        self.upstream = self.backend.upstream()

    def pool(self, **kwargs: Any) -> UpstreamClient:
        pool = UpstreamClient(reactor, **kwargs)
        self.addCleanup(pool.close)
        return pool

    def request(self, pool: UpstreamClient, **kwargs: Any) -> Deferred[Any]:
        return pool.request(
            self.upstream, b"GET", b"/", [(b"Host", self.upstream.authority)], **kwargs
        )

    async def test_close_answers_the_queue(self) -> None:
        # The backend never answers a request with this body, so the first holds on.
        hold_backend = RawBackend(hold).start()
        self.addCleanup(lambda: ensureDeferred(hold_backend.stop()))
        upstream = hold_backend.upstream()
        pool = self.pool(max_connections_per_upstream=1)
        first = pool.request(upstream, b"GET", b"/", [(b"Host", upstream.authority)])
        second = pool.request(upstream, b"HEAD", b"/", [(b"Host", upstream.authority)])
        self.assertEqual(pool.queued(upstream), 1)
        await pool.close()
        await self.assertFailure(second, UpstreamUnavailableError)
        first.cancel()
        await first.addErrback(lambda failure: None)

    async def test_upgrade_makes_room_from_an_idle_connection(self) -> None:
        pool = self.pool(max_connections_per_upstream=1)
        response = await self.request(pool)
        await response.deliver(Collector())
        await eventually(lambda: pool.idle_connections(self.upstream) == 1)
        upgraded = await self.request(pool, upgrade=True)
        self.assertEqual(upgraded.code, 200)
        await upgraded.deliver(Collector())
        self.assertEqual(len(self.backend.connections), 2)
        self.assertEqual(pool.idle_connections(self.upstream), 0)

    async def test_cancelled_while_queued(self) -> None:
        hold_backend = RawBackend(hold).start()
        self.addCleanup(lambda: ensureDeferred(hold_backend.stop()))
        upstream = hold_backend.upstream()
        pool = self.pool(max_connections_per_upstream=1)
        first = pool.request(upstream, b"GET", b"/", [(b"Host", upstream.authority)])
        second = pool.request(upstream, b"GET", b"/", [(b"Host", upstream.authority)])
        self.assertEqual(pool.queued(upstream), 1)
        second.cancel()
        self.failureResultOf(second, CancelledError)
        self.assertEqual(pool.queued(upstream), 0)
        await eventually(lambda: len(hold_backend.connections) == 1)
        first.cancel()
        await first.addErrback(lambda failure: None)
        await eventually(lambda: pool.open_connections(upstream) == 0)
        await hold_backend.all_lost()
        self.assertEqual(len(hold_backend.connections), 1)


class ShutdownTests(TestCase):
    """
    Review finding L3: draining closes idle keep-alive connections at once; a request in
    flight is answered with C{Connection: close}.
    """

    async def test_idle_connections_closed_when_draining(self) -> None:
        backend = HeldBackend(self)
        root = write_tree(
            self.mktemp(),
            {
                "gateway.yaml": GATEWAY
                + "  drainTimeout: 5s\n"
                + "---\nkind: Route\nmetadata: {name: health}\n"
                + "spec: {match: GET /healthz, handler: {type: health}}\n"
                + "---\nkind: Route\nmetadata: {name: p}\nspec:\n  match: /\n"
                + f'  handler: {{type: reverse-proxy, upstream: "{backend.url}"}}\n'
            },
        )
        service = build_service(load_config(root, {}), reactor)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(stop_if_running, service)
        port = port_of(service)
        # A keep-alive connection, idle after its first request.
        idle = await connect(port)
        self.assertEqual(await healthy(idle, HEALTH), 200)
        # A request in flight on another one.
        busy = await connect(port)
        arrived = backend.arrival()
        busy.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held = await arrived
        stopped = service.stopService()
        # The idle connection cannot start another request: it is closed, unanswered.
        idle.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await idle.closed
        self.assertEqual(len(parse_responses(idle.received)), 1)
        self.assertNoResult(stopped)
        HeldBackend.answer(held, b"slow")
        await busy.closed
        [response] = parse_responses(busy.received)
        self.assertEqual((response.status, response.header("connection")), (200, "close"))
        await stopped
        self.assertEqual([r.uri for r in backend.site.requests], [b"/slow"])

    def test_head_in_progress_answered_with_close(self) -> None:
        site = LimitedSite(Resource(), reactor=Clock())
        site.protocol = GatewayChannel  # type: ignore[assignment]
        channel = site.buildProtocol(IPv4Address("TCP", "192.0.2.1", 1))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"GET / HTTP/1.1\r\n")
        site.shut_down()
        self.assertFalse(transport.disconnecting)
        channel.dataReceived(b"Host: x\r\n\r\n")
        self.assertIn(b"\r\nConnection: close\r\n", transport.value())
        self.assertTrue(transport.disconnecting)
        # And no new connection is let in.
        self.assertNotIsInstance(
            site.buildProtocol(IPv4Address("TCP", "192.0.2.1", 2)), GatewayChannel
        )
        self.assertEqual(site.connections.refused, 0)


class RefusalTests(SynchronousTestCase):
    """
    Admission, in memory: keys, exemptions, the refusal log.
    """

    def site(self, **limits: Any) -> tuple[LimitedSite, Clock]:
        clock = Clock()
        site = LimitedSite(
            Resource(),
            LimitsSpec(**limits),
            trusted_peer=lambda host: host == "192.0.2.100",
            reactor=clock,
        )
        site.protocol = GatewayChannel  # type: ignore[assignment]
        return site, clock

    def test_refused_connection_closed_at_once(self) -> None:
        site, _ = self.site(max_connections=1)
        site.buildProtocol(IPv4Address("TCP", "192.0.2.1", 1))
        refused = site.buildProtocol(IPv4Address("TCP", "192.0.2.2", 1))
        self.assertNotIsInstance(refused, GatewayChannel)
        transport = StringTransport()
        refused.makeConnection(transport)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")

    def test_closed_connection_makes_room(self) -> None:
        site, _ = self.site(max_connections=1)
        address = IPv4Address("TCP", "192.0.2.1", 1)
        channel = site.buildProtocol(address)
        channel.makeConnection(StringTransport())
        channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(site.connections.count, 0)
        self.assertIsInstance(site.buildProtocol(address), GatewayChannel)

    def test_address_keys(self) -> None:
        site, _ = self.site(max_connections_per_address=1)

        def admitted(host: str) -> bool:
            kind = IPv6Address if ":" in host else IPv4Address
            return isinstance(site.buildProtocol(kind("TCP", host, 1)), GatewayChannel)

        self.assertTrue(admitted("2001:db8:0:1::1"))
        # One /64 is one client; an IPv4-mapped address is its IPv4 address.
        self.assertFalse(admitted("2001:db8:0:1:ffff::2"))
        self.assertTrue(admitted("2001:db8:0:2::1"))
        self.assertTrue(admitted("192.0.2.1"))
        self.assertFalse(admitted("::ffff:192.0.2.1"))
        # A trusted proxy speaks for many clients: no per-address cap.
        self.assertTrue(admitted("192.0.2.100"))
        self.assertTrue(admitted("192.0.2.100"))
        # Nor for peers without an IP address.
        self.assertTrue(isinstance(site.buildProtocol(UNIXAddress(None)), GatewayChannel))
        self.assertTrue(isinstance(site.buildProtocol(UNIXAddress(None)), GatewayChannel))
        self.assertEqual(site.connections.refused_over_address, 2)

    def test_refusals_logged_once_per_interval(self) -> None:
        site, clock = self.site(max_connections=1, max_connections_per_address=0)
        events: list[dict[str, Any]] = []
        site.connections.log = recording(events)
        address = IPv4Address("TCP", "192.0.2.1", 1)
        site.buildProtocol(address)
        for _ in range(3):
            site.buildProtocol(address)
        self.assertEqual([event["total"] for event in events], [1])
        clock.advance(REFUSAL_LOG_INTERVAL - 1)
        site.buildProtocol(address)
        self.assertEqual(len(events), 1)
        clock.advance(1)
        site.buildProtocol(address)
        self.assertEqual([event["total"] for event in events], [1, 4])
        self.assertEqual(site.connections.refused, 5)


def recording(events: list[dict[str, Any]]) -> Logger:
    """
    A logger for the limits' namespace whose events go to C{events}.
    """
    return Logger(namespace="edgegw.limits", observer=cast(ILogObserver, events.append))


class DescriptorLimitTests(SynchronousTestCase):
    """
    The open-file limit is raised to fit the connection cap, or the cap lowered.
    """

    def limits(self, soft: int, hard: int) -> list[tuple[int, int]]:
        current = [soft, hard]
        calls: list[tuple[int, int]] = []

        def setrlimit(which: int, values: tuple[int, int]) -> None:
            calls.append(values)
            current[0] = values[0]

        self.patch(resource, "getrlimit", lambda which: tuple(current))
        self.patch(resource, "setrlimit", setrlimit)
        return calls

    def test_raised_to_fit(self) -> None:
        calls = self.limits(1024, 65536)
        self.assertEqual(fit_descriptor_limit(8192), 8192)
        self.assertEqual(calls, [(2 * 8192 + DESCRIPTOR_RESERVE, 65536)])

    def test_room_already(self) -> None:
        calls = self.limits(65536, 65536)
        self.assertEqual(fit_descriptor_limit(8192), 8192)
        self.assertEqual(calls, [])

    def test_cap_lowered_when_the_hard_limit_is_low(self) -> None:
        calls = self.limits(1024, 4096)
        self.assertEqual(fit_descriptor_limit(8192), (4096 - DESCRIPTOR_RESERVE) // 2)
        self.assertEqual(calls, [(4096, 4096)])

    def test_site_warns_and_lowers_its_cap(self) -> None:
        self.limits(1024, 1024)
        site = LimitedSite(Resource(), LimitsSpec(max_connections=8192), reactor=Clock())
        events: list[dict[str, Any]] = []
        self.patch(ClientConnections, "log", recording(events))
        site.fit_descriptor_limit()
        self.assertEqual(site.connections.max_connections, (1024 - DESCRIPTOR_RESERVE) // 2)
        self.assertEqual(len(events), 1)


class ChannelTimerTests(Fixture, SynchronousTestCase):
    """
    Which timer runs when, on one connection in memory.
    """

    def connect_limited(self, answer: Any = ok) -> Any:
        conn, handler = self.connect(answer, timeout=75)
        conn.channel.headerTimeout = 60
        conn.channel.bodyTimeout = 30
        return conn, handler

    def closes_after(self, conn: Any, seconds: float) -> None:
        """
        Assert that C{conn} stays open for C{seconds} less 0.1, then closes.
        """
        self.clock.advance(seconds - 0.1)
        self.assertFalse(conn.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(conn.transport.disconnecting)

    def test_keep_alive_requests_share_one_timer(self) -> None:
        """
        The timer is not stopped and started again for each request (two C{callLater}s
        and two cancellations a request): the pending one stays while the deadline moves
        later, and a timer that fires before the deadline waits for the rest.
        """
        conn, _ = self.connect_limited()
        made = []
        call_later = conn.channel.callLater

        def counted(*args: Any, **kwargs: Any) -> Any:
            made.append(args[0])
            return call_later(*args, **kwargs)

        conn.channel.callLater = counted
        for _ in range(100):
            conn.send(head("GET"))
            self.clock.advance(1)
        self.assertEqual(len(conn.responses()), 100)
        # A head's deadline (60 s) sooner than the pending timer (idle, 75 s) takes a
        # new one, and so does the timer firing before the deadline: a few a minute,
        # not two a request (200).
        self.assertLessEqual(len(made), 3)
        # Idle since the last response (at 99 s): closed 75 s after it, not before.
        self.closes_after(conn, 74)
        self.assertEqual(conn.transport.value().count(b" 408 "), 0)

    def test_a_sooner_deadline_replaces_the_pending_timer(self) -> None:
        conn, _ = self.connect_limited()
        conn.channel.headerTimeout = 5
        # Idle (75 s), then a head's first byte: its deadline, 5 s on, comes first.
        self.clock.advance(10)
        conn.send(b"GET / HTTP/1.1\r\n")
        self.closes_after(conn, 5)
        self.assertEqual(conn.transport.value().count(b"HTTP/1.1 408 "), 1)

    def test_a_head_begun_with_an_answered_one_has_its_deadline(self) -> None:
        # The start of a pipelined head, read with a request answered within the same
        # read: its deadline starts with that read, not with the next one.
        conn, _ = self.connect_limited()
        conn.send(head("GET") + b"GET /b HTTP/1.1\r\n")
        self.closes_after(conn, 60)
        self.assertEqual(conn.transport.value().count(b"HTTP/1.1 408 "), 1)

    def test_an_empty_line_between_requests_leaves_the_connection_idle(self) -> None:
        # RFC 9112 section 2.2: ignored, whether it comes with the request before it or
        # in a read of its own: no head deadline (no 408), and a shutdown closes at once.
        for reads in ([head("GET") + b"\r\n"], [head("GET"), b"\r\n"]):
            conn, _ = self.connect_limited()
            for data in reads:
                conn.send(data)
            self.clock.advance(60)
            self.assertFalse(conn.transport.disconnecting, reads)
            conn.channel.shutDown()
            self.assertTrue(conn.transport.disconnecting, reads)
            self.assertEqual(conn.transport.value().count(b" 408 "), 0)

    def test_a_closed_connection_leaves_no_timer(self) -> None:
        conn, _ = self.connect_limited()
        conn.send(head("GET"))
        self.assertNotEqual(self.clock.getDelayedCalls(), [])
        conn.channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.clock.getDelayedCalls(), [])

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

    def test_caps(self) -> None:
        config = load_gateway(
            self.mktemp(),
            "limits: {maxConnections: 100, maxConnectionsPerAddress: 0,"
            " maxConnectionsPerUpstream: 7, upstreamQueueTimeout: 2s}",
        )
        limits = config.gateway.limits
        self.assertEqual((limits.max_connections, limits.max_connections_per_address), (100, 0))
        self.assertEqual(
            (limits.max_connections_per_upstream, limits.upstream_queue_timeout), (7, 2)
        )
        self.assertEqual(
            (LimitsSpec().max_connections_per_upstream, LimitsSpec().upstream_queue_timeout),
            (1024, 60.0),
        )
        self.assertEqual(
            (LimitsSpec().max_connections, LimitsSpec().max_connections_per_address), (8192, 512)
        )
        self.assertEqual(
            gateway_problems(
                self.mktemp(), 'limits: {maxConnections: -1, maxConnectionsPerAddress: "x"}'
            ),
            [
                'document 1, Gateway "gw": spec.limits.maxConnections: must be at least 0, got -1',
                'document 1, Gateway "gw": spec.limits.maxConnectionsPerAddress: expected an '
                "integer, got a string",
            ],
        )

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


_BIG = 32 * 1024 * 1024


def _big_answer(request: Any, connection: Any) -> None:
    if request.index in connection.answered:
        return
    connection.answered.add(request.index)
    connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % _BIG + b"x" * _BIG)


class SlowReadTests(TestCase):
    """
    A client that stops reading its response ("slow read") holds its connection, and the
    upstream connection paused behind it, only for limits.sendTimeout.
    """

    async def test_client_that_reads_nothing_is_dropped(self) -> None:
        backend = RawBackend(_big_answer, on_head=True).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        clock = Clock()
        gateway, port = start_gateway(
            self, f"http://127.0.0.1:{backend.port}", "limits: {sendTimeout: 20s}\n", clock=clock
        )
        observer = Observer(gateway)
        client = await connect(port)
        self.addCleanup(abort, client)
        cast(Any, client.transport).pauseProducing()
        read = observer.next_read()
        client.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        channel = await read
        # Wait until the client's window and the gateway's buffer are full.
        await eventually(lambda: channel._sendCall is not None)
        clock.advance(19.9)
        self.assertFalse(cast(Any, channel.transport).disconnecting)
        gone = observer.next_gone()
        clock.advance(0.1)
        await gone
        # The upstream connection behind it is not kept either.
        await backend.all_lost()
        self.assertEqual(gateway.site.connections.count, 0)
