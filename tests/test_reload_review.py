"""
Regressions found by the review of the hand-over of client connections at a reload and
of the stop's grace (issue 35, point 1), over real sockets: an HTTP/2 request dispatched
at END_STREAM after a reload is the new configuration's; a WebSocket tunnel is cut at its
configuration's drainTimeout; a silent TLS connection or a trickling head cannot hold a
stop; a per-address cap a reload turns on counts the connections already open.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from edgegw.config.parse import load_config
from edgegw.service import build_service
from tests import test_reload_connections as _connections
from tests.support.backends import RawBackend
from tests.support.certificates import make_certificate
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import sleep
from tests.support.h2client import connect_h2
from tests.support.rawclient import RawClient
from tests.test_reload_connections import get, is_open, route

reactor: Any = _reactor


def tls_gateway(directory: str, extra: str = "") -> tuple[str, bytes]:
    """
    A Gateway document listening with TLS (ALPN offering h2), and its certificate.
    """
    os.makedirs(directory, exist_ok=True)
    key, certificate, pem = make_certificate(directory, "localhost")
    gateway = (
        "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
        '  listen: "127.0.0.1:0"\n'
        f'  tls:\n    certificates:\n      - {{certFile: "{certificate}", keyFile: "{key}"}}\n'
        + extra
    )
    return gateway, pem


class HTTP2ReviewTests(TestCase):
    timeout = 60

    async def test_h2_stream_dispatched_at_end_stream_is_served_by_the_new_config(
        self,
    ) -> None:
        """
        An HTTP/2 request whose HEADERS (with C{content-length: 0}) came before the reload
        and whose END_STREAM comes after the old configuration has retired is dispatched
        at END_STREAM: it must be served by the new configuration, not by the stopped
        old one (H2ServerConnection._request builds the stream with the old site, and
        _ended dispatches it there; the old gateway never counted it in flight).
        """
        directory = os.path.abspath(self.mktemp())
        gateway, self.tls_certificate = tls_gateway(directory)
        root = os.path.join(directory, "config")
        write_tree(root, {"a.yaml": gateway + route("old", "/old", "{type: health}")})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        port: Any = service.port
        client = await connect_h2(self, port.getHost().port)
        self.assertEqual((await client.request(b"GET", b"/old")).status, 200)
        # HEADERS with content-length: 0 and no END_STREAM: dispatched at END_STREAM.
        # /old is the route the reload takes away, /new the one it adds.
        removed_id, removed = client.start(
            b"GET", b"/old", headers=[(b"content-length", b"0")], end=False
        )
        added_id, added = client.start(
            b"GET", b"/new", headers=[(b"content-length", b"0")], end=False
        )
        await sleep(0.2)
        write_tree(root, {"a.yaml": gateway + route("new", "/new", "{type: health}")})
        self.assertTrue(await service.reload())
        # The old configuration has drained (nothing in flight) and stopped its services.
        await service.retired()
        await sleep(0.2)
        client.h2.end_stream(removed_id)
        client.h2.end_stream(added_id)
        client.flush()
        await removed.done
        await added.done
        self.assertEqual(
            (removed.status, added.status),
            (404, 200),
            "served by the retired configuration (its /old route, no /new)",
        )


class TunnelReviewTests(_connections.ReloadedTree):
    async def test_a_tunnel_is_cut_at_the_old_drain_timeout(self) -> None:
        """
        docs/architecture.md ("Reload"): past the old drainTimeout what the old
        configuration still serves is cut. A WebSocket tunnel it opened counts in its
        InFlight until the tunnel ends, so the old generation's drain times out and
        calls abort_connections: GatewayChannel.cut_for -> abortClient ->
        clientCloser(), which reads self.transport, None since takeConnection. Nothing
        is cut: the tunnel runs on, on a generation whose services have stopped (its
        session store's logout subscription included), holding the old Site and
        gateway in memory.
        """

        def respond(request: Any, connection: Any) -> None:
            if request.index in connection.answered:
                return
            connection.answered.add(request.index)
            connection.write(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
            )
            connection.takeover = connection.write  # echo

        raw = RawBackend(respond).start()
        self.addCleanup(lambda: Deferred.fromCoroutine(raw.stop()))
        self.proxy = f"{{type: reverse-proxy, upstream: 'http://127.0.0.1:{raw.port}'}}"
        self.serve(GATEWAY + "  drainTimeout: 1s\n")
        client = await self.client()
        client.send(
            b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        head = await client.until(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 101 "), head)
        await self.reload()
        await self.service.retired()
        await sleep(0.2)
        client.send(b"ping")
        await sleep(0.2)
        self.assertFalse(
            is_open(client) and client.received.endswith(b"ping"),
            "the old configuration's tunnel outlived its drainTimeout",
        )


class StopTLSReviewTests(TestCase):
    # Far below the drainTimeout and headerTimeout: a stop held until either fails.
    timeout = 30

    async def test_a_silent_tls_connection_holds_the_stop_for_drain_timeout(self) -> None:
        """
        A TCP connection to the TLS port that never starts its handshake (a port scan, an
        attacker) would hold a stop (which waits for every connection to close) until its
        handshake deadline (limits.headerTimeout) or drainTimeout: it gets FRESH_GRACE,
        as a connection without its first request does, then it is cut.
        """
        directory = os.path.abspath(self.mktemp())
        gateway, _ = tls_gateway(directory, "  drainTimeout: 120s\n")
        root = os.path.join(directory, "config")
        write_tree(root, {"a.yaml": gateway + route("old", "/old", "{type: health}")})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        port: Any = service.port
        silent = RawClient()
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
        await connectProtocol(endpoint, silent)
        self.addCleanup(lambda: silent.close() if is_open(silent) else None)
        await sleep(0.1)
        await service.stopService()
        await silent.closed

    async def test_a_head_trickling_in_holds_the_stop(self) -> None:
        """
        A request head arriving a byte at a time when the stop begins gets FRESH_GRACE
        to complete, then a 408 (its headerTimeout would hold the stop for a minute).
        """
        root = os.path.abspath(self.mktemp())
        write_tree(
            root,
            {"a.yaml": GATEWAY + "  drainTimeout: 120s\n" + route("old", "/old", "{type: health}")},
        )
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        port: Any = service.port
        slow = RawClient()
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
        await connectProtocol(endpoint, slow)
        self.addCleanup(lambda: slow.close() if is_open(slow) else None)
        slow.send(b"GET /old HTTP/1.1\r\n")
        await sleep(0.1)
        await service.stopService()
        await slow.closed
        self.assertTrue(slow.received.startswith(b"HTTP/1.1 408 "), slow.received)


class CapsReviewTests(_connections.ReloadedTree):
    async def test_per_address_cap_turned_on_by_a_reload_counts_open_connections(
        self,
    ) -> None:
        """
        The docs: one table per listener, "the caps count every open connection
        whichever configuration serves it". Connections admitted while
        maxConnectionsPerAddress was 0 count once a reload sets the cap to 2: with
        three open from 127.0.0.1, a fourth is refused (the three stay).
        """
        self.serve(GATEWAY + "  limits: {maxConnectionsPerAddress: 0}\n")
        first = await self.client()
        second = await self.client()
        third = await self.client()
        await sleep(0.1)  # accepted by the first configuration
        self.gateway = GATEWAY + "  limits: {maxConnectionsPerAddress: 2}\n"
        await self.reload()
        fourth = await self.client()
        fourth.send(get("/new").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        await fourth.closed
        self.assertEqual(fourth.received, b"", "a 4th connection from one address admitted")
        for client in (first, second, third):
            self.assertTrue(is_open(client))
