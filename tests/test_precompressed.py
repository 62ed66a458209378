"""
Precompressed sidecar files of the C{static} handler (C{precompressed}): C{app.js.br},
C{app.js.zst} and C{app.js.gz} served for C{app.js} to a client that accepts them, over
a real gateway on a loopback socket.

The sidecars are made here with each coding's own library at levels the gateway never
uses on the fly (brotli 11, zstd 19, gzip 9), so a body equal byte for byte to the file
can only be the file itself; every body is also decoded with its library and compared to
the original.
"""

from __future__ import annotations

import base64
import gzip
import os
import random
from collections.abc import Mapping

import brotli  # type: ignore[import-untyped]
import zstandard
from twisted.trial.unittest import TestCase
from twisted.web.http import datetimeToString

from tests.support.configs import GATEWAY
from tests.support.encodings import decode
from tests.support.gateways import serve_yaml
from tests.support.processes import connections_closed
from tests.support.raw_response import RawResponse, parse_response
from tests.support.rawclient import connect

# Every file of the tree gets this modification time (ns), sidecars included: a sidecar
# as new as its original is served.
MTIME_NS = 1_700_000_000 * 1_000_000_000

APP_JS = b"".join(b"export const value%d = compute(%d, 'app');\n" % (i, i * 7) for i in range(120))
INDEX = b"<!doctype html><title>app</title>" + b"<p>single-page app shell</p>\n" * 60
DOCS_INDEX = b"<!doctype html><title>docs</title>" + b"<p>documentation</p>\n" * 60
PNG = b"\x89PNG\r\n\x1a\n" + bytes(random.Random(7).getrandbits(8) for _ in range(3000))
SECRET = b"OUTSIDE-SECRET " * 200
ENV = b"ENV-SECRET=1\n" * 200
HIDDEN = b"HIDDEN-SECRET();\n" * 200
# Text that compresses to well over the handler's 64 KiB single-read limit, so that the
# sidecar streams through the file producer.
BIG_JS = base64.b64encode(random.Random(11).randbytes(300_000))

CACHE_CONTROL = b"public, max-age=600"
JS_TYPE = b"text/javascript; charset=utf-8"
HTML_TYPE = b"text/html; charset=utf-8"
CODINGS = ("br", "zstd", "gzip")
SUFFIX = {"br": ".br", "zstd": ".zst", "gzip": ".gz"}


def encode(coding: str, data: bytes) -> bytes:
    """
    C{data} compressed with coding C{coding}'s library, at a level the gateway does not use.
    """
    if coding == "br":
        out: bytes = brotli.compress(data, quality=11)
        return out
    if coding == "zstd":
        return zstandard.ZstdCompressor(level=19).compress(data)
    return gzip.compress(data, compresslevel=9, mtime=0)


def write(path: str, data: bytes, mtime_ns: int = MTIME_NS) -> None:
    """
    Create C{path} (and its parents) holding C{data}, modified at C{mtime_ns}.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def with_sidecars(path: str, data: bytes, codings: tuple[str, ...] = CODINGS) -> None:
    """
    Write C{path} and its sidecars for C{codings}, all with the same modification time.
    """
    write(path, data)
    for coding in codings:
        write(path + SUFFIX[coding], encode(coding, data))


def read(path: str) -> bytes:
    """
    The bytes of the file at C{path}.
    """
    with open(path, "rb") as f:
        return f.read()


class PrecompressedTestCase(TestCase):
    """
    A site tree with sidecars, and a gateway serving it as configured by each test.

    The tree: C{app.js} with all three sidecars, C{index.html} with a brotli one,
    C{docs/index.html} with a gzip one, C{logo.png} and C{plain.js} with none, and
    dotfiles with sidecars; a secret outside the root.
    """

    def setUp(self) -> None:
        base = os.path.abspath(self.mktemp())
        self.root = os.path.join(base, "site")
        self.outside = os.path.join(base, "outside")
        with_sidecars(self.path("app.js"), APP_JS)
        with_sidecars(self.path("index.html"), INDEX, ("br",))
        with_sidecars(self.path("docs", "index.html"), DOCS_INDEX, ("gzip",))
        write(self.path("logo.png"), PNG)
        write(self.path("plain.js"), APP_JS)
        with_sidecars(self.path(".env"), ENV)
        with_sidecars(self.path(".hidden.js"), HIDDEN)
        write(self.path("orphan.js.br"), encode("br", HIDDEN))
        write(os.path.join(self.outside, "secret.js.br"), encode("br", SECRET))
        self.addCleanup(connections_closed)

    def path(self, *names: str) -> str:
        """
        A path in the served tree.
        """
        return os.path.join(self.root, *names)

    def serve(self, handler: str = "", gateway: str = "") -> None:
        """
        Start a gateway with two static routes over the tree, both with C{cacheControl}:
        C{/} and C{/app/} (C{stripPrefix: /app}); C{handler} and C{gateway} are YAML
        lines added to both handlers and to the Gateway's spec.
        """
        routes = ""
        for name, match, strip in (("site", "/", ""), ("prefixed", "/app/", "stripPrefix: /app")):
            routes += (
                f"---\nkind: Route\nmetadata: {{name: {name}}}\nspec:\n"
                f'  match: "{match}"\n  handler:\n    type: static\n'
                f'    dir: "{self.root}"\n    cacheControl: "{CACHE_CONTROL.decode()}"\n'
            )
            for line in (strip, *handler.splitlines()):
                if line.strip():
                    routes += f"    {line.strip()}\n"
        extra = "".join(f"  {line.strip()}\n" for line in gateway.splitlines() if line.strip())
        self.port = serve_yaml(self, GATEWAY + extra + routes)

    async def fetch(
        self,
        target: bytes,
        accept: bytes | None = None,
        method: bytes = b"GET",
        headers: Mapping[bytes, bytes] | None = None,
    ) -> RawResponse:
        """
        One request on a fresh connection (C{Connection: close}).

        @param accept: The C{Accept-Encoding} value (L{None}: no such field).
        """
        lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
        if accept is not None:
            lines.append(b"Accept-Encoding: " + accept)
        lines.extend(name + b": " + value for name, value in (headers or {}).items())
        client = await connect(self.port)
        client.send(b"\r\n".join(lines) + b"\r\n\r\n")
        await client.closed
        answer = parse_response(client.received, method)
        length = answer.header(b"content-length")
        if length is not None and method != b"HEAD" and answer.status != 304:
            self.assertEqual(len(answer.body), int(length))
        return answer

    async def own_etag(self, target: bytes) -> bytes:
        """
        The C{ETag} of the file at C{target} served as itself to a client that accepts
        no coding.
        """
        answer = await self.fetch(target)
        self.assertEqual(answer.status, 200)
        etag = answer.header(b"etag")
        assert etag is not None
        return etag

    def assertSidecar(
        self,
        answer: RawResponse,
        coding: str,
        path: str,
        original: bytes,
        content_type: bytes = JS_TYPE,
        cache_control: bytes = CACHE_CONTROL,
    ) -> None:
        """
        C{answer} is the whole sidecar of coding C{coding} at C{path}, with the original's
        type and caching rule, the sidecar's own length and modification time.
        """
        sidecar = read(path + SUFFIX[coding])
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header(b"content-encoding"), coding.encode())
        self.assertEqual(answer.body, sidecar)
        self.assertEqual(decode(coding, answer.body), original)
        self.assertEqual(answer.header(b"content-length"), b"%d" % len(sidecar))
        self.assertEqual(answer.header(b"content-type"), content_type)
        self.assertEqual(answer.header(b"cache-control"), cache_control)
        self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")
        self.assertEqual(answer.header(b"accept-ranges"), b"bytes")
        self.assertEqual(
            answer.header(b"last-modified"),
            _http_date(os.stat(path + SUFFIX[coding]).st_mtime_ns),
        )

    def assertOriginal(self, answer: RawResponse, original: bytes = APP_JS) -> None:
        """
        C{answer} is the original file as it is (no coding).
        """
        self.assertEqual(answer.status, 200)
        self.assertIsNone(answer.header(b"content-encoding"))
        self.assertEqual(answer.body, original)
        self.assertEqual(answer.header(b"content-length"), b"%d" % len(original))


def _http_date(mtime_ns: int) -> bytes:
    out: bytes = datetimeToString(mtime_ns // 1_000_000_000)
    return out


class SidecarSelectionTests(PrecompressedTestCase):
    """
    Which sidecar a client gets: the codings it accepts, by its q-values, then the
    handler's C{precompressed} order.
    """

    async def test_each_sidecar_to_a_client_that_accepts_it(self) -> None:
        self.serve()
        original_etag = await self.own_etag(b"/app.js")
        seen = {original_etag}
        for coding in CODINGS:
            answer = await self.fetch(b"/app.js", coding.encode())
            self.assertSidecar(answer, coding, self.path("app.js"), APP_JS)
            etag = answer.header(b"etag")
            assert etag is not None
            # The sidecar's own tag: the one it has when requested by its own name.
            self.assertEqual(etag, await self.own_etag(b"/app.js" + SUFFIX[coding].encode()))
            self.assertNotIn(etag, seen)
            seen.add(etag)

    async def test_q_values_pick(self) -> None:
        self.serve()
        for accept, coding in (
            (b"br;q=0.5, gzip", "gzip"),
            (b"gzip;q=0.9, zstd", "zstd"),
            (b"br;q=0.1, zstd;q=0.2, gzip;q=0.3", "gzip"),
            (b"br;q=0, *", "zstd"),
            (b"x-gzip", "gzip"),
            (b"deflate, gzip;q=0.5", "gzip"),
        ):
            answer = await self.fetch(b"/app.js", accept)
            self.assertEqual(answer.header(b"content-encoding"), coding.encode(), accept)
            self.assertEqual(answer.body, read(self.path("app.js" + SUFFIX[coding])), accept)

    async def test_ties_follow_the_list_order(self) -> None:
        self.serve()
        for accept, coding in (
            (b"gzip, zstd, br", "br"),
            (b"*", "br"),
            (b"gzip, zstd", "zstd"),
            (b"gzip;q=0.5, zstd;q=0.5, br;q=0.4", "zstd"),
        ):
            answer = await self.fetch(b"/app.js", accept)
            self.assertEqual(answer.header(b"content-encoding"), coding.encode(), accept)

    async def test_configured_order_breaks_ties(self) -> None:
        self.serve("precompressed: [gzip, zstd, br]")
        answer = await self.fetch(b"/app.js", b"br, zstd, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)
        answer = await self.fetch(b"/app.js", b"br, zstd")
        self.assertSidecar(answer, "zstd", self.path("app.js"), APP_JS)

    async def test_missing_sidecar_falls_to_the_next_accepted(self) -> None:
        os.remove(self.path("app.js.br"))
        self.serve()
        answer = await self.fetch(b"/app.js", b"br, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_only_listed_codings(self) -> None:
        self.serve("precompressed: [gzip]\ncompress: false")
        answer = await self.fetch(b"/app.js", b"br, zstd, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)
        for accept in (b"br", b"zstd", b"br, zstd"):
            self.assertOriginal(await self.fetch(b"/app.js", accept))

    async def test_empty_list_serves_none(self) -> None:
        self.serve("precompressed: []\ncompress: false")
        for coding in CODINGS:
            self.assertOriginal(await self.fetch(b"/app.js", coding.encode()))
        self.assertOriginal(await self.fetch(b"/", b"br"), INDEX)
        # The control: the same tree with the default list.
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_client_accepting_none_gets_the_original(self) -> None:
        self.serve("compress: false")
        for accept in (None, b"", b"identity", b"deflate", b"br;q=0, zstd;q=0, gzip;q=0", b"*;q=0"):
            answer = await self.fetch(b"/app.js", accept)
            self.assertOriginal(answer)
            self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")

    async def test_large_sidecar_streams_whole(self) -> None:
        with_sidecars(self.path("big.js"), BIG_JS)
        self.serve()
        for coding in CODINGS:
            self.assertGreater(len(read(self.path("big.js" + SUFFIX[coding]))), 64 * 1024)
            answer = await self.fetch(b"/big.js", coding.encode())
            self.assertSidecar(answer, coding, self.path("big.js"), BIG_JS)


class StalenessTests(PrecompressedTestCase):
    """
    A sidecar older than its original (a build left it) is never served; one as new is.
    """

    def age(self, name: str, by_ns: int) -> None:
        path = self.path(name)
        mtime = os.stat(self.path("app.js")).st_mtime_ns - by_ns
        os.utime(path, ns=(mtime, mtime))

    async def test_older_sidecar_ignored_original_as_is(self) -> None:
        self.age("app.js.br", 1_000_000_000)
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertOriginal(answer)
        self.assertEqual(answer.header(b"etag"), await self.own_etag(b"/app.js"))
        self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")

    async def test_older_by_a_nanosecond_is_older(self) -> None:
        self.age("app.js.br", 1)
        self.serve("compress: false")
        self.assertOriginal(await self.fetch(b"/app.js", b"br"))
        # Rebuilt: as new as the original, it is served from the next request on.
        self.age("app.js.br", 0)
        answer = await self.fetch(b"/app.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_older_sidecar_ignored_original_compressed_on_the_fly(self) -> None:
        self.age("app.js.br", 1_000_000_000)
        self.serve()
        sidecar_etag = await self.own_etag(b"/app.js.br")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.header(b"content-encoding"), b"br")
        self.assertNotEqual(answer.body, read(self.path("app.js.br")))
        self.assertEqual(decode("br", answer.body), APP_JS)
        self.assertNotEqual(answer.header(b"etag"), sidecar_etag)
        # The fresh gzip sidecar beside it is still served as it is.
        answer = await self.fetch(b"/app.js", b"gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_head_when_the_original_is_compressed_on_the_fly(self) -> None:
        # The stale sidecar is passed over for GET and HEAD alike: both describe the
        # original compressed on the fly.
        self.age("app.js.br", 1_000_000_000)
        self.serve()
        get = await self.fetch(b"/app.js", b"br")
        head = await self.fetch(b"/app.js", b"br", method=b"HEAD")
        self.assertEqual(get.header(b"content-encoding"), b"br")
        self.assertEqual((head.status, head.body), (200, b""))
        for answer in (get, head):
            del answer.headers[b"date"], answer.headers[b"x-request-id"]
        # The compressed length is known only once the body is compressed, which a HEAD
        # does not do: its head is the GET's without Content-Length.
        self.assertNotIn(b"content-length", head.headers)
        del get.headers[b"content-length"]
        self.assertEqual(head.headers, get.headers)

    async def test_older_sidecar_falls_to_the_next_accepted(self) -> None:
        self.age("app.js.br", 1_000_000_000)
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_empty_sidecar_falls_to_the_next_accepted(self) -> None:
        # An empty file is no coding's stream: a build that left one behind must not
        # make the browser fail the script.
        with open(self.path("app.js.br"), "wb"):
            pass
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_equal_and_newer_are_served(self) -> None:
        self.age("app.js.gz", -1_000_000_000)
        self.serve("compress: false")
        self.assertEqual(
            os.stat(self.path("app.js.br")).st_mtime_ns,
            os.stat(self.path("app.js")).st_mtime_ns,
        )
        self.assertSidecar(await self.fetch(b"/app.js", b"br"), "br", self.path("app.js"), APP_JS)
        self.assertSidecar(
            await self.fetch(b"/app.js", b"gzip"), "gzip", self.path("app.js"), APP_JS
        )


class ConditionalAndRangeTests(PrecompressedTestCase):
    """
    Ranges, validators and C{HEAD} apply to the sidecar as the representation sent.
    """

    async def test_range_over_the_sidecar(self) -> None:
        self.serve()
        sidecar = read(self.path("app.js.br"))
        for value, start, end in (
            (b"bytes=0-9", 0, 10),
            (b"bytes=-5", len(sidecar) - 5, len(sidecar)),
            (b"bytes=7-", 7, len(sidecar)),
        ):
            answer = await self.fetch(b"/app.js", b"br", headers={b"Range": value})
            self.assertEqual(answer.status, 206, value)
            self.assertEqual(
                answer.header(b"content-range"), b"bytes %d-%d/%d" % (start, end - 1, len(sidecar))
            )
            self.assertEqual(answer.header(b"content-encoding"), b"br")
            self.assertEqual(answer.body, sidecar[start:end])
            self.assertEqual(answer.header(b"content-length"), b"%d" % (end - start))
            self.assertEqual(answer.header(b"content-type"), JS_TYPE)
            self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")

    async def test_range_past_the_sidecar_is_unsatisfiable(self) -> None:
        self.serve()
        size = len(read(self.path("app.js.br")))
        self.assertLess(size + 10, len(APP_JS))
        answer = await self.fetch(b"/app.js", b"br", headers={b"Range": b"bytes=%d-" % (size + 10)})
        self.assertEqual(answer.status, 416)
        self.assertEqual(answer.header(b"content-range"), b"bytes */%d" % size)

    async def test_if_range(self) -> None:
        self.serve()
        sidecar = read(self.path("app.js.br"))
        etag = await self.own_etag(b"/app.js.br")
        answer = await self.fetch(
            b"/app.js", b"br", headers={b"Range": b"bytes=0-3", b"If-Range": etag}
        )
        self.assertEqual((answer.status, answer.body), (206, sidecar[:4]))
        original_etag = await self.own_etag(b"/app.js")
        answer = await self.fetch(
            b"/app.js", b"br", headers={b"Range": b"bytes=0-3", b"If-Range": original_etag}
        )
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_if_none_match_with_the_sidecars_tag(self) -> None:
        self.serve()
        for coding in CODINGS:
            etag = (await self.fetch(b"/app.js", coding.encode())).header(b"etag")
            self.assertEqual(etag, await self.own_etag(b"/app.js" + SUFFIX[coding].encode()))
            assert etag is not None
            answer = await self.fetch(b"/app.js", coding.encode(), headers={b"If-None-Match": etag})
            self.assertEqual(answer.status, 304, coding)
            self.assertEqual(answer.body, b"")
            self.assertEqual(answer.header(b"etag"), etag)
            self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")
            self.assertEqual(answer.header(b"cache-control"), CACHE_CONTROL)

    async def test_if_none_match_listing_an_on_the_fly_variant_too(self) -> None:
        # A cache holding the original compressed on the fly (from before the sidecar was
        # deployed) and the sidecar lists both tags: the 304 names the sidecar's own.
        self.serve()
        sidecar_etag = await self.own_etag(b"/app.js.br")
        original_etag = await self.own_etag(b"/app.js")
        variant = original_etag[:-1] + b'-br"'
        for listed in (variant + b", " + sidecar_etag, sidecar_etag + b", " + variant):
            answer = await self.fetch(b"/app.js", b"br", headers={b"If-None-Match": listed})
            self.assertEqual(answer.status, 304)
            self.assertEqual(answer.header(b"etag"), sidecar_etag)

    async def test_if_modified_since_the_sidecar(self) -> None:
        self.serve()
        modified = _http_date(os.stat(self.path("app.js.gz")).st_mtime_ns)
        answer = await self.fetch(b"/app.js", b"gzip", headers={b"If-Modified-Since": modified})
        self.assertEqual(answer.status, 304)
        self.assertEqual(answer.header(b"etag"), await self.own_etag(b"/app.js.gz"))
        self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")

    async def test_tags_do_not_cross_representations(self) -> None:
        self.serve()
        sidecar_etag = (await self.fetch(b"/app.js", b"br")).header(b"etag")
        assert sidecar_etag is not None
        original_etag = await self.own_etag(b"/app.js")
        # The client now accepts nothing: the sidecar's tag does not validate the original.
        answer = await self.fetch(b"/app.js", headers={b"If-None-Match": sidecar_etag})
        self.assertOriginal(answer)
        # And the original's tag does not validate the sidecar.
        answer = await self.fetch(b"/app.js", b"br", headers={b"If-None-Match": original_etag})
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)
        answer = await self.fetch(b"/app.js", b"br", headers={b"If-Match": original_etag})
        self.assertEqual(answer.status, 412)
        answer = await self.fetch(b"/app.js", b"br", headers={b"If-Match": sidecar_etag})
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_head_has_the_gets_headers(self) -> None:
        self.serve()
        for coding in CODINGS:
            get = await self.fetch(b"/app.js", coding.encode())
            self.assertSidecar(get, coding, self.path("app.js"), APP_JS)
            head = await self.fetch(b"/app.js", coding.encode(), method=b"HEAD")
            self.assertEqual(head.status, 200)
            self.assertEqual(head.body, b"")
            for answer in (get, head):
                # Per response, not per representation.
                del answer.headers[b"date"], answer.headers[b"x-request-id"]
            self.assertEqual(head.headers, get.headers, coding)


class VaryTests(PrecompressedTestCase):
    """
    C{Vary: Accept-Encoding} on every file answer of a handler with sidecars (once), even
    where no sidecar exists and nothing is compressed on the fly.
    """

    async def assertVaried(self, accept: bytes | None) -> None:
        original_etag = await self.own_etag(b"/logo.png")
        for target, headers, status in (
            (b"/logo.png", {}, 200),
            (b"/logo.png", {b"Range": b"bytes=0-3"}, 206),
            (b"/logo.png", {b"If-None-Match": original_etag}, 304),
            (b"/plain.js", {}, 200),
            (b"/plain.js", {b"Range": b"bytes=0-3"}, 206),
            (b"/app.js", {b"Range": b"bytes=0-3"}, 206),
            (b"/app.js", {}, 200),
            (b"/", {}, 200),
            (b"/client/route", {}, 200),
        ):
            answer = await self.fetch(target, accept, headers=headers)
            self.assertEqual(answer.status, status, (target, headers))
            self.assertEqual(
                answer.headers.get(b"vary"), [b"Accept-Encoding"], (target, headers, accept)
            )
        answer = await self.fetch(b"/logo.png", accept, method=b"HEAD")
        self.assertEqual(answer.headers.get(b"vary"), [b"Accept-Encoding"])

    async def test_without_compression_on_the_fly(self) -> None:
        self.serve("compress: false")
        await self.assertVaried(None)
        await self.assertVaried(b"br, zstd, gzip")
        await self.assertVaried(b"deflate")
        # The control: without sidecars, the image's answer does not vary.
        self.serve("precompressed: []\ncompress: false")
        answer = await self.fetch(b"/logo.png", b"br")
        self.assertEqual(answer.status, 200)
        self.assertIsNone(answer.header(b"vary"))

    async def test_with_compression_on_the_fly_once(self) -> None:
        self.serve()
        await self.assertVaried(None)
        await self.assertVaried(b"br, zstd, gzip")


class LookupTests(PrecompressedTestCase):
    """
    Sidecars never change what another URL answers, nor what the lookup rules (dotfiles,
    traversal, links, regular files only) let through; the index and stripped prefixes
    get theirs.
    """

    async def test_a_sidecar_url_serves_that_file_as_itself(self) -> None:
        self.serve()
        for coding, content_type in (
            ("br", b"application/octet-stream"),
            ("zstd", b"application/octet-stream"),
            ("gzip", b"application/gzip"),
        ):
            name = b"/app.js" + SUFFIX[coding].encode()
            for accept in (None, coding.encode(), b"br, zstd, gzip"):
                answer = await self.fetch(name, accept)
                self.assertEqual(answer.status, 200)
                self.assertIsNone(answer.header(b"content-encoding"), (name, accept))
                self.assertEqual(answer.body, read(self.path("app.js" + SUFFIX[coding])))
                self.assertEqual(answer.header(b"content-type"), content_type)
                self.assertEqual(answer.header(b"vary"), b"Accept-Encoding")

    async def test_dotfiles_stay_hidden(self) -> None:
        self.serve()
        for target in (
            b"/.env",
            b"/.env.br",
            b"/.env.gz",
            b"/.hidden.js",
            b"/.hidden.js.br",
            b"/%2eenv",
            b"/%2ehidden.js",
        ):
            for accept in (None, b"br", b"gzip", b"br, zstd, gzip"):
                answer = await self.fetch(target, accept)
                self.assertEqual((answer.status, answer.body), (404, b"not found"), target)
                self.assertIsNone(answer.header(b"content-encoding"))
        # The control: a visible file beside them gets its sidecar.
        answer = await self.fetch(b"/app.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_sidecar_without_its_original(self) -> None:
        self.serve()
        for accept in (b"br", b"br, zstd, gzip"):
            answer = await self.fetch(b"/orphan.js", accept)
            self.assertEqual((answer.status, answer.body), (404, b"not found"))
        write(self.path("orphan.js"), HIDDEN)
        answer = await self.fetch(b"/orphan.js", b"br")
        self.assertSidecar(answer, "br", self.path("orphan.js"), HIDDEN)

    async def test_traversal(self) -> None:
        self.serve()
        for target in (
            b"/../outside/secret.js",
            b"/%2e%2e/outside/secret.js",
            b"/docs/../../outside/secret.js",
            b"/..%2foutside%2fsecret.js",
        ):
            answer = await self.fetch(target, b"br")
            # Refused (by the edge or the handler), or redirected to the cleaned path.
            self.assertIn(answer.status, (301, 400, 404), target)
            self.assertNotIn(b"SECRET", answer.body)
            self.assertIsNone(answer.header(b"content-encoding"))
        answer = await self.fetch(b"/docs/../app.js", b"br")
        if answer.status == 301:
            self.assertEqual(answer.header(b"location"), b"/app.js")
            answer = await self.fetch(b"/app.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_link_leaving_the_root_is_not_a_sidecar(self) -> None:
        os.remove(self.path("app.js.br"))
        os.symlink(os.path.join(self.outside, "secret.js.br"), self.path("app.js.br"))
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertOriginal(answer)
        # The next accepted coding's sidecar, when there is one.
        answer = await self.fetch(b"/app.js", b"br, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_link_to_a_directory_leaving_the_root(self) -> None:
        os.symlink(self.outside, self.path("out"))
        write(self.path("secret.js"), APP_JS)
        os.remove(self.path("app.js.br"))
        os.symlink("out/secret.js.br", self.path("app.js.br"))
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertOriginal(answer)
        answer = await self.fetch(b"/app.js", b"br, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_link_inside_the_root_is_followed(self) -> None:
        # The control for the two above: links are not refused as such.
        os.makedirs(self.path("build"))
        os.rename(self.path("app.js.br"), self.path("build", "app.js.br"))
        os.symlink(os.path.join("build", "app.js.br"), self.path("app.js.br"))
        self.serve("compress: false")
        answer = await self.fetch(b"/app.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_link_to_the_original_gets_the_originals_sidecar(self) -> None:
        # Sidecars are looked up beside the real path; the name asked picks the type.
        os.symlink("app.js", self.path("alias.js"))
        self.serve()
        answer = await self.fetch(b"/alias.js", b"br")
        self.assertSidecar(answer, "br", self.path("app.js"), APP_JS)

    async def test_directory_and_fifo_sidecars_ignored(self) -> None:
        os.remove(self.path("app.js.br"))
        os.mkdir(self.path("app.js.br"))
        os.utime(self.path("app.js.br"), ns=(MTIME_NS, MTIME_NS))
        os.remove(self.path("app.js.zst"))
        os.mkfifo(self.path("app.js.zst"))
        os.utime(self.path("app.js.zst"), ns=(MTIME_NS, MTIME_NS))
        self.serve("compress: false")
        for accept in (b"br", b"zstd", b"br, zstd"):
            self.assertOriginal(await self.fetch(b"/app.js", accept))
        answer = await self.fetch(b"/app.js", b"br, zstd, gzip")
        self.assertSidecar(answer, "gzip", self.path("app.js"), APP_JS)

    async def test_index_sidecar(self) -> None:
        self.serve()
        for target in (b"/", b"/index.html", b"/some/route", b"/client/deep/route"):
            answer = await self.fetch(target, b"br")
            self.assertSidecar(
                answer,
                "br",
                self.path("index.html"),
                INDEX,
                content_type=HTML_TYPE,
                cache_control=b"no-cache",
            )

    async def test_directory_index_sidecar(self) -> None:
        self.serve()
        for target in (b"/docs/", b"/docs", b"/docs/index.html"):
            answer = await self.fetch(target, b"gzip")
            self.assertSidecar(
                answer,
                "gzip",
                self.path("docs", "index.html"),
                DOCS_INDEX,
                content_type=HTML_TYPE,
                cache_control=b"no-cache",
            )

    async def test_strip_prefix(self) -> None:
        self.serve()
        answer = await self.fetch(b"/app/app.js", b"zstd")
        self.assertSidecar(answer, "zstd", self.path("app.js"), APP_JS)
        answer = await self.fetch(b"/app/", b"br")
        self.assertSidecar(
            answer,
            "br",
            self.path("index.html"),
            INDEX,
            content_type=HTML_TYPE,
            cache_control=b"no-cache",
        )
        answer = await self.fetch(b"/app/app.js.br", b"br")
        self.assertIsNone(answer.header(b"content-encoding"))
        self.assertEqual(answer.body, read(self.path("app.js.br")))


class CompressionOffTests(PrecompressedTestCase):
    """
    Sidecars are files compressed ahead: served whatever the compression on the fly.
    """

    async def test_route_compress_false(self) -> None:
        self.serve("compress: false")
        for coding in CODINGS:
            answer = await self.fetch(b"/app.js", coding.encode())
            self.assertSidecar(answer, coding, self.path("app.js"), APP_JS)

    async def test_gateway_compression_disabled(self) -> None:
        self.serve(gateway="compression: {enabled: false}")
        for coding in CODINGS:
            answer = await self.fetch(b"/app.js", coding.encode())
            self.assertSidecar(answer, coding, self.path("app.js"), APP_JS)
        # Nothing else is compressed: the file without a sidecar goes as it is.
        answer = await self.fetch(b"/plain.js", b"br")
        self.assertOriginal(answer)
