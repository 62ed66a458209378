"""
An adversarial review of compression on the fly (issue 34), after its held bodies: a body
of known length up to C{HOLD_LIMIT} that comes in pieces is held until whole. What the
holding could break, over real sockets on 127.0.0.1: a body short of its length, a client
that leaves while the body is held, HTTP/1.0 and HTTP/2, keep-alive, response plugins
that change the status, and the encoders' own state.
"""

from __future__ import annotations

import gc
import random
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from edgegw.compression.codings import CODINGS as CODING_TABLE
from edgegw.compression.response_coding import HOLD_LIMIT
from edgegw.plugins.stages import PluginError
from tests.support.backends import RawBackend, RawConnection, RawRequest
from tests.support.encodings import (
    CODINGS,
    dechunk_prefix,
    decode,
    parse_reply,
    request_bytes,
)
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls
from tests.support.log_capture import capture_log
from tests.support.plugin_dists import install_plugins
from tests.support.rawclient import connect
from tests.test_compression import (
    BIG_TEXT,
    TEXT,
    CompressionTestCase,
    Page,
    head_bytes,
    plugin,
    route,
    wait_for,
)

reactor: Any = _reactor


def paced(
    body: bytes, pieces: int, declared: int | None = None, pending: list[Any] | None = None
) -> Page:
    """
    A page whose C{Content-Length} (C{declared}, else the body's) goes out with the
    head, then the body in C{pieces} writes a reactor turn apart; when C{declared} is
    given, the backend closes its connection after the last piece. The calls still to
    come are kept in C{pending} (for the test to cancel once it is done).
    """
    scheduled = [] if pending is None else pending

    def page(request: RawRequest, connection: RawConnection) -> None:
        length = len(body) if declared is None else declared
        connection.write(
            head_bytes(200, [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % length)])
        )
        size = -(-len(body) // pieces)
        parts = [body[i : i + size] for i in range(0, len(body), size)]

        def send(index: int) -> None:
            transport: Any = connection.transport
            if transport is None or not transport.connected:
                return
            connection.write(parts[index])
            if index + 1 < len(parts):
                scheduled.append(reactor.callLater(0.01, send, index + 1))
            elif declared is not None:
                transport.loseConnection()

        scheduled.append(reactor.callLater(0.01, send, 0))

    return page


class ReviewTestCase(CompressionTestCase):
    """
    An L{Origin} with a held page (C{/held}: about 96 KiB in four pieces).
    """

    def setUp(self) -> None:
        super().setUp()
        self.held_body = TEXT * 4
        assert len(self.held_body) < HOLD_LIMIT
        self.pending: list[Any] = []
        self.addCleanup(self._cancel_pending)
        self.origin.pages[b"held"] = paced(self.held_body, 4, pending=self.pending)

    def first_piece_sent(self) -> bool:
        """
        Whether the backend has sent the first piece of a held page's body (the gateway
        is then reading it whole, with nothing sent to the client yet).
        """
        return bool(self.pending) and not self.pending[0].active()

    def _cancel_pending(self) -> None:
        for call in self.pending:
            if call.active():
                call.cancel()


class ShortBodyTests(ReviewTestCase):
    """
    A body that ends short of its C{Content-Length} never reaches the client as a
    complete response, held or streamed.
    """

    async def test_streamed_body_short_of_its_length(self) -> None:
        """
        Over C{HOLD_LIMIT} (streamed, chunked): the backend closes early, and the
        client gets no last chunk.
        """
        body = BIG_TEXT[: HOLD_LIMIT + 20_000]
        self.origin.pages[b"cut"] = paced(
            body, 4, declared=len(body) + 50_000, pending=self.pending
        )
        port = self.serve()
        for coding in CODINGS:
            client = await connect(port)
            client.send(request_bytes("GET", "/cut", [("Accept-Encoding", coding)]))
            await client.closed
            head, _, rest = client.received.partition(b"\r\n\r\n")
            self.assertIn(b"transfer-encoding: chunked", head.lower())
            _, complete = dechunk_prefix(rest)
            self.assertFalse(complete, f"{coding}: a cut body ended with its last chunk")


class HeldBodyProtocolTests(ReviewTestCase):
    """
    A held body over HTTP/1.0, keep-alive HTTP/1.1 and HTTP/2.
    """

    async def test_http10_client_gets_the_held_body_with_its_length(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            client = await connect(port)
            client.send(
                b"GET /held HTTP/1.0\r\nHost: x\r\nAccept-Encoding: "
                + coding.encode()
                + b"\r\n\r\n"
            )
            await client.closed
            reply = parse_reply(client.received)
            self.assert_compressed(reply, coding, self.held_body)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))

    async def test_keep_alive_after_a_held_body(self) -> None:
        """
        Two requests on one connection, the first one's body held: both answered in
        order, the first with its compressed length.
        """
        port = self.serve()
        client = await connect(port)
        client.send(
            b"GET /held HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
            b"GET /whole HTTP/1.1\r\nHost: x\r\nAccept-Encoding: br\r\nConnection: close\r\n\r\n"
        )
        await client.closed
        first = parse_reply(client.received)
        self.assertEqual(first.header("content-encoding"), "gzip")
        length = int(first.header("content-length") or "-1")
        self.assertEqual(decode("gzip", first.raw[:length]), self.held_body)
        second = parse_reply(first.raw[length:])
        self.assert_compressed(second, "br", TEXT)

    async def test_held_body_over_http2(self) -> None:
        built, _ = start_gateway(self, self.origin.url)
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port)
        for coding in CODINGS:
            response = await client.request(
                b"GET", b"/held", [(b"accept-encoding", coding.encode())]
            )
            self.assertEqual(response.status, 200)
            self.assertEqual(response.header(b"content-encoding"), coding.encode())
            self.assertEqual(response.header(b"content-length"), b"%d" % len(response.body))
            self.assertEqual(decode(coding, response.body), self.held_body)


class HeldBodyRequestTests(ReviewTestCase):
    """
    A paced body of known length asked for with C{Range}, or by an HTTP/1.0 client
    whose body would otherwise stream.
    """

    async def test_range_request_is_answered_as_it_is(self) -> None:
        port = self.serve()
        reply = await self.get(port, "/held", "gzip", ("Range", "bytes=0-9"))
        # The backend ignores Range: its whole 200, not compressed, with its length.
        self.assert_identity(reply, self.held_body)

    async def test_over_the_limit_to_http10_is_sent_as_it_is(self) -> None:
        body = BIG_TEXT
        self.origin.pages[b"big"] = paced(body, 4, pending=self.pending)
        port = self.serve()
        client = await connect(port)
        client.send(b"GET /big HTTP/1.0\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
        await client.closed
        reply = parse_reply(client.received)
        self.assert_identity(reply, body)


class ClientGoneTests(ReviewTestCase):
    """
    A client that leaves while its body is held.
    """

    async def test_backend_connection_dropped_and_gateway_goes_on(self) -> None:
        lost: list[Deferred[None]] = []

        def slow(request: RawRequest, connection: RawConnection) -> None:
            # The head and half the body, then nothing: the body stays held.
            connection.write(
                head_bytes(
                    200,
                    [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % len(TEXT))],
                )
                + TEXT[: len(TEXT) // 2]
            )
            lost.append(self.origin.raw.next_lost())

        self.origin.pages[b"slow"] = slow
        port = self.serve()
        client = await connect(port)
        client.send(request_bytes("GET", "/slow", [("Accept-Encoding", "gzip")]))
        await wait_for(lambda: lost)
        self.assertEqual(client.received, b"")
        client.transport.abortConnection()  # type: ignore[union-attr]
        await client.closed
        # The gateway lets the backend's exchange go.
        await lost[0]
        reply = await self.get(port, "/held", "zstd")
        self.assert_compressed(reply, "zstd", self.held_body)

    async def test_access_log_says_nothing_was_sent(self) -> None:
        """
        The access log counts a request whose client left before any response with no
        status (edgegw.chain.access_log._status): a held body is no response yet.
        """
        events = capture_log(self)

        def slow(request: RawRequest, connection: RawConnection) -> None:
            connection.write(
                head_bytes(
                    200,
                    [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % len(TEXT))],
                )
                + TEXT[: len(TEXT) // 2]
            )

        self.origin.pages[b"slow"] = slow
        _, port = start_gateway(self, self.origin.url)
        client = await connect(port)
        client.send(request_bytes("GET", "/slow", [("Accept-Encoding", "gzip")]))
        # Held: the response counts as started, though nothing of it went out.
        await wait_for(lambda: self.origin.requests)
        client.transport.abortConnection()  # type: ignore[union-attr]
        await client.closed

        def logged() -> list[dict[str, Any]]:
            return [e["access"] for e in events if e.get("access", {}).get("path") == "/slow"]

        await wait_for(logged)
        [record] = logged()
        self.assertEqual(client.received, b"")
        self.assertIsNone(record["status"], record)

    async def test_http2_stream_reset_while_held(self) -> None:
        """
        Over HTTP/2, a client that resets its stream while the body is held: the
        backend's exchange is let go, and the connection's next stream is answered.
        """
        lost: list[Deferred[None]] = []

        def slow(request: RawRequest, connection: RawConnection) -> None:
            connection.write(
                head_bytes(
                    200,
                    [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % len(TEXT))],
                )
                + TEXT[: len(TEXT) // 2]
            )
            lost.append(self.origin.raw.next_lost())

        self.origin.pages[b"slow"] = slow
        built, _ = start_gateway(self, self.origin.url)
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port)
        stream_id, response = client.start(b"GET", b"/slow", [(b"accept-encoding", b"br")])
        await wait_for(lambda: self.origin.requests)
        self.assertIsNone(response.status)
        client.h2.reset_stream(stream_id)
        client.flush()
        await lost[0]
        again = await client.request(b"GET", b"/held", [(b"accept-encoding", b"br")])
        self.assertEqual(again.header(b"content-length"), b"%d" % len(again.body))
        self.assertEqual(decode("br", again.body), self.held_body)


class MalformedUploadTests(ReviewTestCase):
    """
    A request body that turns out malformed while the response's body is held.
    """

    async def test_bad_request_answered_while_nothing_was_sent(self) -> None:
        """
        The backend answers on the request's head (half of a body of known length,
        held); the client's chunked upload then breaks its framing. Nothing of the
        response has gone out, so the client is told 400, as when no response has
        started, rather than the connection closing on nothing.
        """

        answered: list[bool] = []

        def early(request: RawRequest, connection: RawConnection) -> None:
            if request.complete:
                return
            answered.append(True)
            connection.write(
                head_bytes(
                    200,
                    [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % len(TEXT))],
                )
                + TEXT[: len(TEXT) // 2]
            )

        backend = RawBackend(early, on_head=True).start()
        self.addCleanup(backend.stop)
        _, port = start_gateway(self, f"http://127.0.0.1:{backend.port}")
        client = await connect(port)
        client.send(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        await wait_for(lambda: answered)
        self.assertEqual(client.received, b"")
        client.send(b"zz\r\nnot a chunk\r\n")
        await client.closed
        self.assertTrue(client.received.startswith(b"HTTP/1.1 400 "), client.received[:200])


class PluginStatusTests(ReviewTestCase):
    """
    A response plugin that makes a held response a 304 or a 204.
    """

    def setUp(self) -> None:
        super().setUp()
        install_plugins(self)

    async def test_hook_makes_it_not_modified(self) -> None:
        for status in (304, 204):
            port = self.serve(
                route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
                plugin("ResponsePlugin", "st", "status", {"status": status}),
            )
            client = await connect(port)
            client.send(
                b"GET /held HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
                b"GET /whole HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            await client.closed
            head, _, rest = client.received.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 %d " % status), head)
            self.assertNotIn(b"content-length", head.lower())
            self.assertNotIn(b"content-encoding", head.lower())
            self.assertNotIn(b"transfer-encoding", head.lower())
            # Nothing of the body follows the head: the next response does.
            self.assertTrue(rest.startswith(b"HTTP/1.1 %d " % status), rest[:80])

    async def test_body_plugin_over_a_paced_body(self) -> None:
        """
        A plugin that wants the body gets the whole identity body of a paced response;
        what it returns is compressed with its length.
        """
        port = self.serve(
            route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
            plugin("ResponsePlugin", "up", "upper", {"maxBodyBytes": 1_000_000}),
        )
        rewritten = b"[" + self.held_body.upper() + b"]"
        for coding in CODINGS:
            reply = await self.get(port, "/held", coding)
            self.assert_compressed(reply, coding, rewritten)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertEqual(reply.header("x-upper"), str(len(self.held_body)))

    async def test_failing_plugin_over_a_paced_body(self) -> None:
        """
        A plugin that raises on the head, or wants the body and gets more than its
        limit (4096 bytes), over a paced body: one clean answer (500, 502), one head,
        nothing of the backend's body.
        """
        answers = ((False, 500, b"internal server error\n"), (True, 502, b"bad gateway\n"))
        for wants, status, text in answers:
            port = self.serve(
                route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
                plugin("ResponsePlugin", "b", "boom", {"wantsBody": wants}),
            )
            reply = await self.get(port, "/held", "gzip")
            self.assertEqual(reply.status, status, reply)
            self.assertEqual(reply.raw.count(b"HTTP/1.1"), 0, reply.raw[:200])
            self.assertEqual(reply.body, text)
        self.flushLoggedErrors(PluginError)


class DrainTests(ReviewTestCase):
    """
    A gateway that starts draining while a response's body is held.
    """

    async def test_held_response_says_it_closes(self) -> None:
        """
        Draining makes every response not yet sent carry C{Connection: close}; a held
        response has sent nothing yet, so it carries it too (as a streamed one whose
        head had not gone out would).
        """
        built, port = start_gateway(self, self.origin.url)
        client = await connect(port)
        client.send(b"GET /held HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
        await wait_for(self.first_piece_sent)
        self.assertEqual(client.received, b"")
        built.inflight.drain()
        await client.closed
        reply = parse_reply(client.received)
        self.assert_compressed(reply, "gzip", self.held_body)
        self.assertEqual(reply.header("connection"), "close", reply.headers)


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


class EncoderMemoryTests(SynchronousTestCase):
    """
    What the streaming encoders keep once their streams are done.
    """

    def test_finished_zstd_streams_keep_little(self) -> None:
        """
        Sixteen zstd streams at once (sixteen downloads of a large script), all
        finished: what stays resident afterwards is well under issue 34's budget for a
        whole 1 GiB stream (32 MiB). The pool of idle compressors keeps each one's
        context, 3.2 MiB resident at level 6 with its 512 KiB window (3.7 MiB by
        zstandard's own count), so sixteen keep about 52 MiB for the life of the process.
        """
        rng = random.Random(34)
        data = b"".join(
            b"%06d the quick brown fox %s\n" % (i, str(rng.random()).encode()) for i in range(40000)
        )
        gc.collect()
        before = _resident_mib()
        encoders = [CODING_TABLE["zstd"].encoder(None) for _ in range(16)]
        for encoder in encoders:
            for start in range(0, len(data), 65536):
                encoder.compress(data[start : start + 65536])
        for encoder in encoders:
            encoder.finish()
        del encoders, encoder
        gc.collect()
        kept = _resident_mib() - before
        self.assertLess(kept, 32, f"{kept:.1f} MiB stay resident after the streams ended")
