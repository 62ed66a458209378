"""
An independent review of the static cache of compressed bodies (issue 34, ca036ec..9933034):
each test here is a finding, failing on the reviewed tree.

Over real sockets on 127.0.0.1; the gateway and its helpers are the cache's own tests'
(L{tests.test_static_compression_cache}).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import TestCase

from edgegw.server.h2 import stream as h2_stream
from tests.support.encodings import CODINGS, decode
from tests.support.h2client import connect_h2, listen_tls
from tests.test_static_compression_cache import Caches, get, serve, text

MIB = 1024 * 1024


class _CountingDeque(deque):  # type: ignore[type-arg]
    """
    A stream's queue of response bytes that counts the bytes put back at its head: what
    the connection's C{_send} copies when it sends part of a queued piece
    (C{pending[0] = chunk[window:]}).
    """

    copied = 0

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, bytes | bytearray):
            # A slice of bytes is a copy (of a memoryview, a view).
            _CountingDeque.copied += len(value)
        super().__setitem__(index, value)


class Http2LargeBodyTests(TestCase):
    """
    A large cached body over HTTP/2 is written in one piece (C{writeWhole}); the
    connection sends it one frame at a time, copying what is left of it after each frame.
    """

    timeout = 120

    async def test_large_cached_body_copied_once_at_most(self) -> None:
        """
        A 2 MiB script (the largest the default cache takes), compressed from the cache
        and sent over HTTP/2: the bytes the connection copies while slicing it into
        frames are at most the body's own length (each byte copied once, not once per
        frame sent before it). On the reviewed tree: 18,647,940 bytes copied for a
        789,901-byte body, on the miss and on the hit (23.6 times: quadratic in the body,
        over its 16 KiB frames); with C{staticCacheSize: 0} the same file, streamed in
        64 KiB pieces, copied 198,564 bytes for its 709,124-byte zstd body.
        """
        _CountingDeque.copied = 0
        self.patch(h2_stream, "deque", _CountingDeque)
        big = text(7, 2 * MIB)
        built, _, _ = serve(self, "{}", {"big.js": big})
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port)
        for _ in range(2):  # a miss, then a hit
            _CountingDeque.copied = 0
            response = await client.request(b"GET", b"/s/big.js", [(b"accept-encoding", b"gzip")])
            self.assertEqual(response.status, 200)
            self.assertEqual(response.header(b"content-encoding"), b"gzip")
            self.assertEqual(response.header(b"content-length"), b"%d" % len(response.body))
            self.assertEqual(decode("gzip", response.body), big)
            self.assertLessEqual(
                _CountingDeque.copied,
                len(response.body),
                f"{_CountingDeque.copied} bytes copied to send a {len(response.body)}-byte body",
            )

    async def test_tiny_windows_copy_no_more_than_they_send(self) -> None:
        """
        A client that grants its window one byte at a time (a 13-byte WINDOW_UPDATE
        for the stream and one for the connection, within the control-frame budget of
        500 a second) is sent one byte per grant; the connection copies no more than it
        sends. On the reviewed tree each grant copies the rest of the body: 12,842,550
        bytes for 20 grants (642 KB a grant for a 2 MiB script; up to 2 MiB for a poorly
        compressible one), ~25,000 times the bytes of the client's WINDOW_UPDATE frames,
        for any public static file the cache answers whole (before the cache, only whole
        bodies did: proxied ones of at most 256 KiB, api answers).
        """
        _CountingDeque.copied = 0
        self.patch(h2_stream, "deque", _CountingDeque)
        big = text(8, 2 * MIB)
        built, _, _ = serve(self, "{}", {"big.js": big})
        port = listen_tls(self, built.site)
        client = await connect_h2(self, port, auto_window=False)
        stream_id, response = client.start(b"GET", b"/s/big.js", [(b"accept-encoding", b"zstd")])
        # The first 64 KiB (the initial windows) arrive; then the server waits.
        await client.until(lambda: len(response.body) >= 65535)
        received = len(response.body)
        _CountingDeque.copied = 0
        grants = 20
        for _ in range(grants):
            client.h2.increment_flow_control_window(1, stream_id)
            client.h2.increment_flow_control_window(1)
            client.flush()
            received += 1
            await client.until(_received(response, received))
        self.assertEqual(len(response.body), 65535 + grants)
        self.assertLessEqual(
            _CountingDeque.copied,
            grants * 16384,
            f"{_CountingDeque.copied} bytes copied to send {grants} bytes",
        )


def _received(response: Any, length: int) -> Callable[[], bool]:
    """
    Whether C{response}'s body has reached C{length} bytes.
    """
    return lambda: len(response.body) >= length


class HeaderPluginTests(TestCase):
    """
    A response plugin's hooks see the head before the coding decides, and may forbid the
    transform: a route with one compresses per request, never from the cache (a headers
    plugin site-wide keeps the cache off its routes: documented, docs/architecture.md,
    "Compression"). The review found the docs saying only a filter that takes the body
    did.
    """

    timeout = 60

    async def test_a_plugins_no_transform_wins_over_a_cached_body(self) -> None:
        """
        The file is in the cache (through C{/s/}); on C{/p/}, whose response plugin sets
        C{Cache-Control: no-transform}, it is answered as it is.
        """
        caches = Caches(self)
        plugged = (
            "---\nkind: Route\nmetadata: {name: p, labels: {site: p}}\n"
            'spec: {match: /p/, handler: {type: static, dir: "ROOT", stripPrefix: /p, '
            "precompressed: []}}\n"
            "---\nkind: ResponsePlugin\nmetadata: {name: keep-as-is}\n"
            "spec: {plugin: headers, selector: {matchLabels: {site: p}}, "
            "config: {set: {Cache-Control: no-transform}}}\n"
        )
        app = text(1, 48 * 1024)
        _, port, _ = serve(self, "{}", {"app.js": app}, more=plugged)
        [cache] = caches.made
        reply = await get(port, "/s/app.js", "zstd")
        self.assertEqual(reply.header("content-encoding"), "zstd")
        self.assertEqual(len(cache), 1)
        reply = await get(port, "/p/app.js", "zstd")
        self.assertEqual(reply.header("cache-control"), "no-transform")
        self.assertIsNone(reply.header("content-encoding"))
        self.assertEqual(reply.body, app)


class BoundTests(TestCase):
    """
    The cache's bound counts each entry's body and 256 bytes (C{ENTRY_OVERHEAD}); what an
    entry holds besides its body is its key: two tuples, five integers and the file's real
    path, a string of its own per entry (each request resolves the path anew, so the
    entries of one file's codings hold three copies). None of the path's length is counted.
    """

    timeout = 60

    async def test_entries_hold_no_more_than_they_count(self) -> None:
        """
        Files of 1 KiB or more that compress to a few dozen bytes (a text file of one
        repeated line), about 300 characters deep, each asked for in every coding: the
        memory the entries hold (bodies, keys, paths; the dictionary's own table) is at
        most what the cache counts. On the reviewed tree: 99,247 bytes held against
        34,210 counted for these 120 entries (2.9 times). With tracemalloc over 20,000
        entries of 19-byte bodies: 612/678/1,558/4,558 bytes held an entry for paths of
        40/120/1,000/4,000 characters, 275 counted (2.2 to 16.5 times the bound).
        """
        caches = Caches(self)
        deep = "/".join(["assets-" + "d" * 32] * 5)
        files = {f"{deep}/f{i:03d}.txt": (b"line %d\n" % i) * 200 for i in range(40)}
        _, port, _ = serve(self, f"{{staticCacheSize: {MIB}}}", files)
        [cache] = caches.made
        for name, identity in files.items():
            for coding in CODINGS:
                reply = await get(port, f"/s/{name}", coding)
                self.assertEqual(decode(coding, reply.body), identity)
        self.assertEqual(len(cache), len(files) * len(CODINGS))
        entries = cache._entries
        held = sys.getsizeof(entries)
        seen: set[int] = set()
        for key, body in entries.items():
            # Each object once, however many entries share it.
            for part in (key, *key, *key[0], body):
                if id(part) not in seen:
                    seen.add(id(part))
                    held += sys.getsizeof(part)
        self.assertLessEqual(held, cache.size, f"{held} bytes held, {cache.size} counted")
