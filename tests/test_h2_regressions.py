"""
HTTP/2 flow control, limits and reading: what an independent review found wrong, each
over a real TLS socket (or, for pure logic, in process).
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

from h2.events import DataReceived
from h2.settings import SettingCodes
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, PingFrame
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IConsumer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from edgegw.config.model import LimitsSpec
from edgegw.server.gateway_site import GatewaySite
from edgegw.server.h2.field_encoder import MAX_TABLE_SIZE, ResponseFieldEncoder
from edgegw.server.h2.frame_watch import HeaderBlockWatch
from edgegw.server.h2.request_head import (
    HeaderListTooLargeError,
    MalformedRequestError,
    read_request_head,
)
from edgegw.server.h2.stream import H2ClientStream
from tests.support.backends import SiteBackend
from tests.support.gateways import start_gateway
from tests.support.h2client import H2Client, connect_h2, listen_tls
from tests.support.h2frames import connect_raw, data, rst, window_update

reactor: Any = _reactor


async def turns(count: int = 5) -> None:
    """
    Let the reactor run C{count} times round (what is in flight on loopback arrives).
    """
    for _ in range(count):
        await deferLater(reactor, 0, lambda: None)


async def until(condition: Any, tries: int = 500) -> None:
    for _ in range(tries):
        if condition():
            return
        await deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("the condition never held")


@implementer(IConsumer)
class PausingConsumer:
    """
    A request body's consumer that pauses the body at each write until told.
    """

    def __init__(self, request: Any) -> None:
        self.request = request
        self.body = request.body
        self.data = b""
        self.done: Deferred[None] = self.body.startProducing(self)
        self.done.addCallback(self._finish)
        self.done.addErrback(lambda failure: None)

    def write(self, data: bytes) -> None:
        self.data += data
        self.body.pauseProducing()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def resume(self) -> None:
        self.body.resumeProducing()

    def _finish(self, ignored: object) -> None:
        self.request.write(b"got %d" % len(self.data))
        self.request.finish()


class Holder(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[PausingConsumer] = []

    def render(self, request: Any) -> Any:
        self.held.append(PausingConsumer(request))
        return NOT_DONE_YET


class Hang(Resource):
    isLeaf = True

    def render(self, request: Any) -> Any:
        return NOT_DONE_YET


class Big(Resource):
    isLeaf = True

    def render(self, request: Any) -> Any:
        request.write(b"x" * 200_000)
        request.finish()
        return NOT_DONE_YET


def site_of(resource: Resource, clock: Any = None) -> GatewaySite:
    site = GatewaySite(resource, LimitsSpec(), None, timeout=75, reactor=clock or reactor)
    site.noisy = False
    return site


def recording_upstream(test: TestCase) -> tuple[list[bytes], Any]:
    """
    A gateway proxying to an upstream that records every byte it receives and answers
    nothing; the recorded bytes and the gateway.
    """
    received: list[bytes] = []

    class Recording(Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.append(data)

    listening = reactor.listenTCP(0, Factory.forProtocol(Recording), interface="127.0.0.1")
    test.addCleanup(listening.stopListening)
    built, _ = start_gateway(test, f"http://127.0.0.1:{listening.getHost().port}")
    return received, built


class WindowTests(TestCase):
    """
    Request bodies held back by a slow consumer give the connection's window back.
    """

    tls_certificate: bytes

    async def test_bodies_completing_while_paused(self) -> None:
        """
        25 uploads of 60 kB (1.5 MB, more than the connection's 1 MiB window), each
        complete while its consumer is paused: every one gets through.
        """
        holder = Holder()
        client = await connect_h2(self, listen_tls(self, site_of(holder)))
        body = b"x" * 60000
        for i in range(25):
            _, response = client.start(
                b"POST", b"/u", [(b"content-length", b"%d" % len(body))], body
            )
            await until(lambda i=i: len(holder.held) > i and holder.held[i].body.complete)
            holder.held[i].resume()
            self.assertEqual((await response.done).body, b"got 60000")

    async def test_cancelled_uploads_while_paused(self) -> None:
        """
        Uploads cancelled by the client while their consumer is paused: 20 of them
        (more than the connection's window), then one that completes.
        """
        holder = Holder()
        client = await connect_h2(self, listen_tls(self, site_of(holder)))
        body = b"x" * 60000
        for i in range(20):
            stream_id, _ = client.start(
                b"POST", b"/u", [(b"content-length", b"%d" % (2 * len(body)))], body, end=False
            )
            await until(lambda i=i: len(holder.held) > i and holder.held[i].data)
            client.h2.reset_stream(stream_id)
            client.flush()
        _, response = client.start(b"POST", b"/u", [(b"content-length", b"%d" % len(body))], body)
        await until(lambda: len(holder.held) > 20 and holder.held[20].body.complete)
        holder.held[20].resume()
        self.assertEqual((await response.done).body, b"got 60000")

    async def test_no_body_timeout_while_the_consumer_is_paused(self) -> None:
        """
        The body's deadline runs only while the gateway reads: not while its consumer
        (the upstream) holds the body back.
        """
        clock = Clock()
        holder = Holder()
        client = await connect_h2(self, listen_tls(self, site_of(holder, clock)))
        body = b"x" * 1000
        stream_id, response = client.start(
            b"POST", b"/u", [(b"content-length", b"%d" % (2 * len(body)))], body, end=False
        )
        await until(lambda: holder.held and holder.held[0].body.received == len(body))
        clock.advance(LimitsSpec().body_timeout + 1)
        await turns()
        self.assertIsNone(response.reset)
        holder.held[0].resume()
        client.send_body(stream_id, body)
        await until(lambda: holder.held[0].body.complete)
        holder.held[0].resume()
        self.assertEqual((await response.done).body, b"got 2000")

    async def test_settings_opening_the_window_resumes(self) -> None:
        """
        A larger SETTINGS_INITIAL_WINDOW_SIZE opens every stream's window (RFC 9113
        section 6.9.2): a response waiting for it is sent.
        """
        holder = Holder()
        client = await connect_h2(self, listen_tls(self, site_of(holder)))
        client.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        _, response = client.start(b"POST", b"/u", [(b"content-length", b"1")], b"a")
        await until(lambda: holder.held and holder.held[0].body.complete)
        holder.held[0].resume()
        await client.until(lambda: response.status == 200)
        client.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        client.flush()
        self.assertEqual((await response.done).body, b"got 1")


class RefusalTests(TestCase):
    """
    Refusals that need no window, and requests a backend would read otherwise.
    """

    tls_certificate: bytes

    async def test_431_with_a_closed_window(self) -> None:
        """
        A header list too large, from a client whose stream window is 0: 431 (a head
        alone), and the connection goes on.
        """
        client = await connect_h2(self, listen_tls(self, site_of(Big())))
        client.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        _, response = client.start(b"GET", b"/", [(b"x-big", b"a" * 17000)])
        self.assertEqual((await response.done).status, 431)
        _, second = client.start(b"GET", b"/", [(b"x-small", b"a")])
        await client.until(lambda: second.status == 200)
        self.assertIsNone(client.terminated)

    async def test_method_must_be_a_token(self) -> None:
        """
        A :method with a tab (which an HTTP/1.1 request line could never carry) is
        refused on its stream; nothing reaches the upstream.
        """
        seen, built = recording_upstream(self)
        client = await connect_h2(self, listen_tls(self, built.site))
        _, response = client.start(b"GET\t/admin", b"/public")
        self.assertIsNotNone((await response.done).reset)
        self.assertEqual(seen, [])

    async def test_over_length_body_never_completes_upstream(self) -> None:
        """
        content-length 5 and DATA of 5 bytes without END_STREAM, then more DATA: the
        upstream never has a complete request (the last byte waits for END_STREAM), and
        the request fails.
        """
        received, built = recording_upstream(self)
        client = await connect_h2(self, listen_tls(self, built.site))
        stream_id, response = client.start(
            b"POST", b"/transfer", [(b"content-length", b"5")], b"hello", end=False
        )
        await until(lambda: b"hell" in b"".join(received))
        await turns()
        self.assertTrue(b"".join(received).endswith(b"hell"), received)
        frame = DataFrame(stream_id)
        frame.data = b"world"
        frame.flags.add("END_STREAM")
        client.send_raw(frame.serialize())
        await client.until(lambda: response.done.called or client.terminated is not None)
        self.assertNotIn(b"hello", b"".join(received))

    async def test_empty_declared_body_waits_for_end_stream(self) -> None:
        """
        content-length 0 on a stream left open: nothing reaches the upstream until
        END_STREAM; DATA instead fails the request, and the upstream never had it.
        """
        received, built = recording_upstream(self)
        client = await connect_h2(self, listen_tls(self, built.site))
        stream_id, response = client.start(
            b"POST", b"/transfer", [(b"content-length", b"0")], end=False
        )
        second_id, second = client.start(b"GET", b"/healthz")
        await second.done
        self.assertEqual(received, [])
        frame = DataFrame(stream_id)
        frame.data = b"x"
        frame.flags.add("END_STREAM")
        client.send_raw(frame.serialize())
        await client.until(lambda: response.done.called or client.terminated is not None)
        self.assertEqual(received, [])
        del second_id

    async def test_length_kept_when_end_stream_comes_alone(self) -> None:
        """
        The held last byte goes on when END_STREAM arrives on an empty DATA frame.
        """

        def echo(request: Any) -> bytes:
            return b"got " + bytes(request.content.getvalue())

        backend = SiteBackend(echo).start()
        self.addCleanup(backend.stop)
        built, _ = start_gateway(self, f"http://127.0.0.1:{backend.port}")
        client = await connect_h2(self, listen_tls(self, built.site))
        stream_id, response = client.start(
            b"POST", b"/p", [(b"content-length", b"5")], b"hello", end=False
        )
        await turns()
        client.h2.end_stream(stream_id)
        client.flush()
        self.assertEqual((await response.done).body, b"got hello")


class ConnectionBoundTests(TestCase):
    """
    What one connection can make the gateway hold, and for how long.
    """

    tls_certificate: bytes

    async def test_no_reading_while_the_client_reads_nothing(self) -> None:
        """
        While the transport is paused (the client reads nothing), the connection reads
        nothing either: PINGs are not answered into a full buffer; and a deadline runs.
        """
        clock = Clock()
        site = site_of(Hang(), clock)
        client = await connect_h2(self, listen_tls(self, site))
        client.start(b"GET", b"/sse")
        # Once the stream is in, the connection counted is the HTTP/2 one (not the TLS
        # connection still choosing its protocol).
        await until(lambda: any(getattr(c, "streams", None) for c in site.connections.channels))
        (connection,) = site.connections.channels
        pings = len([e for e in client.events if type(e).__name__ == "PingAckReceived"])
        connection.pauseProducing()  # type: ignore[attr-defined]
        client.send_raw(b"".join(PingFrame(0).serialize() for _ in range(50)))
        await turns(20)
        after = len([e for e in client.events if type(e).__name__ == "PingAckReceived"])
        self.assertEqual(after, pings)
        connection.resumeProducing()  # type: ignore[attr-defined]
        await client.until(
            lambda: (
                len([e for e in client.events if type(e).__name__ == "PingAckReceived"])
                == pings + 50
            )
        )
        connection.pauseProducing()  # type: ignore[attr-defined]
        clock.advance(LimitsSpec().send_timeout + 1)
        await client.closed

    async def test_window_update_dribble_is_not_free(self) -> None:
        """
        WINDOW_UPDATE(1) frames each buying a 1-byte DATA frame do not earn their tokens
        back: the budget runs out (GOAWAY ENHANCE_YOUR_CALM).
        """
        clock = Clock()
        client = await connect_h2(self, listen_tls(self, site_of(Big(), clock)), auto_window=False)
        client.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        stream_id, response = client.start(b"GET", b"/big")
        await client.until(lambda: response.status == 200)
        for i in range(1500):
            if client.terminated is not None:
                break
            client.h2.increment_flow_control_window(1, stream_id)
            client.flush()

            def moved(count: int = i) -> bool:
                return len(response.body) > count or client.terminated is not None

            await client.until(moved)
        self.assertIsNotNone(client.terminated)
        assert client.terminated is not None
        self.assertEqual(client.terminated.error_code, 11)  # ENHANCE_YOUR_CALM
        data = [e for e in client.events if isinstance(e, DataReceived)]
        self.assertLess(len(data), 1100)

    async def test_unfinished_header_block_bounded_in_bytes(self) -> None:
        """
        With a stream open, a header block that goes on past 64 KiB of CONTINUATIONs
        ends the connection (ENHANCE_YOUR_CALM), at once (its deadlines on a clock that
        never moves: the TLS layer closes only once the connection's producer is gone).
        """
        site = site_of(Hang(), Clock())
        client = await connect_h2(self, listen_tls(self, site))
        client.start(b"GET", b"/sse")
        await until(lambda: site.connections.channels)
        block = HeadersFrame(3)
        block.data = b"\x82"
        frames = [block.serialize()]
        for _ in range(8):
            continuation = ContinuationFrame(3)
            continuation.data = b"\x00" * 16384
            frames.append(continuation.serialize())
        client.send_raw(b"".join(frames))
        await client.closed
        assert client.terminated is not None
        self.assertEqual(client.terminated.error_code, 11)

    async def test_unfinished_header_block_bounded_in_time(self) -> None:
        """
        With a stream open (which stops the idle timeout), a header block that never
        ends closes the connection after limits.headerTimeout.
        """
        clock = Clock()
        site = site_of(Hang(), clock)
        client = await connect_h2(self, listen_tls(self, site))
        client.start(b"GET", b"/sse")
        await until(lambda: site.connections.channels)
        block = HeadersFrame(3)
        block.data = b"\x82"
        client.send_raw(block.serialize())
        # The open stream arms no timer of its own: only the header block's can fire
        # (advanced until the block has arrived and its timer with it).
        for _ in range(500):
            if client.closed.called:
                break
            clock.advance(LimitsSpec().header_timeout + 1)
            await deferLater(reactor, 0.01, lambda: None)
        await client.closed

    async def test_finished_streams_freed_without_the_cycle_collector(self) -> None:
        """
        A finished stream and its request are freed by reference counting alone.
        """
        backend = SiteBackend().start()
        self.addCleanup(backend.stop)
        built, _ = start_gateway(self, f"http://127.0.0.1:{backend.port}")
        client = await connect_h2(self, listen_tls(self, built.site))
        await client.request(b"GET", b"/healthz")
        refs: list[Any] = []
        original = H2ClientStream.__init__

        def track(stream: Any, *args: Any) -> None:
            original(stream, *args)
            refs.append(weakref.ref(stream))

        H2ClientStream.__init__ = track  # type: ignore[assignment, method-assign]
        self.addCleanup(setattr, H2ClientStream, "__init__", original)
        gc.collect()
        gc.disable()
        self.addCleanup(gc.enable)
        for _ in range(20):
            await client.request(b"GET", b"/healthz")
        await turns()
        self.assertEqual(len(refs), 20)
        self.assertEqual([r for r in refs if r() is not None], [])


class PureLogicTests(SynchronousTestCase):
    """
    The encoder's table, cookies' size, the frame watch.
    """

    def test_encoder_table_never_above_the_default(self) -> None:
        encoder = ResponseFieldEncoder()
        encoder.header_table_size = 2**31
        self.assertEqual(encoder.header_table_size, MAX_TABLE_SIZE)
        sizes = [len(encoder.encode([(b"x-runtime", b"0.%06d" % i)])) for i in range(300)]
        # Once the table is full, every new value goes out as a literal, indexed never.
        self.assertEqual(sizes[-1], sizes[-2])

    def test_encoder_numbers_after_an_insertion(self) -> None:
        """
        A field new to the dynamic table renumbers every entry already in it: the fields
        after it in the same block are encoded with the new numbers, as a decoder reads
        them (issue 36's review: a 401 after a 302 on one connection came out wrong).
        """
        from hpack import Decoder

        encoder, decoder = ResponseFieldEncoder(), Decoder()
        first = [(b":status", b"302"), (b"x-frame-options", b"DENY"), (b"x-a", b"1")]
        second = [(b":status", b"401"), (b"x-b", b"2"), (b"x-frame-options", b"DENY")]
        second.append((b"x-a", b"1"))
        for block in (first, second, second):
            decoded = decoder.decode(encoder.encode(block), raw=True)
            self.assertEqual(decoded, block)

    def test_cookie_crumbs_sized_as_their_line(self) -> None:
        """
        180 cookie crumbs (an 11 kB Cookie line, which HTTP/1.1 reads) are read.
        """
        crumbs = [(b"cookie", b"c%03d=%s" % (i, b"v" * 55)) for i in range(180)]
        head = read_request_head(
            [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/"), *crumbs],
            16384,
            500,
        )
        self.assertEqual(len(dict(head.fields)[b"cookie"].split(b"; ")), 180)
        with self.assertRaises(HeaderListTooLargeError):
            read_request_head(
                [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/"), *crumbs * 2],
                16384,
                500,
            )

    def test_method_token(self) -> None:
        for method in (b"GET\t/x", b"GET /x", b"G\x00T", b""):
            with self.assertRaises(MalformedRequestError):
                read_request_head(
                    [(b":method", method), (b":scheme", b"https"), (b":path", b"/")], 16384, 500
                )

    def test_frame_watch_follows_blocks_across_reads(self) -> None:
        watch = HeaderBlockWatch()
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        headers = HeadersFrame(1)
        headers.data = b"\x82" * 100
        continuation = ContinuationFrame(1)
        continuation.data = b"\x00" * 50
        done = ContinuationFrame(1)
        done.data = b"\x00" * 5
        done.flags.add("END_HEADERS")
        data = DataFrame(1)
        data.data = b"\x01" * 300
        wire = preface + data.serialize() + headers.serialize() + continuation.serialize()
        for i in range(0, len(wire), 7):
            watch.feed(wire[i : i + 7])
        self.assertEqual((watch.open, watch.block_bytes), (True, 150))
        watch.feed(done.serialize())
        self.assertEqual((watch.open, watch.block_bytes), (False, 0))


del H2Client


class Small(Resource):
    isLeaf = True

    def render(self, request: Any) -> Any:
        request.write(b"ok")
        request.finish()
        return NOT_DONE_YET


class PullProducer:
    """
    A pull producer writing 20 kB each time it is asked, 50 times.
    """

    def __init__(self, request: Any) -> None:
        self.request = request
        self.left = 50

    def resumeProducing(self) -> None:
        self.left -= 1
        self.request.write(b"p" * 20000)
        if not self.left:
            self.request.unregisterProducer()
            self.request.finish()

    def stopProducing(self) -> None:
        self.left = -1


class Router(Resource):
    isLeaf = True

    def render(self, request: Any) -> Any:
        if request.path == b"/pull":
            request.registerProducer(PullProducer(request), False)
            return NOT_DONE_YET
        return Big().render(request)


class SecondReviewTests(TestCase):
    """
    What a second review found: sends on a stream the same read reset, a pull producer
    never asked again, floods of frames on closed streams.
    """

    async def test_headers_and_reset_in_one_write(self) -> None:
        """
        HEADERS and RST_STREAM for one stream in one write, to a route answering at
        once: the answer finds the stream closed in h2; the connection goes on.
        """
        client = await connect_raw(self, listen_tls(self, site_of(Small())))
        stream_id, frames = client.request_frames(b"GET", b"/")
        client.send(frames + rst(stream_id))
        await client.sync()
        second = client.request(b"GET", b"/")
        await client.sync()
        self.assertIsNone(client.goaway)
        self.assertFalse(client.lost)
        self.assertTrue(client.response(second).done)
        self.assertEqual(self.flushLoggedErrors(), [])

    async def test_window_update_and_reset_in_one_write(self) -> None:
        """
        A response waiting for its window, then WINDOW_UPDATE and RST_STREAM for it in
        one write: the send finds the stream closed; the connection goes on.
        """
        client = await connect_raw(self, listen_tls(self, site_of(Big())))
        stream_id = client.request(b"GET", b"/")
        await client.until(lambda: len(client.response(stream_id).body) >= 65535)
        await client.sync()
        client.send(window_update(0, 10000) + window_update(stream_id, 10000) + rst(stream_id))
        await client.sync()
        second = client.request(b"GET", b"/")
        await client.until(lambda: bool(client.response(second).heads) or client.lost)
        self.assertFalse(client.lost)
        self.assertEqual(self.flushLoggedErrors(), [])

    async def test_malformed_headers_and_reset_in_one_write(self) -> None:
        client = await connect_raw(self, listen_tls(self, site_of(Hang())))
        stream_id, frames = client.request_frames(b"GET", b"/", [(b"Bad", b"x")])
        client.send(frames + rst(stream_id))
        await client.sync()
        self.assertFalse(client.lost)
        self.assertEqual(self.flushLoggedErrors(), [])

    async def test_pull_producer_asked_again_once_output_drains(self) -> None:
        """
        A pull producer (static files) that stopped because the connection held too
        much output is asked again once that output is gone.
        """
        client = await connect_raw(self, listen_tls(self, site_of(Router())))
        client.send(window_update(0, 50_000_000))
        big = [client.request(b"GET", b"/big") for _ in range(4)]
        await client.until(lambda: all(len(client.response(s).body) == 65535 for s in big))
        pull = client.request(b"GET", b"/pull")
        await client.sync()
        client.send(*[rst(s) for s in big])
        await client.sync()
        client.send(window_update(pull, 1_000_000))
        await client.until(lambda: len(client.response(pull).body) == 50 * 20000)
        self.assertTrue(client.response(pull).done)

    async def flood(self, frame: Any) -> None:
        client = await connect_raw(self, listen_tls(self, site_of(Small())))
        stream_id = client.request(b"GET", b"/")
        await client.until(lambda: client.response(stream_id).done)
        for _ in range(60):
            client.write(frame(stream_id) * 200)
            with contextlib.suppress(ConnectionError):
                await client.sync()
            if client.ended_by_server():
                break
        self.assertIsNotNone(client.goaway)
        assert client.goaway is not None
        self.assertEqual(client.goaway.error_code, 11)

    async def test_empty_data_on_a_closed_stream(self) -> None:
        await self.flood(lambda stream_id: data(stream_id))

    async def test_window_update_on_a_closed_stream(self) -> None:
        await self.flood(lambda stream_id: window_update(stream_id, 1))

    async def test_reset_on_a_closed_stream(self) -> None:
        await self.flood(lambda stream_id: rst(stream_id))
