"""
The reverse-proxy handler end to end: a real backend, a real gateway, real sockets.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import textwrap
from typing import Any, cast

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import Certificate, PrivateCertificate
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from twisted.web.test.requesthelper import DummyRequest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    RejectConnection,
    TextMessage,
)
from wsproto.events import (
    Request as WSRequest,
)

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.chain.access_log import AccessLog
from edgegw.config.model import ProxyHandlerSpec
from edgegw.config.parse import load_config
from edgegw.handlers import proxy as proxy_module
from edgegw.handlers.hop_by_hop import HOP_BY_HOP
from edgegw.handlers.proxy import ProxyHandler
from edgegw.stream.response_headers import ResponseHeaders
from edgegw.upstream.pool import UpstreamClient
from edgegw.upstream.response import UpstreamResponse
from tests.support.backends import EndlessBody
from tests.support.certificates import make_certificate
from tests.support.configs import GATEWAY, write_tree
from tests.support.gateways import serve_yaml
from tests.support.processes import listen_local, port_of, refused_port
from tests.support.rawclient import RawClient, connect, response_complete


class Backend(Resource):
    """
    A test upstream that records what it received and answers per path.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []
        self.held: list[Request] = []
        self.lost: list[str] = []
        self.sse: list[Request] = []

    def render(self, request: Request) -> bytes | int:
        assert request.content is not None
        body = request.content.read()
        record = {
            "method": request.method.decode(),
            "uri": request.uri.decode(),
            "headers": [
                [name.decode(), value.decode()]
                for name, values in request.requestHeaders.getAllRawHeaders()
                for value in values
            ],
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body_length": len(body),
        }
        self.seen.append(record)
        path = request.path
        if path.endswith(b"/cookies"):
            request.responseHeaders.setRawHeaders(b"set-cookie", [b"a=1; Path=/", b"b=2"])
            request.responseHeaders.setRawHeaders(b"x-hop", [b"secret"])
            request.responseHeaders.setRawHeaders(b"connection", [b"x-hop"])
            request.responseHeaders.setRawHeaders(b"keep-alive", [b"timeout=5"])
            request.responseHeaders.setRawHeaders(b"server", [b"backend/1.0"])
            request.responseHeaders.setRawHeaders(b"x-frame-options", [b"ALLOWALL"])
            return b"cookies"
        if path.endswith(b"/missing"):
            request.setResponseCode(404)
            return b"backend says not found"
        if path.endswith(b"/slow"):
            self.held.append(request)
            request.notifyFinish().addErrback(lambda f: self.lost.append("slow"))
            return NOT_DONE_YET
        if path.endswith(b"/events"):
            request.responseHeaders.setRawHeaders(b"content-type", [b"text/event-stream"])
            request.write(b"")
            self.sse.append(request)
            return NOT_DONE_YET
        if path.endswith(b"/close"):
            # Not reused: the gateway closes its upstream connection after the response.
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
        return json.dumps(record).encode()

    def header(self, index: int, name: str) -> list[str]:
        return [v for n, v in self.seen[index]["headers"] if n.lower() == name.lower()]


class ProxyTestCase(TestCase):
    def setUp(self) -> None:
        self.backend = Backend()
        backend_site = Site(self.backend)
        self.backend_port = listen_local(backend_site)
        self.addCleanup(self.backend_port.stopListening)

    def gateway(
        self,
        handler: str = "",
        route: str = "/",
        gateway_spec: str = "",
        upstream_path: str = "",
        upstream_port: int | None = None,
        scheme: str = "http",
        host: str = "127.0.0.1",
        trust: Certificate | None = None,
    ) -> int:
        """
        Start a gateway with one reverse-proxy route to the backend; return its port.
        """
        port = upstream_port or port_of(self.backend_port)
        upstream = f"{scheme}://{host}:{port}{upstream_path}"
        spec = textwrap.indent(textwrap.dedent(handler), "    ")
        gateway = GATEWAY + textwrap.indent(textwrap.dedent(gateway_spec), "  ")
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": gateway
                + "---\nkind: Route\nmetadata: {name: p}\nspec:\n"
                + f'  match: "{route}"\n  handler:\n    type: reverse-proxy\n'
                + f'    upstream: "{upstream}"\n'
                + spec
            },
        )
        client = UpstreamClient(reactor, tls_trust_root=trust)
        built: Gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = listen_local(built.site)
        self.addCleanup(listening.stopListening)
        self.addCleanup(built.upstream_client.close)
        return port_of(listening)

    async def get(
        self, port: int, target: str, headers: str = ""
    ) -> tuple[int, dict[str, list[str]], bytes]:
        """
        One GET over a fresh connection; status, headers (lowercased) and body.
        """
        client = await connect(port)
        client.send(
            f"GET {target} HTTP/1.1\r\nHost: gateway.test\r\n{headers}"
            "Connection: close\r\n\r\n".encode()
        )
        data = await client.until(response_complete)
        await client.close()
        return parse(data)


def parse(data: bytes) -> tuple[int, dict[str, list[str]], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(": ")
        headers.setdefault(name.lower(), []).append(value)
    if "chunked" in headers.get("transfer-encoding", []):
        decoded = b""
        while True:
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded += body[:size]
            body = body[size + 2 :]
        body = decoded
    return int(lines[0].split(" ")[1]), headers, body


class ForwardingTests(ProxyTestCase):
    async def test_path_prefix_strip_and_query(self) -> None:
        port = self.gateway(
            "stripPrefix: /api\n",
            route="/api/",
            upstream_path="/base",
            gateway_spec="security: {encodedSlashes: keep}\n",
        )
        status, _, body = await self.get(port, "/api/users/a%2Fb?x=1&y=%20")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["uri"], "/base/users/a%2Fb?x=1&y=%20")
        status, _, body = await self.get(port, "/api/")
        self.assertEqual(json.loads(body)["uri"], "/base/")

    async def test_strip_whole_path_gives_root(self) -> None:
        port = self.gateway("stripPrefix: /app\n", route="/app")
        status, _, body = await self.get(port, "/app")
        self.assertEqual((status, json.loads(body)["uri"]), (200, "/"))

    async def test_host_default_and_preserved(self) -> None:
        port = self.gateway()
        await self.get(port, "/x")
        self.assertEqual(
            self.backend.header(0, "host"), [f"127.0.0.1:{port_of(self.backend_port)}"]
        )
        port = self.gateway("preserveHost: true\n")
        await self.get(port, "/x")
        self.assertEqual(self.backend.header(1, "host"), ["gateway.test"])

    async def test_request_header_hygiene(self) -> None:
        port = self.gateway()
        await self.get(
            port,
            "/x",
            "X-Hop-Custom: 1\r\nConnection: X-Hop-Custom\r\nKeep-Alive: 300\r\nTE: trailers\r\n"
            "Proxy-Authorization: Basic eA==\r\nCookie: sid=1\r\nAuthorization: Bearer t\r\n"
            "X-User-Id: admin\r\nX-Gw-Identity: forged\r\nX-Kept: yes\r\n"
            "X-Forwarded-For: 6.6.6.6\r\n"
            "Upgrade: h2c\r\n",
        )
        names = {name.lower() for name, _ in self.backend.seen[0]["headers"]}
        for gone in (
            "x-hop-custom",
            "keep-alive",
            "te",
            "proxy-authorization",
            "cookie",
            "authorization",
            "x-user-id",
            "x-gw-identity",
            "upgrade",
        ):
            self.assertNotIn(gone, names)
        self.assertEqual(self.backend.header(0, "x-kept"), ["yes"])
        self.assertEqual(self.backend.header(0, "x-forwarded-for"), ["127.0.0.1"])
        self.assertEqual(self.backend.header(0, "x-forwarded-proto"), ["http"])
        self.assertEqual(self.backend.header(0, "x-forwarded-host"), ["gateway.test"])
        self.assertEqual(len(self.backend.header(0, "x-request-id")), 1)

    async def test_cookies_and_authorization_when_forwarded(self) -> None:
        port = self.gateway("forwardCookies: true\n")
        await self.get(port, "/x", "Cookie: sid=1\r\nAuthorization: Bearer t\r\n")
        self.assertEqual(self.backend.header(0, "cookie"), ["sid=1"])
        # forwardAccessToken sends the principal's token; a client's own never passes.
        self.assertEqual(self.backend.header(0, "authorization"), [])

    async def test_trusted_proxy_chain_appended(self) -> None:
        port = self.gateway(gateway_spec='trustedProxies: ["127.0.0.1"]\n')
        await self.get(port, "/x", "X-Forwarded-For: 203.0.113.5\r\nX-Forwarded-Proto: https\r\n")
        self.assertEqual(self.backend.header(0, "x-forwarded-for"), ["203.0.113.5, 127.0.0.1"])
        self.assertEqual(self.backend.header(0, "x-forwarded-proto"), ["https"])

    async def test_response_headers(self) -> None:
        port = self.gateway()
        status, headers, body = await self.get(port, "/cookies")
        self.assertEqual((status, body), (200, b"cookies"))
        self.assertEqual(headers["set-cookie"], ["a=1; Path=/", "b=2"])
        self.assertNotIn("x-hop", headers)
        self.assertNotIn("keep-alive", headers)
        self.assertEqual(headers["server"], ["edgegw"])
        self.assertEqual(headers["x-frame-options"], ["DENY"])

    async def test_upstream_errors_pass_through(self) -> None:
        port = self.gateway()
        status, _, body = await self.get(port, "/missing")
        self.assertEqual((status, body), (404, b"backend says not found"))


class FailureTests(ProxyTestCase):
    async def test_connection_refused_is_502(self) -> None:
        port = self.gateway()
        backend = str(port_of(self.backend_port)).encode()
        await self.backend_port.stopListening()
        status, _, body = await self.get(port, "/x")
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        self.assertNotIn(backend, body)

    async def test_timeout_is_504_and_cancels_upstream(self) -> None:
        port = self.gateway("timeout: 200ms\n")
        status, _, body = await self.get(port, "/slow")
        self.assertEqual((status, body), (504, b"gateway timeout\n"))
        while not self.backend.lost:
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(self.backend.lost, ["slow"])

    async def test_client_disconnect_cancels_upstream(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        while not self.backend.held:
            await deferLater(reactor, 0.01, lambda: None)
        await client.close()
        while not self.backend.lost:
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(self.backend.lost, ["slow"])

    async def test_ambiguous_request_never_forwarded(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        data = await client.until(b"\r\n\r\n")
        self.assertTrue(data.startswith(b"HTTP/1.1 400 "), data)
        await client.closed
        self.assertEqual(self.backend.seen, [])


class OversizedHeadTests(ProxyTestCase):
    async def test_oversized_header_refused_not_forwarded(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        data = await client.until(b"\r\n\r\n")
        self.assertTrue(data.startswith(b"HTTP/1.1 431 "), data)
        await client.closed
        self.assertEqual(self.backend.seen, [])


class StreamingTests(ProxyTestCase):
    async def test_upload_with_content_length_arrives_exact(self) -> None:
        port = self.gateway()
        payload = os.urandom(1024 * 1024)
        client = await connect(port)
        client.send(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload)
        )
        for offset in range(0, len(payload), 65536):
            client.send(payload[offset : offset + 65536])
        status, _, body = parse(await client.until(response_complete))
        await client.close()
        record = json.loads(body)
        self.assertEqual(status, 200)
        self.assertEqual(record["body_length"], len(payload))
        self.assertEqual(record["body_sha256"], hashlib.sha256(payload).hexdigest())

    async def test_chunked_upload_arrives_exact(self) -> None:
        port = self.gateway()
        parts = [os.urandom(n) for n in (1, 1000, 70000, 5)]
        client = await connect(port)
        client.send(
            b"PUT /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for part in parts:
            client.send(b"%x\r\n%s\r\n" % (len(part), part))
        client.send(b"0\r\n\r\n")
        _, _, body = parse(await client.until(response_complete))
        await client.close()
        whole = b"".join(parts)
        self.assertEqual(json.loads(body)["body_sha256"], hashlib.sha256(whole).hexdigest())

    async def test_post_without_body_sends_zero_length(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, _ = parse(await client.until(response_complete))
        await client.close()
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, "content-length"), ["0"])

    async def test_sse_events_arrive_one_by_one(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        while not self.backend.sse:
            await deferLater(reactor, 0.01, lambda: None)
        stream = self.backend.sse[0]
        stream.write(b"data: one\n\n")
        first = await client.until(b"data: one\n\n")
        self.assertIn(b"text/event-stream", first)
        self.assertNotIn(b"data: two", first)
        # Event 2 is written only after the client has read event 1.
        stream.write(b"data: two\n\n")
        await client.until(b"data: two\n\n")
        stream.finish()
        await client.until(b"0\r\n\r\n")
        await client.close()


class StreamHeadTests(ProxyTestCase):
    async def test_head_of_silent_stream_reaches_client(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(b"GET /silent/events HTTP/1.1\r\nHost: x\r\n\r\n")
        # The backend sends its head and no event yet: the client still sees the head.
        head = await client.until(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 OK\r\n"), head)
        self.assertIn(b"text/event-stream", head.lower())
        self.backend.sse[0].finish()
        await client.until(b"0\r\n\r\n")
        await client.close()


class WebSocketTests(ProxyTestCase):
    def setUp(self) -> None:
        super().setUp()
        factory = Factory.forProtocol(EchoWebSocket)
        self.ws_port = listen_local(factory)
        self.addCleanup(self.ws_port.stopListening)

    def ws_gateway(self) -> int:
        return self.gateway(route="/ws", upstream_port=port_of(self.ws_port))

    async def test_echo_through_gateway(self) -> None:
        port = self.ws_gateway()
        client = await connect(port)
        ws = WSConnection(ConnectionType.CLIENT)
        client.send(ws.send(WSRequest(host="gateway.test", target="/ws")))
        await client.until(b"\r\n\r\n")
        ws.receive_data(client.received)
        client.received = b""
        events = list(ws.events())
        self.assertIsInstance(events[0], AcceptConnection, events)
        for text in ("hello", "x" * 100000):
            client.send(ws.send(Message(data=text)))
            message = await next_message(client, ws)
            self.assertEqual(message, text)
        client.send(ws.send(CloseConnection(code=1000)))
        await client.closed

    async def test_an_upgrade_the_client_protocol_cannot_hand_over_is_a_502(self) -> None:
        """
        Where the client's protocol cannot hand its connection over (HTTP/2), the
        upstream's 101 is not relayed: the client gets 502 and the request is answered.
        """
        from edgegw.handlers import tunnel as tunnel_module
        from edgegw.stream.boundary import UpgradeNotPossibleError

        def cannot(request: object) -> tuple[object, bytes]:
            raise UpgradeNotPossibleError("not on this protocol")

        self.patch(tunnel_module, "take_connection", cannot)
        port = self.ws_gateway()
        client = await connect(port)
        client.send(
            WSConnection(ConnectionType.CLIENT).send(WSRequest(host="gateway.test", target="/ws"))
        )
        status, _, body = parse(await client.until(response_complete))
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        await client.close()

    async def test_refused_upgrade_passes_through(self) -> None:
        port = self.ws_gateway()
        client = await connect(port)
        client.send(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nX-Refuse: yes\r\n\r\n"
        )
        status, _, body = parse(await client.until(response_complete))
        self.assertEqual((status, body), (403, b"refused"))
        await client.close()


async def next_message(client: RawClient, ws: WSConnection) -> str:
    """
    The next complete text message on a WebSocket client connection.
    """
    parts: list[str] = []
    while True:
        for event in ws.events():
            if isinstance(event, TextMessage):
                parts.append(event.data)
                if event.message_finished:
                    return "".join(parts)
        await client.until(lambda data: len(data) > 0)
        ws.receive_data(client.received)
        client.received = b""


class EchoWebSocket(Protocol):
    """
    A WebSocket echo server (wsproto), refusing handshakes that carry X-Refuse.
    """

    def connectionMade(self) -> None:
        self.ws = WSConnection(ConnectionType.SERVER)

    def dataReceived(self, data: bytes) -> None:
        if b"X-Refuse: yes" in data:
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: close\r\n\r\nrefused"
            )
            self.transport.loseConnection()
            return
        self.ws.receive_data(data)
        assert self.transport is not None
        for event in self.ws.events():
            if isinstance(event, WSRequest):
                self.transport.write(self.ws.send(AcceptConnection()))
            elif isinstance(event, Message):
                # wsproto hands over partial messages as they arrive: echo them as parts.
                reply = Message(data=event.data, message_finished=event.message_finished)
                self.transport.write(self.ws.send(reply))
            elif isinstance(event, CloseConnection):
                self.transport.write(self.ws.send(event.response()))
                self.transport.loseConnection()
            elif isinstance(event, (RejectConnection, BytesMessage)):
                pass

    def connectionLost(self, reason: Failure | None = None) -> None:
        pass


class TlsUpstreamTests(ProxyTestCase):
    """
    https and wss upstreams: verified, refused when invalid, accepted when told to skip.
    """

    def setUp(self) -> None:
        super().setUp()
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key_path, _, cert_pem = make_certificate(directory, "localhost")
        with open(key_path, "rb") as stream:
            server_cert = PrivateCertificate.loadPEM(stream.read() + cert_pem)
        self.trusted = Certificate.loadPEM(cert_pem)
        other = os.path.join(directory, "other")
        os.makedirs(other)
        self.untrusted = Certificate.loadPEM(make_certificate(other, "localhost")[2])
        # One options object per listener: Twisted binds ALPN to the first factory.
        self.tls_port = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Site(self.backend), server_cert.options(), interface="127.0.0.1"
        )
        self.addCleanup(self.tls_port.stopListening)
        self.wss_port = reactor.listenSSL(  # type: ignore[attr-defined]
            0, Factory.forProtocol(EchoWebSocket), server_cert.options(), interface="127.0.0.1"
        )
        self.addCleanup(self.wss_port.stopListening)

    def tls_gateway(self, handler: str = "", **kwargs: Any) -> int:
        kwargs.setdefault("upstream_port", port_of(self.tls_port))
        kwargs.setdefault("host", "localhost")
        kwargs.setdefault("trust", self.trusted)
        return self.gateway(handler, scheme="https", **kwargs)

    async def test_verified_upstream(self) -> None:
        port = self.tls_gateway()
        status, _, body = await self.get(port, "/secure")
        self.assertEqual((status, json.loads(body)["uri"]), (200, "/secure"))

    async def test_untrusted_certificate_refused(self) -> None:
        port = self.tls_gateway(trust=self.untrusted)
        status, _, body = await self.get(port, "/secure")
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        self.assertEqual(self.backend.seen, [])

    async def test_wrong_hostname_refused(self) -> None:
        port = self.tls_gateway(host="127.0.0.1")
        status, _, _ = await self.get(port, "/secure")
        self.assertEqual(status, 502)
        self.assertEqual(self.backend.seen, [])

    async def test_insecure_skip_verify_accepts(self) -> None:
        port = self.tls_gateway("insecureSkipVerify: true\n", trust=self.untrusted)
        status, _, _ = await self.get(port, "/secure")
        self.assertEqual(status, 200)

    async def test_wss_upstream(self) -> None:
        port = self.tls_gateway(route="/ws", upstream_port=port_of(self.wss_port))
        client = await connect(port)
        ws = WSConnection(ConnectionType.CLIENT)
        client.send(ws.send(WSRequest(host="gateway.test", target="/ws")))
        await client.until(b"\r\n\r\n")
        self.assertTrue(client.received.startswith(b"HTTP/1.1 101 "), client.received)
        ws.receive_data(client.received)
        client.received = b""
        self.assertIsInstance(next(iter(ws.events())), AcceptConnection)
        client.send(ws.send(Message(data="over tls")))
        self.assertEqual(await next_message(client, ws), "over tls")
        client.send(ws.send(CloseConnection(code=1000)))
        await client.closed


class BackpressureTests(ProxyTestCase):
    async def test_slow_client_pauses_upstream(self) -> None:
        total = 256 * 1024 * 1024
        bodies: list[EndlessBody] = []

        class Big(Resource):
            isLeaf = True

            def render(self, request: Request) -> int:
                request.setHeader(b"content-length", b"%d" % total)
                body = EndlessBody(request, total)
                bodies.append(body)
                body.start()
                return NOT_DONE_YET

        big_port = listen_local(Site(Big()))
        self.addCleanup(big_port.stopListening)
        port = self.gateway(upstream_port=port_of(big_port))
        client = await connect(port)
        transport: Any = client.transport
        transport.pauseProducing()  # a client that reads nothing
        client.send(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while not bodies or not bodies[0].pauses:
            await deferLater(reactor, 0.01, lambda: None)
        # The backend was paused: what it sent is bounded by the socket and transport
        # buffers on the way (which the kernel may still grow a little), never by the
        # body's size.
        for _ in range(4):
            await deferLater(reactor, 0.1, lambda: None)
            self.assertLess(bodies[0].sent, 32 * 1024 * 1024)
        # Reading again lets the whole body through.
        transport.resumeProducing()
        counted = 0

        def enough(data: bytes) -> bool:
            return len(data) > 0

        while counted < total:
            await client.until(enough)
            counted += len(client.received)
            client.received = b""
        head_and_body = counted
        self.assertGreater(head_and_body, total)
        await client.closed


class ProxiedHeadTests(ProxyTestCase):
    async def test_one_date_and_server(self) -> None:
        port = self.gateway()
        _, headers, _ = await self.get(port, "/cookies")
        self.assertEqual(len(headers["date"]), 1)
        self.assertEqual(headers["server"], ["edgegw"])


class ProxyCallRecordTests(ProxyTestCase):
    async def test_call_in_the_access_log(self) -> None:
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        port = self.gateway()
        await self.get(port, "/missing")
        backend = str(port_of(self.backend_port))
        dead_port = await refused_port()
        await self.get(self.gateway(upstream_port=dead_port), "/x")
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        first, second = (record["upstream_calls"][0] for record in records)
        self.assertEqual((first["name"], first["status"]), ("upstream", 404))
        self.assertEqual(first["upstream"], "127.0.0.1:" + backend)
        self.assertIsNone(second["status"])
        self.assertIn("ConnectionRefusedError", second["error"])


class RequestHygieneTests(ProxyTestCase):
    """
    Nothing gets a request past the route, its policies or the header hygiene the
    gateway promises: absolute-form targets, underscored headers, invented content
    types, upgrades other than WebSocket, malformed chunked bodies, a client's own
    C{Authorization}.
    """

    def raw_backend(self, response: bytes) -> Any:
        from tests.support.backends import RawBackend, scripted

        backend = RawBackend(scripted(response, close=True)).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        return backend

    async def test_absolute_form_is_routed_and_forwarded_in_origin_form(self) -> None:
        port = self.gateway("preserveHost: true\n")
        client = await connect(port)
        client.send(
            b"GET http://other.test?/admin/secret HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
        )
        await client.until(response_complete)
        await client.close()
        client = await connect(port)
        client.send(
            b"GET http://other.test/api/x?y=1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
        )
        await client.until(response_complete)
        await client.close()
        self.assertEqual(
            [seen["uri"] for seen in self.backend.seen], ["/?/admin/secret", "/api/x?y=1"]
        )
        self.assertEqual(self.backend.header(1, "host"), ["other.test"])

    async def test_absolute_form_cannot_skip_a_policy(self) -> None:
        upstream = f"http://127.0.0.1:{port_of(self.backend_port)}"
        port = serve_yaml(
            self,
            GATEWAY
            + "---\nkind: Policy\nmetadata: {name: admins}\n"
            + "spec: {require: {groups: [admin]}}\n"
            + "---\nkind: Route\nmetadata: {name: admin}\nspec:\n  match: /admin/\n"
            + f'  handler: {{type: reverse-proxy, upstream: "{upstream}"}}\n'
            + "  access: {auth: public, authorize: [admins]}\n"
            + "---\nkind: Route\nmetadata: {name: rest}\nspec:\n  match: /\n"
            + f'  handler: {{type: reverse-proxy, upstream: "{upstream}"}}\n'
            + "  access: {auth: public}\n",
        )
        for target in ("/admin/secret", "http://x/admin/secret"):
            status, _, _ = await self.get(port, target)
            self.assertEqual(status, 403, target)
        for target in ("/x/%2e%2e/admin/secret", "/x/%2E/admin", "/admin%5csecret", "/a\\b"):
            status, _, _ = await self.get(port, target)
            self.assertEqual(status, 400, target)
        self.assertEqual(self.backend.seen, [])

    async def test_underscored_headers_never_reach_the_backend(self) -> None:
        port = self.gateway()
        await self.get(
            port,
            "/x",
            "X_User_Id: admin\r\nX_User_Groups: admins\r\nX_Forwarded_For: 6.6.6.6\r\n"
            "X_Gw_Identity: forged\r\nX-Kept: yes\r\n",
        )
        names = {name.lower() for name, _ in self.backend.seen[0]["headers"]}
        self.assertFalse({n for n in names if "_" in n}, names)
        self.assertIn("x-kept", names)

    async def test_no_content_type_is_invented(self) -> None:
        backend = self.raw_backend(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        port = self.gateway(upstream_port=backend.port)
        status, headers, body = await self.get(port, "/x")
        self.assertEqual((status, body), (200, b"ok"))
        self.assertNotIn("content-type", headers)

    async def test_only_websocket_is_upgraded(self) -> None:
        backend = self.raw_backend(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
        )
        port = self.gateway(upstream_port=backend.port)
        client = await connect(port)
        client.send(
            b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: websocket, h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAA\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        status, _, body = parse(await client.until(response_complete))
        await client.close()
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        head = backend.connections[0].requests[0].head.lower()
        self.assertIn(b"\r\nupgrade: websocket\r\n", head)
        self.assertNotIn(b"h2c", head)
        self.assertNotIn(b"http2-settings", head)

    async def test_malformed_chunked_body_gets_one_answer(self) -> None:
        port = self.gateway()
        client = await connect(port)
        client.send(
            b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0x5\r\nhello\r\n0\r\n\r\n"
        )
        await client.closed
        self.assertEqual(client.received.count(b"HTTP/1.1 "), 1, client.received)
        self.assertTrue(client.received.startswith(b"HTTP/1.1 400 "), client.received)

    async def test_client_authorization_not_forwarded_without_a_principal(self) -> None:
        port = self.gateway("forwardAccessToken: true\n")
        await self.get(port, "/x", "Authorization: Bearer client-made-this-up\r\n")
        self.assertEqual(self.backend.header(0, "authorization"), [])


class ProjectedHeaderForgeryTests(ProxyTestCase):
    """
    Identity headers projected under names outside X-User-* (an explicit claim map, a
    custom groups header) are the gateway's to set: a client's own copy never reaches a
    backend, on the projecting route or any other.
    """

    async def test_custom_projection_names_stripped_everywhere(self) -> None:
        upstream = f"http://127.0.0.1:{port_of(self.backend_port)}"
        port = serve_yaml(
            self,
            GATEWAY + "---\nkind: Route\nmetadata: {name: projecting}\nspec:\n"
            '  match: "/p/"\n'
            "  access: {projection: {session: {claims: {email: X-Mail}, "
            "groups: {header: X-Teams}}}}\n"
            f'  handler: {{type: reverse-proxy, upstream: "{upstream}"}}\n'
            "---\nkind: Route\nmetadata: {name: plain}\nspec:\n"
            '  match: "/other/"\n'
            f'  handler: {{type: reverse-proxy, upstream: "{upstream}"}}\n',
        )
        forged = "X-Mail: boss@corp\r\nx-teams: admins\r\nX-User-Id: root\r\nX-Other: kept\r\n"
        for target in ("/p/x", "/other/x"):
            status, _, _ = await self.get(port, target, forged)
            self.assertEqual(status, 200)
        for index in (0, 1):
            self.assertEqual(self.backend.header(index, "x-mail"), [])
            self.assertEqual(self.backend.header(index, "x-teams"), [])
            self.assertEqual(self.backend.header(index, "x-user-id"), [])
            self.assertEqual(self.backend.header(index, "x-other"), ["kept"])


class UpstreamFramingTests(ProxyTestCase):
    """
    Issue 10, point 10: the client gets one Content-Length of the gateway's own reading
    of the upstream's framing, never the upstream's fields as received; none on a
    response without a body.
    """

    RESPONSES = {
        b"/twice": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"/list": b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        b"/differ": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"/differ-list": b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        b"/204": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n",
        b"/304": b'HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: "e"\r\n\r\n',
        b"/head": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"/101": (
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Content-Length: 5\r\n\r\n"
        ),
    }

    def setUp(self) -> None:
        super().setUp()
        from tests.support.backends import RawBackend

        def respond(request: Any, connection: Any) -> None:
            target = request.request_line.split(b" ")[1]
            connection.write(self.RESPONSES[target])
            connection.close()

        self.raw = RawBackend(respond).start()
        self.addCleanup(lambda: ensureDeferred(self.raw.stop()))
        self.port = self.gateway(upstream_port=self.raw.port)

    async def exchange(self, request: bytes) -> tuple[bytes, bytes]:
        """
        Send one raw request; the raw response head (lowercased) and body.
        """
        client = await connect(self.port)
        client.send(request)
        await client.closed
        head, _, body = client.received.partition(b"\r\n\r\n")
        return head.lower(), body

    def upstream_targets(self) -> list[bytes]:
        return [
            request.request_line
            for connection in self.raw.connections
            for request in connection.requests
        ]

    async def test_repeated_content_length_relayed_once(self) -> None:
        for target in (b"/twice", b"/list"):
            head, body = await self.exchange(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target
            )
            self.assertTrue(head.startswith(b"http/1.1 200 "), head)
            self.assertEqual(head.count(b"\r\ncontent-length:"), 1, head)
            self.assertIn(b"\r\ncontent-length: 5", head)
            self.assertNotIn(b"transfer-encoding", head)
            self.assertEqual(body, b"hello")
        self.assertEqual(self.upstream_targets(), [b"GET /twice HTTP/1.1", b"GET /list HTTP/1.1"])

    async def test_differing_content_lengths_are_502(self) -> None:
        for target in (b"/differ", b"/differ-list"):
            head, body = await self.exchange(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target
            )
            self.assertTrue(head.startswith(b"http/1.1 502 "), head)
            self.assertEqual(body, b"bad gateway\n")
        self.assertEqual(
            self.upstream_targets(), [b"GET /differ HTTP/1.1", b"GET /differ-list HTTP/1.1"]
        )

    async def test_no_content_length_without_a_body(self) -> None:
        for target, status in ((b"/204", b"204"), (b"/304", b"304")):
            head, body = await self.exchange(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target
            )
            self.assertTrue(head.startswith(b"http/1.1 " + status), head)
            self.assertNotIn(b"content-length", head)
            self.assertNotIn(b"transfer-encoding", head)
            self.assertEqual(body, b"")
        head, _ = await self.exchange(b"GET /204 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertIn(b"\r\nx-a: 1", head)
        self.assertEqual(
            self.upstream_targets(),
            [b"GET /204 HTTP/1.1", b"GET /304 HTTP/1.1", b"GET /204 HTTP/1.1"],
        )

    async def test_head_gets_the_declared_length_once(self) -> None:
        head, body = await self.exchange(
            b"HEAD /head HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        self.assertTrue(head.startswith(b"http/1.1 200 "), head)
        self.assertEqual(head.count(b"\r\ncontent-length:"), 1, head)
        self.assertIn(b"\r\ncontent-length: 5", head)
        self.assertEqual(body, b"")
        self.assertEqual(self.upstream_targets(), [b"HEAD /head HTTP/1.1"])

    async def test_no_content_length_on_101(self) -> None:
        head, _ = await self.exchange(
            b"GET /101 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        self.assertTrue(head.startswith(b"http/1.1 101 "), head)
        self.assertNotIn(b"content-length", head)
        [request] = self.raw.connections[0].requests
        self.assertIn(b"\r\nupgrade: websocket\r\n", request.head.lower())


class ConnectionTokenTests(ProxyTestCase):
    """
    Issue 10, point 11: a client's Connection header removes the client's own headers,
    never one the gateway sets (X-Request-Id, X-Forwarded-*, projected identity).
    """

    async def test_request_id_and_forwarding_headers_survive(self) -> None:
        port = self.gateway()
        status, headers, _ = await self.get(
            port,
            "/x",
            "Connection: X-Request-Id, X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host,"
            " X-Custom\r\nX-Request-Id: client-id-1\r\nX-Custom: 1\r\nX-Kept: yes\r\n",
        )
        self.assertEqual((status, headers["x-request-id"]), (200, ["client-id-1"]))
        self.assertEqual(self.backend.header(0, "x-request-id"), ["client-id-1"])
        self.assertEqual(self.backend.header(0, "x-forwarded-for"), ["127.0.0.1"])
        self.assertEqual(self.backend.header(0, "x-forwarded-proto"), ["http"])
        self.assertEqual(self.backend.header(0, "x-forwarded-host"), ["gateway.test"])
        self.assertEqual(self.backend.header(0, "x-custom"), [])
        self.assertEqual(self.backend.header(0, "x-kept"), ["yes"])
        # Without an id of the client's, the backend gets the one the gateway made.
        status, headers, _ = await self.get(port, "/x", "Connection: x-request-id\r\n")
        [made] = headers["x-request-id"]
        self.assertEqual(self.backend.header(1, "x-request-id"), [made])

    async def test_projected_identity_headers_survive(self) -> None:
        import edgegw.assembly.route_chains
        from edgegw.chain.projection import projection as original
        from edgegw.identity.principal import Principal

        def signed_in(*args: Any, **kwargs: Any) -> Any:
            # A principal as the session stage will set one, before the real projection.
            project = original(*args, **kwargs)

            async def stage(exchange: Any, next: Any) -> None:
                exchange.principal = Principal(
                    "u1", {"email": "u1@corp"}, groups=("admins",), access_token="tok"
                )
                await project(exchange, next)

            return stage

        self.patch(edgegw.assembly.route_chains, "projection", signed_in)
        upstream = f"http://127.0.0.1:{port_of(self.backend_port)}"
        port = serve_yaml(
            self,
            GATEWAY + "---\nkind: Route\nmetadata: {name: p}\nspec:\n"
            '  match: "/"\n'
            "  access: {projection: {session: {claims: {email: X-Mail}}}}\n"
            f'  handler: {{type: reverse-proxy, upstream: "{upstream}"}}\n',
        )
        status, _, _ = await self.get(
            port,
            "/x",
            "Connection: X-User-Id, x-user-groups, X-Mail, X-Custom\r\n"
            "X-User-Id: forged\r\nX-Mail: forged@evil\r\nX-Custom: 1\r\n",
        )
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, "x-user-id"), ["u1"])
        self.assertEqual(self.backend.header(0, "x-user-groups"), ["admins"])
        self.assertEqual(self.backend.header(0, "x-mail"), ["u1@corp"])
        self.assertEqual(self.backend.header(0, "x-custom"), [])


class RelayHeadTests(SynchronousTestCase):
    """
    L{ProxyHandler.relay_head} against a plain model of what it relays: random upstream
    heads, names in any case, repeated, skipped, named by C{Connection}, the gateway's
    own cookie among others.
    """

    POOL = [
        (b"Content-Type", b"application/json"),
        (b"content-type", b"text/plain"),
        (b"X-A", b"1"),
        (b"x-a", b"2"),
        (b"X-B", b"3"),
        (b"ETag", b'"e"'),
        (b"etag", b'"f"'),
        (b"Set-Cookie", b"app=1; Path=/"),
        (b"set-cookie", b"gw_session=evil"),
        (b"SET-COOKIE", b"other=2"),
        (b"Server", b"nginx"),
        (b"Date", b"yesterday"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Length", b"12"),
        (b"X-Frame-Options", b"ALLOW"),
        (b"Connection", b"keep-alive"),
        (b"Connection", b"X-B, x-a"),
        (b"connection", b"close, X-Request-Id"),
        (b"X-Request-Id", b"upstream-id"),
        (b"WWW-Authenticate", b"Basic"),
        (b"Connection", b"close"),
        (b"Connection", b"Close"),
        (b"Close", b"hop"),
        (b"Keep-Alive", b"max=5"),
    ]

    @staticmethod
    def model(
        headers: list[tuple[bytes, bytes]], before: dict[bytes, list[bytes]], code: int
    ) -> list[tuple[bytes, list[bytes]]]:
        skip = HOP_BY_HOP | {b"x-frame-options", b"server", b"date", b"content-length"}
        named: set[bytes] = set()
        for name, value in headers:
            if name.lower() == b"connection":
                named |= {t.strip().lower() for t in value.split(b",") if t.strip()}
        out = {name.lower(): values for name, values in before.items()}
        grouped: dict[bytes, list[bytes]] = {}
        for name, value in headers:
            lower = name.lower()
            if lower in skip or lower in named:
                continue
            if lower == b"set-cookie" and value.startswith(b"gw_session="):
                continue
            grouped.setdefault(lower, []).append(value)
        for lower, values in grouped.items():
            out[lower] = values
        if code not in (204, 304):
            out[b"content-length"] = [b"12"]
        return list(out.items())

    def test_same_as_the_model(self) -> None:
        handler = ProxyHandler(
            ProxyHandlerSpec(upstream="http://127.0.0.1:1"),
            UpstreamClient(reactor),
            reactor,
            gateway_headers=frozenset({b"x-frame-options"}),
            own_cookie=lambda name: name == b"gw_session",
        )
        self.patch(proxy_module._log, "warn", lambda *a, **k: None)
        rng = random.Random(19)
        for _ in range(2_000):
            headers = [rng.choice(self.POOL) for _ in range(rng.randrange(0, 12))]
            code = rng.choice([200, 200, 204, 304, 404])
            request = DummyRequest([b""])
            request.responseHeaders = ResponseHeaders()
            before = {b"X-Request-Id": [b"gateway-id"], b"Vary": [b"Origin"]}
            for name, values in before.items():
                request.responseHeaders.setRawHeaders(name, values)
            response = UpstreamResponse(None, b"HTTP/1.1", code, b"X", headers, 12, True)
            handler.relay_head(cast(Request, request), response)
            got = [
                (name.lower(), values)
                for name, values in request.responseHeaders.getAllRawHeaders()
            ]
            self.assertEqual(got, self.model(headers, before, code), headers)
            self.assertEqual(request.responseCode, code)


class EagerFlushTests(ProxyTestCase):
    async def seen_before_the_access_log_line(self, head: bytes) -> bytes:
        """
        Send C{head} to a gateway and return what the client had received when the
        access-log line was made.
        """
        port = self.gateway()
        client = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(client.close)
        seen: list[bytes] = []
        real = AccessLog.emit

        def emit(log: AccessLog, record: dict[str, Any]) -> None:
            try:
                seen.append(client.recv(65536, socket.MSG_DONTWAIT))
            except BlockingIOError:
                seen.append(b"")
            real(log, record)

        self.patch(AccessLog, "emit", emit)
        client.sendall(head)
        for _ in range(200):
            if seen:
                break
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(len(seen), 1)
        return seen[0]

    async def test_the_response_leaves_before_the_access_log_line(self) -> None:
        """
        On the daemon's reactor, a small proxied response is on its way to the client
        before the access-log line is made (the rest of the event's work does not delay
        it); on another reactor it leaves at the end of the iteration.
        """
        seen = await self.seen_before_the_access_log_line(
            b"GET /x HTTP/1.1\r\nHost: gateway.test\r\n\r\n"
        )
        eager = hasattr(reactor, "flushWriter")
        self.assertEqual(seen.startswith(b"HTTP/1.1 200 "), eager, seen)

    async def test_also_after_a_request_body(self) -> None:
        """
        The same for a request with a body on a kept-alive connection (Twisted leaves
        an empty leftover behind each body, which is not a pipelined request).
        """
        seen = await self.seen_before_the_access_log_line(
            b"POST /x HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 5\r\n\r\nhello"
        )
        self.assertEqual(seen.startswith(b"HTTP/1.1 200 "), hasattr(reactor, "flushWriter"))

    async def test_also_when_the_upstream_connection_closes(self) -> None:
        """
        The same when the upstream connection is not reused (the backend's
        C{Connection: close}): its close, asked for first, holds no bytes to overtake.
        """
        seen = await self.seen_before_the_access_log_line(
            b"GET /close HTTP/1.1\r\nHost: gateway.test\r\n\r\n"
        )
        self.assertEqual(seen.startswith(b"HTTP/1.1 200 "), hasattr(reactor, "flushWriter"))
