"""
HTTP/2 over TLS through the whole gateway: the same chain as HTTP/1.1, on real sockets.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET

from tests.support.backends import SiteBackend, answer
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls


class H2ThroughTheGatewayTests(TestCase):
    """
    Requests over HTTP/2 reach the same routes, handlers and backends as over HTTP/1.1.
    """

    tls_certificate: bytes

    def gateway(self, responder: Any = None, **kwargs: Any) -> tuple[Any, SiteBackend, int]:
        backend = SiteBackend(responder).start()
        self.addCleanup(backend.stop)
        built, _ = start_gateway(self, f"http://127.0.0.1:{backend.port}", **kwargs)
        return built, backend, listen_tls(self, built.site)

    async def test_health_and_proxy(self) -> None:
        """
        A health route and a proxied GET answer over h2, the backend seeing an
        HTTP/1.1 request with the Host from :authority.
        """
        _, backend, port = self.gateway()
        client = await connect_h2(self, port)
        health = await client.request(b"GET", b"/healthz")
        self.assertEqual(client.negotiated, b"h2")
        self.assertEqual(health.status, 200)
        proxied = await client.request(b"GET", b"/some/path?q=1", [(b"accept", b"text/plain")])
        self.assertEqual((proxied.status, proxied.body), (200, b"hello"))
        seen = backend.requests[-1]
        self.assertEqual(seen.uri, b"/some/path?q=1")
        self.assertEqual(seen.header(b"x-forwarded-host"), b"localhost")
        self.assertIsNone(proxied.header(b"connection"))

    async def test_upload(self) -> None:
        """
        A request body over h2 reaches the backend whole, with its length.
        """

        def echo(request: Any) -> bytes:
            request.content.seek(0)
            return b"got %d" % len(request.content.read())

        _, backend, port = self.gateway(echo)
        client = await connect_h2(self, port)
        body = b"x" * 200_000
        response = await client.request(
            b"POST", b"/upload", [(b"content-length", b"%d" % len(body))], body
        )
        self.assertEqual((response.status, response.body), (200, b"got 200000"))
        self.assertEqual(backend.requests[-1].body, body)

    async def test_concurrent_streams(self) -> None:
        """
        Several streams on one connection are answered, each its own body.
        """

        def path_back(request: Any) -> bytes:
            return bytes(request.uri)

        _, _, port = self.gateway(path_back)
        client = await connect_h2(self, port)
        responses = [client.request(b"GET", b"/n/%d" % i) for i in range(20)]
        bodies = [(await r).body for r in responses]
        self.assertEqual(bodies, [b"/n/%d" % i for i in range(20)])

    async def test_http11_over_the_same_listener(self) -> None:
        """
        A client offering only http/1.1 gets HTTP/1.1 on the same listener.
        """
        from twisted.internet import reactor
        from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
        from twisted.internet.ssl import Certificate, optionsForClientTLS

        from tests.support.rawclient import RawClient

        _, _, port = self.gateway()
        options = optionsForClientTLS(
            "localhost",
            trustRoot=Certificate.loadPEM(self.tls_certificate),
            acceptableProtocols=[b"http/1.1"],
        )
        endpoint = wrapClientTLS(options, TCP4ClientEndpoint(reactor, "127.0.0.1", port))
        raw = await connectProtocol(endpoint, RawClient())
        raw.transport.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = await raw.until(b"\r\n\r\n")
        self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received)
        raw.transport.loseConnection()
        await raw.closed

    async def test_slow_backend_streams(self) -> None:
        """
        A body the backend sends in pieces reaches the client in pieces.
        """
        from twisted.internet import reactor

        pending: list[Any] = []

        def later(request: Any) -> int:
            request.setHeader(b"content-type", b"text/event-stream")
            request.write(b"data: one\n\n")
            pending.append(request)
            return NOT_DONE_YET

        _, _, port = self.gateway(later)
        client = await connect_h2(self, port)
        _stream_id, response = client.start(b"GET", b"/events")
        await client.until(lambda: b"data: one" in response.body)
        self.assertEqual(response.status, 200)
        pending[0].write(b"data: two\n\n")
        await client.until(lambda: b"data: two" in response.body)
        pending[0].finish()
        await response.done
        del reactor


del answer
