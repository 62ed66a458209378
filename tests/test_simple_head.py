"""
Tests for the one-pass parse of whole, simple request heads (L{parse_simple_head}) and
the channel's use of it: every head it takes must come out exactly as Twisted's line
parser reads it, and every other head must reach that parser.
"""

from __future__ import annotations

import random
import re
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from edgegw.server import channel as channel_module
from edgegw.server.channel import GatewayChannel
from edgegw.server.head import parse_simple_head
from edgegw.server.request import GatewayRequest
from tests.test_request import Connection, Handler, gateway_site, ok

PLAIN = b"GET /a/b?c=d HTTP/1.1\r\nHost: gateway.test\r\nAccept:  */*  \r\nX-Empty:\r\n\r\n"


class ParseTests(SynchronousTestCase):
    """
    What L{parse_simple_head} takes and what it leaves to Twisted.
    """

    def test_plain_head(self) -> None:
        self.assertEqual(
            parse_simple_head(PLAIN, 100),
            (
                b"GET",
                b"/a/b?c=d",
                b"HTTP/1.1",
                [(b"Host", b"gateway.test"), (b"Accept", b"*/*"), (b"X-Empty", b"")],
            ),
        )

    def test_values_stripped(self) -> None:
        """
        A value's trailing spaces and tabs go, as Twisted strips them, whichever field
        has them; a head without any keeps its values as they are.
        """
        head = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\t\r\nC: 3 \t \r\nD:  \t\r\nE: 5\r\n\r\n"
        parsed = parse_simple_head(head, 100)
        assert parsed is not None
        self.assertEqual(
            parsed[3], [(b"A", b"1"), (b"B", b"2"), (b"C", b"3"), (b"D", b""), (b"E", b"5")]
        )
        parsed = parse_simple_head(b"GET / HTTP/1.1\r\nA: 1\r\nB: x y\r\n\r\n", 100)
        assert parsed is not None
        self.assertEqual(parsed[3], [(b"A", b"1"), (b"B", b"x y")])

    def test_no_fields(self) -> None:
        self.assertEqual(
            parse_simple_head(b"GET / HTTP/1.0\r\n\r\n", 100), (b"GET", b"/", b"HTTP/1.0", [])
        )

    def test_declined(self) -> None:
        declined = [
            b"",
            b"\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n",  # not whole
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n",  # pipelined
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody",  # bytes after the head
            # Two heads, or a head and bytes that end like one: an empty line inside.
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n\r\n",
            b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a blank line first
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / http/1.1\r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
            b"GET /\x7f HTTP/1.1\r\n\r\n",
            b"GET /\xa0 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",  # space before the colon
            b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",  # obs-fold
            b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",  # bare LF
            b"GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",  # bare CR
            b"GET / HTTP/1.1\r\nHost: x\x00\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\x01\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad line x: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            b"GET / HTTP/1.1\r\n: empty name\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ]
        for data in declined:
            self.assertIsNone(parse_simple_head(data, 100), data)

    def test_field_limit(self) -> None:
        head = b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 5 + b"\r\n"
        self.assertIsNotNone(parse_simple_head(head, 5))
        self.assertIsNone(parse_simple_head(head, 4))


def _state(connection: Connection, handler: Handler) -> Any:
    """
    What a connection made of its input: each request as the handler saw it, what the
    client got (without the Date line), and whether the connection is closing.
    """
    requests = [
        (
            request.method,
            request.uri,
            request.clientproto,
            sorted(request.requestHeaders.getAllRawHeaders()),
            request.received_cookies,
        )
        for request in handler.requests
    ]
    sent = re.sub(rb"Date: [^\r]*\r\n", b"", connection.transport.value())
    return requests, sent, connection.transport.disconnecting


_METHODS = [b"GET", b"HEAD", b"OPTIONS", b"get", b"G@T", b"DELETE", b""]
_TARGETS = [b"/", b"/a?b=c", b"/a b", b"/%00", b"/\x7f", b"/\xaf", b"", b"*", b"http://h/x"]
_VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "]
_FIELDS = [
    b"Host: gateway.test",
    b"Host:gateway.test",
    b"Host: other.test",
    b"Accept: */*",
    b"X-Trail: v \t",
    b"X-Lead:\t v",
    b"X-Empty:",
    b"X-Empty: ",
    b"Cookie: a=b; c=d",
    b"Connection: close",
    b"Connection: keep-alive, Upgrade",
    b"Expect: 100-continue",
    b"Content-Length: 0",
    b"Content-Length: 5",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: identity",
    b" folded",
    b"Bad Name: x",
    b"NoColon",
    b"X-Nul: a\x00b",
    b"X-Ctl: a\x01b",
    b"X-Obs: caf\xe9",
    b"X-Bare: a\rb",
    b"X-Bare: a\nb",
    b"X_Under: x",
    b"x-mixed-CASE: v",
]


class ChannelTests(SynchronousTestCase):
    """
    The channel reads a simple head in one pass, exactly as Twisted's parser does.
    """

    def connect(self) -> tuple[Connection, Handler]:
        handler = Handler(ok)
        return Connection(gateway_site(handler, Clock())), handler

    def test_a_simple_head_skips_the_line_parser(self) -> None:
        connection, handler = self.connect()
        lines: list[bytes] = []
        original = GatewayChannel.lineReceived

        def counted(channel: GatewayChannel, line: bytes) -> None:
            lines.append(line)
            original(channel, line)

        self.patch(GatewayChannel, "lineReceived", counted)
        connection.send(PLAIN)
        connection.send(PLAIN)
        self.assertEqual(lines, [])
        self.assertEqual([r.status for r in connection.responses()], [200, 200])
        [first, second] = handler.requests
        self.assertIsInstance(first, GatewayRequest)
        self.assertEqual(first.requestHeaders.getRawHeaders(b"accept"), [b"*/*"])
        self.assertEqual(second.uri, b"/a/b?c=d")
        # A head in two reads takes Twisted's path.
        connection.send(PLAIN[:5])
        connection.send(PLAIN[5:])
        self.assertEqual(len(lines), 5)

    def test_same_as_the_line_parser(self) -> None:
        """
        Heads made at random from plain and faulty pieces: one connection gets each
        head in one read (the one-pass parse where it applies), another gets it in two
        (Twisted's parser always); the requests, the bytes sent back and the closing
        are the same.
        """
        chooser = random.Random(20261127)
        fast_taken = 0
        for n in range(3000):
            # Half the time from the first, plain, choices of each list.
            plain = chooser.random() < 0.5
            line = b" ".join(
                [
                    chooser.choice(_METHODS[:3] if plain else _METHODS),
                    chooser.choice(_TARGETS[:2] if plain else _TARGETS),
                    chooser.choice(_VERSIONS[:2] if plain else _VERSIONS),
                ]
            )
            fields = chooser.sample(_FIELDS[:12] if plain else _FIELDS, chooser.randint(0, 5))
            if chooser.random() < 0.3:
                fields = [b"Host: gateway.test", *(f for f in fields if not f.startswith(b"Host"))]
            data = b"\r\n".join([line, *fields]) + b"\r\n\r\n"
            if parse_simple_head(data, 100) is not None:
                fast_taken += 1
            one, one_handler = self.connect()
            two, two_handler = self.connect()
            one.send(data)
            two.send(data[:1])
            two.send(data[1:])
            self.assertEqual(_state(one, one_handler), _state(two, two_handler), (n, data))
        # Enough of both kinds to mean something.
        self.assertGreater(fast_taken, 300)
        self.assertLess(fast_taken, 2700)

    def test_a_head_cut_short_after_a_pipelined_answer(self) -> None:
        """
        A read holding a whole request and the start of the next, answered within that
        read: the next read goes on with Twisted's parser, never starts over in one
        pass (review finding: a line Twisted refuses would have been served, and the
        connection left answering for good).
        """
        connection, handler = self.connect()
        connection.send(b"GET /a HTTP/1.1\r\nHost: gateway.test\r\n\r\nGET /b HTTP/1.1\r\n")
        connection.send(b"GET /c HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        # "GET /c HTTP/1.1" is a header line without a colon to Twisted: 400, closed.
        self.assertEqual([r.status for r in connection.responses()], [200, 400])
        self.assertEqual([r.uri for r in handler.requests], [b"/a"])
        self.assertTrue(connection.transport.disconnecting)

    def test_not_while_closing(self) -> None:
        # TLS goes on delivering after loseConnection: Twisted parses one line and stops.
        connection, handler = self.connect()
        connection.transport.disconnecting = True
        connection.send(PLAIN)
        self.assertEqual(handler.requests, [])

    def test_same_as_the_line_parser_across_reads(self) -> None:
        """
        Streams of one to three heads, cut into reads at random (at head boundaries,
        inside heads), go the same way with the one-pass parse as without it.
        """
        chooser = random.Random(1127)
        plain_heads = [
            PLAIN,
            b"GET / HTTP/1.1\r\nHost: gateway.test\r\n\r\n",
            b"GET /x HTTP/1.0\r\nHost: gateway.test\r\nConnection: keep-alive\r\n\r\n",
            b"POST /p HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 3\r\n\r\nabc",
            b"GET /b HTTP/1.1\r\nHost: gateway.test\r\nX\r\n\r\n",
            b"GET /c HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n",
            b"GET /d HTTP/1.1\r\nHost: gateway.test\r\n folded\r\n\r\n",
            b"\r\nGET /e HTTP/1.1\r\nHost: gateway.test\r\n\r\n",
        ]
        # Pieces of heads too: a client may start a new request line in the middle of
        # a head, so that a read looks like a whole head to the one-pass parse.
        pieces = [*plain_heads, b"GET /f HTTP/1.1\r\n", b"Host: gateway.test\r\n", b"\r\n"]
        fragments = pieces[len(plain_heads) :]
        for n in range(2000):
            parts = chooser.choices(pieces, k=chooser.randint(1, 4))
            mode = chooser.random()
            if mode < 0.3:
                # A head and the start of another in one read, then whole heads.
                reads = [
                    chooser.choice(plain_heads) + chooser.choice(fragments),
                    *chooser.choices(plain_heads, k=chooser.randint(1, 2)),
                ]
            elif mode < 0.65:
                # Reads of whole pieces, grouped at random: a whole head may come in one
                # read, after one that ended in the middle of a head.
                reads = [parts[0]]
                for part in parts[1:]:
                    if chooser.random() < 0.5:
                        reads[-1] += part
                    else:
                        reads.append(part)
            else:
                stream = b"".join(parts)
                cuts = sorted(set(chooser.sample(range(1, len(stream)), min(2, len(stream) - 1))))
                bounds = zip([0, *cuts], [*cuts, len(stream)], strict=True)
                reads = [stream[a:b] for a, b in bounds]
            one, one_handler = self.connect()
            for data in reads:
                if one.transport.disconnecting:
                    break  # as a TCP transport stops reading
                one.send(data)
            with_fast = _state(one, one_handler)
            self.patch(channel_module, "parse_simple_head", lambda data, limit: None)
            two, two_handler = self.connect()
            for data in reads:
                if two.transport.disconnecting:
                    break  # as a TCP transport stops reading
                two.send(data)
            self.patch(channel_module, "parse_simple_head", parse_simple_head)
            self.assertEqual(with_fast, _state(two, two_handler), (n, reads))
