"""
What a reload does to the connections open at that moment (issue 35, point 1), on a
service tree running in this process over real sockets: none is closed because of the
reload; one that has not sent a request yet, or sits idle between keep-alive requests,
has its next request served by the new configuration; one with a request in flight
finishes it on the old configuration, then serves its next request from the new one
(HTTP/1.1 and HTTP/2); the connection caps count every open connection, whichever
configuration serves it. And a stop answers the first request of a connection that had
not sent one yet.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.config.parse import load_config
from edgegw.service import GatewayService, build_service
from tests.support.backends import SiteBackend
from tests.support.certificates import make_certificate
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import sleep
from tests.support.h2client import connect_h2
from tests.support.rawclient import RawClient, connect, response_complete

reactor: Any = _reactor


def route(name: str, match: str, handler: str) -> str:
    """
    A public Route document.
    """
    spec = f"{{access: {{auth: public}}, match: '{match}', handler: {handler}}}"
    return f"---\nkind: Route\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def get(path: str) -> bytes:
    """
    A keep-alive GET for C{path}.
    """
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def is_open(client: RawClient) -> bool:
    """
    Whether C{client}'s connection is still open.
    """
    transport: Any = client.transport
    return transport is not None and bool(transport.connected)


class ReloadedTree(TestCase):
    """
    A tree with routes C{/old} (first configuration only), C{/slow} (proxied to a backend
    that holds each request until the test answers it) and, after the reload, C{/new};
    the helpers of the tests on it (no test of its own).
    """

    timeout = 60

    def setUp(self) -> None:
        self.held: list[Request] = []

        def slow(request: Request) -> bytes | int:
            self.held.append(request)
            return NOT_DONE_YET

        self.backend = SiteBackend(slow).start()
        self.addCleanup(lambda: Deferred.fromCoroutine(self.backend.stop()))
        self.root = os.path.abspath(self.mktemp())
        self.proxy = f"{{type: reverse-proxy, upstream: 'http://127.0.0.1:{self.backend.port}'}}"

    def serve(self, gateway: str = GATEWAY) -> GatewayService:
        """
        Start the first configuration (C{gateway} and the routes); stopped at the end.
        """
        self.gateway = gateway
        write_tree(
            self.root,
            {
                "00-gateway.yaml": gateway,
                "10-routes.yaml": route("old", "/old", "{type: health}")
                + route("slow", "/slow", self.proxy),
            },
        )
        service = build_service(load_config(self.root, {}), reactor, source=self.root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        self.service = service
        return service

    @property
    def port(self) -> int:
        port: Any = self.service.port
        return int(port.getHost().port)

    async def reload(self) -> None:
        """
        Reload into the second configuration: C{/old} gone, C{/new} there.
        """
        write_tree(
            self.root,
            {
                "00-gateway.yaml": self.gateway,
                "10-routes.yaml": route("new", "/new", "{type: health}")
                + route("slow", "/slow", self.proxy),
            },
        )
        self.assertTrue(await self.service.reload())

    async def client(self) -> RawClient:
        client = await connect(self.port)
        self.addCleanup(lambda: client.close() if is_open(client) else None)
        return client

    async def exchange(self, client: RawClient, path: str) -> bytes:
        """
        Send a GET for C{path} on C{client}; the response (the bytes received since).
        """
        start = len(client.received)
        client.send(get(path))
        received = await client.until(lambda data: response_complete(data[start:]))
        return received[start:]

    async def until_held(self, count: int) -> None:
        for _ in range(500):
            if len(self.held) >= count:
                return
            await sleep(0.01)
        raise AssertionError(f"{len(self.held)} requests reached the backend, not {count}")

    def assertServed(self, response: bytes, status: bytes = b"200") -> None:
        self.assertTrue(response.startswith(b"HTTP/1.1 " + status + b" "), response)
        self.assertNotIn(b"connection: close", response.lower())


class ReloadConnectionTests(ReloadedTree):
    """
    The connections open at a reload.
    """

    async def test_a_connection_without_a_request_yet(self) -> None:
        """
        A connection accepted before the reload that sends its first request after it is
        served by the new configuration, and stays open.
        """
        self.serve()
        client = await self.client()
        await sleep(0.1)
        await self.reload()
        await sleep(0.1)
        self.assertServed(await self.exchange(client, "/new"))
        self.assertServed(await self.exchange(client, "/old"), b"404")
        self.assertTrue(is_open(client))

    async def test_an_idle_keep_alive_connection(self) -> None:
        """
        A keep-alive connection idle at the reload is not closed; its next request is
        served by the new configuration.
        """
        self.serve()
        client = await self.client()
        self.assertServed(await self.exchange(client, "/old"))
        await self.reload()
        await sleep(0.2)
        self.assertTrue(is_open(client))
        self.assertServed(await self.exchange(client, "/new"))

    async def test_a_request_head_arriving_at_the_reload(self) -> None:
        """
        A request whose head is half sent at the reload is served (by the new
        configuration, which serves the connection from then on).
        """
        self.serve()
        client = await self.client()
        client.send(b"GET /new HTTP/1.1\r\n")
        await sleep(0.1)
        await self.reload()
        client.send(b"Host: x\r\n\r\n")
        received = await client.until(response_complete)
        self.assertServed(received)

    async def test_a_request_in_flight_then_the_next(self) -> None:
        """
        A request in flight at the reload finishes on the old configuration, whole and
        without closing its connection, whose next request the new one serves.
        """
        self.serve()
        client = await self.client()
        client.send(get("/slow"))
        await self.until_held(1)
        await self.reload()
        held = self.held[0]
        held.setHeader(b"content-length", b"4")
        held.write(b"late")
        held.finish()
        answer = await client.until(response_complete)
        self.assertServed(answer)
        self.assertTrue(answer.endswith(b"\r\n\r\nlate"), answer)
        self.assertServed(await self.exchange(client, "/new"))
        # The old configuration retires once its request is done; the connection stays.
        await self.service.retired()
        self.assertServed(await self.exchange(client, "/new"))

    async def test_the_drain_timeout_cuts_only_the_old_request(self) -> None:
        """
        Past the old configuration's drainTimeout its request still in flight is cut; a
        connection the new configuration serves is not.
        """
        self.serve(GATEWAY + "  drainTimeout: 1s\n")
        stuck = await self.client()
        stuck.send(get("/slow"))
        await self.until_held(1)
        idle = await self.client()
        self.assertServed(await self.exchange(idle, "/old"))
        await self.reload()
        self.assertServed(await self.exchange(idle, "/new"))
        await stuck.closed
        self.assertEqual(stuck.received, b"")
        await self.service.retired()
        self.assertServed(await self.exchange(idle, "/new"))

    async def test_caps_count_connections_of_both_configurations(self) -> None:
        """
        The connection cap counts the connections the old configuration accepted too:
        after the reload, one more than the new cap allows is refused.
        """
        limits = "  limits: {maxConnections: 2}\n"
        self.serve(GATEWAY + limits)
        first = await self.client()
        second = await self.client()
        await self.reload()
        third = await connect(self.port)
        await third.closed
        self.assertEqual(third.received, b"")
        self.assertServed(await self.exchange(first, "/new"))
        await second.close()
        await sleep(0.05)
        fourth = await self.client()
        self.assertServed(await self.exchange(fourth, "/new"))

    async def test_a_stop_answers_a_first_request_that_comes_late(self) -> None:
        """
        A stop keeps a connection that has not sent its first request open for a grace:
        the request that then arrives is answered, with C{Connection: close}; an idle
        keep-alive connection is closed at once.
        """
        self.serve()
        fresh = await self.client()
        used = await self.client()
        self.assertServed(await self.exchange(used, "/old"))
        stopping = self.service.stopService()
        await sleep(0.3)
        await used.closed
        fresh.send(get("/old"))
        answer = await fresh.until(response_complete)
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer)
        self.assertIn(b"connection: close", answer.lower())
        await fresh.closed
        await stopping


class ReloadHTTP2Tests(TestCase):
    """
    An HTTP/2 connection across a reload: its new streams are the new configuration's,
    its streams in flight finish on the old one.
    """

    timeout = 60

    async def test_streams_across_a_reload(self) -> None:
        held: list[Request] = []

        def slow(request: Request) -> bytes | int:
            held.append(request)
            return NOT_DONE_YET

        backend = SiteBackend(slow).start()
        self.addCleanup(lambda: Deferred.fromCoroutine(backend.stop()))
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key, certificate, pem = make_certificate(directory, "localhost")
        self.tls_certificate = pem
        gateway = (
            "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
            '  listen: "127.0.0.1:0"\n  drainTimeout: 1s\n'
            f'  tls:\n    certificates:\n      - {{certFile: "{certificate}", keyFile: "{key}"}}\n'
        )
        proxy = f"{{type: reverse-proxy, upstream: 'http://127.0.0.1:{backend.port}'}}"
        root = os.path.join(directory, "config")
        write_tree(
            root,
            {
                "a.yaml": gateway
                + route("old", "/old", "{type: health}")
                + route("slow", "/slow", proxy)
            },
        )
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        port: Any = service.port
        client = await connect_h2(self, port.getHost().port)
        self.assertEqual((await client.request(b"GET", b"/old")).status, 200)
        _, in_flight = client.start(b"GET", b"/slow")
        for _ in range(500):
            if held:
                break
            await sleep(0.01)
        write_tree(
            root,
            {
                "a.yaml": gateway
                + route("new", "/new", "{type: health}")
                + route("slow", "/slow", proxy)
            },
        )
        self.assertTrue(await service.reload())
        # A new stream on the same connection: the new configuration's.
        self.assertEqual((await client.request(b"GET", b"/new")).status, 200)
        self.assertEqual((await client.request(b"GET", b"/old")).status, 404)
        # The stream in flight is the old configuration's: cut at its drainTimeout,
        # alone (the connection serves on).
        await in_flight.done
        self.assertIsNotNone(in_flight.reset)
        await service.retired()
        self.assertEqual((await client.request(b"GET", b"/new")).status, 200)
