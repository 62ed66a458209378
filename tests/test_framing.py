"""
Request framing the gateway and a backend could read differently (issue 10, points 4 and
9): refused at the edge with 400, the connection closed, nothing forwarded. Raw requests
over real sockets to a whole gateway whose backend records every byte it receives.
"""

from __future__ import annotations

from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.server.channel import MAX_CONTENT_LENGTH_DIGITS
from tests.support.backends import RawBackend
from tests.support.gateways import answer_ok, start_gateway
from tests.support.memory import parse_responses
from tests.support.rawclient import connect, response_complete
from tests.test_request import Fixture, head, ok

REFUSED = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class EdgeTestCase(TestCase):
    """
    A gateway proxying C{/} to a backend that answers every request head with 200.
    """

    def setUp(self) -> None:
        self.backend = RawBackend(answer_ok, on_head=True).start()
        self.addCleanup(lambda: ensureDeferred(self.backend.stop()))
        _, self.port = start_gateway(self, f"http://127.0.0.1:{self.backend.port}", clock=Clock())

    async def exchange(self, raw: bytes) -> bytes:
        """
        Send C{raw} on a new connection; everything received until the gateway closes it.
        """
        client = await connect(self.port)
        client.send(raw)
        await client.closed
        return client.received

    async def assert_refused(self, raw: bytes) -> None:
        """
        C{raw} gets exactly one 400, the connection closes, and the backend is never
        contacted.
        """
        self.assertEqual(await self.exchange(raw), REFUSED)
        self.assertEqual(self.backend.connections, [])

    def forwarded(self) -> list[bytes]:
        """
        The request lines the backend received, over all its connections.
        """
        return [
            request.request_line
            for connection in self.backend.connections
            for request in connection.requests
        ]


# What a request smuggled in a body the gateway failed to frame would look like.
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class ContentLengthTests(EdgeTestCase):
    """
    Point 4: a Content-Length beyond the bound is refused, never forwarded.
    """

    async def test_wrapping_length_refused(self) -> None:
        # 2**64 + 5: a backend parsing into 64 bits unsigned reads 5 and runs the rest.
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551621\r\n"
            b"Connection: close\r\n\r\nhello" + SMUGGLED
        )

    async def test_one_digit_over_the_bound_refused(self) -> None:
        digits = b"1" + b"0" * MAX_CONTENT_LENGTH_DIGITS
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\ncontent-LENGTH:  " + digits + b"\r\n\r\n"
        )

    async def test_padded_with_zeros_refused(self) -> None:
        zeros = b"0" * MAX_CONTENT_LENGTH_DIGITS
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + zeros + b"5\r\n"
            b"Connection: close\r\n\r\nhello"
        )

    async def test_thousands_of_digits_answered(self) -> None:
        # Twisted's int() raises past 4300 digits: the connection dropped unanswered.
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n"
        )

    async def test_length_within_the_bound_forwarded(self) -> None:
        raw = await self.exchange(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 00005\r\n"
            b"Connection: close\r\n\r\nhello"
        )
        [response] = parse_responses(raw)
        self.assertEqual((response.status, response.body), (200, b"ok"))
        self.assertEqual(self.forwarded(), [b"POST /x HTTP/1.1"])


class TransferEncodingTests(EdgeTestCase):
    """
    Point 9: any Transfer-Encoding other than exactly one C{chunked} on HTTP/1.1 is
    refused and the connection closed.
    """

    async def test_identity_alone(self) -> None:
        # Twisted ignored it: the body was read as the next request.
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + SMUGGLED
        )

    async def test_identity_with_content_length(self) -> None:
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n"
            b"Content-Length: 5\r\nConnection: close\r\n\r\nhello"
        )

    async def test_identity_then_chunked(self) -> None:
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )

    async def test_chunked_twice(self) -> None:
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
        )
        await self.assert_refused(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n"
            b"Connection: close\r\n\r\n0\r\n\r\n"
        )

    async def test_other_codings(self) -> None:
        for coding in (b"gzip, chunked", b"gzip", b""):
            await self.assert_refused(
                b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + b"\r\n"
                b"Connection: close\r\n\r\n0\r\n\r\n"
            )

    async def test_http10_chunked(self) -> None:
        # Twisted decoded it; RFC 9112 section 6.1: faulty framing.
        await self.assert_refused(
            b"POST /x HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n"
        )

    async def test_chunked_forwarded(self) -> None:
        raw = await self.exchange(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n"
            b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        [response] = parse_responses(raw)
        self.assertEqual((response.status, response.body), (200, b"ok"))
        self.assertEqual(self.forwarded(), [b"POST /x HTTP/1.1"])


class ConnectionTokenTests(EdgeTestCase):
    """
    Point 9: C{Connection} is a comma-separated list with optional whitespace; a
    C{close} anywhere in it closes the connection after the response.
    """

    async def assert_closes_after_one(self, connection: bytes) -> None:
        # The pipelined second request asks to close too, so that a gateway that kept the
        # connection open answers it and closes: two responses instead of one.
        raw = await self.exchange(
            b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: " + connection + b"\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        [response] = parse_responses(raw)
        self.assertEqual((response.status, response.body), (200, b"ok"))
        self.assertEqual(response.header("connection"), "close")
        self.assertEqual(self.forwarded(), [b"GET /a HTTP/1.1"])

    async def test_close_then_other_token(self) -> None:
        await self.assert_closes_after_one(b"close,foo")

    async def test_keep_alive_then_close(self) -> None:
        await self.assert_closes_after_one(b"keep-alive,close")

    async def test_whitespace_around_tokens(self) -> None:
        await self.assert_closes_after_one(b"foo ,\tCLOSE\t, bar")

    async def test_close_in_a_second_line(self) -> None:
        await self.assert_closes_after_one(b"keep-alive\r\nConnection: close")

    async def test_keep_alive_stays_open(self) -> None:
        client = await connect(self.port)
        client.send(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, closed\r\n\r\n")
        await client.until(response_complete)
        client.send(b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await client.closed
        self.assertEqual(len(parse_responses(client.received)), 2)
        self.assertEqual(self.forwarded(), [b"GET /a HTTP/1.1", b"GET /b HTTP/1.1"])


class ChannelFramingTests(Fixture, SynchronousTestCase):
    """
    The same rules on one channel, in memory: nothing is dispatched.
    """

    def test_refused_before_dispatch(self) -> None:
        for raw in (
            head(headers=("Content-Length: " + "9" * 16,)),
            head(headers=("Transfer-Encoding: identity",)),
            head(chunked=True, version="HTTP/1.0"),
        ):
            conn, handler = self.connect(ok)
            conn.send(raw + b"0\r\n\r\n")
            self.assertEqual(conn.transport.value(), REFUSED)
            self.assertTrue(conn.transport.disconnecting)
            self.assertEqual(handler.requests, [])

    def test_longest_length_dispatched(self) -> None:
        conn, handler = self.connect()
        conn.send(head(length=10**MAX_CONTENT_LENGTH_DIGITS - 1))
        [request] = handler.requests
        self.assertEqual(request.body.length, 10**MAX_CONTENT_LENGTH_DIGITS - 1)
