"""
Compression on the fly end to end (issue 34): a gateway built from YAML on 127.0.0.1,
real backends, real clients over HTTP/1.1 and HTTP/2; every compressed body decoded by
its coding's own library (L{tests.support.encodings}) and compared byte for byte with
what the backend, the file, the api merge or the plugin produced.

The precompressed sidecars of the static handler and the configuration's errors are
tested in C{tests/test_precompressed.py}; the pieces (q-values, encoders, the policy) in
C{tests/test_compression_units.py}.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from edgegw.compression.response_coding import HOLD_LIMIT
from tests.support.backends import EndlessBody, RawBackend, RawConnection, RawRequest
from tests.support.configs import GATEWAY
from tests.support.encodings import (
    CODINGS,
    Reply,
    dechunk_prefix,
    decode,
    decode_prefix,
    exchange,
    parse_reply,
    request_bytes,
    serve_documents,
)
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls
from tests.support.plugin_dists import install_plugins
from tests.support.processes import listen_local, port_of
from tests.support.rawclient import RawClient, connect

reactor: Any = _reactor

TEXT = b"".join(
    b"%05d: the quick brown fox jumps over the lazy dog, %s\n" % (i, b"abcdefghij"[: i % 10])
    for i in range(400)
)
"""About 24 KiB of compressible text: a backend reads and writes it at once."""

BIG_TEXT = TEXT * 13
"""Over 256 KiB: a static file this size is streamed, not read whole (without the static
cache of compressed bodies)."""

SMALL_TEXT = TEXT[:100]
"""Under the default C{minSize} (1024)."""

PNG = bytes(range(256)) * 20
"""An image/png body (compressible bytes, but not a compressible type)."""

FILES = {
    "site/app.js": TEXT,
    "site/big.txt": BIG_TEXT,
    "site/logo.png": PNG,
}


def variant(tag: str, coding: str) -> str:
    """
    The variant of the strong entity tag C{tag} (C{"abc"} -> C{"abc-br"}).
    """
    assert tag.startswith('"') and tag.endswith('"'), tag
    return f'{tag[:-1]}-{coding}"'


async def wait_for(condition: Callable[[], object]) -> None:
    """
    Poll the real reactor until C{condition()} is true (never a pass/fail timing).
    """
    while not condition():
        await deferLater(reactor, 0.01, lambda: None)


# -- configuration -------------------------------------------------------------------


def route(name: str, match: str, handler: dict[str, Any], **spec: Any) -> str:
    """
    A Route document (JSON is YAML).
    """
    metadata: dict[str, Any] = {"name": name}
    labels = spec.pop("labels", None)
    if labels:
        metadata["labels"] = labels
    body = {"match": match, "handler": handler, **spec}
    return f"---\nkind: Route\nmetadata: {json.dumps(metadata)}\nspec: {json.dumps(body)}\n"


def plugin(kind: str, name: str, uses: str, config: dict[str, Any], **spec: Any) -> str:
    """
    A RequestPlugin or ResponsePlugin document.
    """
    body = {"plugin": uses, "config": config, **spec}
    return f"---\nkind: {kind}\nmetadata: {json.dumps({'name': name})}\nspec: {json.dumps(body)}\n"


def gateway_document(compression: dict[str, Any] | None = None) -> str:
    """
    The Gateway document, with C{compression} as its C{spec.compression} when given.
    """
    if compression is None:
        return GATEWAY
    return GATEWAY + f"  compression: {json.dumps(compression)}\n"


# -- the backend ---------------------------------------------------------------------


Page = Callable[[RawRequest, RawConnection], None]


def field(request: RawRequest, name: bytes) -> bytes | None:
    """
    The first value of field C{name} in a request the backend read.
    """
    for line in request.head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def method_of(request: RawRequest) -> bytes:
    """
    The request's method.
    """
    return request.request_line.split(b" ")[0]


def head_bytes(status: int, fields: list[tuple[bytes, bytes]]) -> bytes:
    """
    A response head.
    """
    lines = [b"HTTP/1.1 %d Status" % status, *(name + b": " + value for name, value in fields)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def whole(
    body: bytes = b"",
    content_type: bytes | None = b"text/plain",
    fields: list[tuple[bytes, bytes]] | None = None,
    status: int = 200,
) -> Page:
    """
    A page answered in one write: head (with C{Content-Length}) and body together.
    """

    def page(request: RawRequest, connection: RawConnection) -> None:
        head: list[tuple[bytes, bytes]] = []
        if content_type is not None:
            head.append((b"Content-Type", content_type))
        head.extend(fields or [])
        if status not in (204, 304):
            head.append((b"Content-Length", b"%d" % len(body)))
        sent = b"" if method_of(request) == b"HEAD" or status in (204, 304) else body
        connection.write(head_bytes(status, head) + sent)

    return page


def chunk(data: bytes) -> bytes:
    """
    One chunk of a chunked body.
    """
    return b"%x\r\n%s\r\n" % (len(data), data)


class Origin:
    """
    A raw backend on 127.0.0.1 answering by the last segment of the path from
    L{pages}; it records every request, and keeps the connections of the streams it
    started (L{streams}) for the test to write the rest.
    """

    def __init__(self, test: TestCase) -> None:
        self.pages: dict[bytes, Page] = {
            b"whole": whole(TEXT),
            b"small": whole(SMALL_TEXT),
            b"logo.png": whole(PNG, b"image/png"),
            b"chunked": self.chunked_at_once(TEXT, b"text/plain"),
            b"stream": self.stream_page(b"text/plain"),
        }
        self.requests: list[RawRequest] = []
        self.streams: list[RawConnection] = []
        self.raw = RawBackend(self._respond).start()
        test.addCleanup(lambda: ensureDeferred(self.raw.stop()))
        self.url = f"http://127.0.0.1:{self.raw.port}"

    def _respond(self, request: RawRequest, connection: RawConnection) -> None:
        self.requests.append(request)
        target = request.request_line.split(b" ")[1].split(b"?")[0]
        self.pages[target.rsplit(b"/", 1)[-1]](request, connection)

    def stream_page(
        self, content_type: bytes, fields: tuple[tuple[bytes, bytes], ...] = ()
    ) -> Page:
        """
        A chunked page whose head goes out at once; the test writes the chunks.
        """

        def page(request: RawRequest, connection: RawConnection) -> None:
            head = [(b"Content-Type", content_type), *fields, (b"Transfer-Encoding", b"chunked")]
            connection.write(head_bytes(200, head))
            self.streams.append(connection)

        return page

    @staticmethod
    def chunked_at_once(body: bytes, content_type: bytes) -> Page:
        """
        A chunked page written whole in a few chunks.
        """

        def page(request: RawRequest, connection: RawConnection) -> None:
            head = head_bytes(
                200, [(b"Content-Type", content_type), (b"Transfer-Encoding", b"chunked")]
            )
            third = len(body) // 3
            pieces = [body[:third], body[third : 2 * third], body[2 * third :]]
            connection.write(head + b"".join(chunk(p) for p in pieces) + b"0\r\n\r\n")

        return page


class CompressionTestCase(TestCase):
    """
    An L{Origin}, and gateways in front of it.
    """

    timeout = 30

    def setUp(self) -> None:
        self.origin = Origin(self)

    def serve(self, *routes: str, compression: dict[str, Any] | None = None) -> int:
        """
        A gateway with C{routes}, or by default C{/} proxied to the origin, C{/static/}
        serving L{FILES} (no sidecars) and C{GET /api/merged} merging two of the
        origin's JSON documents.
        """
        if not routes:
            routes = (
                route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
                route(
                    "s",
                    "/static/",
                    {
                        "type": "static",
                        "dir": "ROOT/site",
                        "stripPrefix": "/static",
                        "precompressed": [],
                    },
                ),
                route(
                    "a",
                    "GET /api/merged",
                    {
                        "type": "api",
                        "backends": [
                            {"group": "users", "upstream": self.origin.url, "path": "/users"},
                            {"group": "items", "upstream": self.origin.url, "path": "/items"},
                        ],
                    },
                    access={"auth": "public"},
                ),
            )
        return serve_documents(self, gateway_document(compression) + "".join(routes), FILES)

    async def get(
        self, port: int, target: str, accept: str | None, *more: tuple[str, str]
    ) -> Reply:
        """
        C{GET target} with C{Accept-Encoding: accept} (none when L{None}) and C{more}.
        """
        headers = [] if accept is None else [("Accept-Encoding", accept)]
        return await exchange(port, "GET", target, [*headers, *more])

    def assert_compressed(self, reply: Reply, coding: str, identity: bytes) -> None:
        """
        C{reply} is a 200 in C{coding} that decodes to exactly C{identity}, with
        C{Vary: Accept-Encoding}.
        """
        self.assertEqual(reply.status, 200, reply)
        self.assertEqual(reply.header("content-encoding"), coding, reply.headers)
        self.assertEqual(decode(coding, reply.body), identity)
        self.assertIn("accept-encoding", [member.lower() for member in reply.vary()])

    def assert_identity(self, reply: Reply, identity: bytes, vary: bool = True) -> None:
        """
        C{reply} is a 200 with the body C{identity} as it is, its C{Content-Length}
        intact, and C{Vary: Accept-Encoding} exactly when C{vary}.
        """
        self.assertEqual(reply.status, 200, reply)
        self.assertIsNone(reply.header("content-encoding"), reply.headers)
        self.assertEqual(reply.body, identity)
        self.assertEqual(reply.header("content-length"), str(len(identity)))
        members = [member.lower() for member in reply.vary()]
        if vary:
            self.assertEqual(members.count("accept-encoding"), 1, reply.headers)
        else:
            self.assertNotIn("accept-encoding", members)


# -- 1. each coding, whole and streamed, proxied -------------------------------------


class ProxiedCodingTests(CompressionTestCase):
    """
    A proxied body in each coding decodes to the backend's bytes.
    """

    async def test_whole_body_has_the_encoded_length(self) -> None:
        """
        A body the backend sends with its length in one piece goes out compressed
        with the compressed length (not chunked).
        """
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/whole", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertFalse(reply.chunked, reply.headers)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertLess(len(reply.body), len(TEXT))

    async def test_chunked_body(self) -> None:
        """
        A body the backend sends chunked (several chunks) goes out compressed and
        chunked, without a length.
        """
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/chunked", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertTrue(reply.chunked, reply.headers)
            self.assertIsNone(reply.header("content-length"))

    async def test_stream_flushed_piece_by_piece(self) -> None:
        """
        Each piece of a streamed body reaches the client, decodable, before the backend
        sends the next.
        """
        port = self.serve()
        pieces = [TEXT[:5000], TEXT[5000:15000], TEXT[15000:]]
        for coding in CODINGS:
            client = await connect(port)
            client.send(request_bytes("GET", "/stream", [("Accept-Encoding", coding)]))
            await wait_for(lambda: self.origin.streams)
            upstream = self.origin.streams.pop()
            sent = b""
            for piece in pieces:
                upstream.write(chunk(piece))
                sent += piece
                await client.until(_decodes_to(coding, sent))
            upstream.write(b"0\r\n\r\n")
            await client.closed
            reply = parse_reply(client.received)
            self.assert_compressed(reply, coding, TEXT)
            self.assertTrue(reply.chunked)

    async def test_digests_of_the_identity_body_dropped(self) -> None:
        """
        Digests of the identity body are dropped from a compressed answer, kept on the
        identity one.
        """
        digests = [
            (b"Content-MD5", b"Q2hlY2sgSW50ZWdyaXR5IQ=="),
            (b"Content-Digest", b"sha-256=:AAAA:"),
            (b"Repr-Digest", b"sha-256=:AAAA:"),
        ]
        self.origin.pages[b"digested"] = whole(TEXT, fields=digests)
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/digested", coding)
            self.assert_compressed(reply, coding, TEXT)
            for name, _ in digests:
                self.assertIsNone(reply.header(name.decode()), name)
        identity = await self.get(port, "/digested", None)
        for name, value in digests:
            self.assertEqual(identity.header(name.decode()), value.decode())

    async def test_gateway_order_breaks_ties(self) -> None:
        """
        A client accepting all three equally gets the gateway's first (zstd).
        """
        port = self.serve()
        reply = await self.get(port, "/whole", "gzip, br, zstd")
        self.assert_compressed(reply, "zstd", TEXT)


class HeldBodyTests(CompressionTestCase):
    """
    A proxied body of known length up to C{HOLD_LIMIT} that arrives in pieces is read
    whole, compressed at once and sent with its length; a longer one, or a static file a
    pull producer writes, streams; one that ends short of its length is a cut transfer.
    """

    def paced(self, body: bytes, pieces: int, declared: int | None = None) -> Page:
        """
        A page whose C{Content-Length} (C{declared}, else the body's) goes out with the
        head, then the body in C{pieces} writes a reactor turn apart (the last one
        closing the connection when the body is short of its length).
        """

        def page(request: RawRequest, connection: RawConnection) -> None:
            length = len(body) if declared is None else declared
            connection.write(
                head_bytes(
                    200, [(b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % length)]
                )
            )
            size = -(-len(body) // pieces)
            parts = [body[i : i + size] for i in range(0, len(body), size)]

            def send(index: int) -> None:
                if index == len(parts):
                    if declared is not None:
                        assert connection.transport is not None
                        connection.transport.loseConnection()
                    return
                connection.write(parts[index])
                reactor.callLater(0.01, send, index + 1)

            reactor.callLater(0.01, send, 0)

        return page

    async def test_held_until_whole_then_sent_with_its_length(self) -> None:
        body = TEXT * 4  # ~96 KiB
        self.assertLess(len(body), HOLD_LIMIT)
        self.origin.pages[b"paced"] = self.paced(body, 4)
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/paced", coding)
            self.assert_compressed(reply, coding, body)
            self.assertFalse(reply.chunked, reply.headers)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))

    async def test_longer_than_the_limit_streams(self) -> None:
        body = BIG_TEXT  # over 256 KiB
        self.assertGreater(len(body), HOLD_LIMIT)
        self.origin.pages[b"paced"] = self.paced(body, 4)
        port = self.serve()
        reply = await self.get(port, "/paced", "gzip")
        self.assert_compressed(reply, "gzip", body)
        self.assertTrue(reply.chunked, reply.headers)

    async def test_short_of_its_length_is_cut(self) -> None:
        """
        The backend closes before the length it announced: the client never gets a
        complete response it would trust.
        """
        body = TEXT * 2
        self.origin.pages[b"paced"] = self.paced(body, 2, declared=len(body) + 1000)
        port = self.serve()
        client = await connect(port)
        client.send(request_bytes("GET", "/paced", [("Accept-Encoding", "gzip")]))
        await client.closed
        # Held, nothing of it had gone out: the connection is dropped with nothing
        # (streamed, a head and part of a body would have come first).
        self.assertEqual(client.received, b"")

    async def test_pulled_file_between_the_limits_streams(self) -> None:
        """
        A static file over the one-read size and under C{HOLD_LIMIT} is written by a pull
        producer, which writes its next piece only once the last is sent: it streams
        (held, it would never complete). Without the static cache, which reads a file
        it keeps whole (tests/test_static_compression_cache.py).
        """
        body = TEXT * 5  # ~120 KiB: pulled, not read whole
        port = serve_documents(
            self,
            gateway_document({"staticCacheSize": 0})
            + route(
                "s",
                "/",
                {"type": "static", "dir": "ROOT/site", "precompressed": []},
            ),
            {"site/mid.txt": body},
        )
        for coding in CODINGS:
            reply = await self.get(port, "/mid.txt", coding)
            self.assert_compressed(reply, coding, body)
            self.assertTrue(reply.chunked, reply.headers)


def _decodes_to(coding: str, sent: bytes) -> Callable[[bytes], bool]:
    """
    Whether a chunked, C{coding}-compressed response whose start is given decodes to
    C{sent} so far.
    """
    return lambda data: _decoded_so_far(coding, data) == sent


def _decoded_so_far(coding: str, data: bytes) -> bytes:
    """
    What a chunked, C{coding}-compressed response whose start is C{data} decodes to.
    """
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep or f"content-encoding: {coding}".encode() not in head.lower():
        return b""
    return decode_prefix(coding, dechunk_prefix(rest)[0])


class H2CodingTests(TestCase):
    """
    Over HTTP/2: the same codings, the whole body with its compressed length, a stream
    without one.
    """

    timeout = 30
    tls_certificate: bytes

    async def test_whole_and_streamed(self) -> None:
        origin = Origin(self)
        built, _ = start_gateway(self, origin.url)
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port)
        for coding in CODINGS:
            response = await client.request(
                b"GET", b"/whole", [(b"accept-encoding", coding.encode())]
            )
            self.assertEqual(response.status, 200)
            self.assertEqual(response.header(b"content-encoding"), coding.encode())
            self.assertEqual(response.header(b"content-length"), b"%d" % len(response.body))
            self.assertIn(b"Accept-Encoding", response.header(b"vary") or b"")
            self.assertEqual(decode(coding, response.body), TEXT)
            streamed = await client.request(
                b"GET", b"/chunked", [(b"accept-encoding", coding.encode())]
            )
            self.assertEqual(streamed.status, 200)
            self.assertEqual(streamed.header(b"content-encoding"), coding.encode())
            self.assertIsNone(streamed.header(b"content-length"))
            self.assertEqual(decode(coding, streamed.body), TEXT)
        plain = await client.request(b"GET", b"/whole")
        self.assertIsNone(plain.header(b"content-encoding"))
        self.assertEqual(plain.body, TEXT)
        self.assertEqual(plain.header(b"vary"), b"Accept-Encoding")


# -- static, api, plugin answers -----------------------------------------------------


class OtherAnswersTests(CompressionTestCase):
    """
    Static files, api merges and plugin replies are compressed too.
    """

    def setUp(self) -> None:
        super().setUp()
        self.origin.pages[b"users"] = whole(
            json.dumps([{"id": i, "name": f"user {i}"} for i in range(100)]).encode(),
            b"application/json",
        )
        self.origin.pages[b"items"] = whole(
            json.dumps({"items": [f"item {i}" for i in range(100)]}).encode(),
            b"application/json",
        )

    async def test_static_file_read_whole(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/static/app.js", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertEqual(reply.header("content-type"), "text/javascript; charset=utf-8")

    async def test_static_file_streamed(self) -> None:
        # Without the static cache (which sends a file it keeps whole, with its length:
        # tests/test_static_compression_cache.py).
        port = self.serve(compression={"staticCacheSize": 0})
        for coding in CODINGS:
            reply = await self.get(port, "/static/big.txt", coding)
            self.assert_compressed(reply, coding, BIG_TEXT)
            self.assertTrue(reply.chunked)
            self.assertIsNone(reply.header("content-length"))

    async def test_api_merge(self) -> None:
        port = self.serve()
        identity = await self.get(port, "/api/merged", None)
        self.assertEqual(identity.status, 200)
        self.assertIn("Accept-Encoding", identity.vary())
        expected = {
            "users": [{"id": i, "name": f"user {i}"} for i in range(100)],
            "items": {"items": [f"item {i}" for i in range(100)]},
        }
        self.assertEqual(json.loads(identity.body), expected)
        for coding in CODINGS:
            reply = await self.get(port, "/api/merged", coding)
            self.assert_compressed(reply, coding, identity.body)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertEqual(reply.header("content-type"), "application/json")

    async def test_request_plugin_reply(self) -> None:
        install_plugins(self)
        port = self.serve(
            route("r", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
            plugin("RequestPlugin", "answer", "replier", {"body": TEXT.decode()}),
        )
        for coding in CODINGS:
            reply = await self.get(port, "/anything", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertEqual(reply.header("content-type"), "text/plain; charset=utf-8")
        self.assertEqual(self.origin.requests, [])


# -- 2. Vary, ETag, 304, Range, HEAD -------------------------------------------------


class VaryTests(CompressionTestCase):
    async def test_on_the_identity_answer(self) -> None:
        """
        A client that accepts no coding (no field, identity only) gets the body as it
        is, with C{Vary: Accept-Encoding}.
        """
        port = self.serve()
        for accept in (None, "identity"):
            self.assert_identity(await self.get(port, "/whole", accept), TEXT)
            self.assert_identity(await self.get(port, "/static/app.js", accept), TEXT)

    async def test_appended_to_the_upstream_vary(self) -> None:
        self.origin.pages[b"varies"] = whole(TEXT, fields=[(b"Vary", b"Origin")])
        port = self.serve()
        reply = await self.get(port, "/varies", "gzip")
        self.assert_compressed(reply, "gzip", TEXT)
        self.assertEqual(reply.vary(), ["Origin", "Accept-Encoding"])
        identity = await self.get(port, "/varies", None)
        self.assertEqual(identity.vary(), ["Origin", "Accept-Encoding"])

    async def test_not_duplicated(self) -> None:
        self.origin.pages[b"varies"] = whole(TEXT, fields=[(b"Vary", b"accept-encoding, Cookie")])
        port = self.serve()
        for accept in ("br", None):
            reply = await self.get(port, "/varies", accept)
            self.assertEqual(reply.vary(), ["accept-encoding", "Cookie"], accept)
        self.assert_compressed(await self.get(port, "/varies", "br"), "br", TEXT)

    async def test_star_left_alone(self) -> None:
        self.origin.pages[b"varies"] = whole(TEXT, fields=[(b"Vary", b"*")])
        port = self.serve()
        for accept in ("br", None):
            self.assertEqual((await self.get(port, "/varies", accept)).vary(), ["*"], accept)
        self.assertEqual((await self.get(port, "/varies", "br")).decoded(), TEXT)
        self.assertEqual((await self.get(port, "/varies", "br")).header("content-encoding"), "br")

    async def test_not_for_a_type_never_compressed(self) -> None:
        port = self.serve()
        for target in ("/logo.png", "/static/logo.png"):
            reply = await self.get(port, target, "gzip, br, zstd")
            self.assert_identity(reply, PNG, vary=False)
            self.assertEqual(reply.header("content-type"), "image/png")
        # Beside a compressed answer of the same route.
        self.assert_compressed(await self.get(port, "/whole", "gzip"), "gzip", TEXT)


class EntityTagTests(CompressionTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.origin.pages[b"strong"] = self.tagged(b'"abc"')
        self.origin.pages[b"weak"] = self.tagged(b'W/"abc"')

    def tagged(self, tag: bytes) -> Page:
        """
        A page with C{ETag: tag}, answering 304 to an C{If-None-Match} listing it.
        """

        def page(request: RawRequest, connection: RawConnection) -> None:
            listed = field(request, b"if-none-match")
            if listed is not None and tag in [t.strip() for t in listed.split(b",")]:
                whole(fields=[(b"ETag", tag)], status=304)(request, connection)
            else:
                whole(TEXT, fields=[(b"ETag", tag)])(request, connection)

        return page

    async def test_strong_tag_gets_a_variant_per_coding(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/strong", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertEqual(reply.header("etag"), f'"abc-{coding}"')
        self.assertEqual((await self.get(port, "/strong", None)).header("etag"), '"abc"')

    async def test_weak_tag_left_alone(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/weak", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertEqual(reply.header("etag"), 'W/"abc"')

    async def test_proxied_304_for_variant_and_base(self) -> None:
        """
        C{If-None-Match} with the variant reaches the backend as the base tag, and the
        304 carries the variant again; the base tag gives a 304 too.
        """
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/strong", coding, ("If-None-Match", f'"abc-{coding}"'))
            self.assertEqual((reply.status, reply.body), (304, b""), reply)
            self.assertEqual(reply.header("etag"), f'"abc-{coding}"')
            self.assertIsNone(reply.header("content-encoding"))
            self.assertIn("Accept-Encoding", reply.vary())
            self.assertEqual(field(self.origin.requests[-1], b"if-none-match"), b'"abc"')
            base = await self.get(port, "/strong", coding, ("If-None-Match", '"abc"'))
            self.assertEqual((base.status, base.body), (304, b""), base)
            self.assertIn("Accept-Encoding", base.vary())

    async def test_another_codings_variant_is_not_a_match(self) -> None:
        """
        The br variant does not validate the gzip representation: a 200 in gzip.
        """
        port = self.serve()
        reply = await self.get(port, "/strong", "gzip", ("If-None-Match", '"abc-br"'))
        self.assert_compressed(reply, "gzip", TEXT)
        self.assertEqual(reply.header("etag"), '"abc-gzip"')

    async def test_static_variant_and_304s(self) -> None:
        port = self.serve()
        base = (await self.get(port, "/static/app.js", None)).header("etag")
        assert base is not None
        for coding in CODINGS:
            reply = await self.get(port, "/static/app.js", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertEqual(reply.header("etag"), variant(base, coding))
            again = await self.get(
                port, "/static/app.js", coding, ("If-None-Match", variant(base, coding))
            )
            self.assertEqual((again.status, again.body), (304, b""), again)
            self.assertEqual(again.header("etag"), variant(base, coding))
            self.assertIsNone(again.header("content-encoding"))
            self.assertIn("Accept-Encoding", again.vary())
            by_base = await self.get(port, "/static/app.js", coding, ("If-None-Match", base))
            self.assertEqual((by_base.status, by_base.body), (304, b""), by_base)

    async def test_static_if_match_with_the_variant(self) -> None:
        """
        C{If-Match} with the variant holds for the file (200, compressed); another tag
        does not (412).
        """
        port = self.serve()
        base = (await self.get(port, "/static/app.js", None)).header("etag")
        assert base is not None
        for coding in CODINGS:
            reply = await self.get(
                port, "/static/app.js", coding, ("If-Match", variant(base, coding))
            )
            self.assert_compressed(reply, coding, TEXT)
            refused = await self.get(port, "/static/app.js", coding, ("If-Match", '"other"'))
            self.assertEqual(refused.status, 412)


class RangeAndHeadTests(CompressionTestCase):
    async def test_range_answered_from_identity(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/static/app.js", coding, ("Range", "bytes=100-199"))
            self.assertEqual((reply.status, reply.body), (206, TEXT[100:200]), reply)
            self.assertIsNone(reply.header("content-encoding"))
            self.assertEqual(reply.header("content-range"), f"bytes 100-199/{len(TEXT)}")
            self.assertEqual(reply.header("content-length"), "100")
        # Without the Range the same request is compressed.
        self.assert_compressed(await self.get(port, "/static/app.js", "gzip"), "gzip", TEXT)

    async def test_proxied_range_answered_from_identity(self) -> None:
        """
        A Range request through the proxy is never compressed: neither the backend's
        206, nor its whole 200 when it ignores the Range.
        """

        def ranged(request: RawRequest, connection: RawConnection) -> None:
            if field(request, b"range") == b"bytes=100-199":
                whole(
                    TEXT[100:200],
                    fields=[(b"Content-Range", b"bytes 100-199/%d" % len(TEXT))],
                    status=206,
                )(request, connection)
            else:
                whole(TEXT)(request, connection)

        self.origin.pages[b"ranged"] = ranged
        port = self.serve()
        for coding in CODINGS:
            reply = await self.get(port, "/ranged", coding, ("Range", "bytes=100-199"))
            self.assertEqual((reply.status, reply.body), (206, TEXT[100:200]), reply)
            self.assertIsNone(reply.header("content-encoding"))
            self.assertEqual(reply.header("content-length"), "100")
            ignored = await self.get(port, "/whole", coding, ("Range", "bytes=100-199"))
            self.assert_identity(ignored, TEXT)
            self.assert_compressed(await self.get(port, "/ranged", coding), coding, TEXT)

    async def test_accept_ranges_dropped_when_compressed(self) -> None:
        port = self.serve()
        identity = await self.get(port, "/static/app.js", None)
        self.assertEqual(identity.header("accept-ranges"), "bytes")
        for target in ("/static/app.js", "/static/big.txt"):
            for coding in CODINGS:
                reply = await self.get(port, target, coding)
                self.assertEqual(reply.header("content-encoding"), coding)
                self.assertIsNone(reply.header("accept-ranges"), (target, reply.headers))

    async def assert_head(self, port: int, target: str, etag: str | None) -> None:
        for coding in CODINGS:
            reply = await exchange(port, "HEAD", target, [("Accept-Encoding", coding)])
            self.assertEqual(reply.status, 200, reply)
            self.assertEqual(reply.header("content-encoding"), coding, (target, reply.headers))
            self.assertIsNone(reply.header("content-length"), (target, reply.headers))
            self.assertEqual(reply.raw, b"")
            self.assertIn("Accept-Encoding", reply.vary())
            if etag is not None:
                self.assertEqual(reply.header("etag"), variant(etag, coding))

    async def test_head_of_a_static_file(self) -> None:
        port = self.serve()
        base = (await self.get(port, "/static/app.js", None)).header("etag")
        await self.assert_head(port, "/static/app.js", base)

    async def test_head_of_a_proxied_answer(self) -> None:
        self.origin.pages[b"strong"] = whole(TEXT, fields=[(b"ETag", b'"abc"')])
        port = self.serve()
        await self.assert_head(port, "/strong", '"abc"')


# -- what is never compressed --------------------------------------------------------


class NeverCompressedTests(CompressionTestCase):
    async def test_already_encoded_upstream_body_untouched(self) -> None:
        gzipped = zlib.compress(TEXT, 9, 31)
        self.origin.pages[b"encoded"] = whole(gzipped, fields=[(b"Content-Encoding", b"gzip")])
        port = self.serve()
        for accept in ("br, zstd, gzip", "br"):
            reply = await self.get(port, "/encoded", accept)
            self.assertEqual(reply.status, 200)
            self.assertEqual(reply.header("content-encoding"), "gzip")
            self.assertEqual(reply.body, gzipped)
            self.assertEqual(reply.header("content-length"), str(len(gzipped)))
            self.assertIn("Accept-Encoding", reply.vary())

    async def test_no_transform(self) -> None:
        self.origin.pages[b"kept"] = whole(
            TEXT, fields=[(b"Cache-Control", b"public, no-transform")]
        )
        port = self.serve()
        for coding in CODINGS:
            self.assert_identity(await self.get(port, "/kept", coding), TEXT)

    async def test_event_stream_flushed_per_event(self) -> None:
        self.origin.pages[b"events"] = self.origin.stream_page(b"text/event-stream")
        port = self.serve()
        client = await connect(port)
        client.send(request_bytes("GET", "/events", [("Accept-Encoding", "gzip, br, zstd")]))
        await wait_for(lambda: self.origin.streams)
        upstream = self.origin.streams.pop()
        upstream.write(chunk(b"data: one\n\n"))
        first = await client.until(b"data: one\n\n")
        self.assertNotIn(b"data: two", first)
        # Event 2 goes out only once the client has event 1, as it was sent.
        upstream.write(chunk(b"data: two\n\n"))
        await client.until(b"data: two\n\n")
        upstream.write(b"0\r\n\r\n")
        await client.closed
        reply = parse_reply(client.received)
        self.assertEqual(reply.body, b"data: one\n\ndata: two\n\n")
        self.assertIsNone(reply.header("content-encoding"))
        self.assertNotIn("Accept-Encoding", reply.vary())
        # The same route compresses other types.
        self.assert_compressed(await self.get(port, "/whole", "gzip"), "gzip", TEXT)

    async def test_no_content(self) -> None:
        """
        A 204 (of a compressible type) is never compressed, even with no C{minSize}.
        """
        self.origin.pages[b"empty"] = whole(status=204)
        for compression in (None, {"minSize": 0}):
            port = self.serve(compression=compression)
            reply = await self.get(port, "/empty", "gzip")
            self.assertEqual((reply.status, reply.raw), (204, b""))
            self.assertIsNone(reply.header("content-encoding"))
            self.assertIsNone(reply.header("content-length"))
            self.assert_compressed(await self.get(port, "/whole", "gzip"), "gzip", TEXT)

    async def test_empty_body_with_no_min_size(self) -> None:
        """
        With C{minSize: 0} an empty 200 is either sent as it is or as a complete
        stream of its coding (never C{Content-Encoding} over no bytes at all).
        """
        self.origin.pages[b"nothing"] = whole(b"")
        port = self.serve(compression={"minSize": 0})
        for coding in CODINGS:
            reply = await self.get(port, "/nothing", coding)
            self.assertEqual(reply.status, 200)
            self.assertEqual(reply.decoded(), b"", reply)
            self.assertEqual(reply.header("content-length") or "0", str(len(reply.body)))
        self.assert_compressed(await self.get(port, "/small", "gzip"), "gzip", SMALL_TEXT)

    async def test_not_modified(self) -> None:
        self.origin.pages[b"same"] = whole(fields=[(b"ETag", b'"v1"')], status=304)
        port = self.serve()
        reply = await self.get(port, "/same", "gzip", ("If-None-Match", '"v1"'))
        self.assertEqual((reply.status, reply.raw), (304, b""))
        self.assertIsNone(reply.header("content-encoding"))
        self.assertIn("Accept-Encoding", reply.vary())

    async def test_under_min_size(self) -> None:
        port = self.serve()
        for coding in CODINGS:
            self.assert_identity(await self.get(port, "/small", coding), SMALL_TEXT)

    async def test_type_parameters_ignored(self) -> None:
        document = json.dumps({"rows": [TEXT.decode()]}).encode()
        self.origin.pages[b"data.json"] = whole(document, b"application/json; charset=utf-8")
        self.origin.pages[b"page.html"] = whole(TEXT, b"TEXT/HTML;charset=UTF-8")
        self.origin.pages[b"events"] = whole(TEXT, b"Text/Event-Stream; charset=utf-8")
        port = self.serve()
        for coding in CODINGS:
            self.assert_compressed(await self.get(port, "/data.json", coding), coding, document)
            self.assert_compressed(await self.get(port, "/page.html", coding), coding, TEXT)
            events = await self.get(port, "/events", coding)
            self.assert_identity(events, TEXT, vary=False)

    async def test_websocket_upgrade_unaffected(self) -> None:
        """
        An upgrade asked with C{Accept-Encoding} is tunnelled: its bytes pass as they
        are, both ways.
        """

        def upgrade(request: RawRequest, connection: RawConnection) -> None:
            connection.write(
                head_bytes(
                    101,
                    [
                        (b"Upgrade", b"websocket"),
                        (b"Connection", b"Upgrade"),
                        (b"Content-Type", b"text/plain"),
                    ],
                )
            )
            connection.takeover = connection.write

        self.origin.pages[b"ws"] = upgrade
        port = self.serve()
        client = await connect(port)
        client.send(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Accept-Encoding: gzip\r\n\r\n"
        )
        head = await client.until(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 101 "), head)
        self.assertNotIn(b"content-encoding", head.lower())
        client.received = b""
        client.send(TEXT)
        echoed = await client.until(lambda data: len(data) >= len(TEXT))
        self.assertEqual(echoed, TEXT)
        await client.close()
        self.assert_compressed(await self.get(port, "/whole", "gzip"), "gzip", TEXT)


# -- q-values ------------------------------------------------------------------------


class QValueTests(CompressionTestCase):
    async def test_client_q_values_decide(self) -> None:
        port = self.serve()
        for accept, coding in [
            ("br;q=0.5, gzip", "gzip"),
            ("gzip;q=0.1, zstd;q=0.2, br;q=0.3", "br"),
            ("gzip;q=0, *", "zstd"),
            ("zstd;q=0, br;q=0, *;q=0.5", "gzip"),
            ("x-gzip", "gzip"),
        ]:
            reply = await self.get(port, "/whole", accept)
            self.assert_compressed(reply, coding, TEXT)

    async def test_nothing_acceptable_is_identity(self) -> None:
        port = self.serve()
        for accept in ("*;q=0", "identity;q=0", "gzip;q=0, br;q=0, zstd;q=0", "compress"):
            self.assert_identity(await self.get(port, "/whole", accept), TEXT)


# -- configuration -------------------------------------------------------------------


class ConfigurationTests(CompressionTestCase):
    def proxy(self, name: str, match: str, **handler: Any) -> str:
        return route(name, match, {"type": "reverse-proxy", "upstream": self.origin.url, **handler})

    async def test_compress_false_on_a_route(self) -> None:
        port = self.serve(
            self.proxy("off", "/off/", compress=False),
            self.proxy("on", "/"),
            route(
                "files",
                "/static/",
                {
                    "type": "static",
                    "dir": "ROOT/site",
                    "stripPrefix": "/static",
                    "precompressed": [],
                    "compress": False,
                },
            ),
        )
        for coding in CODINGS:
            self.assert_identity(await self.get(port, "/off/whole", coding), TEXT, vary=False)
            self.assert_identity(await self.get(port, "/static/app.js", coding), TEXT, vary=False)
            self.assert_compressed(await self.get(port, "/whole", coding), coding, TEXT)

    async def test_disabled(self) -> None:
        off = self.serve(self.proxy("p", "/"), compression={"enabled": False})
        on = self.serve(self.proxy("p", "/"), compression={"enabled": True})
        for coding in CODINGS:
            self.assert_identity(await self.get(off, "/whole", coding), TEXT, vary=False)
            self.assert_compressed(await self.get(on, "/whole", coding), coding, TEXT)

    async def test_encodings(self) -> None:
        port = self.serve(self.proxy("p", "/"), compression={"encodings": ["gzip"]})
        self.assert_compressed(await self.get(port, "/whole", "br, gzip"), "gzip", TEXT)
        self.assert_compressed(await self.get(port, "/whole", "zstd, br, gzip"), "gzip", TEXT)
        self.assert_identity(await self.get(port, "/whole", "br, zstd"), TEXT)

    async def test_encodings_order_is_the_preference(self) -> None:
        port = self.serve(self.proxy("p", "/"), compression={"encodings": ["gzip", "br"]})
        self.assert_compressed(await self.get(port, "/whole", "zstd, br, gzip"), "gzip", TEXT)
        self.assert_compressed(await self.get(port, "/whole", "zstd, br"), "br", TEXT)

    async def test_types(self) -> None:
        self.origin.pages[b"thing"] = whole(TEXT, b"application/x-thing; v=1")
        port = self.serve(self.proxy("p", "/"), compression={"types": ["application/x-thing"]})
        self.assert_compressed(await self.get(port, "/thing", "gzip"), "gzip", TEXT)
        self.assert_identity(await self.get(port, "/whole", "gzip"), TEXT, vary=False)

    async def test_type_wildcard(self) -> None:
        self.origin.pages[b"thing"] = whole(TEXT, b"application/x-thing")
        port = self.serve(self.proxy("p", "/"), compression={"types": ["application/*"]})
        self.assert_compressed(await self.get(port, "/thing", "br"), "br", TEXT)
        self.assert_identity(await self.get(port, "/whole", "br"), TEXT, vary=False)

    async def test_min_size(self) -> None:
        low = self.serve(self.proxy("p", "/"), compression={"minSize": 50})
        high = self.serve(self.proxy("p", "/"), compression={"minSize": len(TEXT) + 1})
        exact = self.serve(self.proxy("p", "/"), compression={"minSize": len(TEXT)})
        for coding in CODINGS:
            reply = await self.get(low, "/small", coding)
            self.assert_compressed(reply, coding, SMALL_TEXT)
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assert_identity(await self.get(high, "/whole", coding), TEXT)
            self.assert_compressed(await self.get(exact, "/whole", coding), coding, TEXT)


# -- plugins see identity bytes ------------------------------------------------------


class PluginTests(CompressionTestCase):
    def setUp(self) -> None:
        super().setUp()
        install_plugins(self)

    async def test_response_plugin_sees_identity_and_its_body_is_compressed(self) -> None:
        port = self.serve(
            route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
            plugin("ResponsePlugin", "up", "upper", {"maxBodyBytes": 1_000_000}),
        )
        rewritten = b"[" + TEXT.upper() + b"]"
        for target in ("/whole", "/chunked"):
            for coding in CODINGS:
                reply = await self.get(port, target, coding)
                self.assert_compressed(reply, coding, rewritten)
                self.assertEqual(reply.header("x-upper"), str(len(TEXT)), target)

    async def test_header_plugin_on_a_compressed_stream(self) -> None:
        """
        A response plugin that does not want the body changes the head of a response
        still compressed (and streamed) after it.
        """
        port = self.serve(
            route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
            plugin("ResponsePlugin", "tag", "tagger", {"tag": "seen"}),
        )
        for coding in CODINGS:
            reply = await self.get(port, "/chunked", coding)
            self.assert_compressed(reply, coding, TEXT)
            self.assertTrue(reply.chunked)
            self.assertEqual(reply.header("x-tags"), "seen")

    async def test_body_limit_counts_the_request_body_as_sent(self) -> None:
        def echo(request: RawRequest, connection: RawConnection) -> None:
            whole(request.body)(request, connection)

        self.origin.pages[b"echo"] = echo
        port = self.serve(
            route("p", "/", {"type": "reverse-proxy", "upstream": self.origin.url}),
            plugin("RequestPlugin", "limit", "body-limit", {"maxBytes": 4096}),
        )
        sent = TEXT[:4096]
        for coding in CODINGS:
            reply = await exchange(port, "POST", "/echo", [("Accept-Encoding", coding)], sent)
            self.assert_compressed(reply, coding, sent)
            self.assertEqual(self.origin.requests[-1].body, sent)
        before = len(self.origin.requests)
        over = await exchange(port, "POST", "/echo", [("Accept-Encoding", "gzip")], TEXT[:4097])
        self.assertEqual((over.status, over.body), (413, b"payload too large\n"))
        self.assertEqual(len(self.origin.requests), before)


# -- backpressure --------------------------------------------------------------------


class BackpressureTests(TestCase):
    timeout = 60

    async def test_slow_client_pauses_a_compressed_stream(self) -> None:
        """
        A client that stops reading a large compressed stream stops the backend: what
        the gateway read of it is bounded by the buffers on the way, not the body.
        """
        total = 256 * 1024 * 1024
        # Incompressible for gzip (a 64 KiB piece repeated lies outside its 32 KiB
        # window): the compressed stream fills the buffers as the plain one would.
        noise = random.Random(34).randbytes(65536)
        bodies: list[EndlessBody] = []

        class Big(Resource):
            isLeaf = True

            def render(self, request: Request) -> int:
                request.setHeader(b"content-type", b"text/plain")
                body = EndlessBody(request, total)
                body.chunk = noise
                bodies.append(body)
                body.start()
                return NOT_DONE_YET

        site = Site(Big())
        site.log = lambda request: None  # type: ignore[method-assign]
        big_port = listen_local(site)
        self.addCleanup(big_port.stopListening)
        port = serve_documents(
            self,
            GATEWAY
            + route(
                "p",
                "/",
                {"type": "reverse-proxy", "upstream": f"http://127.0.0.1:{port_of(big_port)}"},
            ),
        )
        client: RawClient = await connect(port)
        client.send(
            b"GET /big HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        )
        head = await client.until(b"\r\n\r\n")
        transport: Any = client.transport
        transport.pauseProducing()  # from now on, the client reads nothing
        self.assertIn(b"\r\ncontent-encoding: gzip\r\n", head.partition(b"\r\n\r\n")[0].lower())
        self.assertIn(b"\r\ntransfer-encoding: chunked\r\n", head.lower())
        await wait_for(lambda: bodies and bodies[0].pauses)
        for _ in range(4):
            await deferLater(reactor, 0.1, lambda: None)
            self.assertLess(bodies[0].sent, 32 * 1024 * 1024)
        # Reading again lets the stream go on, still decodable.
        transport.resumeProducing()
        sent_before = bodies[0].sent
        await wait_for(lambda: bodies[0].sent > sent_before + 8 * 1024 * 1024)
        data = client.received.partition(b"\r\n\r\n")[2]
        prefix = decode_prefix("gzip", dechunk_prefix(data)[0])
        self.assertGreater(len(prefix), 0)
        self.assertEqual(prefix, (noise * (len(prefix) // len(noise) + 1))[: len(prefix)])
        transport.abortConnection()
        await client.closed
