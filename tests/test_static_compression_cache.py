"""
The static cache of compressed bodies (C{Gateway.spec.compression.staticCacheSize},
L{edgegw.compression.static_cache}): a static file is compressed once per file version
and coding per process, and a hit sends exactly the bytes a miss does.

Over real sockets on 127.0.0.1; each coding decoded by its own library. How often a body
is compressed is counted through the codings' table (L{codings.CODINGS}), which the
compression policy reads when the configuration loads: a counting coding put there
before the gateway is built is the one its responses use.
"""

from __future__ import annotations

import os
import random
from typing import Any

import attrs
from twisted.internet import reactor as _reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.compression import codings, response_coding
from edgegw.compression.static_cache import ENTRY_OVERHEAD, StaticBodyCache
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.support.configs import GATEWAY, problems_of, write_tree
from tests.support.encodings import CODINGS, Reply, decode, exchange
from tests.support.h2client import connect_h2, listen_tls
from tests.support.plugin_dists import install_plugins
from tests.support.processes import connections_closed, listen_local, port_of

reactor: Any = _reactor

MIB = 1024 * 1024


def text(seed: int, size: int) -> bytes:
    """
    C{size} bytes of text made of words drawn at random (C{seed}): compressible about
    as source code is (3-4:1), different for each seed.
    """
    rng = random.Random(seed)
    words = [
        bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 10)))
        for _ in range(2000)
    ]
    out = bytearray()
    while len(out) < size:
        out += b" ".join(rng.choice(words) for _ in range(12)) + b";\n"
    return bytes(out[:size])


APP = text(1, 48 * 1024)
"""Read and written at once by the static terminal (up to 64 KiB)."""

MEDIUM = text(2, 300 * 1024)
"""Over 256 KiB: streamed chunk by chunk without the cache, whole with it."""


class Counted:
    """
    The codings of L{codings.CODINGS} replaced, until the test ends, by ones that count
    their whole-body and streaming compressions.
    """

    def __init__(self, test: TestCase) -> None:
        self.whole: dict[str, int] = dict.fromkeys(CODINGS, 0)
        self.streams: dict[str, int] = dict.fromkeys(CODINGS, 0)
        for name in CODINGS:
            original = codings.CODINGS[name]
            test.addCleanup(codings.CODINGS.__setitem__, name, original)
            codings.CODINGS[name] = attrs.evolve(
                original,
                whole=self._whole(name, original.whole),
                encoder=self._encoder(name, original.encoder),
            )

    def _whole(self, name: str, whole: Any) -> Any:
        def counted(body: bytes) -> bytes:
            self.whole[name] += 1
            return bytes(whole(body))

        return counted

    def _encoder(self, name: str, encoder: Any) -> Any:
        def counted(size: int | None = None) -> Any:
            self.streams[name] += 1
            return encoder(size)

        return counted


class Caches:
    """
    The L{StaticBodyCache} each configuration loaded during the test made.
    """

    def __init__(self, test: TestCase) -> None:
        self.made: list[StaticBodyCache] = []
        made = self.made

        class Recorded(StaticBodyCache):
            def __init__(self, capacity: int) -> None:
                super().__init__(capacity)
                made.append(self)

        test.patch(response_coding, "StaticBodyCache", Recorded)


def serve(
    test: TestCase,
    compression: str,
    files: dict[str, bytes],
    static: str = "precompressed: []",
    more: str = "",
) -> tuple[Any, int, str]:
    """
    A gateway with C{Gateway.spec.compression: {compression}} and a static route C{/s/}
    (its prefix stripped, C{static}'s fields added) serving C{files}, and C{more}
    documents (C{ROOT} in them stands for the directory served).

    @return: The built gateway, its port and the directory served.
    """
    root = os.path.abspath(test.mktemp())
    for name, content in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(content)
    os.makedirs(root, exist_ok=True)
    documents = (
        GATEWAY
        + f"  compression: {compression}\n"
        + "---\nkind: Route\nmetadata: {name: s}\n"
        + f'spec: {{match: /s/, handler: {{type: static, dir: "{root}", stripPrefix: /s, '
        + f"{static}}}}}\n"
        + more.replace("ROOT", root)
    )
    tree = write_tree(test.mktemp(), {"a.yaml": documents})
    client = UpstreamClient(reactor)
    built = build_gateway(load_config(tree, {}), reactor, client)
    listening = listen_local(built.site)
    test.addCleanup(connections_closed)
    test.addCleanup(client.close)
    test.addCleanup(listening.stopListening)
    return built, port_of(listening), root


async def get(port: int, target: str, coding: str | None, *more: tuple[str, str]) -> Reply:
    """
    C{GET target} accepting only C{coding} (nothing when L{None}).
    """
    headers = [] if coding is None else [("Accept-Encoding", coding)]
    return await exchange(port, "GET", target, [*headers, *more])


class CachedBodyTests(TestCase):
    """
    What a client receives: the same bytes, head and framing on a hit as on a miss, and
    as compressing the whole file at once gives.
    """

    timeout = 60

    def assertWhole(self, reply: Reply, coding: str, identity: bytes) -> None:
        """
        C{reply} is C{identity} compressed whole with C{coding}, with its length.
        """
        self.assertEqual(reply.status, 200, reply.headers)
        self.assertEqual(reply.header("content-encoding"), coding)
        self.assertEqual(reply.header("content-length"), str(len(reply.body)))
        self.assertFalse(reply.chunked)
        self.assertIn("Accept-Encoding", reply.vary())
        self.assertIsNone(reply.header("accept-ranges"))
        self.assertEqual(decode(coding, reply.body), identity)
        self.assertEqual(reply.body, codings.CODINGS[coding].whole(identity))

    async def test_hit_sends_what_a_miss_sends(self) -> None:
        """
        Each coding: the first answer (compressed now) and the next (from the cache)
        are the same bytes with the same head: the file compressed whole, its variant
        C{ETag}.
        """
        _, port, _ = serve(self, "{}", {"app.js": APP, "mid.css": MEDIUM})
        for name, identity in (("app.js", APP), ("mid.css", MEDIUM)):
            plain = await get(port, f"/s/{name}", None)
            self.assertEqual(plain.body, identity)
            base = plain.header("etag")
            assert base is not None
            for coding in CODINGS:
                first = await get(port, f"/s/{name}", coding)
                second = await get(port, f"/s/{name}", coding)
                self.assertWhole(first, coding, identity)
                self.assertWhole(second, coding, identity)
                self.assertEqual(first.body, second.body)
                variant = base[:-1] + f'-{coding}"'
                for reply in (first, second):
                    self.assertEqual(reply.header("etag"), variant)
                    self.assertEqual(reply.header("last-modified"), plain.header("last-modified"))
                    self.assertEqual(reply.header("content-type"), plain.header("content-type"))

    async def test_compressed_once_per_file_and_coding(self) -> None:
        """
        Five requests for each of two files in each coding: one compression of each
        file in each coding. (Without the cache: one per request.)
        """
        counted = Counted(self)
        _, port, _ = serve(self, "{}", {"app.js": APP, "mid.css": MEDIUM})
        for _ in range(5):
            for coding in CODINGS:
                for name, identity in (("app.js", APP), ("mid.css", MEDIUM)):
                    reply = await get(port, f"/s/{name}", coding)
                    self.assertEqual(decode(coding, reply.body), identity)
        self.assertEqual(counted.whole, dict.fromkeys(CODINGS, 2))
        self.assertEqual(counted.streams, dict.fromkeys(CODINGS, 0))

    async def test_off(self) -> None:
        """
        C{staticCacheSize: 0}: nothing kept; every request compresses the file, and a
        file over 64 KiB is streamed (chunked) as before.
        """
        counted = Counted(self)
        caches = Caches(self)
        _, port, _ = serve(self, "{staticCacheSize: 0}", {"app.js": APP, "mid.css": MEDIUM})
        self.assertEqual(caches.made, [])
        for _ in range(3):
            reply = await get(port, "/s/app.js", "zstd")
            self.assertEqual(reply.header("content-length"), str(len(reply.body)))
            self.assertEqual(decode("zstd", reply.body), APP)
            streamed = await get(port, "/s/mid.css", "br")
            self.assertTrue(streamed.chunked)
            self.assertEqual(decode("br", streamed.body), MEDIUM)
        self.assertEqual(counted.whole["zstd"], 3)
        self.assertEqual(counted.streams["br"], 3)

    async def test_changed_file_gets_new_bytes(self) -> None:
        """
        A file written again with the same size and modification time (its change time
        moves), or replaced by a rename: the next answer is the new file's, compressed
        again.
        """
        counted = Counted(self)
        _, port, root = serve(self, "{}", {"app.js": APP})
        path = os.path.join(root, "app.js")
        old = await get(port, "/s/app.js", "zstd")
        self.assertEqual(decode("zstd", old.body), APP)
        stat = os.stat(path)
        same_size = text(3, len(APP))
        with open(path, "r+b") as stream:
            stream.write(same_size)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        rewritten = await get(port, "/s/app.js", "zstd")
        self.assertEqual(decode("zstd", rewritten.body), same_size)
        self.assertNotEqual(rewritten.header("etag"), old.header("etag"))
        replacement = text(4, len(APP) + 100)
        with open(path + ".new", "wb") as stream:
            stream.write(replacement)
        os.rename(path + ".new", path)
        renamed = await get(port, "/s/app.js", "zstd")
        self.assertEqual(decode("zstd", renamed.body), replacement)
        again = await get(port, "/s/app.js", "zstd")
        self.assertEqual(again.body, renamed.body)
        self.assertEqual(counted.whole["zstd"], 3)

    async def test_each_file_its_own_bytes(self) -> None:
        """
        Files of the same size and modification time, and one file under several
        names (its aliases, a link to it): each name answers its own file's bytes; the
        aliases of one file share its entry.
        """
        counted = Counted(self)
        files = {f"f{i}.js": text(10 + i, len(APP)) for i in range(4)}
        _, port, root = serve(self, "{}", files)
        stat = os.stat(os.path.join(root, "f0.js"))
        for name in files:
            os.utime(os.path.join(root, name), ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.symlink(os.path.join(root, "f1.js"), os.path.join(root, "link.js"))
        for _ in range(2):
            for name, identity in files.items():
                reply = await get(port, f"/s/{name}", "gzip")
                self.assertEqual(decode("gzip", reply.body), identity, name)
        for target in ("/s/./f1.js", "/s/x/../f1.js", "/s/f1.js?v=2", "/s/link.js", "/s//f1.js"):
            reply = await get(port, target, "gzip")
            if reply.status == 200:
                self.assertEqual(decode("gzip", reply.body), files["f1.js"], target)
        self.assertEqual(counted.whole["gzip"], len(files))

    async def test_bound_holds_under_many_files(self) -> None:
        """
        A client asking for many files in every coding (and with every spelling of
        C{Accept-Encoding}) fills the cache to its bound, never past it; what goes is
        what was used least recently.
        """
        caches = Caches(self)
        counted = Counted(self)
        files = {f"f{i:03d}.js": text(100 + i, 60 * 1024) for i in range(40)}
        _, port, _ = serve(self, f"{{staticCacheSize: {MIB}}}", files)
        [cache] = caches.made
        spellings = {
            "zstd": ("zstd", "zstd;q=1, gzip;q=0.5"),
            "br": ("br", "BR"),
            "gzip": ("gzip",),
        }
        for name in files:
            for coding in CODINGS:
                for accept in spellings[coding]:
                    reply = await get(port, f"/s/{name}", accept)
                    self.assertEqual(reply.header("content-encoding"), coding)
                    self.assertLessEqual(cache.size, MIB)
        self.assertLessEqual(cache.size, MIB)
        self.assertLess(len(cache), len(files) * len(CODINGS))
        self.assertEqual(counted.whole, dict.fromkeys(CODINGS, len(files)))
        # The newest entries are held; the oldest went first.
        before = dict(counted.whole)
        await get(port, "/s/f039.js", "gzip")
        self.assertEqual(counted.whole, before)
        await get(port, "/s/f000.js", "zstd")
        self.assertEqual(counted.whole["zstd"], before["zstd"] + 1)

    async def test_least_recently_used_goes(self) -> None:
        """
        A file asked for again stays while files not asked for since are evicted.
        """
        caches = Caches(self)
        counted = Counted(self)
        files = {f"f{i:03d}.js": text(200 + i, 100 * 1024) for i in range(60)}
        _, port, _ = serve(self, f"{{staticCacheSize: {MIB}}}", files)
        [cache] = caches.made
        for name in files:
            await get(port, f"/s/{name}", "br")
            await get(port, "/s/f000.js", "br")
        self.assertEqual(counted.whole["br"], len(files))
        self.assertLess(len(cache), len(files))
        await get(port, "/s/f001.js", "br")
        self.assertEqual(counted.whole["br"], len(files) + 1)

    async def test_large_file_not_cached(self) -> None:
        """
        A file over an eighth of the cache is streamed and compressed as before, on
        every request; the cache keeps nothing of it.
        """
        caches = Caches(self)
        counted = Counted(self)
        big = text(5, MIB // 8 + 1)
        _, port, _ = serve(self, f"{{staticCacheSize: {MIB}}}", {"big.js": big})
        [cache] = caches.made
        for _ in range(2):
            reply = await get(port, "/s/big.js", "zstd")
            self.assertTrue(reply.chunked)
            self.assertEqual(decode("zstd", reply.body), big)
        self.assertEqual(len(cache), 0)
        self.assertEqual(counted.streams["zstd"], 2)
        self.assertEqual(counted.whole["zstd"], 0)

    async def test_small_file_not_compressed(self) -> None:
        """
        Under C{minSize}, or of a type not compressed: as it is, nothing kept.
        """
        caches = Caches(self)
        _, port, _ = serve(self, "{}", {"tiny.js": APP[:500], "logo.png": APP})
        [cache] = caches.made
        for name, identity in (("tiny.js", APP[:500]), ("logo.png", APP)):
            reply = await get(port, f"/s/{name}", "zstd")
            self.assertIsNone(reply.header("content-encoding"))
            self.assertEqual(reply.body, identity)
        self.assertEqual(len(cache), 0)

    async def test_identity_client(self) -> None:
        """
        A client accepting no coding gets the file as it is, after others got it
        compressed from the cache.
        """
        _, port, _ = serve(self, "{}", {"app.js": APP, "mid.css": MEDIUM})
        for name, identity in (("app.js", APP), ("mid.css", MEDIUM)):
            await get(port, f"/s/{name}", "zstd")
            for accept in (None, "identity", "zstd;q=0"):
                reply = await get(port, f"/s/{name}", accept)
                self.assertIsNone(reply.header("content-encoding"))
                self.assertEqual(reply.header("content-length"), str(len(identity)))
                self.assertEqual(reply.body, identity)

    async def test_http2(self) -> None:
        """
        Over HTTP/2: the cached body, with its length, on a miss and a hit.
        """
        built, _, _ = serve(self, "{}", {"app.js": APP, "mid.css": MEDIUM})
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port)
        for name, identity in ((b"app.js", APP), (b"mid.css", MEDIUM)):
            for coding in CODINGS:
                bodies = []
                for _ in range(2):
                    response = await client.request(
                        b"GET", b"/s/" + name, [(b"accept-encoding", coding.encode())]
                    )
                    self.assertEqual(response.status, 200)
                    self.assertEqual(response.header(b"content-encoding"), coding.encode())
                    self.assertEqual(response.header(b"content-length"), b"%d" % len(response.body))
                    self.assertEqual(decode(coding, response.body), identity)
                    bodies.append(response.body)
                self.assertEqual(bodies[0], bodies[1])


class UnchangedAnswersTests(TestCase):
    """
    Range, C{HEAD}, 304 and precompressed sidecars answer as they did without the cache,
    before and after the file's compressed body is cached.
    """

    timeout = 60

    async def test_range_is_identity(self) -> None:
        counted = Counted(self)
        _, port, _ = serve(self, "{}", {"app.js": APP})
        await get(port, "/s/app.js", "zstd")
        reply = await get(port, "/s/app.js", "zstd", ("Range", "bytes=100-199"))
        self.assertEqual(reply.status, 206)
        self.assertIsNone(reply.header("content-encoding"))
        self.assertEqual(reply.body, APP[100:200])
        self.assertEqual(counted.whole["zstd"], 1)

    async def test_head(self) -> None:
        _, port, _ = serve(self, "{}", {"app.js": APP})
        for _ in range(2):
            get_reply = await get(port, "/s/app.js", "br")
            head = await exchange(port, "HEAD", "/s/app.js", [("Accept-Encoding", "br")])
            self.assertEqual(head.status, 200)
            self.assertEqual(head.body, b"")
            self.assertEqual(head.header("content-encoding"), "br")
            self.assertIsNone(head.header("content-length"))
            self.assertEqual(head.header("etag"), get_reply.header("etag"))

    async def test_not_modified(self) -> None:
        _, port, _ = serve(self, "{}", {"app.js": APP})
        first = await get(port, "/s/app.js", "gzip")
        variant = first.header("etag")
        assert variant is not None
        base = variant.replace("-gzip", "")
        for tag in (variant, base):
            reply = await get(port, "/s/app.js", "gzip", ("If-None-Match", tag))
            self.assertEqual(reply.status, 304, tag)
            self.assertEqual(reply.body, b"")
        changed = await get(port, "/s/app.js", "gzip", ("If-None-Match", '"other"'))
        self.assertEqual(changed.status, 200)
        self.assertEqual(changed.body, first.body)

    async def test_sidecar_served_as_it_is(self) -> None:
        """
        A precompressed sidecar is sent as it is, and never stored; a coding without a
        sidecar is compressed (once).
        """
        counted = Counted(self)
        sidecar = codings.CODINGS["br"].whole(APP)
        caches = Caches(self)
        _, port, _ = serve(
            self, "{}", {"app.js": APP, "app.js.br": sidecar}, static="precompressed: [br]"
        )
        [cache] = caches.made
        for _ in range(2):
            reply = await get(port, "/s/app.js", "br")
            self.assertEqual(reply.header("content-encoding"), "br")
            self.assertEqual(reply.body, sidecar)
            self.assertEqual(reply.header("accept-ranges"), "bytes")
        self.assertEqual(len(cache), 0)
        for _ in range(2):
            reply = await get(port, "/s/app.js", "zstd")
            self.assertEqual(decode("zstd", reply.body), APP)
        self.assertEqual(counted.whole["zstd"], 1)
        self.assertEqual(len(cache), 1)

    async def test_route_without_compression(self) -> None:
        """
        A static route with C{compress: false}: as it is, nothing kept.
        """
        caches = Caches(self)
        _, port, _ = serve(self, "{}", {"app.js": APP}, static="compress: false")
        [cache] = caches.made
        reply = await get(port, "/s/app.js", "zstd")
        self.assertIsNone(reply.header("content-encoding"))
        self.assertEqual(reply.body, APP)
        self.assertEqual(len(cache), 0)


class ResponsePluginTests(TestCase):
    """
    A response plugin that takes the body sees the file as it is, and what it writes is
    compressed; it is never stored under the file's entry, nor served from it.
    """

    timeout = 60

    def setUp(self) -> None:
        install_plugins(self)

    async def test_plugin_route_beside_a_plain_one(self) -> None:
        counted = Counted(self)
        caches = Caches(self)
        plugged = (
            "---\nkind: Route\nmetadata: {name: u, labels: {plugged: 'yes'}}\n"
            'spec: {match: /u/, handler: {type: static, dir: "ROOT", stripPrefix: /u, '
            "precompressed: []}}\n"
            "---\nkind: ResponsePlugin\nmetadata: {name: up}\n"
            "spec: {plugin: upper, config: {maxBodyBytes: 1000000}, "
            "selector: {matchLabels: {plugged: 'yes'}}}\n"
        )
        _, port, _ = serve(self, "{}", {"app.js": APP}, more=plugged)
        [cache] = caches.made
        rewritten = b"[" + APP.upper() + b"]"
        for _ in range(2):
            for coding in CODINGS:
                plain = await get(port, "/s/app.js", coding)
                self.assertEqual(decode(coding, plain.body), APP)
                self.assertIsNone(plain.header("x-upper"))
                upper = await get(port, "/u/app.js", coding)
                self.assertEqual(upper.header("x-upper"), str(len(APP)))
                self.assertEqual(upper.header("content-encoding"), coding)
                self.assertEqual(decode(coding, upper.body), rewritten)
        self.assertEqual(len(cache), len(CODINGS))
        # The plain route's once per coding; the plugin's body on every request.
        self.assertEqual(counted.whole, dict.fromkeys(CODINGS, 1 + 2))


class StaticBodyCacheTests(SynchronousTestCase):
    """
    The cache alone: its bound in bytes and its order of eviction.
    """

    def test_bound_and_order(self) -> None:
        cache = StaticBodyCache(10_000)
        self.assertEqual(cache.entry_limit, 1250)
        body = b"x" * (1000 - ENTRY_OVERHEAD)
        for i in range(10):
            self.assertEqual(cache.body((0, i, 0, 0, 0), "br", lambda: body), body)
            self.assertLessEqual(cache.size, 10_000)
        self.assertEqual(len(cache), 10)
        self.assertEqual(cache.size, 10_000)
        cache.body((0, 0, 0, 0, 0), "br", lambda: None)  # used: newest now
        cache.body((0, 10, 0, 0, 0), "br", lambda: body)
        self.assertEqual(len(cache), 10)
        self.assertEqual(cache.misses, 11)
        self.assertIsNone(cache.body((0, 1, 0, 0, 0), "br", lambda: None))
        self.assertIsNotNone(cache.body((0, 0, 0, 0, 0), "br", lambda: None))

    def test_entry_limit(self) -> None:
        """
        An eighth of the capacity, and never over 2 MiB (a miss is compressed in one
        call).
        """
        self.assertEqual(StaticBodyCache(MIB).entry_limit, MIB // 8)
        self.assertEqual(StaticBodyCache(16 * MIB).entry_limit, 2 * MIB)
        self.assertEqual(StaticBodyCache(32 * MIB).entry_limit, 2 * MIB)
        self.assertEqual(StaticBodyCache(1024 * MIB).entry_limit, 2 * MIB)

    def test_coding_is_part_of_the_key(self) -> None:
        cache = StaticBodyCache(10_000)
        version = (0, 1, 5, 0, 0)
        cache.body(version, "br", lambda: b"br body")
        self.assertEqual(cache.body(version, "gzip", lambda: b"gzip body"), b"gzip body")
        self.assertEqual(cache.body(version, "br", lambda: None), b"br body")

    def test_too_large_not_stored(self) -> None:
        cache = StaticBodyCache(10_000)
        big = b"x" * 1250
        self.assertEqual(cache.body((0, 1, 0, 0, 0), "br", lambda: big), big)
        self.assertEqual((len(cache), cache.size), (0, 0))

    def test_failed_compression_not_stored(self) -> None:
        cache = StaticBodyCache(10_000)
        self.assertIsNone(cache.body((0, 1, 0, 0, 0), "br", lambda: None))
        self.assertEqual((len(cache), cache.size), (0, 0))


class ConfigurationTests(SynchronousTestCase):
    """
    C{Gateway.spec.compression.staticCacheSize}: its default, 0, and its errors at the
    field.
    """

    def load(self, block: str) -> Any:
        tree = write_tree(self.mktemp(), {"a.yaml": GATEWAY + f"  compression: {block}\n"})
        return load_config(tree, {}).gateway.compression

    def test_default(self) -> None:
        self.assertEqual(self.load("{}").static_cache_size, 32 * MIB)
        self.assertEqual(self.load("{staticCacheSize: 0}").static_cache_size, 0)
        self.assertEqual(self.load(f"{{staticCacheSize: {MIB}}}").static_cache_size, MIB)

    def test_errors(self) -> None:
        where = 'document 1, Gateway "gw": spec.compression.staticCacheSize: '
        for value, message in (
            ("-1", "must be at least 0, got -1"),
            ('"32MiB"', "expected an integer, got a string"),
            ("1.5", "expected an integer, got a number"),
            ("true", "expected an integer, got a boolean"),
            (
                "65536",
                "65536 bytes would hold no file worth compressing: at least 1048576 (1 MiB), "
                "or 0 to keep none",
            ),
            (
                str(8 * 1024 * MIB),
                f"{8 * 1024 * MIB} bytes is more than 4294967296 (4 GiB): a second copy of "
                "the files in memory, per process",
            ),
        ):
            problems = problems_of(
                self.mktemp(),
                GATEWAY + f"  compression: {{staticCacheSize: {value}}}\n",
                gateway=False,
            )
            self.assertEqual(len(problems), 1, problems)
            self.assertIn(where + message, problems[0], value)
