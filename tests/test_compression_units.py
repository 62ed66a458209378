"""
The compression package's pure parts: C{Accept-Encoding} ranking, the codings' streams
and one-shot functions, the media-type match and the precondition rewriting.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli  # type: ignore[import-untyped]
import zstandard
from twisted.trial.unittest import SynchronousTestCase

from edgegw.compression.accept import AcceptedCodings
from edgegw.compression.codings import CODINGS
from edgegw.compression.response_coding import CompressionPolicy
from edgegw.seam import GatewayHeaders
from tests.support.encodings import decode

_DEFAULT_TYPES = ("text/*", "application/json", "image/svg+xml")


class AcceptedCodingsTests(SynchronousTestCase):
    """
    Which offered codings a client's C{Accept-Encoding} accepts, best first.
    """

    def setUp(self) -> None:
        self.accepted = AcceptedCodings(("zstd", "br", "gzip"))

    def ranked(self, *values: bytes) -> tuple[str, ...]:
        return self.accepted.ranked(list(values))

    def test_gateway_order_breaks_ties(self) -> None:
        self.assertEqual(self.ranked(b"gzip, deflate, br, zstd"), ("zstd", "br", "gzip"))
        self.assertEqual(self.ranked(b"gzip, br"), ("br", "gzip"))

    def test_client_q_values_decide(self) -> None:
        self.assertEqual(self.ranked(b"zstd;q=0.5, br;q=0.9, gzip"), ("gzip", "br", "zstd"))
        self.assertEqual(self.ranked(b"gzip;q=1.0, br;q=0.999"), ("gzip", "br"))

    def test_q_zero_refuses(self) -> None:
        self.assertEqual(self.ranked(b"br;q=0, gzip"), ("gzip",))
        self.assertEqual(self.ranked(b"br;q=0.000, gzip;Q=0"), ())

    def test_star(self) -> None:
        self.assertEqual(self.ranked(b"*"), ("zstd", "br", "gzip"))
        self.assertEqual(self.ranked(b"br;q=0, *;q=0.5"), ("zstd", "gzip"))
        self.assertEqual(self.ranked(b"gzip, *;q=0"), ("gzip",))
        self.assertEqual(self.ranked(b"*;q=0"), ())

    def test_identity_only(self) -> None:
        self.assertEqual(self.ranked(b"identity"), ())
        self.assertEqual(self.ranked(b""), ())
        self.assertEqual(self.accepted.ranked(None), ())
        self.assertIsNone(self.accepted.best(None))

    def test_identity_refused_still_gets_identity(self) -> None:
        # Nothing acceptable: the body goes as it is (no 406).
        self.assertEqual(self.ranked(b"identity;q=0, deflate"), ())

    def test_aliases_case_and_spaces(self) -> None:
        self.assertEqual(self.ranked(b"X-GZIP"), ("gzip",))
        self.assertEqual(self.ranked(b"  BR ; q = 0.8 ,GZip;q=0.9"), ("gzip", "br"))

    def test_bad_q_value_refuses_its_element(self) -> None:
        for field in (b"br;q=high", b"br;q=2", b"br;q=1.5", b"br;q=0.1234", b"br;q", b"br;q="):
            self.assertEqual(self.ranked(field), (), field)

    def test_listed_twice_lower_wins(self) -> None:
        self.assertEqual(self.ranked(b"br, br;q=0, gzip"), ("gzip",))

    def test_several_fields_are_one_list(self) -> None:
        self.assertEqual(self.ranked(b"gzip", b"br;q=0.5"), ("gzip", "br"))

    def test_other_parameters_ignored(self) -> None:
        self.assertEqual(self.ranked(b"br;level=9;q=0.5, gzip;x=y"), ("gzip", "br"))

    def test_answers_are_cached_within_a_bound(self) -> None:
        for index in range(1000):
            self.ranked(b"gzip;q=0.%d" % (index % 10) + b", x%d" % index)
        self.assertLessEqual(len(self.accepted._cache), 256)
        long_field = b"gzip, " + b"x" * 1000
        self.assertEqual(self.ranked(long_field), ("gzip",))
        self.assertNotIn(long_field, self.accepted._cache)

    def test_overlong_field_is_not_read(self) -> None:
        # Thousands of elements, parsed on every request, would cost the gateway CPU.
        field = b"gzip, " + b"x;q=0.5, " * 200
        self.assertGreater(len(field), 1024)
        self.assertEqual(self.ranked(field), ())


class CodingsTests(SynchronousTestCase):
    """
    Each coding's streaming encoder and one-shot function give what its library decodes
    to the original bytes.
    """

    body = b"".join(b'{"id": %d, "name": "item %d", "ok": true},\n' % (i, i) for i in range(5000))

    def test_whole(self) -> None:
        for name, coding in CODINGS.items():
            encoded = coding.whole(self.body)
            self.assertLess(len(encoded), len(self.body) // 4, name)
            self.assertEqual(decode(name, encoded), self.body, name)

    def test_whole_small_and_empty(self) -> None:
        for name, coding in CODINGS.items():
            for body in (b"", b"x", b"abc" * 10):
                self.assertEqual(decode(name, coding.whole(body)), body, name)

    def test_stream_flushes_every_piece(self) -> None:
        for name, coding in CODINGS.items():
            encoder = coding.encoder(None)
            pieces = [self.body[i : i + 7000] for i in range(0, len(self.body), 7000)]
            step: Callable[[bytes], bytes]
            if name == "gzip":
                step = zlib.decompressobj(31).decompress
            elif name == "br":
                step = brotli.Decompressor().process
            else:
                step = zstandard.ZstdDecompressor().decompressobj().decompress
            out = []
            decoded = b""
            for piece in pieces:
                encoded = encoder.compress(piece)
                self.assertTrue(encoded, name)
                out.append(encoded)
                # What was sent so far decodes to everything given so far.
                decoded += step(encoded)
                self.assertEqual(decoded, b"".join(pieces[: len(out)]), name)
            out.append(encoder.finish())
            self.assertEqual(decode(name, b"".join(out)), self.body, name)

    def test_streams_at_once_keep_apart(self) -> None:
        """
        Encoders of one coding fed in turn (as an HTTP/2 connection's streams, or two
        connections, interleave their writes) each produce their own stream; one that
        finished leaves nothing behind for the next (zstd's compressors are reused).
        Found by the page-load benchmark: Chromium failed zstd scripts over HTTP/2.
        """
        bodies = [self.body, self.body[::-1], self.body.upper()]
        for name, coding in CODINGS.items():
            for _ in range(2):
                encoders = [coding.encoder(None) for _ in bodies]
                outputs: list[list[bytes]] = [[] for _ in bodies]
                for start in range(0, len(self.body), 16384):
                    for body, encoder, out in zip(bodies, encoders, outputs, strict=True):
                        out.append(encoder.compress(body[start : start + 16384]))
                for encoder, out in zip(encoders, outputs, strict=True):
                    out.append(encoder.finish())
                for body, out in zip(bodies, outputs, strict=True):
                    self.assertEqual(decode(name, b"".join(out)), body, name)

    def test_known_length_stream(self) -> None:
        for name, coding in CODINGS.items():
            encoder = coding.encoder(len(self.body))
            encoded = encoder.compress(self.body[:1000]) + encoder.compress(self.body[1000:])
            self.assertEqual(decode(name, encoded + encoder.finish()), self.body, name)

    def test_names(self) -> None:
        self.assertEqual(
            {(c.name, c.token, c.sidecar, c.etag_suffix) for c in CODINGS.values()},
            {
                ("zstd", b"zstd", ".zst", b"-zstd"),
                ("br", b"br", ".br", b"-br"),
                ("gzip", b"gzip", ".gz", b"-gzip"),
            },
        )


class _Request:
    def __init__(self, **fields: bytes) -> None:
        self.requestHeaders = GatewayHeaders()
        for name, value in fields.items():
            self.requestHeaders.setRawHeaders(name.replace("_", "-").encode(), [value])


class PolicyTests(SynchronousTestCase):
    """
    L{CompressionPolicy}: the types it compresses and the preconditions it rewrites.
    """

    def setUp(self) -> None:
        self.policy = CompressionPolicy(("zstd", "br", "gzip"), 1024, _DEFAULT_TYPES)

    def test_types(self) -> None:
        compressible = self.policy.compressible
        self.assertTrue(compressible(b"text/html"))
        self.assertTrue(compressible(b"Text/CSS; charset=utf-8"))
        self.assertTrue(compressible(b"application/json;charset=UTF-8"))
        self.assertTrue(compressible(b"IMAGE/SVG+XML"))
        self.assertFalse(compressible(b"image/png"))
        self.assertFalse(compressible(b"application/jsonp"))
        self.assertFalse(compressible(b"application/octet-stream"))
        # Even though text/* covers it.
        self.assertFalse(compressible(b"text/event-stream"))
        self.assertFalse(compressible(b"text/event-stream; charset=utf-8"))

    def test_offer_picks_the_client_preference(self) -> None:
        coding = self.policy.offer(_Request(accept_encoding=b"gzip, br"))
        assert coding.coding is not None
        self.assertEqual(coding.coding.name, "br")
        self.assertIsNone(self.policy.offer(_Request()).coding)

    def test_variant_tags_become_base_tags(self) -> None:
        request = _Request(
            accept_encoding=b"br",
            if_none_match=b'"abc-br", W/"weak-br", "other-gzip", "x"',
            if_match=b'"abc-br", W/"weak-br"',
        )
        self.policy.offer(request)
        headers = request.requestHeaders
        # If-None-Match compares weakly: the weak form of a variant is one too.
        self.assertEqual(
            headers.getRawHeaders(b"if-none-match"), [b'"abc", W/"weak", "other-gzip", "x"']
        )
        # If-Match compares strongly: a weak tag never matches, and is left.
        self.assertEqual(headers.getRawHeaders(b"if-match"), [b'"abc", W/"weak-br"'])

    def test_other_codings_tags_are_left(self) -> None:
        request = _Request(accept_encoding=b"gzip", if_none_match=b'"abc-br"')
        self.policy.offer(request)
        self.assertEqual(request.requestHeaders.getRawHeaders(b"if-none-match"), [b'"abc-br"'])
