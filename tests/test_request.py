"""
Tests for streaming request bodies (L{GatewayRequest}, L{GatewayChannel},
L{RequestBody}): in memory over a L{StringTransport} for exact channel behaviour, and
over real sockets for backpressure.
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Callable
from hashlib import sha256
from io import BytesIO
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.abstract import FileDescriptor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.error import TimeoutError as ConnectionTimedOut
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
    ISSLTransport,
)
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.http import HTTPChannel
from twisted.web.iweb import UNKNOWN_LENGTH
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site
from zope.interface import alsoProvides, implementer

from edgegw.reactor import IEagerSends, flush_now
from edgegw.server import response_head
from edgegw.server.body import (
    BUFFER_LIMIT,
    DISCARD_LIMIT,
    EMPTY_BODY,
    BodyDiscardedError,
    RequestBody,
)
from edgegw.server.channel import LINGER_SECONDS, GatewayChannel
from edgegw.server.request import GatewayRequest
from tests.support.memory import Response, parse_responses

reactor: Any = _reactor
Answer = Callable[[GatewayRequest], "bytes | int"]


class Handler(Resource):
    """
    A leaf resource that records every request and answers with C{answer}.
    """

    isLeaf = True

    def __init__(self, answer: Answer) -> None:
        super().__init__()
        self.answer = answer
        self.requests: list[GatewayRequest] = []

    def render(self, request: Any) -> bytes | int:
        self.requests.append(request)
        return self.answer(request)


def pending(request: GatewayRequest) -> int:
    return NOT_DONE_YET


def ok(request: GatewayRequest) -> bytes:
    return b"ok " + request.method + b" " + request.uri


def refuse(code: int) -> Callable[[GatewayRequest], bytes]:
    def answer(request: GatewayRequest) -> bytes:
        request.setResponseCode(code)
        return b"refused\n"

    return answer


class QuietSite(Site):
    def log(self, request: object) -> None:
        pass


def gateway_site(
    resource: Resource, clock: IReactorTime | None = None, timeout: float = 60.0
) -> Site:
    site = QuietSite(resource, requestFactory=GatewayRequest, reactor=clock, timeout=timeout)
    site.protocol = GatewayChannel  # type: ignore[assignment]
    return site


@implementer(IConsumer)
class Collector:
    """
    A consumer that keeps everything written to it.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.on_write: Callable[[bytes], None] | None = None

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)

    def registerProducer(self, producer: object, streaming: bool) -> None:
        raise AssertionError("a body producer is never registered")

    def unregisterProducer(self) -> None:
        raise AssertionError("a body producer is never unregistered")

    def write(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.on_write is not None:
            self.on_write(data)


class Outcome:
    """
    What a Deferred did, as far as the test has seen.
    """

    def __init__(self, d: Deferred[Any]) -> None:
        self.result: object = None
        self.failure: Failure | None = None
        self.fired = False
        d.addCallbacks(self._ok, self._failed)

    def _ok(self, result: object) -> None:
        self.fired = True
        self.result = result

    def _failed(self, failure: Failure) -> None:
        self.fired = True
        self.failure = failure


class Connection:
    """
    One in-memory client connection to a Site of L{GatewayChannel}s.
    """

    def __init__(self, site: Site) -> None:
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "192.0.2.7", 40000))
        channel = site.buildProtocol(IPv4Address("TCP", "192.0.2.7", 40000))
        assert isinstance(channel, GatewayChannel)
        self.channel = channel
        channel.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    def responses(self) -> list[Response]:
        return parse_responses(self.transport.value())

    @property
    def reading(self) -> bool:
        return self.transport.producerState == "producing"


def head(
    method: str = "POST",
    target: str = "/upload",
    headers: tuple[str, ...] = (),
    length: int | None = None,
    chunked: bool = False,
    version: str = "HTTP/1.1",
) -> bytes:
    lines = [f"{method} {target} {version}", "Host: gateway.test", *headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class Fixture(SynchronousTestCase):
    def connect(
        self, answer: Answer = pending, timeout: float = 60.0
    ) -> tuple[Connection, Handler]:
        handler = Handler(answer)
        self.clock = Clock()
        self.site = gateway_site(handler, self.clock, timeout)
        return Connection(self.site), handler


def _counted(target: Any, name: str) -> list[object]:
    """
    Replace the method C{name} of C{target} with one that records each call in the
    returned list, then calls the original.
    """
    calls: list[object] = []
    original = getattr(target, name)

    def counted(*args: Any) -> Any:
        calls.append(args)
        return original(*args)

    setattr(target, name, counted)
    return calls


class WithoutBodyTests(Fixture):
    """
    Requests without a body take Twisted's path unchanged.
    """

    def test_addresses_asked_of_the_transport_once(self) -> None:
        """
        Every request on a connection has its local and peer addresses, asked of the
        transport once for the connection rather than once per request (a system call
        and a new address, or a new address).
        """
        connection, handler = self.connect(ok)
        ask = connection.transport.getHost
        ask_peer = connection.transport.getPeer
        asked = _counted(connection.transport, "getHost")
        peers = _counted(connection.transport, "getPeer")
        connection.send(head("GET", "/a") + head("GET", "/b"))
        self.assertEqual([r.status for r in connection.responses()], [200, 200])
        self.assertEqual([r.getHost() for r in handler.requests], [ask(), ask()])
        self.assertEqual(len(asked), 1)
        self.assertEqual([r.getClientAddress() for r in handler.requests], [ask_peer()] * 2)
        self.assertEqual(len(peers), 1)

    def test_tls_asked_of_the_transport_once(self) -> None:
        """
        Whether the connection is secure is asked of its transport once (an interface
        adaptation each time otherwise), and again only if the transport changes.
        """
        asked = []
        original = HTTPChannel.isSecure

        def counted(channel: HTTPChannel) -> bool:
            asked.append(channel)
            return bool(original(channel))

        self.patch(HTTPChannel, "isSecure", counted)
        seen = []

        def answer(request: GatewayRequest) -> bytes:
            seen.append(request.isSecure())
            return b"ok"

        connection, _ = self.connect(answer)
        connection.send(head("GET", "/a") + head("GET", "/b"))
        self.assertEqual((seen, len(asked)), ([False, False], 1))

        secure = StringTransport()
        alsoProvides(secure, ISSLTransport)
        connection.channel.transport = secure
        self.assertTrue(connection.channel.isSecure())
        self.assertEqual(len(asked), 2)

    def test_get(self) -> None:
        conn, handler = self.connect(ok)
        conn.send(b"GET /a/b%20c?x=1&x=2&y HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        [response] = conn.responses()
        self.assertEqual((response.status, response.body), (200, b"ok GET /a/b%20c?x=1&x=2&y"))
        [request] = handler.requests
        self.assertIs(request.body, EMPTY_BODY)
        self.assertEqual((request.body.length, request.body.complete), (0, True))
        self.assertEqual(request.path, b"/a/b%20c")
        self.assertEqual(request.args, {b"x": [b"1", b"2"]})
        self.assertEqual(request.postpath, [b"a", b"b c"])
        self.assertEqual(request.clientproto, b"HTTP/1.1")
        self.assertTrue(conn.reading)
        self.assertFalse(conn.transport.disconnecting)

    def test_content_is_empty_file(self) -> None:
        conn, handler = self.connect()
        conn.send(head("POST", length=0))
        [request] = handler.requests
        assert request.content is not None
        self.assertEqual(request.content.read(), b"")
        self.assertIs(request.body, EMPTY_BODY)

    def test_content_file_from_the_site(self) -> None:
        # As Twisted's Request.gotLength: a site's getContentFile makes the file.
        conn, handler = self.connect()
        made = BytesIO(b"from the site")
        self.site.getContentFile = lambda length: made  # type: ignore[attr-defined]
        conn.send(head("GET"))
        [request] = handler.requests
        self.assertIs(request.content, made)

    def test_empty_body_produces_nothing(self) -> None:
        collector = Collector()
        outcome = Outcome(EMPTY_BODY.startProducing(collector))
        EMPTY_BODY.pauseProducing()
        EMPTY_BODY.resumeProducing()
        EMPTY_BODY.stopProducing()
        self.assertTrue(outcome.fired)
        self.assertIsNone(outcome.failure)
        self.assertEqual(collector.chunks, [])
        # Shared, so it must be reusable: a second consumer is fine too.
        self.assertTrue(Outcome(EMPTY_BODY.startProducing(Collector())).fired)

    def test_pipelined_keep_alive(self) -> None:
        conn, _ = self.connect(ok)
        conn.send(head("GET", "/one") + head("GET", "/two") + head("DELETE", "/three"))
        self.assertEqual(
            [r.body for r in conn.responses()],
            [b"ok GET /one", b"ok GET /two", b"ok DELETE /three"],
        )
        self.assertTrue(conn.reading)

    def test_nothing_installed_without_body(self) -> None:
        conn, _ = self.connect(ok)
        conn.send(head("GET") * 3)
        self.assertIsNone(conn.channel._gate)
        self.assertIs(conn.channel._networkProducer, conn.transport)

    def test_dispatched_after_head_only(self) -> None:
        conn, handler = self.connect()
        conn.send(head("GET")[:-2])
        self.assertEqual(handler.requests, [])
        conn.send(b"\r\n")
        self.assertEqual(len(handler.requests), 1)

    def test_expect_continue_without_body(self) -> None:
        # Twisted's behaviour, kept: the 100 is sent at once.
        conn, _ = self.connect(ok)
        conn.send(head("GET", headers=("Expect: 100-continue",)))
        self.assertEqual([r.status for r in conn.responses()], [100, 200])


class EarlyDispatchTests(Fixture):
    """
    A request with a body is rendered as soon as its head is in.
    """

    def test_content_length(self) -> None:
        conn, handler = self.connect()
        conn.send(head("PUT", "/files/a%2Fb?v=1&v=2", ("Content-Type: text/plain",), length=10))
        [request] = handler.requests
        self.assertEqual(request.method, b"PUT")
        self.assertEqual(request.uri, b"/files/a%2Fb?v=1&v=2")
        self.assertEqual(request.path, b"/files/a%2Fb")
        self.assertEqual(request.args, {b"v": [b"1", b"2"]})
        self.assertEqual(request.clientproto, b"HTTP/1.1")
        self.assertEqual(request.prepath, [])
        self.assertEqual(request.postpath, [b"files", b"a/b"])
        self.assertIsInstance(request.body, RequestBody)
        self.assertEqual((request.body.length, request.body.complete), (10, False))
        assert request.content is not None
        self.assertEqual(request.content.read(), b"")

    def test_same_fields_as_twisted(self) -> None:
        target = "/a/%7Eb/c%20d/?q=1&q=2&r=%20x&flag&=e;s=t"
        conn, handler = self.connect()
        conn.send(head("GET", target))
        Connection(self.site).send(head("POST", target, length=2))
        normal, early = handler.requests
        self.assertIs(normal.body, EMPTY_BODY)
        self.assertIsNot(early.body, EMPTY_BODY)
        for name in ("uri", "path", "args", "clientproto", "prepath", "postpath", "sitepath"):
            self.assertEqual(getattr(early, name), getattr(normal, name), name)
        self.assertEqual(early.method, b"POST")

    def test_chunked(self) -> None:
        conn, handler = self.connect()
        conn.send(head(chunked=True))
        [request] = handler.requests
        self.assertEqual(request.body.length, UNKNOWN_LENGTH)
        self.assertFalse(request.body.complete)

    def test_empty_query(self) -> None:
        conn, handler = self.connect()
        conn.send(head(target="/x?", length=1))
        self.assertEqual(handler.requests[0].args, {})
        self.assertEqual(handler.requests[0].path, b"/x")

    def test_form_post_is_not_parsed(self) -> None:
        # Twisted's requestReceived would parse (and here 400) an empty multipart body.
        conn, handler = self.connect()
        conn.send(
            head(headers=("Content-Type: multipart/form-data; boundary=zz",), length=4) + b"abcd"
        )
        [request] = handler.requests
        self.assertEqual(request.args, {})
        self.assertTrue(request.body.complete)
        self.assertEqual(conn.transport.value(), b"")

    def test_consumer_gets_everything_in_order(self) -> None:
        body = bytes(range(256)) * 40
        conn, handler = self.connect()
        conn.send(head(length=len(body)))
        [request] = handler.requests
        early = pieces(body[:3000], 700)
        for piece in early:
            conn.send(piece)
        self.assertEqual(request.body.buffered, 3000)
        self.assertEqual(request.body.received, 3000)
        collector = Collector()
        done = Outcome(request.body.startProducing(collector))
        self.assertEqual(collector.data, body[:3000])
        self.assertEqual(request.body.buffered, 0)
        for piece in pieces(body[3000:], 999):
            self.assertFalse(done.fired)
            conn.send(piece)
        self.assertEqual(collector.data, body)
        self.assertTrue(done.fired)
        self.assertIsNone(done.failure)
        self.assertTrue(request.body.complete)
        assert request.content is not None
        self.assertEqual(request.content.read(), b"")

    def test_chunked_consumer(self) -> None:
        conn, handler = self.connect()
        conn.send(head(chunked=True))
        request = handler.requests[0]
        collector = Collector()
        done = Outcome(request.body.startProducing(collector))
        raw = chunk(b"hello ") + chunk(b"streaming ") + chunk(b"world") + b"0\r\nX-T: 1\r\n\r\n"
        for piece in pieces(raw, 3):
            conn.send(piece)
        self.assertEqual(collector.data, b"hello streaming world")
        self.assertTrue(done.fired)
        self.assertIsNone(done.failure)

    def test_finish_after_body_then_next_request(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=5))
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        collector = Collector()

        def respond(_: object) -> None:
            request.write(b"got " + collector.data)
            request.finish()

        request.body.startProducing(collector).addCallback(respond)
        conn.send(b"12345" + head("GET", "/next"))
        self.assertTrue(finished.fired)
        self.assertIsNone(finished.failure)
        self.assertEqual(len(handler.requests), 2)
        handler.requests[1].write(b"second")
        handler.requests[1].finish()
        self.assertEqual([r.body for r in conn.responses()], [b"got 12345", b"second"])
        self.assertTrue(conn.reading)

    def test_answered_synchronously_after_body(self) -> None:
        # A render that answers at once still waits for the body before the next request.
        conn, _ = self.connect(ok)
        conn.send(head(length=3) + b"abc" + head("GET", "/after"))
        self.assertEqual([r.body for r in conn.responses()], [b"ok POST /upload", b"ok GET /after"])

    def test_only_one_consumer(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=5))
        body = handler.requests[0].body
        body.startProducing(Collector())
        self.assertRaises(RuntimeError, body.startProducing, Collector())

    def test_gateway_request_needs_gateway_channel(self) -> None:
        site = QuietSite(Handler(pending), requestFactory=GatewayRequest, reactor=Clock())
        channel = site.buildProtocol(IPv4Address("TCP", "192.0.2.7", 40000))
        assert channel is not None
        channel.makeConnection(StringTransport())
        self.assertRaises(TypeError, channel.dataReceived, head(length=3))


class FlowControlTests(Fixture):
    """
    The body reads from the client no faster than it is consumed.
    """

    def test_bounded_before_consumer(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=4 * BUFFER_LIMIT))
        body = handler.requests[0].body
        timeout = conn.channel.timeOut
        sent = 0
        while conn.reading:
            conn.send(b"x" * 4096)
            sent += 4096
        self.assertEqual(sent, BUFFER_LIMIT)
        self.assertEqual(body.buffered, BUFFER_LIMIT)
        # Not the client's fault that we stopped reading: no idle timeout meanwhile.
        self.assertIsNone(conn.channel.timeOut)
        collector = Collector()
        body.startProducing(collector)
        self.assertEqual(len(collector.data), BUFFER_LIMIT)
        self.assertTrue(conn.reading)
        self.assertEqual(conn.channel.timeOut, timeout)

    def test_consumer_pause_and_resume(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=30))
        body = handler.requests[0].body
        collector = Collector()
        done = Outcome(body.startProducing(collector))
        conn.send(b"a" * 10)
        body.pauseProducing()
        self.assertFalse(conn.reading)
        # Bytes already read from the socket are held, not written to a paused consumer.
        conn.send(b"b" * 10)
        self.assertEqual(collector.data, b"a" * 10)
        self.assertEqual(body.buffered, 10)
        body.resumeProducing()
        self.assertTrue(conn.reading)
        self.assertEqual(collector.data, b"a" * 10 + b"b" * 10)
        conn.send(b"c" * 10)
        self.assertTrue(done.fired)
        self.assertEqual(collector.data, b"a" * 10 + b"b" * 10 + b"c" * 10)

    def test_paused_before_start(self) -> None:
        # A consumer may register the body with its transport, which pauses it, before
        # calling startProducing.
        conn, handler = self.connect()
        conn.send(head(length=20) + b"a" * 10)
        body = handler.requests[0].body
        body.pauseProducing()
        self.assertFalse(conn.reading)
        collector = Collector()
        done = Outcome(body.startProducing(collector))
        self.assertEqual(collector.chunks, [])
        body.resumeProducing()
        self.assertTrue(conn.reading)
        conn.send(b"b" * 10)
        self.assertEqual(collector.data, b"a" * 10 + b"b" * 10)
        self.assertTrue(done.fired)

    def test_pause_from_write(self) -> None:
        # IBodyProducer: the consumer's write may pause the producer synchronously.
        conn, handler = self.connect()
        conn.send(head(length=9))
        body = handler.requests[0].body
        collector = Collector()
        collector.on_write = lambda data: body.pauseProducing()
        done = Outcome(body.startProducing(collector))
        conn.send(b"abc")
        self.assertFalse(conn.reading)
        conn.send(b"def")
        conn.send(b"ghi")
        self.assertEqual(collector.data, b"abc")
        self.assertTrue(body.complete)
        self.assertFalse(done.fired)
        body.resumeProducing()
        self.assertEqual(collector.data, b"abcdefghi")
        self.assertTrue(done.fired)

    def test_completes_while_paused(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=6) + b"abc")
        body = handler.requests[0].body
        collector = Collector()
        done = Outcome(body.startProducing(collector))
        body.pauseProducing()
        conn.send(b"def" + head("GET", "/next"))
        self.assertTrue(body.complete)
        # Whatever follows the body is Twisted's to read now.
        self.assertTrue(conn.reading)
        self.assertFalse(done.fired)
        body.resumeProducing()
        self.assertEqual(collector.data, b"abcdef")
        self.assertTrue(done.fired)

    def test_channel_and_body_pauses_combine(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=100))
        body = handler.requests[0].body
        body.startProducing(Collector())
        # The client's socket stops draining our writes: Twisted pauses reading...
        conn.channel.pauseProducing()
        self.assertFalse(conn.reading)
        body.pauseProducing()
        body.resumeProducing()
        # ... and the body resuming does not resume what Twisted paused,
        self.assertFalse(conn.reading)
        body.pauseProducing()
        conn.channel.resumeProducing()
        # nor the other way round.
        self.assertFalse(conn.reading)
        body.resumeProducing()
        self.assertTrue(conn.reading)

    def test_no_idle_timeout_while_held(self) -> None:
        conn, handler = self.connect(timeout=5)
        conn.send(head(length=2 * BUFFER_LIMIT) + b"x" * BUFFER_LIMIT)
        self.assertFalse(conn.reading)
        self.clock.advance(60)
        self.assertFalse(conn.transport.disconnecting)
        produced = Outcome(handler.requests[0].body.startProducing(Collector()))
        self.assertTrue(conn.reading)
        # Reading again: a client that then stalls is timed out as usual.
        self.clock.advance(5)
        self.assertTrue(conn.transport.disconnecting)
        assert produced.failure is not None
        self.assertTrue(produced.failure.check(ConnectionTimedOut))

    def test_idle_timeout_restored_after_request(self) -> None:
        conn, handler = self.connect(timeout=5)
        conn.send(head(length=6) + b"abc")
        request = handler.requests[0]
        body = request.body
        body.startProducing(Collector())
        body.pauseProducing()
        conn.send(b"def")
        body.resumeProducing()
        request.finish()
        self.assertEqual(conn.channel.timeOut, 5)
        self.clock.advance(5)
        self.assertTrue(conn.transport.disconnecting)

    def test_body_after_transport_backlog(self) -> None:
        # Reading was paused by Twisted (the client is not reading our responses) when
        # the first body request arrives: the body's flow control must not resume it.
        conn, handler = self.connect()
        conn.channel.pauseProducing()
        conn.send(head(length=100))
        body = handler.requests[0].body
        body.startProducing(Collector())
        body.pauseProducing()
        body.resumeProducing()
        self.assertFalse(conn.reading)
        conn.channel.resumeProducing()
        self.assertTrue(conn.reading)

    def test_pipelined_request_after_paused_body(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=BUFFER_LIMIT + 10))
        request = handler.requests[0]
        conn.send(b"x" * BUFFER_LIMIT)
        self.assertFalse(conn.reading)
        # What the socket had already given us is still parsed.
        conn.send(b"y" * 10 + head("GET", "/two"))
        self.assertTrue(request.body.complete)
        self.assertTrue(conn.reading)
        self.assertEqual(len(handler.requests), 1)
        collector = Collector()
        request.body.startProducing(collector)
        self.assertEqual(collector.data, b"x" * BUFFER_LIMIT + b"y" * 10)
        request.finish()
        self.assertEqual(len(handler.requests), 2)
        handler.requests[1].finish()
        self.assertEqual([r.status for r in conn.responses()], [200, 200])
        self.assertTrue(conn.reading)

    def test_finish_while_held(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=BUFFER_LIMIT + 100) + b"x" * BUFFER_LIMIT)
        self.assertFalse(conn.reading)
        request = handler.requests[0]
        request.setResponseCode(403)
        request.finish()
        # The held bytes are dropped and the rest is read, to keep the connection.
        self.assertEqual(request.body.buffered, 0)
        self.assertTrue(conn.reading)
        conn.send(b"y" * 100 + head("GET", "/next"))
        self.assertEqual(len(handler.requests), 2)

    def test_two_uploads_on_one_connection(self) -> None:
        conn, handler = self.connect()
        results = []
        for n in range(2):
            conn.send(head(length=BUFFER_LIMIT + 10) + b"%d" % n * BUFFER_LIMIT)
            self.assertFalse(conn.reading)
            request = handler.requests[n]
            collector = Collector()
            done = Outcome(request.body.startProducing(collector))
            request.body.pauseProducing()
            conn.send(b"z" * 10)
            request.body.resumeProducing()
            self.assertTrue(done.fired)
            results.append(collector.data)
            request.finish()
            self.assertTrue(conn.reading)
        self.assertEqual(
            results, [b"0" * BUFFER_LIMIT + b"z" * 10, b"1" * BUFFER_LIMIT + b"z" * 10]
        )
        self.assertEqual([r.status for r in conn.responses()], [200, 200])

    def test_cancel(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=100))
        request = handler.requests[0]
        collector = Collector()
        d = request.body.startProducing(collector)
        outcome = Outcome(d)
        d.cancel()
        assert outcome.failure is not None
        self.assertTrue(outcome.failure.check(CancelledError))
        conn.send(b"z" * 100)
        self.assertEqual(collector.chunks, [])
        request.finish()
        self.assertTrue(conn.reading)


class EarlyResponseTests(Fixture):
    """
    A response finished before the body has arrived.
    """

    def test_refused_then_keep_alive(self) -> None:
        conn, handler = self.connect(refuse(403))
        conn.send(head(length=5000))
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        # Written at once, without waiting for the body.
        [response] = conn.responses()
        self.assertEqual(response.status, 403)
        self.assertIsNone(response.header("connection"))
        for piece in pieces(b"q" * 4990, 1000):
            conn.send(piece)
            self.assertEqual(request.body.buffered, 0)
        # The request is done only once the body has been read.
        self.assertFalse(finished.fired)
        self.assertEqual(conn.channel.requests, [request])
        conn.send(b"q" * 10 + head("GET", "/next"))
        self.assertTrue(finished.fired)
        self.assertIsNone(finished.failure)
        self.assertEqual(len(handler.requests), 2)
        self.assertEqual([r.status for r in conn.responses()], [403, 403])
        self.assertFalse(conn.transport.disconnecting)

    def test_chunked_refused_then_keep_alive(self) -> None:
        conn, _ = self.connect(refuse(401))
        conn.send(head(chunked=True))
        raw = b"".join(chunk(b"p" * 1000) for _ in range(20)) + b"0\r\n\r\n"
        conn.send(raw + head("GET", "/next"))
        self.assertEqual([r.status for r in conn.responses()], [401, 401])
        self.assertFalse(conn.transport.disconnecting)

    def test_consumer_told_of_discard(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=100))
        request = handler.requests[0]
        collector = Collector()
        outcome = Outcome(request.body.startProducing(collector))
        conn.send(b"a" * 10)
        request.setResponseCode(502)
        request.finish()
        assert outcome.failure is not None
        self.assertTrue(outcome.failure.check(BodyDiscardedError))
        conn.send(b"b" * 90)
        self.assertEqual(collector.data, b"a" * 10)
        self.assertRaises(RuntimeError, request.body.startProducing, Collector())

    def test_start_after_finish(self) -> None:
        conn, handler = self.connect(refuse(404))
        conn.send(head(length=100))
        outcome = Outcome(handler.requests[0].body.startProducing(Collector()))
        assert outcome.failure is not None
        self.assertTrue(outcome.failure.check(BodyDiscardedError))

    def test_large_remainder_closes(self) -> None:
        outcomes: list[Outcome] = []

        def answer(request: GatewayRequest) -> bytes:
            outcomes.append(Outcome(request.notifyFinish()))
            return refuse(413)(request)

        conn, handler = self.connect(answer)
        conn.send(head(length=10 * 1024 * 1024) + b"x" * 1000)
        [finished] = outcomes
        self.assertTrue(finished.fired)
        self.assertIsNone(finished.failure)
        [response] = conn.responses()
        self.assertEqual(response.status, 413)
        self.assertEqual(response.header("connection"), "close")
        self.assertEqual(conn.channel.requests, [])
        # Lingering: the rest is read (so the close does not reset the connection before
        # the client reads the response) and dropped, then the connection is closed.
        self.assertFalse(conn.transport.disconnecting)
        self.assertTrue(conn.reading)
        conn.send(b"x" * 100_000 + head("GET", "/ignored"))
        self.assertEqual(len(handler.requests), 1)
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(len(conn.responses()), 1)

    def test_within_limit_is_read(self) -> None:
        conn, _ = self.connect(refuse(404))
        conn.send(head(length=DISCARD_LIMIT))
        conn.send(b"x" * DISCARD_LIMIT + head("GET", "/next"))
        self.assertEqual([r.status for r in conn.responses()], [404, 404])
        self.assertFalse(conn.transport.disconnecting)

    def test_chunked_over_limit_closes(self) -> None:
        conn, handler = self.connect(refuse(404))
        conn.send(head(chunked=True))
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        block = chunk(b"x" * 65536)
        sent = 0
        while not finished.fired:
            conn.send(block)
            sent += 65536
        self.assertEqual(sent, DISCARD_LIMIT + 65536)
        self.assertEqual(conn.channel.requests, [])
        conn.send(block + b"0\r\n\r\n" + head("GET", "/ignored"))
        self.assertEqual(len(handler.requests), 1)
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)

    def test_not_persistent_closes_at_once(self) -> None:
        conn, handler = self.connect(refuse(404))
        conn.send(head(headers=("Connection: close",), length=100))
        request = handler.requests[0]
        self.assertEqual(conn.responses()[0].header("connection"), "close")
        self.assertEqual(conn.channel.requests, [])
        self.assertEqual(request.body.received, 0)
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)

    def test_http10(self) -> None:
        conn, _ = self.connect(refuse(404))
        conn.send(head(length=100, version="HTTP/1.0"))
        self.assertEqual(conn.responses()[0].status, 404)
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)

    def test_disconnect_while_discarding(self) -> None:
        conn, handler = self.connect(refuse(403))
        conn.send(head(length=100) + b"x" * 10)
        finished = Outcome(handler.requests[0].notifyFinish())
        conn.channel.connectionLost(Failure(ConnectionDone()))
        # The response had been written whole.
        self.assertTrue(finished.fired)
        self.assertIsNone(finished.failure)


class StopProducingTests(Fixture):
    def test_rest_discarded_and_never_fires(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=300) + b"a" * 100)
        request = handler.requests[0]
        collector = Collector()
        outcome = Outcome(request.body.startProducing(collector))
        request.body.stopProducing()
        conn.send(b"b" * 200)
        self.assertEqual(collector.data, b"a" * 100)
        self.assertTrue(request.body.complete)
        self.assertFalse(outcome.fired)
        request.write(b"done")
        request.finish()
        conn.send(head("GET", "/next"))
        self.assertEqual(len(handler.requests), 2)

    def test_over_limit_before_finish(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=4 * DISCARD_LIMIT))
        request = handler.requests[0]
        request.body.startProducing(Collector())
        request.body.stopProducing()
        while conn.reading:
            conn.send(b"x" * 65536)
        # Reading stops beyond the limit; the response, when it comes, closes.
        self.assertEqual(request.body.received, DISCARD_LIMIT + 65536)
        request.finish()
        self.assertEqual(conn.responses()[0].header("connection"), "close")
        self.assertTrue(conn.reading)
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)


class ExpectContinueTests(Fixture):
    def test_sent_when_consumer_starts(self) -> None:
        conn, handler = self.connect()
        conn.send(head(headers=("Expect: 100-continue",), length=3))
        self.assertEqual(conn.transport.value(), b"")
        collector = Collector()
        handler.requests[0].body.startProducing(collector)
        self.assertEqual(conn.transport.value(), b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.send(b"abc")
        self.assertEqual(collector.data, b"abc")

    def test_not_sent_when_body_already_coming(self) -> None:
        conn, handler = self.connect()
        conn.send(head(headers=("Expect: 100-continue",), length=3) + b"a")
        handler.requests[0].body.startProducing(Collector())
        self.assertEqual(conn.transport.value(), b"")

    def test_refused_without_continue_closes(self) -> None:
        # The client may never send the body: do not wait for it.
        conn, _ = self.connect(refuse(401))
        conn.send(head(headers=("Expect: 100-continue",), length=3))
        [response] = conn.responses()
        self.assertEqual((response.status, response.header("connection")), (401, "close"))
        self.clock.advance(LINGER_SECONDS)
        self.assertTrue(conn.transport.disconnecting)


class DisconnectTests(Fixture):
    def test_mid_body(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=100) + b"a" * 10)
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        produced = Outcome(request.body.startProducing(Collector()))
        conn.channel.connectionLost(Failure(ConnectionLost("gone")))
        assert produced.failure is not None and finished.failure is not None
        self.assertTrue(produced.failure.check(ConnectionLost))
        self.assertTrue(finished.failure.check(ConnectionLost))

    def test_before_consumer(self) -> None:
        conn, handler = self.connect()
        conn.send(head(chunked=True) + chunk(b"abc"))
        request = handler.requests[0]
        conn.channel.connectionLost(Failure(ConnectionDone()))
        produced = Outcome(request.body.startProducing(Collector()))
        assert produced.failure is not None
        self.assertTrue(produced.failure.check(ConnectionDone))

    def test_stopped_consumer_not_fired(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=100))
        body = handler.requests[0].body
        produced = Outcome(body.startProducing(Collector()))
        body.stopProducing()
        conn.channel.connectionLost(Failure(ConnectionDone()))
        self.assertFalse(produced.fired)


class RefusalTests(Fixture):
    """
    Malformed and over-long request heads.
    """

    def status_for(self, raw: bytes) -> int:
        conn, handler = self.connect(ok)
        conn.send(raw)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(handler.requests, [])
        [response] = conn.responses()
        return response.status

    def test_long_header_line(self) -> None:
        raw = b"GET / HTTP/1.1\r\nHost: g\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n"
        self.assertEqual(self.status_for(raw), 431)

    def test_long_header_line_unterminated(self) -> None:
        self.assertEqual(self.status_for(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 17000), 431)

    def test_long_request_line(self) -> None:
        self.assertEqual(self.status_for(b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\n\r\n"), 414)
        self.assertEqual(self.status_for(b"GET /" + b"a" * 17000), 414)

    def test_long_request_line_on_second_request(self) -> None:
        conn, _ = self.connect(ok)
        conn.send(head("GET") + b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\n\r\n")
        self.assertEqual([r.status for r in conn.responses()], [200, 414])

    def test_header_section_too_large(self) -> None:
        headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(20))
        self.assertEqual(self.status_for(b"GET / HTTP/1.1\r\n" + headers + b"\r\n"), 431)

    def test_content_length_and_chunked(self) -> None:
        raw = head(headers=("Transfer-Encoding: chunked",), length=5) + b"0\r\n\r\n"
        self.assertEqual(self.status_for(raw), 400)

    def test_duplicate_content_length(self) -> None:
        self.assertEqual(self.status_for(head(headers=("Content-Length: 5",), length=5)), 400)

    def test_bad_content_length(self) -> None:
        self.assertEqual(self.status_for(head(headers=("Content-Length: -5",))), 400)

    def test_bad_header_name(self) -> None:
        self.assertEqual(self.status_for(head("GET", headers=("Bad Name: x",))), 400)
        self.assertEqual(self.status_for(head("GET", headers=("NoColon",))), 400)

    def test_nul_in_value(self) -> None:
        self.assertEqual(self.status_for(head("GET", headers=("X-A: a\x00b",))), 400)

    def test_too_many_headers(self) -> None:
        headers = tuple(f"X-{i}: v" for i in range(501))
        self.assertEqual(self.status_for(head("GET", headers=headers)), 400)

    def test_malformed_request_line(self) -> None:
        self.assertEqual(self.status_for(b"GET /\r\n\r\n"), 400)
        self.assertEqual(self.status_for(b"GET / HTTP/2.0\r\n\r\n"), 400)

    def test_obs_fold(self) -> None:
        raw = b"GET / HTTP/1.1\r\nHost: g\r\nX-Folded: a\r\n b\r\n\r\n"
        self.assertEqual(self.status_for(raw), 400)
        raw = b"GET / HTTP/1.1\r\nHost: g\r\nX-Folded: a\r\n\tb\r\n\r\n"
        self.assertEqual(self.status_for(raw), 400)
        self.assertEqual(self.status_for(b"GET / HTTP/1.1\r\n Host: g\r\n\r\n"), 400)

    def test_bad_chunk_framing(self) -> None:
        conn, handler = self.connect()
        conn.send(head(chunked=True))
        request = handler.requests[0]
        finished = Outcome(request.notifyFinish())
        produced = Outcome(request.body.startProducing(Collector()))
        conn.send(chunk(b"fine") + b"zz\r\nnot hex\r\n")
        self.assertEqual([r.status for r in conn.responses()], [400])
        self.assertTrue(conn.transport.disconnecting)
        # The request, already being answered, learns at once.
        assert finished.failure is not None and produced.failure is not None
        self.assertTrue(finished.failure.check(ConnectionLost))
        self.assertTrue(produced.failure.check(ConnectionLost))
        self.assertEqual(conn.channel.requests, [])

    def test_bad_chunk_framing_after_response_started(self) -> None:
        conn, handler = self.connect()
        conn.send(head(chunked=True))
        request = handler.requests[0]
        request.write(b"partial")
        conn.send(b"1\r\nab\r\n")
        # No 400 in the middle of a response: the connection is just closed.
        self.assertNotIn(b"400", conn.transport.value())
        self.assertTrue(conn.transport.disconnecting)
        self.assertTrue(request._disconnected)

    def test_bad_chunk_framing_while_discarding(self) -> None:
        conn, handler = self.connect(refuse(403))
        conn.send(head(chunked=True))
        finished = Outcome(handler.requests[0].notifyFinish())
        conn.send(b"zz\r\n")
        self.assertEqual([r.status for r in conn.responses()], [403])
        self.assertTrue(conn.transport.disconnecting)
        self.assertTrue(finished.fired)
        self.assertIsNone(finished.failure)


# -- over real sockets ----------------------------------------------------------------------


def block(index: int) -> bytes:
    """
    64 KiB that differ from any other index's, so that reordering would show.
    """
    return struct.pack(">Q", index) * 8192


@implementer(IPushProducer)
class Uploader(Protocol):
    """
    Sends a request head and then C{total} body bytes as fast as its transport takes
    them, counting the times the transport pushes back.
    """

    def __init__(self, request_head: bytes, total: int) -> None:
        self.head = request_head
        self.remaining = total
        self.index = 0
        self.paused = False
        self.pushed_back = 0
        self.digest = sha256()
        self.received = b""
        self.closed: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        # A small send buffer, so that the server's not reading shows here quickly.
        handle: Any = self.transport.getHandle()  # type: ignore[union-attr]
        handle.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        self.transport.write(self.head)  # type: ignore[union-attr]
        self.pump()

    def pump(self) -> None:
        while self.remaining and not self.paused:
            data = block(self.index)[: self.remaining]
            self.index += 1
            self.remaining -= len(data)
            self.digest.update(data)
            self.transport.write(data)  # type: ignore[union-attr]
        if not self.remaining and self.transport is not None:
            self.transport.unregisterProducer()  # type: ignore[attr-defined]
            self.remaining = -1

    def pauseProducing(self) -> None:
        self.paused = True
        self.pushed_back += 1

    def resumeProducing(self) -> None:
        self.paused = False
        if self.remaining > 0:
            self.pump()

    def stopProducing(self) -> None:
        self.remaining = 0

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed.callback(None)


@implementer(IConsumer)
class SlowConsumer:
    """
    Takes the body a piece at a time, pausing its producer after each write.
    """

    def __init__(self, body: RequestBody) -> None:
        self.body = body
        self.digest = sha256()
        self.count = 0
        self._resume: IDelayedCall | None = None

    def registerProducer(self, producer: object, streaming: bool) -> None:
        raise AssertionError("never called for a body producer")

    def unregisterProducer(self) -> None:
        raise AssertionError("never called for a body producer")

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.count += len(data)
        self.body.pauseProducing()
        self._resume = reactor.callLater(0.001, self._resumed)

    def _resumed(self) -> None:
        self._resume = None
        self.body.resumeProducing()

    def done(self) -> None:
        """
        The whole body has been written: resume nothing more. (The last write, like
        every other, scheduled a resume; left pending, it would outlive the test.)
        """
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None


class RecordingRequest(GatewayRequest):
    most_buffered = 0

    def handleContentChunk(self, data: bytes) -> None:
        super().handleContentChunk(data)
        self.most_buffered = max(self.most_buffered, self.body.buffered)


class TrackedChannel(GatewayChannel):
    """
    A gateway connection that records when it is gone, in C{lost} (one L{Deferred}
    per connection accepted, set per site).
    """

    lost: list[Deferred[None]]

    def connectionMade(self) -> None:
        self._gone: Deferred[None] = Deferred()
        self.lost.append(self._gone)
        super().connectionMade()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self._gone.callback(None)


class RealSocketTests(TestCase):
    timeout = 120
    server_lost: list[Deferred[None]]

    def serve(self, answer: Answer, request_factory: type[GatewayRequest]) -> int:
        lost: list[Deferred[None]] = []

        class Channel(TrackedChannel):
            pass

        Channel.lost = lost
        self.server_lost = lost
        site = gateway_site(Handler(answer))
        site.requestFactory = request_factory
        site.protocol = Channel  # type: ignore[assignment]
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return int(port.getHost().port)

    async def upload(self, port: int, uploader: Uploader) -> None:
        """
        Run C{uploader} against the gateway on C{port} until both sides have closed:
        the client seeing the end of the connection does not mean the gateway is done
        with it (after an early refusal it lingers, reading what is still in flight,
        with its idle timeout and linger timer pending, until the client's close
        reaches it).
        """
        factory = ClientFactory.forProtocol(lambda: uploader)
        connector = reactor.connectTCP("127.0.0.1", port, factory)
        self.addCleanup(connector.disconnect)
        await uploader.closed
        self.assertEqual(len(self.server_lost), 1)
        await self.server_lost[0]

    async def test_slow_consumer_backpressure(self) -> None:
        total = 10 * 1024 * 1024
        seen: list[RecordingRequest] = []
        content_sizes: list[int] = []

        def answer(request: GatewayRequest) -> int:
            assert isinstance(request, RecordingRequest)
            seen.append(request)
            consumer = SlowConsumer(request.body)

            def respond(_: object) -> None:
                consumer.done()
                assert request.content is not None
                content_sizes.append(request.content.seek(0, 2))
                request.write(b"%d %s" % (consumer.count, consumer.digest.hexdigest().encode()))
                request.finish()

            def attach() -> None:
                request.body.startProducing(consumer).addCallback(respond)

            # Late, so that the body is first held for it (and reading stops).
            reactor.callLater(0.2, attach)
            return NOT_DONE_YET

        port = self.serve(answer, RecordingRequest)
        uploader = Uploader(head(length=total, headers=("Connection: close",)), total)
        await self.upload(port, uploader)
        [response] = parse_responses(uploader.received)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, b"%d %s" % (total, uploader.digest.hexdigest().encode()))
        [request] = seen
        # The client was made to wait, and the gateway never held more than its bound
        # (plus what one read from the socket had already brought in).
        self.assertGreater(uploader.pushed_back, 0)
        self.assertGreaterEqual(request.most_buffered, BUFFER_LIMIT)
        self.assertLessEqual(request.most_buffered, BUFFER_LIMIT + FileDescriptor.bufferSize)
        self.assertEqual(content_sizes, [0])

    async def test_early_refusal_of_large_upload(self) -> None:
        total = 10 * 1024 * 1024
        seen: list[GatewayRequest] = []

        def answer(request: GatewayRequest) -> bytes:
            seen.append(request)
            return refuse(413)(request)

        port = self.serve(answer, GatewayRequest)
        uploader = Uploader(head(length=total), total)
        await self.upload(port, uploader)
        # The whole response reached the client, and the connection was closed without
        # reading the whole upload.
        [response] = parse_responses(uploader.received)
        self.assertEqual((response.status, response.body), (413, b"refused\n"))
        self.assertEqual(response.header("connection"), "close")
        self.assertFalse(seen[0].body.complete)

    async def test_a_client_reset_under_a_whole_response(self) -> None:
        """
        A client gone (reset) just before its whole response is written: the response's
        send at once fails, the request still finishes as usual (nothing is called back
        from the middle of C{write_whole}), and the connection is dropped at the end of
        the iteration.
        """
        sockets: list[socket.socket] = []
        finished: list[object] = []

        def answer(request: GatewayRequest) -> int:
            client = sockets[0]
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            request.responseHeaders.setRawHeaders(b"content-length", [b"2"])
            request.defaultContentType = None
            request.notifyFinish().addBoth(finished.append)
            request.write_whole(b"ok")
            return NOT_DONE_YET

        # On the daemon's reactor: the send at once was tried, failed, and left the
        # transport due for the end of the iteration.
        left_due: list[bool] = []
        flush = getattr(reactor, "flushWriter", None)
        if flush is not None:

            def flushWriter(writer: Any) -> None:
                sends: list[int] = []
                send = writer.writeSomeData

                def counted(data: bytes) -> Any:
                    sends.append(len(data))
                    return send(data)

                writer.writeSomeData = counted
                try:
                    flush(writer)
                finally:
                    del writer.writeSomeData
                # Tried (one send), failed, still due.
                left_due.append(len(sends) == 1 and writer in reactor._due)

            self.patch(reactor, "flushWriter", flushWriter)
        port = self.serve(answer, GatewayRequest)
        client = socket.create_connection(("127.0.0.1", port))
        sockets.append(client)
        client.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        while not self.server_lost:
            await deferLater(reactor, 0.01, lambda: None)
        await self.server_lost[0]
        self.assertEqual(finished, [None])
        self.assertEqual(left_due, [True] if flush is not None else [])

    async def test_a_pipelined_delete_from_a_reset_client_is_not_sent(self) -> None:
        """
        A client pipelines, in one packet, a request answered at once and a bodiless
        DELETE that goes upstream, then resets: the response's failed send stays ahead
        of the DELETE's upstream request, and the end of the iteration finds the client
        gone and cancels the DELETE unsent (as the proxy does: its upstream connection
        aborted).
        """
        server = socket.socket()
        self.addCleanup(server.close)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        connected: list[Protocol] = []

        class Upstream(Protocol):
            def connectionMade(self) -> None:
                connected.append(self)

        connector = reactor.connectTCP(
            "127.0.0.1", server.getsockname()[1], ClientFactory.forProtocol(Upstream)
        )
        self.addCleanup(connector.disconnect)
        while not connected:
            await deferLater(reactor, 0.01, lambda: None)
        upstream_side, _ = server.accept()
        self.addCleanup(upstream_side.close)
        upstream: Any = connected[0].transport

        def abort(_: object) -> None:
            upstream.abortConnection()

        def answer(request: GatewayRequest) -> int:
            request.responseHeaders.setRawHeaders(b"content-length", [b"2"])
            request.defaultContentType = None
            if request.uri == b"/1":
                request.write_whole(b"ok")
            else:
                request.notifyFinish().addErrback(abort)
                upstream.write(b"DELETE /2 HTTP/1.1\r\n\r\n")
                flush_now(upstream)
            return NOT_DONE_YET

        port = self.serve(answer, GatewayRequest)
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nDELETE /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        while not self.server_lost:
            await deferLater(reactor, 0.01, lambda: None)
        await self.server_lost[0]
        # The abort (a timed call) has run, and anything sent would have arrived.
        await deferLater(reactor, 0.05, lambda: None)
        upstream_side.setblocking(False)
        try:
            received = upstream_side.recv(1000)
        except (BlockingIOError, ConnectionResetError):
            received = b""
        self.assertEqual(received, b"")


class WriteWholeTests(SynchronousTestCase):
    """
    L{GatewayRequest.write_whole} sends what C{write(body)} then C{finish()} send, in one
    transport write where it can: random responses, methods, versions and settings.
    """

    @staticmethod
    def exchange(
        whole: bool, method: bytes, version: bytes, settings: dict[str, Any]
    ) -> tuple[bytes, int, list[bytes]]:
        def answer(request: GatewayRequest) -> int:
            request.setResponseCode(settings["code"])
            length = settings["length"]
            if length is not None:
                # An empty list of values: no Content-Length to Twisted, which chunks.
                values = [] if length == b"empty" else [length]
                request.responseHeaders.setRawHeaders(b"content-length", values)
            if settings["type"]:
                request.responseHeaders.setRawHeaders(b"content-type", [b"text/x"])
            request.defaultContentType = settings["default_type"]
            if settings["etag"]:
                request.setETag(b'"e"')
            if settings["cookie"]:
                request.addCookie(b"c", b"1")
            if settings["started"]:
                request.write(b"")
            body = settings["body"]
            if whole:
                request.write_whole(body)
            else:
                request.write(body)
                request.finish()
            return NOT_DONE_YET

        # A clock of its own: the connection timers must not be left on the reactor.
        connection = Connection(gateway_site(Handler(answer), Clock()))
        writes: list[bytes] = []
        real = connection.transport.write

        def write(data: bytes) -> None:
            writes.append(data)
            real(data)

        connection.transport.write = write  # type: ignore[method-assign]
        connection.send(method + b" /x " + version + b"\r\nHost: a\r\n\r\n")
        return connection.transport.value(), len(writes), writes

    def test_same_as_write_and_finish(self) -> None:
        self.patch(response_head, "date_line", lambda: b"Date: now\r\n")
        rng = random.Random(19)
        whole_writes = 0
        for _ in range(1_000):
            settings = {
                "code": rng.choice([200, 200, 204, 304, 404]),
                "length": rng.choice([None, b"2", b"0", b"empty"]),
                "type": rng.random() < 0.5,
                "default_type": rng.choice([None, None, b"text/html"]),
                "etag": rng.random() < 0.1,
                "cookie": rng.random() < 0.1,
                "started": rng.random() < 0.1,
                "body": rng.choice([b"ok", b""]),
            }
            method = rng.choice([b"GET", b"GET", b"HEAD", b"POST"])
            version = rng.choice([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"])
            whole, count, _ = self.exchange(True, method, version, settings)
            parts, parts_count, _ = self.exchange(False, method, version, settings)
            self.assertEqual(whole, parts, (method, version, settings))
            if count == 1 and parts_count == 2:
                whole_writes += 1
        # Head and body in one write is the usual case, not an accident of the draw.
        self.assertGreater(whole_writes, 50)


@implementer(IEagerSends)
class _RecordingReactor:
    """
    Stands for the daemon's reactor under a transport: records what is flushed at once,
    and whether flushes were held then.
    """

    def __init__(self) -> None:
        self.held = 0
        self.flushes: list[tuple[object, bool]] = []

    def flushWriter(self, writer: object) -> None:
        self.flushes.append((writer, self.held > 0))

    def holdFlushes(self) -> None:
        self.held += 1

    def releaseFlushes(self) -> None:
        self.held -= 1


def _answered_at_once(data: bytes) -> tuple[Connection, _RecordingReactor]:
    """
    Send C{data} to a gateway whose every request is answered at once with a whole
    C{ok}, on a transport whose reactor records the flushes asked for.
    """
    recording = _RecordingReactor()

    def answer(request: GatewayRequest) -> int:
        request.responseHeaders.setRawHeaders(b"content-length", [b"2"])
        request.defaultContentType = None
        request.write_whole(b"ok")
        return NOT_DONE_YET

    connection = Connection(gateway_site(Handler(answer), Clock()))
    connection.transport.reactor = recording  # type: ignore[attr-defined]
    connection.send(data)
    return connection, recording


class WriteWholeFlushTests(SynchronousTestCase):
    def test_the_response_is_out_before_it_finishes(self) -> None:
        """
        C{write_whole} has the response written out before C{finish()} (the request's
        notifications, and the chain's access-log line after them): the bytes leave
        first.
        """
        recording = _RecordingReactor()
        events: list[str] = []
        recording.flushWriter = lambda writer: events.append("flushed")  # type: ignore[method-assign]

        def answer(request: GatewayRequest) -> int:
            request.responseHeaders.setRawHeaders(b"content-length", [b"2"])
            request.defaultContentType = None
            request.notifyFinish().addCallback(lambda _: events.append("finished"))
            request.write_whole(b"ok")
            return NOT_DONE_YET

        connection = Connection(gateway_site(Handler(answer), Clock()))
        connection.transport.reactor = recording  # type: ignore[attr-defined]
        connection.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual([r.status for r in connection.responses()], [200])
        self.assertEqual(events, ["flushed", "finished"])

    def test_a_pipelined_request_sends_nothing_before_the_response_ahead(self) -> None:
        """
        A response with a pipelined request read behind it is not flushed at once: it
        leaves at the end of the iteration, and what that request, started by its
        finish, asks to flush (its upstream request, its own response) is held until
        then, so that nothing leaves before the response ahead of it.
        """
        recording = _RecordingReactor()
        upstream = StringTransport()
        upstream.reactor = recording  # type: ignore[attr-defined]
        first: list[GatewayRequest] = []

        def answer(request: GatewayRequest) -> int:
            request.responseHeaders.setRawHeaders(b"content-length", [b"2"])
            request.defaultContentType = None
            if request.uri == b"/1":
                first.append(request)  # answered later, as by an upstream's response
            else:
                flush_now(upstream)
                request.write_whole(b"ok")
            return NOT_DONE_YET

        connection = Connection(gateway_site(Handler(answer), Clock()))
        connection.transport.reactor = recording  # type: ignore[attr-defined]
        connection.send(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(recording.flushes, [])
        first[0].write_whole(b"ok")
        self.assertEqual([r.status for r in connection.responses()], [200, 200])
        # /1's response not at once (/2 read behind it); /2's upstream request and /2's
        # response, both within /1's finish, held until the end of the iteration.
        self.assertEqual(recording.flushes, [(upstream, True), (connection.transport, True)])

    def test_pipelined_responses_answered_at_once_leave_together(self) -> None:
        """
        Requests pipelined in one read and answered at once: a response with another
        request read behind it waits for the end of the iteration, so that the
        responses leave in one write; the last one is flushed at once.
        """
        connection, recording = _answered_at_once(
            b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"
        )
        self.assertEqual([r.status for r in connection.responses()], [200, 200])
        self.assertEqual(recording.flushes, [(connection.transport, False)])

    def test_not_at_once_on_a_closing_connection(self) -> None:
        """
        A response after which the connection closes is not flushed at once: the end
        of the iteration sends it and closes in one write.
        """
        for head in (
            b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        ):
            connection, recording = _answered_at_once(head)
            [response] = connection.responses()
            self.assertEqual((response.status, response.body), (200, b"ok"))
            self.assertEqual(recording.flushes, [], head)
            self.assertTrue(connection.transport.disconnecting, head)
