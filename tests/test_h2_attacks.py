"""
HTTP/2 at the edge under attack and at its limits (issue 33, items 4 to 6): raw frames
over a real TLS socket to a whole gateway, which proxies to a real backend.

Nothing here depends on how fast anything runs: the gateway's timers are on a
L{Clock} the tests advance, a PING's acknowledgement tells that the gateway has read
every frame sent before it, and what the backend saw is read from the backend itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.assembly.assemble import Gateway
from edgegw.assembly.edge_site import IDLE_CONNECTION_TIMEOUT
from edgegw.server.h2.connection import H2ServerConnection
from tests.support.backends import EndlessBody, RawBackend, RawConnection, RawRequest, SiteBackend
from tests.support.gateways import OK_RESPONSE, start_gateway
from tests.support.h2client import connect_h2, listen_tls
from tests.support.h2frames import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RawH2Client,
    connect_raw,
    continuation,
    data,
    header_frames,
    headers,
    indexed,
    literal,
    literal_indexed,
    ping,
    priority,
    rst,
    settings,
    table_size_update,
    unknown,
    window_update,
)

reactor: Any = _reactor

MiB = 1024 * 1024


async def eventually(condition: Callable[[], bool]) -> None:
    """
    Wait until C{condition} holds (checked every few milliseconds): for what only the
    gateway or the backend can tell.
    """
    while not condition():
        await deferLater(reactor, 0.005, lambda: None)


def hold(request: RawRequest, connection: RawConnection) -> None:
    """
    A L{RawBackend} responder that never answers.
    """


def answer_ok_once(request: RawRequest, connection: RawConnection) -> None:
    """
    A L{RawBackend} responder (on heads) that answers each complete request with 200.
    """
    if request.complete and request.index not in connection.answered:
        connection.answered.add(request.index)
        connection.write(OK_RESPONSE)


def pseudo(
    method: bytes = b"GET", path: bytes = b"/", authority: bytes = b"localhost"
) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", method),
        (b":scheme", b"https"),
        (b":authority", authority),
        (b":path", path),
    ]


def raw_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    """
    C{fields} as HPACK literals that leave the decoder's table alone.
    """
    return b"".join(literal(name, value) for name, value in fields)


class H2Case(TestCase):
    """
    A gateway with HTTP/2 over TLS in front of a test backend.
    """

    # A guard only: every wait here ends on an event, and a test that fails waits this
    # long at most.
    timeout = 30
    tls_certificate: bytes

    def site_backend(self, responder: Any = None) -> SiteBackend:
        backend = SiteBackend(responder).start()
        self.addCleanup(backend.stop)
        return backend

    def raw_backend(self, respond: Any, on_head: bool = True) -> RawBackend:
        backend = RawBackend(respond, on_head=on_head).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        return backend

    def gateway(
        self, backend_port: int, gateway_spec: str = "", proxy_spec: str = ""
    ) -> tuple[Gateway, Clock, int]:
        """
        A gateway proxying to C{backend_port}, its timers on a clock; return it, the
        clock and its TLS port.
        """
        clock = Clock()
        built, _ = start_gateway(
            self, f"http://127.0.0.1:{backend_port}", gateway_spec, proxy_spec, clock=clock
        )
        return built, clock, listen_tls(self, built.site)

    def h2_connections(self, built: Gateway) -> list[H2ServerConnection]:
        return [c for c in built.site.connections.channels if isinstance(c, H2ServerConnection)]

    async def connection_of(self, built: Gateway) -> H2ServerConnection:
        await eventually(lambda: len(self.h2_connections(built)) == 1)
        [connection] = self.h2_connections(built)
        return connection

    async def flood(
        self, client: RawH2Client, batch: Callable[[], bytes], batches: int = 100
    ) -> int:
        """
        Send C{batch()} again and again, each followed by a PING, until the server sends
        GOAWAY or closes; return how many batches it took. Fails after C{batches}.
        """
        for sent in range(1, batches + 1):
            client.write(batch())
            with contextlib.suppress(ConnectionError):
                await client.sync()
            if client.ended_by_server():
                return sent
        self.fail(f"{batches} batches and the connection is still open")

    def assertCalmed(self, client: RawH2Client) -> None:
        self.assertIsNotNone(client.goaway, "no GOAWAY")
        assert client.goaway is not None
        self.assertEqual(client.goaway.error_code, ENHANCE_YOUR_CALM)

    async def still_serves(self, port: int) -> None:
        """
        A new connection to C{port} is served.
        """
        other = await connect_h2(self, port)
        response = await other.request(b"GET", b"/healthz")
        self.assertEqual(response.status, 200)


# -- item 4: the gateway's reading on HTTP/2 ---------------------------------------------


class MalformedRequestTests(H2Case):
    """
    A malformed request is a stream error (RST_STREAM PROTOCOL_ERROR): it reaches no
    backend, and the other streams of the connection go on.
    """

    async def test_malformed_streams_reset_others_answered(self) -> None:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        bad = {
            "uppercase name": [*pseudo(), (b"X-Upper", b"1")],
            "connection": [*pseudo(), (b"connection", b"close")],
            "keep-alive": [*pseudo(), (b"keep-alive", b"300")],
            "proxy-connection": [*pseudo(), (b"proxy-connection", b"keep-alive")],
            "transfer-encoding": [*pseudo(), (b"transfer-encoding", b"chunked")],
            "upgrade": [*pseudo(), (b"upgrade", b"h2c")],
            "te gzip": [*pseudo(), (b"te", b"gzip")],
            "CR in value": [*pseudo(), (b"x-a", b"a\rb")],
            "LF in value": [*pseudo(), (b"x-a", b"a\nx-injected: 1")],
            "NUL in value": [*pseudo(), (b"x-a", b"a\x00b")],
            "unknown pseudo": [*pseudo(), (b":foo", b"x")],
            "pseudo after regular": [*pseudo()[:3], (b"accept", b"*/*"), pseudo()[3]],
            "duplicate pseudo": [*pseudo(), (b":path", b"/other")],
            "missing path": pseudo()[:3],
            "response pseudo": [*pseudo(), (b":status", b"200")],
        }
        frames = []
        first, request = client.request_frames(b"GET", b"/first")
        frames.append(request)
        streams = {}
        for why, fields in bad.items():
            stream_id = client.next_stream_id
            client.next_stream_id += 2
            frames.append(header_frames(stream_id, raw_block(fields), end_stream=True))
            streams[why] = stream_id
        last, request = client.request_frames(b"GET", b"/last")
        frames.append(request)
        client.send(*frames)
        await client.until(lambda: client.response(last).done and client.response(first).done)
        await client.sync()
        for why, stream_id in streams.items():
            with self.subTest(why=why):
                response = client.response(stream_id)
                self.assertEqual((response.reset, response.status), (PROTOCOL_ERROR, None))
        for stream_id in (first, last):
            self.assertEqual(client.response(stream_id).status, 200)
            self.assertEqual(client.response(stream_id).body, b"hello")
        self.assertIsNone(client.goaway)
        self.assertEqual(sorted(r.uri for r in backend.requests), [b"/first", b"/last"])

    async def test_authority_and_host_differ(self) -> None:
        """
        C{:authority} and C{host} naming different hosts: refused (a stream error, or
        400), never proxied; the same host in both is served.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        differ = client.request(b"GET", b"/a", [(b"host", b"evil.test")])
        same = client.request(b"GET", b"/b", [(b"host", b"localhost")])
        await client.until(lambda: client.response(differ).done and client.response(same).done)
        refused = client.response(differ)
        self.assertTrue(refused.reset == PROTOCOL_ERROR or refused.status == 400)
        self.assertEqual(client.response(same).status, 200)
        self.assertEqual([r.uri for r in backend.requests], [b"/b"])
        self.assertEqual(backend.requests[0].header(b"x-forwarded-host"), b"localhost")

    async def test_host_without_authority(self) -> None:
        """
        A request with C{host} and no C{:authority} is routed by C{host}; with neither it
        is answered 400 (as HTTP/1.1 without Host).
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        host_only = client.request(b"GET", b"/h", [(b"host", b"localhost")], authority=None)
        neither = client.request(b"GET", b"/n", authority=None)
        await client.until(
            lambda: client.response(host_only).done and client.response(neither).done
        )
        self.assertEqual(client.response(host_only).status, 200)
        self.assertEqual(client.response(neither).status, 400)
        self.assertEqual([r.uri for r in backend.requests], [b"/h"])

    async def test_invalid_authority(self) -> None:
        """
        C{:authority} is validated like Host: userinfo, a bad port or bad characters are
        refused.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        streams = [
            client.request(b"GET", b"/x", authority=authority)
            for authority in (b"user@localhost", b"localhost:99999", b"local host", b"")
        ]
        await client.until(lambda: all(client.response(s).done for s in streams))
        for stream_id in streams:
            response = client.response(stream_id)
            self.assertTrue(response.reset == PROTOCOL_ERROR or response.status == 400)
        self.assertEqual(backend.requests, [])

    async def test_path_cleaning(self) -> None:
        """
        C{:path} goes through the edge's cleaning and security rules as an HTTP/1.1
        target does.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        semicolon = client.request(b"GET", b"/admin;x/users")
        slash = client.request(b"GET", b"/docs/a%2Fb")
        backslash = client.request(b"GET", b"/a%5Cb")
        nul = client.request(b"GET", b"/a%00b")
        dots = client.request(b"GET", b"/a/../healthz")
        space = client.request(b"GET", b"/a b")
        fragment = client.request(b"GET", b"/a#b")
        unreserved = client.request(b"GET", b"/%61pi/x")
        streams = [semicolon, slash, backslash, nul, dots, space, fragment, unreserved]
        await client.until(lambda: all(client.response(s).done for s in streams))
        for stream_id in (semicolon, slash, backslash, nul):
            self.assertEqual(client.response(stream_id).status, 400)
        for stream_id in (space, fragment):
            response = client.response(stream_id)
            self.assertTrue(response.status == 400 or response.reset == PROTOCOL_ERROR)
        moved = client.response(dots)
        self.assertEqual((moved.status, moved.header(b"location")), (301, b"/healthz"))
        self.assertEqual(client.response(unreserved).status, 200)
        self.assertEqual([r.uri for r in backend.requests], [b"/api/x"])

    async def test_method_not_a_token(self) -> None:
        """
        A C{:method} with a space is refused, never written into an HTTP/1.1 request
        line upstream (request line injection).
        """
        backend = self.raw_backend(answer_ok_once)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"GET /admin HTTP/1.1\tX", b"/public")
        await client.until(lambda: client.response(stream_id).done)
        response = client.response(stream_id)
        await client.sync()
        lines = [r.request_line for c in backend.connections for r in c.requests]
        self.assertEqual(lines, [])
        # Refused at the edge as malformed, not answered 502 as an upstream failure.
        self.assertTrue(
            response.reset == PROTOCOL_ERROR or response.status in (400, 405, 501),
            (response.reset, response.status),
        )

    async def test_lowercase_method(self) -> None:
        """
        A method in the wrong case is answered 400, as on HTTP/1.1.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"get", b"/x")
        await client.until(lambda: client.response(stream_id).done)
        self.assertEqual(client.response(stream_id).status, 400)
        self.assertEqual(backend.requests, [])


class ForwardingTests(H2Case):
    """
    Every forwarding and identity header rule applies as on HTTP/1.1.
    """

    async def test_forwarding_headers(self) -> None:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(
            b"GET",
            b"/x",
            [
                (b"x-forwarded-for", b"6.6.6.6"),
                (b"x-forwarded-proto", b"http"),
                (b"x-forwarded-host", b"evil.test"),
                (b"x-real-ip", b"6.6.6.6"),
                (b"forwarded", b"for=6.6.6.6"),
                (b"x-user-id", b"admin"),
                (b"x-gw-identity", b"forged"),
                (b"x_user", b"underscored"),
                (b"authorization", b"Bearer t"),
                (b"te", b"trailers"),
                (b"x-kept", b"yes"),
            ],
        )
        await client.until(lambda: client.response(stream_id).done)
        self.assertEqual(client.response(stream_id).status, 200)
        [seen] = backend.requests
        names = {name.lower() for name, _ in seen.headers}
        for gone in (
            b"x-real-ip",
            b"forwarded",
            b"x-user-id",
            b"x-gw-identity",
            b"x_user",
            b"authorization",
            b"te",
            b"cookie",
        ):
            self.assertNotIn(gone, names)
        self.assertEqual(seen.header(b"x-forwarded-for"), b"127.0.0.1")
        self.assertEqual(seen.header(b"x-forwarded-proto"), b"https")
        self.assertEqual(seen.header(b"x-forwarded-host"), b"localhost")
        self.assertEqual(seen.header(b"x-kept"), b"yes")
        self.assertEqual(len([n for n, _ in seen.headers if n.lower() == b"x-request-id"]), 1)

    async def test_trusted_proxy_chain(self) -> None:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port, 'trustedProxies: ["127.0.0.1"]\n')
        client = await connect_raw(self, port)
        stream_id = client.request(
            b"GET",
            b"/x",
            [(b"x-forwarded-for", b"203.0.113.5"), (b"x-forwarded-proto", b"https")],
        )
        await client.until(lambda: client.response(stream_id).done)
        [seen] = backend.requests
        self.assertEqual(seen.header(b"x-forwarded-for"), b"203.0.113.5, 127.0.0.1")
        self.assertEqual(seen.header(b"x-forwarded-proto"), b"https")

    async def test_cookie_crumbs_joined(self) -> None:
        """
        Cookie crumbs (RFC 9113 section 8.2.3) reach the backend as one C{Cookie}.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port, proxy_spec="forwardCookies: true\n")
        client = await connect_raw(self, port)
        stream_id = client.request(
            b"GET",
            b"/x",
            [(b"cookie", b"a=1"), (b"accept", b"*/*"), (b"cookie", b"b=2"), (b"cookie", b"c=3")],
        )
        await client.until(lambda: client.response(stream_id).done)
        [seen] = backend.requests
        self.assertEqual([v for n, v in seen.headers if n.lower() == b"cookie"], [b"a=1; b=2; c=3"])


class HeaderListSizeTests(H2Case):
    """
    A request header list over 16 KiB is answered 431 (as HTTP/1.1's head bound).
    """

    big = [(b"x-big-%d" % i, b"v" * 1000) for i in range(20)]

    async def test_over_16k_answered_431(self) -> None:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        self.assertEqual((client.server_settings or {}).get(MAX_HEADER_LIST_SIZE), 16384)
        stream_id = client.next_stream_id
        client.next_stream_id += 2
        client.send(header_frames(stream_id, raw_block(pseudo() + self.big), end_stream=True))
        after = client.request(b"GET", b"/after")
        await client.until(lambda: client.response(stream_id).done)
        await client.until(lambda: client.response(after).done)
        self.assertEqual(client.response(stream_id).status, 431)
        self.assertEqual(client.response(after).status, 200)
        self.assertIsNone(client.goaway)
        self.assertEqual([r.uri for r in backend.requests], [b"/after"])

    async def test_431_with_a_closed_window(self) -> None:
        """
        A client that opened no window for response bodies still gets its 431 head, and
        the connection goes on.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port, {INITIAL_WINDOW_SIZE: 0})
        stream_id = client.next_stream_id
        client.next_stream_id += 2
        client.send(header_frames(stream_id, raw_block(pseudo() + self.big), end_stream=True))
        await client.until(lambda: client.response(stream_id).status is not None)
        self.assertEqual(client.response(stream_id).status, 431)
        await client.sync()
        self.assertIsNone(client.goaway)
        self.assertFalse(client.lost)

    async def test_431_while_uploading(self) -> None:
        """
        A too-large head with a body to follow: 431, and the body is refused.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.next_stream_id
        client.next_stream_id += 2
        fields = [*pseudo(b"POST"), (b"content-length", b"5"), *self.big]
        client.send(header_frames(stream_id, raw_block(fields), end_stream=False))
        await client.until(lambda: client.response(stream_id).done)
        self.assertEqual(client.response(stream_id).status, 431)
        await client.sync(data(stream_id, b"hello", end_stream=True))
        self.assertIsNone(client.goaway)
        self.assertEqual(backend.requests, [])


class ContentLengthTests(H2Case):
    """
    DATA that disagrees with C{content-length} is an error, and the upstream request is
    aborted before the backend sees a complete request (no h2-to-h1 desync).
    """

    async def started(self, length: bytes = b"10") -> tuple[RawBackend, RawH2Client, int]:
        """
        A POST whose head has reached the backend, its body not sent yet.
        """
        heads: list[RawRequest] = []

        def record(request: RawRequest, connection: RawConnection) -> None:
            heads.append(request)

        backend = self.raw_backend(record)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"POST", b"/up", [(b"content-length", length)], end_stream=False)
        await eventually(lambda: bool(heads))
        return backend, client, stream_id

    async def assertNoCompleteRequest(
        self, backend: RawBackend, client: RawH2Client, stream_id: int
    ) -> None:
        await client.until(lambda: client.response(stream_id).done or client.ended_by_server())
        response = client.response(stream_id)
        self.assertTrue(
            response.reset is not None
            or (client.goaway is not None and client.goaway.error_code != NO_ERROR),
            "neither a stream nor a connection error",
        )
        [connection] = backend.connections
        await eventually(lambda: connection.closed)
        self.assertEqual(connection.requests, [])
        self.assertNotIn(b"longer", bytes(connection.received))

    async def test_data_longer_than_content_length(self) -> None:
        backend, client, stream_id = await self.started()
        client.send(data(stream_id, b"0123456789longer", end_stream=True))
        await self.assertNoCompleteRequest(backend, client, stream_id)

    async def test_data_longer_in_a_second_frame(self) -> None:
        """
        The declared length arrives in one DATA frame, without END_STREAM, and more DATA
        follows: the backend must not have been handed a complete request.
        """
        backend, client, stream_id = await self.started()
        await client.sync(data(stream_id, b"0123456789"))
        client.send(data(stream_id, b"longer", end_stream=True))
        await self.assertNoCompleteRequest(backend, client, stream_id)

    async def test_end_stream_before_content_length(self) -> None:
        backend, client, stream_id = await self.started()
        client.send(data(stream_id, b"01234", end_stream=True))
        await self.assertNoCompleteRequest(backend, client, stream_id)

    async def test_end_stream_in_trailers_before_content_length(self) -> None:
        backend, client, stream_id = await self.started()
        trailers = client.block([(b"x-trailer", b"1")])
        client.send(data(stream_id, b"01234"), headers(stream_id, trailers, end_stream=True))
        await self.assertNoCompleteRequest(backend, client, stream_id)

    async def test_headers_end_stream_with_content_length(self) -> None:
        """
        HEADERS with END_STREAM and C{content-length: 5}: no DATA, which disagrees with
        the length (RFC 9113 section 8.1.1: malformed), so refused, not forwarded.
        """
        backend = self.raw_backend(answer_ok_once)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"POST", b"/up", [(b"content-length", b"5")])
        await client.until(lambda: client.response(stream_id).done or client.ended_by_server())
        response = client.response(stream_id)
        heads = [r.head for c in backend.connections for r in c.requests]
        self.assertTrue(
            response.reset is not None
            or response.status == 400
            or (client.goaway is not None and client.goaway.error_code != NO_ERROR),
            (response.reset, response.status, heads),
        )
        self.assertEqual(heads, [])

    async def test_content_length_not_digits(self) -> None:
        """
        A content-length that is not a length: refused, nothing proxied.
        """
        backend = self.raw_backend(answer_ok_once)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"POST", b"/up", [(b"content-length", b"1e3")], end_stream=False)
        await client.until(lambda: client.response(stream_id).done or client.ended_by_server())
        self.assertTrue(
            client.response(stream_id).reset == PROTOCOL_ERROR
            or (client.goaway is not None and client.goaway.error_code == PROTOCOL_ERROR)
        )
        self.assertEqual(backend.connections, [])


# -- item 5: limits and attacks ------------------------------------------------------------


class StreamLimitTests(H2Case):
    """
    C{limits.maxStreamsPerConnection}: SETTINGS_MAX_CONCURRENT_STREAMS.
    """

    async def test_default_advertised(self) -> None:
        backend = self.site_backend()
        built, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        assert client.server_settings is not None
        self.assertEqual(client.server_settings.get(MAX_CONCURRENT_STREAMS), 100)
        # One connection, whatever its streams, counts once against maxConnections.
        streams = [client.request(b"GET", b"/s/%d" % i) for i in range(10)]
        await client.until(lambda: all(client.response(s).done for s in streams))
        self.assertEqual(built.site.connections.count, 1)

    async def test_configured_advertised(self) -> None:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port, "limits: {maxStreamsPerConnection: 7}\n")
        client = await connect_raw(self, port)
        assert client.server_settings is not None
        self.assertEqual(client.server_settings.get(MAX_CONCURRENT_STREAMS), 7)

    async def test_streams_over_the_limit_refused(self) -> None:
        """
        A stream beyond the advertised limit (a client that opened it before the
        server's SETTINGS arrived) is a stream error (RFC 9113 section 5.1.2: "MUST
        treat this as a stream error of type PROTOCOL_ERROR or REFUSED_STREAM"): the
        streams within the limit are answered.
        """
        backend = self.raw_backend(hold)
        _, _, port = self.gateway(backend.port, "limits: {maxStreamsPerConnection: 3}\n")
        client = await connect_raw(self, port)
        streams = [client.request(b"GET", b"/s/%d" % i) for i in range(4)]
        await client.until(lambda: client.response(streams[3]).done or client.ended_by_server())
        self.assertIn(client.response(streams[3]).reset, (REFUSED_STREAM, PROTOCOL_ERROR))
        await eventually(lambda: sum(len(c.requests) for c in backend.connections) == 3)
        for connection in backend.connections:
            connection.write(OK_RESPONSE)
        await client.until(lambda: all(client.response(s).done for s in streams[:3]))
        for stream_id in streams[:3]:
            self.assertEqual(client.response(stream_id).status, 200)
        self.assertIsNone(client.goaway)


class ConnectionLimitTests(H2Case):
    """
    Per connection: C{limits.maxConnections} counts connections, not streams, and a
    header block that never ends holds a connection no longer than the idle timeout.
    """

    async def test_max_connections_counts_connections(self) -> None:
        backend = self.site_backend()
        built, _, port = self.gateway(backend.port, "limits: {maxConnections: 1}\n")
        client = await connect_raw(self, port)
        streams = [client.request(b"GET", b"/s/%d" % i) for i in range(10)]
        await client.until(lambda: all(client.response(s).done for s in streams))
        self.assertEqual([client.response(s).status for s in streams], [200] * 10)
        await self.assertFailure(ensureDeferred(connect_raw(self, port)), ConnectionError)
        client.abort()
        await client.closed
        await eventually(lambda: built.site.connections.count == 0)
        await self.still_serves(port)

    async def test_header_block_that_never_ends(self) -> None:
        """
        HEADERS without END_HEADERS, then silence: no stream is open, so the
        connection's idle timeout runs, and closes it.
        """
        backend = self.site_backend()
        _, clock, port = self.gateway(backend.port)
        partial = headers(1, raw_block(pseudo()), end_stream=True, end_headers=False)
        # Nothing (no PING) may come inside a header block: the gateway has read it
        # once it acknowledges the SETTINGS sent with it.
        client = await connect_raw(self, port, after_preface=partial)
        await client.until(client.settings_acked)
        clock.advance(IDLE_CONNECTION_TIMEOUT)
        await client.until(client.ended_by_server)
        await client.closed
        self.assertEqual(backend.requests, [])


class RapidResetTests(H2Case):
    """
    CVE-2023-44487: streams opened and cancelled faster than a bounded rate get GOAWAY
    ENHANCE_YOUR_CALM, and every upstream request they started is cancelled.
    """

    async def test_rapid_reset(self) -> None:
        backend = self.raw_backend(hold)
        _, _, port = self.gateway(backend.port, "limits: {maxStreamsPerConnection: 10}\n")
        client = await connect_raw(self, port)
        held = [client.request(b"GET", b"/held/%d" % i) for i in range(3)]
        await eventually(lambda: sum(len(c.requests) for c in backend.connections) == 3)
        upstream = {c.requests[0].request_line.split(b" ")[1]: c for c in backend.connections}
        # One cancelled stream: its upstream request is cancelled (its connection closed).
        client.send(rst(held[0]))
        await eventually(lambda: upstream[b"/held/0"].closed)

        def batch() -> bytes:
            frames = []
            for _ in range(10):
                stream_id, request = client.request_frames(b"GET", b"/flood")
                frames += [request, rst(stream_id)]
            return b"".join(frames)

        await self.flood(client, batch)
        self.assertCalmed(client)
        await eventually(lambda: upstream[b"/held/1"].closed and upstream[b"/held/2"].closed)
        await client.closed
        await self.still_serves(port)

    async def test_resets_within_the_rate_are_fine(self) -> None:
        """
        A client that cancels streams now and then (a browser navigating) is not cut off:
        the budget refills with time.
        """
        backend = self.site_backend()
        _, clock, port = self.gateway(backend.port, "limits: {maxStreamsPerConnection: 10}\n")
        client = await connect_raw(self, port)
        for _ in range(10):
            frames = []
            for _ in range(10):
                stream_id, request = client.request_frames(b"GET", b"/x")
                frames += [request, rst(stream_id)]
            await client.sync(b"".join(frames))
            clock.advance(2)
        self.assertIsNone(client.goaway)
        stream_id = client.request(b"GET", b"/after")
        await client.until(lambda: client.response(stream_id).done)
        self.assertEqual(client.response(stream_id).status, 200)

    async def test_malformed_requests_flood(self) -> None:
        """
        Streams the server resets itself (malformed requests) count too.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port, "limits: {maxStreamsPerConnection: 10}\n")
        client = await connect_raw(self, port)

        def batch() -> bytes:
            frames = []
            for _ in range(10):
                stream_id = client.next_stream_id
                client.next_stream_id += 2
                block = raw_block([*pseudo(), (b"connection", b"close")])
                frames.append(headers(stream_id, block, end_stream=True))
            return b"".join(frames)

        await self.flood(client, batch)
        self.assertCalmed(client)
        self.assertEqual(backend.requests, [])


class HeaderBlockTests(H2Case):
    """
    CONTINUATION floods (CVE-2024-27316) and HPACK bombs: a header block is bounded in
    frames and bytes, its decoded list in size, the decoder's table by the setting.
    """

    async def test_continuation_flood(self) -> None:
        """
        HEADERS without END_HEADERS, then CONTINUATION frames that never end the block:
        the connection is closed with an error once the block is too long.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        client.send(headers(1, raw_block(pseudo()), end_stream=True, end_headers=False))

        def batch() -> bytes:
            return b"".join(continuation(1, literal(b"x-a", b"b" * 50)) for _ in range(20))

        batches = await self.flood(client, batch, batches=500)
        self.assertLess(batches * 20, 10_000)
        assert client.goaway is not None
        self.assertNotEqual(client.goaway.error_code, NO_ERROR)
        await client.closed
        self.assertEqual(backend.requests, [])
        await self.still_serves(port)

    async def test_empty_continuation_flood(self) -> None:
        """
        Empty CONTINUATION frames (no bytes to count) are bounded too.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        client.send(headers(1, raw_block(pseudo()), end_stream=True, end_headers=False))
        batches = await self.flood(client, lambda: continuation(1, b"") * 50, batches=500)
        self.assertLess(batches * 50, 10_000)
        assert client.goaway is not None
        self.assertNotEqual(client.goaway.error_code, NO_ERROR)
        await client.closed

    async def test_big_block_over_continuations(self) -> None:
        """
        A header block of 1 MiB over CONTINUATIONs (each frame full) is refused: 431, or
        a connection error; nothing is proxied.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        fields = pseudo() + [(b"x-%d" % i, b"v" * 4000) for i in range(256)]
        client.send(header_frames(1, raw_block(fields), end_stream=True))
        await client.until(lambda: client.response(1).done or client.ended_by_server())
        response = client.response(1)
        self.assertTrue(
            response.status == 431
            or response.reset is not None
            or (client.goaway is not None and client.goaway.error_code != NO_ERROR)
        )
        self.assertEqual(backend.requests, [])

    async def test_hpack_bomb(self) -> None:
        """
        A small header block that decodes to megabytes (one large table entry, indexed
        again and again) is cut short: a stream or connection error, nothing proxied.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        bomb = raw_block(pseudo()) + literal_indexed(b"x-bomb", b"a" * 4000) + indexed(62) * 4000
        self.assertLess(len(bomb), 16384)
        client.send(headers(1, bomb, end_stream=True))
        await client.until(lambda: client.response(1).done or client.ended_by_server())
        response = client.response(1)
        self.assertTrue(
            response.status == 431
            or response.reset is not None
            or (client.goaway is not None and client.goaway.error_code != NO_ERROR)
        )
        self.assertEqual(backend.requests, [])
        await self.still_serves(port)

    async def test_small_hpack_bomb_431(self) -> None:
        """
        A block that decodes to a list above 16 KiB but within the decoder's bound is
        answered 431 and the connection goes on.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        bomb = raw_block(pseudo()) + literal_indexed(b"x-bomb", b"a" * 4000) + indexed(62) * 5
        client.send(headers(1, bomb, end_stream=True))
        await client.until(lambda: client.response(1).done or client.ended_by_server())
        self.assertEqual(client.response(1).status, 431)
        self.assertIsNone(client.goaway)

    async def test_table_size_over_the_setting(self) -> None:
        """
        A dynamic table size update above SETTINGS_HEADER_TABLE_SIZE (4096: the server
        advertises no other) is a connection error: the table stays bounded.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        block = table_size_update(1 << 24) + raw_block(pseudo())
        client.send(headers(1, block, end_stream=True))
        await client.until(client.ended_by_server)
        assert client.goaway is not None
        self.assertNotEqual(client.goaway.error_code, NO_ERROR)
        self.assertEqual(backend.requests, [])


class ControlFloodTests(H2Case):
    """
    Frames that ask for nothing, sent without end: GOAWAY ENHANCE_YOUR_CALM.
    """

    async def connected(self) -> tuple[RawH2Client, int]:
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        return await connect_raw(self, port), port

    async def test_settings_flood(self) -> None:
        client, port = await self.connected()
        await self.flood(client, lambda: settings({}) * 100)
        self.assertCalmed(client)
        await client.closed
        await self.still_serves(port)

    async def test_ping_flood(self) -> None:
        client, port = await self.connected()
        await self.flood(client, lambda: ping(b"floodfld") * 100)
        self.assertCalmed(client)
        await client.closed
        await self.still_serves(port)

    async def test_window_update_flood(self) -> None:
        client, _port = await self.connected()
        await self.flood(client, lambda: window_update(0, 1) * 100)
        self.assertCalmed(client)
        await client.closed

    async def test_stream_window_update_flood(self) -> None:
        backend = self.raw_backend(hold)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"GET", b"/held")
        await self.flood(client, lambda: window_update(stream_id, 1) * 100)
        self.assertCalmed(client)
        await client.closed

    async def test_priority_flood(self) -> None:
        client, _port = await self.connected()
        stream_id = client.request(b"GET", b"/x")
        await client.until(lambda: client.response(stream_id).done)
        await self.flood(client, lambda: priority(stream_id) * 100)
        self.assertCalmed(client)
        await client.closed

    async def test_unknown_frame_flood(self) -> None:
        client, _port = await self.connected()
        await self.flood(client, lambda: unknown(0xFA, 0, b"x") * 100)
        self.assertCalmed(client)
        await client.closed

    async def test_empty_data_flood(self) -> None:
        """
        Empty DATA frames on a request body cost a frame each and carry nothing; the
        upstream request the stream started is cancelled with the connection.
        """
        heads: list[RawConnection] = []

        def record(request: RawRequest, connection: RawConnection) -> None:
            heads.append(connection)

        backend = self.raw_backend(record)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"POST", b"/up", end_stream=False)
        await eventually(lambda: bool(heads))
        await self.flood(client, lambda: data(stream_id) * 100)
        self.assertCalmed(client)
        await eventually(lambda: heads[0].closed)
        self.assertEqual(heads[0].requests, [])

    async def test_other_connection_answered_during_a_flood(self) -> None:
        """
        While one connection floods, a request on another is answered each time.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        flooder = await connect_raw(self, port)
        other = await connect_h2(self, port)
        answered = 0
        for _ in range(100):
            flooder.write(ping(b"floodfld") * 100)
            response = await other.request(b"GET", b"/during")
            self.assertEqual(response.status, 200)
            answered += 1
            with contextlib.suppress(ConnectionError):
                await flooder.sync()
            if flooder.ended_by_server():
                break
        self.assertCalmed(flooder)
        self.assertGreater(answered, 1)
        response = await other.request(b"GET", b"/after")
        self.assertEqual(response.status, 200)


class FlowControlTests(H2Case):
    """
    Windows both ways: a client that opens no window holds nothing for ever, a slow
    backend closes the client's upload window, a slow client pauses the backend.
    """

    async def test_zero_window_send_timeout(self) -> None:
        """
        A client with INITIAL_WINDOW_SIZE 0 that never opens it: after
        C{limits.sendTimeout} the stream is reset and the upstream exchange dropped.
        """

        def big(request: RawRequest, connection: RawConnection) -> None:
            if request.index not in connection.answered:
                connection.answered.add(request.index)
                body = b"b" * (4 * MiB)
                connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                connection.write(body)

        backend = self.raw_backend(big)
        built, clock, port = self.gateway(backend.port, "limits: {sendTimeout: 5s}\n")
        client = await connect_raw(self, port, {INITIAL_WINDOW_SIZE: 0})
        stream_id = client.request(b"GET", b"/big")
        await client.until(lambda: client.response(stream_id).status is not None)
        connection = await self.connection_of(built)
        await eventually(lambda: stream_id in connection.streams)
        stream = connection.streams[stream_id]
        await eventually(lambda: stream.send_timer is not None)
        clock.advance(4.9)
        await client.sync()
        self.assertIsNone(client.response(stream_id).reset)
        clock.advance(0.2)
        await client.until(lambda: client.response(stream_id).reset is not None)
        self.assertEqual(client.response(stream_id).reset, CANCEL)
        self.assertEqual(client.response(stream_id).body, b"")
        [upstream] = backend.connections
        await eventually(lambda: upstream.closed)
        self.assertIsNone(client.goaway)
        self.assertNotIn(stream_id, connection.streams)

    async def test_slow_reader_pauses_the_backend(self) -> None:
        """
        A client that reads no more than its initial window: the gateway holds a bounded
        part of the body and pauses the backend, never buffering the whole body.
        """
        total = 48 * MiB
        bodies: list[EndlessBody] = []

        def endless(request: Request) -> int:
            request.setHeader(b"content-length", b"%d" % total)
            body = EndlessBody(request, total)
            bodies.append(body)
            body.start()
            return NOT_DONE_YET

        backend = self.site_backend(endless)
        built, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"GET", b"/big")
        await eventually(lambda: bool(bodies) and bodies[0].pauses > 0)
        connection = await self.connection_of(built)
        stream = connection.streams[stream_id]
        # The gateway reads what the kernel still holds for it, and holds no more.
        for _ in range(20):
            self.assertLess(bodies[0].sent, 32 * MiB)
            self.assertLess(stream.pending_bytes, 1 * MiB)
            await client.sync()
        self.assertIsNone(client.goaway)
        self.assertLessEqual(len(client.response(stream_id).body), 65535)
        # Reading again lets the body move on.
        client.open_windows = True
        client.send(window_update(0, 16 * MiB), window_update(stream_id, 16 * MiB))
        await client.until(lambda: len(client.response(stream_id).body) > 4 * MiB)
        self.assertIsNone(client.response(stream_id).reset)

    async def test_slow_upload_closes_the_window(self) -> None:
        """
        A backend that reads nothing: the gateway stops acknowledging the upload, so
        the client stops sending, after a bounded amount.
        """
        total = 64 * MiB
        stopped: list[RawConnection] = []

        def stop_reading(request: RawRequest, connection: RawConnection) -> None:
            transport: Any = connection.transport
            transport.pauseProducing()
            stopped.append(connection)

        backend = self.raw_backend(stop_reading)
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(
            b"POST", b"/up", [(b"content-length", b"%d" % total)], end_stream=False
        )
        # The upstream request has begun (its head is in) before the body is sent.
        client.upload(stream_id, 1, end=False)
        await client.sync()
        await eventually(lambda: bool(stopped))
        client.upload(stream_id, total - 1)

        def blocked() -> bool:
            return (
                client.upload_left(stream_id) == 0
                or client.response(stream_id).done
                or min(client.connection_window, client.stream_windows[stream_id]) <= 0
            )

        def granted() -> tuple[int, int]:
            return client.granted.get(0, 0), client.granted.get(stream_id, 0)

        while True:
            await client.until(blocked)
            self.assertGreater(client.upload_left(stream_id), 0, "the whole body was taken")
            self.assertIsNone(client.response(stream_id).reset)
            before = granted()
            # The gateway has read every DATA frame sent before this PING: a window it
            # reopened for them would come before the acknowledgement.
            await client.sync()
            if granted() == before:
                break
        self.assertIsNone(client.goaway)
        self.assertLess(client.uploaded[stream_id], 32 * MiB)
        self.assertLess(len(stopped[0].received), 32 * MiB)


class StreamIdTests(H2Case):
    """
    Stream ids run out at 2**31-1.
    """

    async def test_highest_stream_id_then_a_lower_one(self) -> None:
        backend = self.site_backend()
        built, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        last = client.request(b"GET", b"/last", stream_id=2**31 - 1)
        await client.until(lambda: client.response(last).done)
        self.assertEqual(client.response(last).status, 200)
        client.request(b"GET", b"/again", stream_id=1)
        await client.until(client.ended_by_server)
        assert client.goaway is not None
        self.assertEqual(client.goaway.error_code, PROTOCOL_ERROR)
        await client.closed
        self.assertEqual([r.uri for r in backend.requests], [b"/last"])
        await eventually(lambda: built.site.connections.count == 0)
        await self.still_serves(port)

    async def test_even_stream_id(self) -> None:
        """
        A client stream id must be odd: an even one is a connection error.
        """
        backend = self.site_backend()
        _, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        client.request(b"GET", b"/even", stream_id=2)
        await client.until(client.ended_by_server)
        assert client.goaway is not None
        self.assertEqual(client.goaway.error_code, PROTOCOL_ERROR)
        self.assertEqual(backend.requests, [])


class BodyTimeoutTests(H2Case):
    """
    C{limits.bodyTimeout} per stream.
    """

    async def test_body_that_stops(self) -> None:
        heads: list[RawConnection] = []

        def record(request: RawRequest, connection: RawConnection) -> None:
            heads.append(connection)

        backend = self.raw_backend(record)
        _, clock, port = self.gateway(backend.port, "limits: {bodyTimeout: 5s}\n")
        client = await connect_raw(self, port)
        stream_id = client.request(b"POST", b"/up", [(b"content-length", b"100")], end_stream=False)
        await client.sync(data(stream_id, b"x" * 10))
        await eventually(lambda: bool(heads))
        clock.advance(4.9)
        await client.sync()
        self.assertIsNone(client.response(stream_id).reset)
        clock.advance(0.2)
        await client.until(lambda: client.response(stream_id).done)
        response = client.response(stream_id)
        self.assertTrue(response.reset is not None or response.status == 408)
        await eventually(lambda: heads[0].closed)
        self.assertEqual(heads[0].requests, [])
        # The connection and its other streams go on.
        self.assertIsNone(client.goaway)


# -- item 6: drain -------------------------------------------------------------------------


class DrainTests(H2Case):
    """
    Draining: GOAWAY NO_ERROR with the last stream id, streams in flight finish, new
    ones are refused, then the connection closes.
    """

    async def test_drain_during_streamed_responses(self) -> None:
        pending: list[Request] = []

        def streamed(request: Request) -> int:
            request.setHeader(b"content-type", b"text/event-stream")
            request.write(b"part one;")
            pending.append(request)
            return NOT_DONE_YET

        backend = self.site_backend(streamed)
        built, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port, open_windows=True)
        first = client.request(b"GET", b"/a")
        second = client.request(b"GET", b"/b")
        await client.until(
            lambda: (
                b"part one;" in client.response(first).body
                and b"part one;" in client.response(second).body
            )
        )
        built.site.shut_down()
        await client.until(lambda: client.goaway is not None)
        assert client.goaway is not None
        self.assertEqual(
            (client.goaway.error_code, client.goaway.last_stream_id), (NO_ERROR, second)
        )
        late = client.request(b"GET", b"/late")
        await client.until(lambda: client.response(late).done)
        self.assertEqual(client.response(late).reset, REFUSED_STREAM)
        for request in pending:
            request.write(b"part two")
            request.finish()
        await client.until(lambda: client.response(first).done and client.response(second).done)
        for stream_id in (first, second):
            response = client.response(stream_id)
            self.assertEqual((response.reset, response.body), (None, b"part one;part two"))
        await client.closed
        self.assertEqual(len(backend.requests), 2)

    async def test_drain_idle_connection(self) -> None:
        """
        An idle connection is sent GOAWAY and closed at once.
        """
        backend = self.site_backend()
        built, _, port = self.gateway(backend.port)
        client = await connect_raw(self, port)
        stream_id = client.request(b"GET", b"/x")
        await client.until(lambda: client.response(stream_id).done)
        built.site.shut_down()
        await client.closed
        assert client.goaway is not None
        self.assertEqual(
            (client.goaway.error_code, client.goaway.last_stream_id), (NO_ERROR, stream_id)
        )
