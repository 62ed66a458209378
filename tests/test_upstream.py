"""
Tests for L{edgegw.upstream}: the HTTP/1.1 client and its connection pool.

Most tests talk over real loopback sockets to the backends of L{tests.support.backends}
(a Twisted site, a server answering scripted bytes, a TLS site); the parser's handling
of bytes split at every position and the pool's timers are also driven in memory.
"""

from __future__ import annotations

import contextlib
import os
import socket
from io import BytesIO
from typing import Any

from OpenSSL import SSL
from service_identity import VerificationError
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.error import (
    ConnectionAborted,
    ConnectionClosed,
    ConnectionDone,
    ConnectionRefusedError,
)
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import FileBodyProducer
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from edgegw.upstream import (
    RequestBodyError,
    ResponseTruncatedError,
    Upstream,
    UpstreamClient,
    UpstreamProtocolError,
    UpstreamResponse,
)
from edgegw.upstream.http11 import UpstreamConnection
from tests.support.backends import (
    RawBackend,
    RawConnection,
    RawRequest,
    SiteBackend,
    answer,
    scripted,
    tls_site_backend,
)

_reactor: Any = reactor

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Collect:
    """
    A body sink that keeps every piece.
    """

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.pieces.append(data)
        self.size += len(data)

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)


@implementer(IBodyProducer)
class TrickleProducer:
    """
    A request body written one piece per reactor turn, honouring pause and stop.
    """

    def __init__(self, pieces: list[bytes], length: Any = UNKNOWN_LENGTH) -> None:
        self.pieces = list(pieces)
        self.length = length
        self.paused = False
        self.pauses = 0
        self.stopped = False
        self.written = 0
        self._consumer: Any = None
        self._done: Deferred[None] = Deferred()
        self._call: Any = None

    def startProducing(self, consumer: Any) -> Deferred[None]:
        self._consumer = consumer
        self._schedule()
        return self._done

    def _schedule(self) -> None:
        if self._call is None and not self.paused and not self.stopped:
            self._call = _reactor.callLater(0, self._step)

    def _step(self) -> None:
        self._call = None
        if self.paused or self.stopped:
            return
        if not self.pieces:
            self._done.callback(None)
            return
        piece = self.pieces.pop(0)
        self.written += len(piece)
        self._consumer.write(piece)
        self._schedule()

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        self._schedule()

    def stopProducing(self) -> None:
        self.stopped = True
        if self._call is not None:
            self._call.cancel()
            self._call = None


class UpstreamTestCase(TestCase):
    """
    Helpers: backends and clients that clean up after themselves.
    """

    def site(self, responder: Any = None) -> SiteBackend:
        backend = SiteBackend(responder).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        return backend

    def raw(self, respond: Any, on_head: bool = False) -> RawBackend:
        backend = RawBackend(respond, on_head=on_head).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        return backend

    def client(self, **kwargs: Any) -> UpstreamClient:
        client = UpstreamClient(reactor, **kwargs)
        self.addCleanup(client.close)
        return client

    async def fetch(
        self,
        client: UpstreamClient,
        upstream: Upstream,
        method: bytes = b"GET",
        target: bytes = b"/",
        headers: list[tuple[bytes, bytes]] | None = None,
        body: IBodyProducer | None = None,
    ) -> tuple[UpstreamResponse, bytes]:
        response = await client.request(
            upstream, method, target, [(b"Host", upstream.authority), *(headers or [])], body
        )
        sink = Collect()
        await response.deliver(sink)
        return response, sink.body


class ResponseTests(UpstreamTestCase):
    """
    Response framing, over real sockets.
    """

    async def test_content_length(self) -> None:
        backend = self.site(answer(200, b"hello", [(b"X-Test", b"a")]))
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(
            client, upstream, target=b"/p?q=1", headers=[(b"Accept", b"*/*")]
        )
        self.assertEqual(
            (response.version, response.code, response.phrase), (b"HTTP/1.1", 200, b"OK")
        )
        self.assertEqual((response.length, response.has_body), (5, True))
        self.assertEqual(body, b"hello")
        self.assertIn((b"X-Test", b"a"), response.headers)
        self.assertIn((b"Content-Length", b"5"), response.headers)
        [seen] = backend.requests
        self.assertEqual((seen.method, seen.uri), (b"GET", b"/p?q=1"))
        self.assertEqual(seen.header(b"host"), b"127.0.0.1:%d" % backend.port)
        self.assertEqual(seen.header(b"accept"), b"*/*")
        self.assertIsNone(seen.header(b"content-length"))
        self.assertIsNone(seen.header(b"transfer-encoding"))
        self.assertEqual(client.idle_connections(upstream), 1)

    async def test_ipv6_literal(self) -> None:
        backend = SiteBackend(interface="::1").start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        client = self.client()
        upstream = Upstream.from_url(f"http://[::1]:{backend.port}/base")
        _response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"hello")
        [seen] = backend.requests
        self.assertEqual(seen.header(b"host"), b"[::1]:%d" % backend.port)

    async def test_chunked_with_extensions_and_trailers(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5;name=value\r\nhello\r\n7 ; x\r\n, world\r\n0\r\n"
                b"X-Checksum: abc\r\nX-Other: d\r\n\r\n",
                OK,
            )
        )
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.length, response.has_body), (None, True))
        self.assertEqual(body, b"hello, world")
        self.assertEqual(client.idle_connections(upstream), 1)
        # The trailers were consumed: the next response on the connection is intact.
        response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"ok")
        self.assertEqual(len(backend.connections), 1)

    async def test_close_delimited(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end", close=True
            )
        )
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.length, response.has_body), (None, True))
        self.assertEqual(body, b"until the end")
        self.assertEqual(client.idle_connections(upstream), 0)

    async def test_close_delimited_reset_is_truncation(self) -> None:
        def reset(request: RawRequest, connection: RawConnection) -> None:
            connection.write(b"HTTP/1.1 200 OK\r\n\r\npartial")
            _reactor.callLater(0.01, connection.transport.abortConnection)  # type: ignore[union-attr]

        backend = self.raw(scripted(reset))
        client = self.client()
        upstream = backend.upstream()
        response = await client.request(upstream, b"GET", b"/", [])
        sink = Collect()
        await self.assertFailure(response.deliver(sink), ResponseTruncatedError)
        self.assertEqual(sink.body, b"partial")

    async def test_http10_and_connection_close_are_not_reused(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\n\r\nok",
            )
        )
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.version, body), (b"HTTP/1.0", b"ok"))
        self.assertEqual(client.idle_connections(upstream), 0)
        await backend.all_lost()
        response, body = await self.fetch(client, upstream)
        self.assertEqual(client.idle_connections(upstream), 0)
        self.assertEqual(len(backend.connections), 2)

    async def test_head(self) -> None:
        backend = self.site(answer(200, b"twelve bytes"))
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream, method=b"HEAD")
        self.assertEqual((response.code, response.has_body, response.length), (200, False, 12))
        self.assertEqual(body, b"")
        # Nothing was waited for or swallowed: the connection serves the next request.
        response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"twelve bytes")
        self.assertEqual(backend.connections, 1)

    async def test_204_and_304_have_no_body(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
                b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\nContent-Length: 10\r\n\r\n',
                OK,
            )
        )
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.code, response.has_body, body), (204, False, b""))
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.code, response.has_body, body), (304, False, b""))
        self.assertEqual(response.length, 10)
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.code, body), (200, b"ok"))
        self.assertEqual(len(backend.connections), 1)

    async def test_content_length_zero(self) -> None:
        backend = self.raw(scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", OK))
        client = self.client()
        upstream = backend.upstream()
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.has_body, response.length, body), (False, 0, b""))
        response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"ok")
        self.assertEqual(len(backend.connections), 1)

    async def test_interim_responses_skipped(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 100 Continue\r\n\r\n"
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Final: yes\r\n\r\nbody"
            )
        )
        client = self.client()
        response, body = await self.fetch(client, backend.upstream())
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers, [(b"Content-Length", b"4"), (b"X-Final", b"yes")])
        self.assertEqual(body, b"body")

    async def test_repeated_headers_kept_in_order_and_case(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 201 Created\r\nSet-Cookie: a=1; Path=/\r\nx-other:  spaced  \r\n"
                b"set-cookie: b=2\r\nSET-COOKIE: c=3; HttpOnly\r\nEmpty:\r\n"
                b"Content-Length: 0\r\n\r\n"
            )
        )
        client = self.client()
        response, _body = await self.fetch(client, backend.upstream())
        self.assertEqual(response.code, 201)
        self.assertEqual(
            response.headers,
            [
                (b"Set-Cookie", b"a=1; Path=/"),
                (b"x-other", b"spaced"),
                (b"set-cookie", b"b=2"),
                (b"SET-COOKIE", b"c=3; HttpOnly"),
                (b"Empty", b""),
                (b"Content-Length", b"0"),
            ],
        )

    async def test_same_content_length_repeated_is_accepted(self) -> None:
        backend = self.raw(
            scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\nok")
        )
        response, body = await self.fetch(self.client(), backend.upstream())
        self.assertEqual((response.length, body), (2, b"ok"))

    async def test_status_line_without_phrase(self) -> None:
        backend = self.raw(scripted(b"HTTP/1.1 404\r\nContent-Length: 2\r\n\r\nno"))
        response, body = await self.fetch(self.client(), backend.upstream())
        self.assertEqual((response.code, response.phrase, body), (404, b"", b"no"))

    async def test_status_lines_like_200_ok(self) -> None:
        """
        C{HTTP/1.1 200 OK} is read without the status-line expression; lines that only
        start like it are read in full.
        """
        cases = [
            (b"HTTP/1.1 200 OK", (200, b"OK", b"HTTP/1.1")),
            (b"HTTP/1.1 200 OKAY", (200, b"OKAY", b"HTTP/1.1")),
            (b"HTTP/1.1 200 OK ", (200, b"OK ", b"HTTP/1.1")),
            (b"HTTP/1.0 200 OK", (200, b"OK", b"HTTP/1.0")),
            (b"HTTP/1.1 200 ", (200, b"", b"HTTP/1.1")),
        ]
        for line, expected in cases:
            backend = self.raw(scripted(line + b"\r\nContent-Length: 2\r\n\r\nok"))
            response, body = await self.fetch(self.client(), backend.upstream())
            self.assertEqual((response.code, response.phrase, response.version), expected)
            self.assertEqual(body, b"ok")
        # Without fields at all, the head ends right after the line.
        backend = self.raw(scripted(b"HTTP/1.1 200 OK\r\n\r\n", close=True))
        response, body = await self.fetch(self.client(), backend.upstream())
        self.assertEqual((response.code, response.headers, body), (200, [], b""))


MALFORMED = [
    # status lines
    b"HTTP/1.1 OK\r\n\r\n",
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 700 Odd\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 0\n\n\r\n\r\n",
    # field lines
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nName : x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: 1\rX-B: 2\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n: empty\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nNo-Colon\r\nContent-Length: 0\r\n\r\n",
    # framing
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    # a 101 nobody asked for
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    # limits
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(201)) + b"\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (70 * 1024),
]


class MalformedResponseTests(UpstreamTestCase):
    """
    Responses that must not be relayed fail the request with L{UpstreamProtocolError}.
    """

    async def test_malformed_heads(self) -> None:
        def respond(request: RawRequest, connection: RawConnection) -> None:
            case = int(request.request_line.split(b" ")[1].strip(b"/"))
            connection.write(MALFORMED[case])

        backend = self.raw(respond)
        client = self.client()
        upstream = backend.upstream()
        for case, data in enumerate(MALFORMED):
            pending = client.request(upstream, b"GET", b"/%d" % case, [])
            try:
                response = await pending
            except UpstreamProtocolError:
                pass
            else:
                self.fail(f"case {case} {data[:80]!r}: accepted as {response!r}")
        self.assertEqual(client.idle_connections(upstream), 0)
        await backend.all_lost()

    async def test_limits_are_inclusive(self) -> None:
        at_limit = (
            b"HTTP/1.1 200 OK\r\n"
            + b"".join(b"X-%d: v\r\n" % i for i in range(199))
            + b"Content-Length: 2\r\n\r\nok"
        )
        backend = self.raw(scripted(at_limit))
        response, body = await self.fetch(self.client(), backend.upstream())
        self.assertEqual((len(response.headers), body), (200, b"ok"))

    async def test_truncated_content_length(self) -> None:
        backend = self.raw(
            scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close=True)
        )
        client = self.client()
        response = await client.request(backend.upstream(), b"GET", b"/", [])
        sink = Collect()
        await self.assertFailure(response.deliver(sink), ResponseTruncatedError)
        self.assertEqual(sink.body, b"abc")

    async def test_truncated_chunked(self) -> None:
        backend = self.raw(
            scripted(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
                close=True,
            )
        )
        client = self.client()
        response = await client.request(backend.upstream(), b"GET", b"/", [])
        sink = Collect()
        await self.assertFailure(response.deliver(sink), ResponseTruncatedError)
        self.assertEqual(sink.body, b"hello")

    async def test_bad_chunk_framing(self) -> None:
        cases = [
            b"zz\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"0\r\nBad Trailer: x\r\n\r\n",
        ]

        def respond(request: RawRequest, connection: RawConnection) -> None:
            case = int(request.request_line.split(b" ")[1].strip(b"/"))
            connection.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + cases[case])

        backend = self.raw(respond)
        client = self.client()
        upstream = backend.upstream()
        for case in range(len(cases)):
            response = await client.request(upstream, b"GET", b"/%d" % case, [])
            await self.assertFailure(response.deliver(Collect()), UpstreamProtocolError)
        self.assertEqual(client.idle_connections(upstream), 0)

    async def test_closed_before_head(self) -> None:
        backend = self.raw(scripted(b"HTTP/1.1 200 OK\r\nContent-", close=True))
        client = self.client()
        await self.assertFailure(
            client.request(backend.upstream(), b"GET", b"/", []), ConnectionDone
        )

    async def test_refused(self) -> None:
        backend = RawBackend(scripted()).start()
        port = backend.port
        await backend.stop()
        client = self.client()
        await self.assertFailure(
            client.request(Upstream("http", "127.0.0.1", port), b"GET", b"/", []),
            ConnectionRefusedError,
        )

    async def test_sink_exception_fails_delivery(self) -> None:
        class Broken:
            def write(self, data: bytes) -> None:
                raise ValueError("sink broke")

        backend = self.site(answer(200, b"x" * 100))
        client = self.client()
        upstream = backend.upstream()
        lost = backend.next_lost()
        response = await client.request(upstream, b"GET", b"/", [(b"Host", b"h")])
        await self.assertFailure(response.deliver(Broken()), ValueError)
        await lost
        self.assertEqual(client.idle_connections(upstream), 0)


class RequestBodyTests(UpstreamTestCase):
    """
    Request bodies are streamed from the producer, framed by the client.
    """

    async def test_content_length_body(self) -> None:
        backend = self.site(answer(200, b"stored"))
        client = self.client()
        data = os.urandom(1024 * 1024)
        _response, body = await self.fetch(
            client, backend.upstream(), b"POST", b"/upload", body=FileBodyProducer(BytesIO(data))
        )
        self.assertEqual(body, b"stored")
        [seen] = backend.requests
        self.assertEqual(seen.header(b"content-length"), b"1048576")
        self.assertIsNone(seen.header(b"transfer-encoding"))
        self.assertEqual(len(seen.body), len(data))
        self.assertTrue(seen.body == data)

    async def test_chunked_body(self) -> None:
        backend = self.site(answer(200, b"stored"))
        client = self.client()
        pieces = [os.urandom(n) for n in (1, 100, 0, 65536, 7, 300000)]
        producer = TrickleProducer(pieces)
        upstream = backend.upstream()
        _response, body = await self.fetch(client, upstream, b"PUT", b"/u", body=producer)
        self.assertEqual(body, b"stored")
        [seen] = backend.requests
        self.assertEqual(seen.header(b"transfer-encoding"), b"chunked")
        self.assertIsNone(seen.header(b"content-length"))
        self.assertTrue(seen.body == b"".join(pieces))
        self.assertEqual(client.idle_connections(upstream), 1)

    async def test_upload_backpressure(self) -> None:
        """
        A backend that stops reading pauses the producer, and resuming it delivers
        every byte.
        """
        hold: list[RawConnection] = []

        def respond(request: RawRequest, connection: RawConnection) -> None:
            if not request.complete:
                # The head arrived: stop reading until the producer has been paused.
                connection.transport.pauseProducing()  # type: ignore[union-attr]
                hold.append(connection)
            else:
                connection.write(OK)

        backend = self.raw(respond, on_head=True)
        client = self.client()
        piece = b"z" * 65536
        producer = TrickleProducer([piece] * 512, length=512 * 65536)
        pending = ensureDeferred(self.fetch(client, backend.upstream(), b"POST", body=producer))
        while not producer.pauses:
            await deferLater(_reactor, 0.005, lambda: None)
        self.assertLess(producer.written, 512 * 65536)
        hold[0].transport.resumeProducing()  # type: ignore[union-attr]
        _response, body = await pending
        self.assertEqual(body, b"ok")
        [request] = backend.connections[0].requests
        self.assertEqual(len(request.body), 512 * 65536)

    async def test_early_response_stops_the_upload(self) -> None:
        backend = self.raw(
            scripted(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig"),
            on_head=True,
        )
        client = self.client()
        upstream = backend.upstream()
        producer = TrickleProducer([b"a" * 16384] * 10000, length=16384 * 10000)
        lost = backend.next_lost()
        response, body = await self.fetch(client, upstream, b"POST", body=producer)
        self.assertEqual((response.code, body), (413, b"big"))
        self.assertTrue(producer.stopped)
        self.assertLess(producer.written, 16384 * 10000)
        self.assertEqual(client.idle_connections(upstream), 0)
        await lost

    async def test_producer_failure_fails_the_request(self) -> None:
        @implementer(IBodyProducer)
        class Failing:
            length = UNKNOWN_LENGTH

            def startProducing(self, consumer: Any) -> Deferred[None]:
                consumer.write(b"some")
                d: Deferred[None] = Deferred()
                _reactor.callLater(0, d.errback, Failure(OSError("client upload broke")))
                return d

            def pauseProducing(self) -> None:
                pass

            def resumeProducing(self) -> None:
                pass

            def stopProducing(self) -> None:
                pass

        backend = self.site(lambda request: NOT_DONE_YET)
        client = self.client()
        await self.assertFailure(
            client.request(backend.upstream(), b"POST", b"/", [], Failing()), OSError
        )

    async def test_body_shorter_than_declared(self) -> None:
        backend = self.site(lambda request: NOT_DONE_YET)
        client = self.client()
        producer = TrickleProducer([b"abc"], length=10)
        await self.assertFailure(
            client.request(backend.upstream(), b"POST", b"/", [], producer), RequestBodyError
        )

    async def test_body_longer_than_declared(self) -> None:
        backend = self.site(lambda request: NOT_DONE_YET)
        client = self.client()
        producer = TrickleProducer([b"abc", b"def"], length=4)
        await self.assertFailure(
            client.request(backend.upstream(), b"POST", b"/", [], producer), RequestBodyError
        )
        self.assertTrue(producer.stopped)

    async def test_header_injection_refused(self) -> None:
        backend = self.site()
        client = self.client()
        upstream = backend.upstream()
        for headers, target in [
            ([(b"X-A", b"1\r\nX-Injected: 2")], b"/"),
            ([(b"X-A", b"1\nX-Injected: 2")], b"/"),
            ([], b"/ HTTP/1.1\r\nX-Injected: 2\r\n\r\nGET /"),
            ([], b"/a b"),
        ]:
            await self.assertFailure(client.request(upstream, b"GET", target, headers), ValueError)
        # Refused before any connection was opened.
        self.assertEqual((backend.connections, backend.requests), (0, []))


class PoolTests(UpstreamTestCase):
    """
    Keep-alive connections: reuse, idle timeout, the stale-connection retry.
    """

    async def test_sequential_requests_share_a_connection(self) -> None:
        backend = self.site()
        client = self.client()
        upstream = backend.upstream()
        for _ in range(3):
            _response, body = await self.fetch(client, upstream)
            self.assertEqual(body, b"hello")
        self.assertEqual(backend.connections, 1)
        self.assertEqual(len(backend.requests), 3)
        self.assertEqual(client.idle_connections(upstream), 1)

    async def test_concurrent_requests_open_connections(self) -> None:
        held: list[Request] = []
        all_arrived: Deferred[None] = Deferred()

        def hold(request: Request) -> int:
            held.append(request)
            if len(held) == 3:
                all_arrived.callback(None)
            return NOT_DONE_YET

        backend = self.site(hold)
        client = self.client(max_idle_per_upstream=2)
        upstream = backend.upstream()
        pending = [ensureDeferred(self.fetch(client, upstream)) for _ in range(3)]
        await all_arrived
        self.assertEqual(backend.connections, 3)
        for request in held:
            request.write(b"done")
            request.finish()
        for d in pending:
            _response, body = await d
            self.assertEqual(body, b"done")
        # Only two are kept; the third was closed.
        self.assertEqual(client.idle_connections(upstream), 2)
        while backend.closed < 1:
            await backend.next_lost()

    async def test_connection_released_after_close_is_not_kept(self) -> None:
        held: list[Request] = []
        arrived: Deferred[None] = Deferred()

        def hold(request: Request) -> int:
            held.append(request)
            arrived.callback(None)
            return NOT_DONE_YET

        backend = self.site(hold)
        client = self.client()
        upstream = backend.upstream()
        pending = ensureDeferred(self.fetch(client, upstream))
        await arrived
        await client.close()
        # The request outlived the pool's shutdown (a drain that timed out): when it is
        # done its connection is closed, not pooled with an idle sweep left running.
        lost = backend.next_lost()
        held[0].write(b"late")
        held[0].finish()
        _response, body = await pending
        self.assertEqual(body, b"late")
        self.assertEqual(client.idle_connections(upstream), 0)
        await lost

    async def test_idle_timeout(self) -> None:
        backend = self.site()
        client = self.client(idle_timeout=0.05)
        upstream = backend.upstream()
        lost = backend.next_lost()
        await self.fetch(client, upstream)
        self.assertEqual(client.idle_connections(upstream), 1)
        await lost
        self.assertEqual(client.idle_connections(upstream), 0)
        # A new request opens a new connection.
        await self.fetch(client, upstream)
        self.assertEqual(backend.connections, 2)

    async def test_server_closing_idle_connection_is_noticed(self) -> None:
        backend = self.raw(scripted(OK, close=True))
        client = self.client()
        upstream = backend.upstream()
        lost = backend.next_lost()
        await self.fetch(client, upstream)
        await lost
        while client.idle_connections(upstream):
            await deferLater(_reactor, 0.001, lambda: None)
        await self.fetch(client, upstream)
        self.assertEqual(len(backend.connections), 2)

    async def test_stale_connection_get_is_retried(self) -> None:
        # Each connection answers one request, then closes on the next one without a
        # byte: the race of a keep-alive timeout with a reused connection.
        backend = self.raw(scripted(OK))
        client = self.client()
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        _response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"ok")
        self.assertEqual(len(backend.connections), 2)
        self.assertEqual([len(c.requests) for c in backend.connections], [2, 1])

    async def test_stale_connection_retry_sends_refreshed_headers(self) -> None:
        # A header that must differ on every attempt (an identity assertion's token id):
        # the retry carries what refresh() gives, not the first attempt's value.
        backend = self.raw(scripted(OK))
        client = self.client()
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        made = []

        def refresh() -> list[tuple[bytes, bytes]]:
            made.append(b"second")
            return [(b"Host", upstream.authority), (b"X-Once", b"second")]

        response = await client.request(
            upstream,
            b"GET",
            b"/",
            [(b"Host", upstream.authority), (b"X-Once", b"first")],
            refresh=refresh,
        )
        sink = Collect()
        await response.deliver(sink)
        self.assertEqual(sink.body, b"ok")
        self.assertEqual(made, [b"second"])
        retried = backend.connections[1].requests[0].head
        self.assertIn(b"X-Once: second", retried)
        self.assertNotIn(b"X-Once: first", retried)

    async def test_stale_connection_post_is_not_retried(self) -> None:
        backend = self.raw(scripted(OK))
        client = self.client()
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        await self.assertFailure(
            client.request(upstream, b"POST", b"/", [], FileBodyProducer(BytesIO(b"data"))),
            ConnectionClosed,
        )
        self.assertEqual(len(backend.connections), 1)

    async def test_stale_connection_bodiless_post_is_not_retried(self) -> None:
        backend = self.raw(scripted(OK))
        client = self.client()
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        await self.assertFailure(client.request(upstream, b"POST", b"/", []), ConnectionClosed)
        self.assertEqual(len(backend.connections), 1)

    async def test_fresh_connection_is_not_retried(self) -> None:
        backend = self.raw(scripted())
        client = self.client()
        await self.assertFailure(
            client.request(backend.upstream(), b"GET", b"/", []), ConnectionClosed
        )
        self.assertEqual(len(backend.connections), 1)

    async def test_retry_only_once(self) -> None:
        backend = self.raw(scripted(OK))
        client = self.client()
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        # Second and third connections close at once: the retry fails, and is not retried.
        backend.respond = scripted(lambda request, connection: connection.close())
        await self.assertFailure(client.request(upstream, b"GET", b"/", []), ConnectionClosed)
        self.assertEqual(len(backend.connections), 2)

    async def test_cancel_aborts_the_connection(self) -> None:
        arrived: Deferred[None] = Deferred()

        def hold(request: Request) -> int:
            arrived.callback(None)
            return NOT_DONE_YET

        backend = self.site(hold)
        client = self.client()
        upstream = backend.upstream()
        pending = client.request(upstream, b"GET", b"/", [(b"Host", b"h")])
        await arrived
        lost = backend.next_lost()
        pending.cancel()
        await self.assertFailure(pending, CancelledError)
        await lost
        self.assertEqual(client.idle_connections(upstream), 0)

    async def test_cancel_during_body_aborts(self) -> None:
        def partial(request: Request) -> int:
            request.setHeader(b"content-length", b"100")
            request.write(b"x" * 10)
            return NOT_DONE_YET

        backend = self.site(partial)
        client = self.client()
        upstream = backend.upstream()
        response = await client.request(upstream, b"GET", b"/", [(b"Host", b"h")])
        sink = Collect()
        delivered = response.deliver(sink)
        while sink.size < 10:
            await deferLater(_reactor, 0.001, lambda: None)
        lost = backend.next_lost()
        delivered.cancel()
        await self.assertFailure(delivered, CancelledError)
        await lost

    async def test_abort_mid_body(self) -> None:
        def partial(request: Request) -> int:
            request.setHeader(b"content-length", b"100")
            request.write(b"x" * 10)
            return NOT_DONE_YET

        backend = self.site(partial)
        client = self.client()
        upstream = backend.upstream()
        response = await client.request(upstream, b"GET", b"/", [(b"Host", b"h")])
        lost = backend.next_lost()
        response.abort()
        await lost
        await self.assertFailure(response.deliver(Collect()), ConnectionClosed)
        self.assertEqual(client.idle_connections(upstream), 0)

    async def test_close_waits_for_idle_connections(self) -> None:
        backend = self.site()
        client = UpstreamClient(reactor)
        upstream = backend.upstream()
        await self.fetch(client, upstream)
        await self.fetch(client, Upstream("http", "localhost", backend.port))
        self.assertEqual(backend.connections, 2)
        await client.close()
        self.assertEqual(client.idle_connections(upstream), 0)
        await backend.all_lost()


@implementer(IPushProducer)
class Flood:
    """
    A backend answer: a chunked body written as fast as the connection takes it, up to
    C{limit} bytes (a server-side push producer, paused when its send buffer is full).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent = 0
        self.paused = False
        self.connection: RawConnection | None = None

    def __call__(self, request: RawRequest, connection: RawConnection) -> None:
        self.connection = connection
        connection.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        connection.transport.registerProducer(self, True)  # type: ignore[union-attr]
        self.pump()

    def pump(self) -> None:
        assert self.connection is not None
        piece = b"f" * 65536
        while not self.paused and self.sent < self.limit:
            self.sent += len(piece)
            self.connection.write(b"10000\r\n" + piece + b"\r\n")
        if self.sent >= self.limit and not self.paused:
            self.connection.write(b"0\r\n\r\n")
            self.connection.transport.unregisterProducer()  # type: ignore[union-attr]
            self.sent += 1  # done

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        if self.sent <= self.limit:
            self.pump()

    def stopProducing(self) -> None:
        self.paused = True


class FlowControlTests(UpstreamTestCase):
    async def test_pause_stops_reading_and_resume_continues(self) -> None:
        limit = 48 * 1024 * 1024
        flood = Flood(limit)
        backend = self.raw(scripted(flood))
        client = self.client()
        response = await client.request(backend.upstream(), b"GET", b"/", [])
        paused_at: list[int] = []

        class PausingSink(Collect):
            def write(self, data: bytes) -> None:
                super().write(data)
                if not paused_at and self.size >= 1024 * 1024:
                    response.pause()
                    paused_at.append(self.size)

        sink = PausingSink()
        delivered = response.deliver(sink)
        # Wait until the backend is blocked: its producer paused and its count steady.
        steady = 0
        last = -1
        while steady < 5:
            await deferLater(_reactor, 0.01, lambda: None)
            if flood.paused and flood.sent == last:
                steady += 1
            else:
                steady = 0
            last = flood.sent
        self.assertEqual(sink.size, paused_at[0])
        self.assertLess(flood.sent, limit)
        response.resume()
        await delivered
        self.assertEqual(sink.size, limit)
        self.assertEqual(sink.body, b"f" * limit)


class UpgradeTests(UpstreamTestCase):
    async def test_detach_hands_over_the_stream(self) -> None:
        def upgrade(request: RawRequest, connection: RawConnection) -> None:
            connection.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n"
                b"Connection: Upgrade\r\n\r\nWELCOME"
            )
            connection.takeover = lambda data: connection.write(data.upper())

        backend = self.raw(scripted(upgrade))
        client = self.client()
        upstream = backend.upstream()
        response = await client.request(
            upstream,
            b"GET",
            b"/ws",
            [(b"Host", upstream.authority), (b"Connection", b"Upgrade"), (b"Upgrade", b"echo")],
            upgrade=True,
        )
        self.assertEqual((response.code, response.has_body), (101, False))
        self.assertIn((b"Upgrade", b"echo"), response.headers)

        class Tunnel(Protocol):
            def __init__(self) -> None:
                self.received = b""
                self.waiting: Deferred[None] | None = None
                self.closed: Deferred[None] = Deferred()

            def dataReceived(self, data: bytes) -> None:
                self.received += data
                if self.waiting is not None:
                    waiting, self.waiting = self.waiting, None
                    waiting.callback(None)

            def connectionLost(self, reason: Failure = connectionDone) -> None:
                self.closed.callback(None)

        tunnel = Tunnel()
        transport = response.detach(tunnel)
        self.assertIs(tunnel.transport, transport)
        while b"WELCOME" not in tunnel.received:
            tunnel.waiting = Deferred()
            await tunnel.waiting
        self.assertEqual(tunnel.received, b"WELCOME")
        transport.write(b"ping")
        while not tunnel.received.endswith(b"PING"):
            tunnel.waiting = Deferred()
            await tunnel.waiting
        self.assertEqual(tunnel.received, b"WELCOMEPING")
        self.assertRaises(RuntimeError, response.detach, Tunnel())
        lost = backend.next_lost()
        transport.loseConnection()
        await lost
        await tunnel.closed
        self.assertEqual(client.idle_connections(upstream), 0)

    async def test_upgrade_refused_is_a_normal_response(self) -> None:
        backend = self.raw(scripted(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno"))
        client = self.client()
        upstream = backend.upstream()
        response = await client.request(
            upstream, b"GET", b"/ws", [(b"Connection", b"Upgrade")], upgrade=True
        )
        self.assertRaises(RuntimeError, response.detach, Protocol())
        sink = Collect()
        await response.deliver(sink)
        self.assertEqual(sink.body, b"no")
        # Never pooled.
        self.assertEqual(client.idle_connections(upstream), 0)


class TLSTests(UpstreamTestCase):
    def tls_site(self) -> tuple[SiteBackend, Any]:
        names: list[bytes | None] = []

        def respond(request: Request) -> bytes:
            names.append(request.channel.transport.getHandle().get_servername())  # type: ignore[union-attr]
            return b"secure"

        backend, certificate = tls_site_backend(self.mktemp(), "localhost", respond)
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        self.server_names = names
        return backend, certificate

    async def test_verified(self) -> None:
        backend, certificate = self.tls_site()
        client = self.client(tls_trust_root=certificate)
        upstream = Upstream("https", "localhost", backend.port)
        response, body = await self.fetch(client, upstream)
        self.assertEqual((response.code, body), (200, b"secure"))
        self.assertEqual(self.server_names, [b"localhost"])
        response, body = await self.fetch(client, upstream)
        self.assertEqual(backend.connections, 1)

    async def test_untrusted_certificate_fails(self) -> None:
        backend, _certificate = self.tls_site()
        client = self.client()
        upstream = Upstream("https", "localhost", backend.port)
        await self.assertFailure(client.request(upstream, b"GET", b"/", []), SSL.Error)
        self.assertEqual(backend.requests, [])

    async def test_wrong_hostname_fails(self) -> None:
        backend, certificate = self.tls_site()
        client = self.client(tls_trust_root=certificate)
        upstream = Upstream("https", "127.0.0.1", backend.port)
        await self.assertFailure(client.request(upstream, b"GET", b"/", []), VerificationError)
        self.assertEqual(backend.requests, [])

    async def test_insecure_skip_verify(self) -> None:
        backend, _certificate = self.tls_site()
        client = self.client()
        upstream = Upstream("https", "localhost", backend.port, verify_tls=False)
        _response, body = await self.fetch(client, upstream)
        self.assertEqual(body, b"secure")
        self.assertEqual(self.server_names, [b"localhost"])


class UpstreamTests(SynchronousTestCase):
    def test_from_url(self) -> None:
        cases = {
            "http://backend": ("http", "backend", 80, b"backend"),
            "https://Backend.Example:443/base/": (
                "https",
                "backend.example",
                443,
                b"backend.example",
            ),
            "https://api:8443": ("https", "api", 8443, b"api:8443"),
            "http://127.0.0.1:8080/x?y": ("http", "127.0.0.1", 8080, b"127.0.0.1:8080"),
            "http://[::1]:9000": ("http", "::1", 9000, b"[::1]:9000"),
            "https://[2001:db8::1]/": ("https", "2001:db8::1", 443, b"[2001:db8::1]"),
        }
        for url, (scheme, host, port, authority) in cases.items():
            upstream = Upstream.from_url(url)
            self.assertEqual(
                (upstream.scheme, upstream.host, upstream.port, upstream.authority),
                (scheme, host, port, authority),
                url,
            )
        self.assertFalse(Upstream.from_url("https://a", verify_tls=False).verify_tls)
        self.assertEqual(Upstream.from_url("http://a:80"), Upstream("http", "a", 80))
        self.assertNotEqual(
            Upstream.from_url("https://a"), Upstream.from_url("https://a", verify_tls=False)
        )

    def test_from_url_invalid(self) -> None:
        for url in (
            "ftp://a",
            "backend:80",
            "http://",
            "http://a:99999",
            "http://u:p@a",
            "http://a:0",
        ):
            self.assertRaises(ValueError, Upstream.from_url, url)


class InMemoryTests(SynchronousTestCase):
    """
    The protocol over a L{StringTransport}: exact bytes out, bytes in split anywhere.
    """

    def connection(self) -> tuple[UpstreamConnection, StringTransport, list[Any]]:
        events: list[Any] = []
        connection = UpstreamConnection(
            lambda c: events.append("idle"), lambda c: events.append("lost")
        )
        transport = StringTransport()
        connection.makeConnection(transport)
        return connection, transport, events

    def test_request_bytes(self) -> None:
        connection, transport, _events = self.connection()
        connection.request(
            b"GET", b"/a?b=c", [(b"Host", b"h"), (b"X-Multi", b"1"), (b"X-Multi", b"2")]
        )
        self.assertEqual(
            transport.value(),
            b"GET /a?b=c HTTP/1.1\r\nHost: h\r\nX-Multi: 1\r\nX-Multi: 2\r\n\r\n",
        )

    def test_split_everywhere(self) -> None:
        responses = [
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                b"X-A: b\r\n\r\n3;e=f\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n",
                b"abc0123456789abcdef",
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", b"x"),
        ]
        for data, expected in responses:
            for split in range(1, len(data)):
                connection, _, events = self.connection()
                d = connection.request(b"GET", b"/", [])
                connection.dataReceived(data[:split])
                connection.dataReceived(data[split:])
                response = self.successResultOf(d)
                sink = Collect()
                self.successResultOf(response.deliver(sink))
                self.assertEqual((sink.body, events), (expected, ["idle"]), (data, split))
            connection, _transport, events = self.connection()
            d = connection.request(b"GET", b"/", [])
            for i in range(len(data)):
                connection.dataReceived(data[i : i + 1])
            sink = Collect()
            self.successResultOf(self.successResultOf(d).deliver(sink))
            self.assertEqual((sink.body, events), (expected, ["idle"]))

    def test_split_everywhere_with_the_sink_attached(self) -> None:
        # The body parsed as it arrives, read by read (test_split_everywhere delivers it
        # only once every byte is in): a chunk's CRLF, size line or trailer split across
        # two reads must be waited for, not refused.
        bodies = [
            (
                b"3;e=f\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n",
                b"abc0123456789abcdef",
            ),
            (b"1\r\nx\r\n0\r\n\r\n", b"x"),
        ]
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for body, expected in bodies:
            splits = [[body[:split], body[split:]] for split in range(1, len(body))]
            splits.append([body[i : i + 1] for i in range(len(body))])
            for reads in splits:
                connection, _, events = self.connection()
                d = connection.request(b"GET", b"/", [])
                connection.dataReceived(head)
                sink = Collect()
                delivered = self.successResultOf(d).deliver(sink)
                for data in reads:
                    self.assertNoResult(delivered)
                    connection.dataReceived(data)
                self.successResultOf(delivered)
                self.assertEqual((sink.body, events), (expected, ["idle"]), reads)

    def test_body_read_with_the_head(self) -> None:
        # A Content-Length body in the head's read ends the exchange before the head's
        # Deferred fires: the connection is idle (back in the pool) and the body is on
        # the response, delivered at once. A body that has not all arrived streams.
        connection, _transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        seen: list[Any] = []

        def on_head(response: Any) -> Any:
            seen.append((response.body, list(events)))
            return response

        d.addCallback(on_head)
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        response = self.successResultOf(d)
        self.assertEqual(seen, [(b"hello", ["idle"])])
        sink = Collect()
        self.successResultOf(response.deliver(sink))
        self.assertEqual(sink.body, b"hello")
        self.assertRaises(RuntimeError, response.deliver, Collect())

        connection, _transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhell")
        response = self.successResultOf(d)
        self.assertEqual((response.body, events), (None, []))

    def test_body_read_with_the_head_then_aborted(self) -> None:
        # An abort (a reader over its size cap) fails the delivery as it would for a
        # body still arriving, before the write or from inside it; the connection,
        # whose exchange is over, stays in the pool. After the delivery it does nothing.
        for when in ("before", "during", "after"):
            connection, transport, events = self.connection()
            d = connection.request(b"GET", b"/", [])
            connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            response = self.successResultOf(d)

            sink = _AbortingSink(response if when == "during" else None)
            if when == "before":
                response.abort()
            delivered = response.deliver(sink)
            if when == "after":
                self.successResultOf(delivered)
                response.abort()
            else:
                self.failureResultOf(delivered, ConnectionAborted)
            self.assertEqual(sink.body, b"" if when == "before" else b"ok", when)
            self.assertEqual((events, transport.disconnecting), (["idle"], False), when)
            self.assertIsNone(response.body)

    def test_body_read_with_the_head_then_a_failing_sink(self) -> None:
        connection, _transport, _events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        class Failing:
            def write(self, data: bytes) -> None:
                raise ValueError("sink")

        self.failureResultOf(self.successResultOf(d).deliver(Failing()), ValueError)

    def test_deliver_later_keeps_bytes_and_pauses(self) -> None:
        connection, transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        response = self.successResultOf(d)
        # Nobody takes the body yet: the transport stops reading.
        self.assertEqual(transport.producerState, "paused")
        sink = Collect()
        delivered = response.deliver(sink)
        self.assertEqual((sink.body, transport.producerState), (b"abc", "producing"))
        connection.dataReceived(b"def")
        self.successResultOf(delivered)
        self.assertEqual((sink.body, events), (b"abcdef", ["idle"]))

    def test_pause_between_chunks(self) -> None:
        connection, transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        response = self.successResultOf(d)

        class PauseAfterFirst(Collect):
            def write(self, data: bytes) -> None:
                super().write(data)
                response.pause()

        sink = PauseAfterFirst()
        delivered = response.deliver(sink)
        connection.dataReceived(b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n")
        self.assertEqual((sink.body, transport.producerState), (b"a", "paused"))
        response.resume()
        self.assertEqual(sink.body, b"ab")
        response.resume()
        self.successResultOf(delivered)
        self.assertEqual((transport.producerState, events), ("producing", ["idle"]))

    def test_pause_stops_reading_only_once_bytes_are_held(self) -> None:
        # A sink paused by its client's full send buffer mostly resumes before the next
        # read: the transport keeps reading until bytes arrive that nobody can take.
        connection, transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
        response = self.successResultOf(d)

        class PausingSink(Collect):
            def write(self, data: bytes) -> None:
                super().write(data)
                response.pause()

        sink = PausingSink()
        delivered = response.deliver(sink)
        connection.dataReceived(b"ab")
        self.assertEqual((sink.body, transport.producerState), (b"ab", "producing"))
        # Paused, and these cannot be taken: held, and reading stops.
        connection.dataReceived(b"cd")
        self.assertEqual((sink.body, transport.producerState), (b"ab", "paused"))
        # Taken (and paused again by the sink): nothing held, reading again.
        response.resume()
        self.assertEqual((sink.body, transport.producerState), (b"abcd", "producing"))
        response.resume()
        connection.dataReceived(b"ef")
        self.successResultOf(delivered)
        self.assertEqual((sink.body, transport.producerState), (b"abcdef", "producing"))
        self.assertEqual(events, ["idle"])

    def test_extra_bytes_after_response_prevent_reuse(self) -> None:
        connection, transport, events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
        self.successResultOf(self.successResultOf(d).deliver(Collect()))
        self.assertEqual(events, [])
        self.assertTrue(transport.disconnecting)

    def test_unsolicited_bytes_on_idle_connection(self) -> None:
        connection, _transport, events = self.connection()
        connection.dataReceived(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        self.assertEqual(events, ["lost"])
        self.assertRaises(RuntimeError, connection.request, b"GET", b"/", [])

    def test_deliver_twice(self) -> None:
        connection, _transport, _events = self.connection()
        d = connection.request(b"GET", b"/", [])
        connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        response = self.successResultOf(d)
        response.deliver(Collect())
        self.assertRaises(RuntimeError, response.deliver, Collect())


class _AbortingSink(Collect):
    """
    Collects the body, and aborts C{response} (if any) from inside its first write.
    """

    def __init__(self, response: Any) -> None:
        super().__init__()
        self.response = response

    def write(self, data: bytes) -> None:
        super().write(data)
        if self.response is not None:
            self.response.abort()


class PoolTimerTests(SynchronousTestCase):
    """
    The pool's bookkeeping, driven by a fake reactor.
    """

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.client = UpstreamClient(self.reactor, idle_timeout=60.0, max_idle_per_upstream=2)
        self.upstream = Upstream("http", "127.0.0.1", 8080)

    def test_idle_timeout_and_lifo(self) -> None:
        transports: list[tuple[Any, StringTransport]] = []

        def connect() -> StringTransport:
            factory = self.reactor.tcpClients[-1][2]
            protocol: Any = factory.buildProtocol(None)
            transport = StringTransport()
            protocol.makeConnection(transport)
            transports.append((protocol, transport))
            return transport

        # Two concurrent exchanges open two connections.
        first = self.client.request(self.upstream, b"GET", b"/", [])
        a = connect()
        second = self.client.request(self.upstream, b"GET", b"/", [])
        b = connect()
        transports[0][0].dataReceived(OK)
        self.successResultOf(self.successResultOf(first).deliver(Collect()))
        self.reactor.advance(10)
        transports[1][0].dataReceived(OK)
        self.successResultOf(self.successResultOf(second).deliver(Collect()))
        self.assertEqual(self.client.idle_connections(self.upstream), 2)
        # LIFO: the most recently released connection (b) serves the next request.
        a.clear()
        b.clear()
        third = self.client.request(self.upstream, b"GET", b"/", [])
        self.assertEqual((a.value(), b.value()[:14]), (b"", b"GET / HTTP/1.1"))
        transports[1][0].dataReceived(OK)
        self.successResultOf(self.successResultOf(third).deliver(Collect()))
        # a has been idle since t=0, b since t=10.
        self.reactor.advance(49.9)
        self.assertFalse(a.disconnecting or b.disconnecting)
        self.reactor.advance(0.1)
        self.assertEqual((a.disconnecting, b.disconnecting), (True, False))
        self.assertEqual(self.client.idle_connections(self.upstream), 1)
        self.reactor.advance(10)
        self.assertTrue(b.disconnecting)
        self.assertEqual(self.client.idle_connections(self.upstream), 0)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_close_cancels_the_sweep(self) -> None:
        d = self.client.request(self.upstream, b"GET", b"/", [])
        factory = self.reactor.tcpClients[-1][2]
        protocol: Any = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(OK)
        self.successResultOf(self.successResultOf(d).deliver(Collect()))
        closed = self.client.close()
        self.assertTrue(transport.disconnecting)
        self.assertNoResult(closed)
        protocol.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(closed)
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_connect_timeout_is_passed(self) -> None:
        client = UpstreamClient(self.reactor, connect_timeout=3.5)
        client.request(self.upstream, b"GET", b"/", [])
        self.assertEqual(self.reactor.tcpClients[-1][3], 3.5)


class BareLineFeedTests(UpstreamTestCase):
    async def test_bare_lf_head_fails_at_once(self) -> None:
        # The backend keeps the connection open: waiting for CRLF CRLF would hang.
        backend = self.raw(scripted(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"))
        client = self.client()
        with self.assertRaises(UpstreamProtocolError) as raised:
            await client.request(backend.upstream(), b"GET", b"/", [(b"Host", b"x")])
        self.assertIn("CRLF", str(raised.exception))
        # The client dropped the connection: the backend sees it close.
        await backend.all_lost()


class EagerSendTests(UpstreamTestCase):
    async def test_a_pooled_request_leaves_at_once(self) -> None:
        """
        On the daemon's reactor, a bodiless request on a pooled connection is on its
        way to the upstream when C{request} returns, not at the end of the reactor
        iteration; on another reactor it leaves then.
        """
        server = socket.socket()
        self.addCleanup(server.close)
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        upstream = Upstream("http", "127.0.0.1", server.getsockname()[1])
        client = self.client()
        first = client.request(upstream, b"GET", b"/one", [(b"Host", b"x")])
        accepted: socket.socket | None = None
        for _ in range(500):
            try:
                accepted, _ = server.accept()
                break
            except BlockingIOError:
                await deferLater(_reactor, 0.01, lambda: None)
        assert accepted is not None
        self.addCleanup(accepted.close)
        received = b""
        for _ in range(500):
            with contextlib.suppress(BlockingIOError):
                received += accepted.recv(65536, socket.MSG_DONTWAIT)
            if received.endswith(b"\r\n\r\n"):
                break
            await deferLater(_reactor, 0.01, lambda: None)
        self.assertTrue(received.startswith(b"GET /one "))
        accepted.sendall(OK)
        response = await first
        await response.deliver(Collect())
        self.assertEqual(client.idle_connections(upstream), 1)
        second = client.request(upstream, b"GET", b"/two", [(b"Host", b"x")])
        try:
            now = accepted.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            now = b""
        self.assertEqual(now.startswith(b"GET /two "), hasattr(_reactor, "flushWriter"), now)
        accepted.sendall(OK)
        response = await second
        await response.deliver(Collect())
