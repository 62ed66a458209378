"""
Tests for L{edgegw.handlers.static}: the handler rendered as a plain Resource (over real
loopback sockets, and in memory), and at the end of a real route's chain.

Most requests go out through a raw TCP client so that the request target reaches the
server byte for byte (no client-side normalisation of C{..}) and every status line and
header can be asserted exactly; the large downloads also go through treq.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, cast

import attrs
from treq.client import HTTPClient
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http import datetimeToString
from twisted.web.server import Request, Site
from twisted.web.test.requesthelper import DummyChannel

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.model import StaticHandlerSpec
from edgegw.handlers.static import SMALL_FILE_LIMIT, StaticHandler
from edgegw.handlers.static.lookup import StaticTree
from tests.support.configs import load_text
from tests.support.memory import MemoryClient
from tests.support.raw_response import RawResponse, parse_response

_reactor: Any = reactor

INDEX = b"<!doctype html><title>app</title>"
APP_JS = b"console.log('app');\n"
DIGITS = bytes(range(48, 58)) * 10
SECRETS = (b"ENV-SECRET", b"GIT-SECRET", b"OUTSIDE-SECRET", b"PASSWD-SECRET")
BIG_SIZE = 5 * 1024 * 1024
ETAG_FORMAT = re.compile(rb'^"[0-9a-f]+-[0-9a-f]+"$')
LONG_AGO = b"Sat, 01 Jan 2000 00:00:00 GMT"


class RawClient(Protocol):
    """
    Send prepared request bytes and collect the whole response until the server closes.

    @ivar received: Fires with all received bytes when the connection is closed.
    @ivar first_data: Fires with the first chunk of response bytes.
    """

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.chunks: list[bytes] = []
        self.received: Deferred[bytes] = Deferred()
        self.first_data: Deferred[bytes] = Deferred()

    @property
    def connection(self) -> Any:
        """
        The transport, untyped (the zope interfaces confuse mypy).
        """
        return self.transport

    def connectionMade(self) -> None:
        self.connection.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)
        if not self.first_data.called:
            self.first_data.callback(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.received.callback(b"".join(self.chunks))


class ObservedRequest(Request):
    """
    A plain L{Request} that tells its L{ObservedSite} when it has ended.
    """

    def process(self) -> None:
        super().process()
        site = cast(ObservedSite, self.site)
        # Asked after rendering, so that the handler's own reaction to the end of the
        # request (closing its file) has run when this fires.
        if self.finished:
            ended: Deferred[None] = Deferred()
            ended.callback(None)
        else:
            ended = self.notifyFinish().addErrback(lambda _: None)
        site.ended.append(ended)


class ObservedSite(Site):
    """
    A Site over a resource (here the StaticHandler itself, rendered by Twisted as any
    Resource is) that keeps one Deferred per request, firing when the request has ended
    (finished, or its connection lost).
    """

    requestFactory = ObservedRequest

    def __init__(self, resource: Any) -> None:
        super().__init__(resource)
        self.ended: list[Deferred[None]] = []


def write_file(path: str, data: bytes) -> None:
    """
    Create C{path} (and its parents) holding C{data}.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def open_descriptors_for(path: str) -> list[int]:
    """
    This process's file descriptors open on C{path} (Linux C{/proc}).
    """
    found = []
    real = os.path.realpath(path)
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target == real:
            found.append(int(name))
    return found


def build_request(method: bytes, target: bytes, headers: dict[bytes, bytes]) -> bytes:
    """
    An HTTP/1.1 request with C{Connection: close}, target sent verbatim.
    """
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines.extend(name + b": " + value for name, value in headers.items())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def listen(test: TestCase, site: Site) -> int:
    """
    Serve C{site} on 127.0.0.1 for the duration of C{test}; return the port.
    """
    port = _reactor.listenTCP(0, site, interface="127.0.0.1")
    test.addCleanup(port.stopListening)
    return int(port.getHost().port)


def connect(port: int, request: bytes) -> Deferred[RawClient]:
    """
    Open a raw connection to 127.0.0.1:C{port} that sends C{request}.
    """
    endpoint = TCP4ClientEndpoint(_reactor, "127.0.0.1", port)
    connected: Deferred[RawClient] = connectProtocol(endpoint, RawClient(request))
    return connected


def get_request(channel: DummyChannel, path: bytes) -> Request:
    """
    A real C{GET path HTTP/1.1} L{Request} on C{channel}, not yet answered.
    """
    request = Request(channel)
    request.method = b"GET"
    request.uri = request.path = path
    request.clientproto = b"HTTP/1.1"
    return request


@attrs.frozen
class SiteTree:
    """
    The files L{make_tree} laid out.

    @ivar root: The served directory.
    @ivar big: The contents of C{big.bin} (random, L{BIG_SIZE} bytes).
    """

    root: str
    big: bytes


def make_tree(base: str) -> SiteTree:
    """
    Lay out a site under C{base}/site with secrets next to it, outside the root.
    """
    root = os.path.join(base, "site")
    outside = os.path.join(base, "outside")
    write_file(os.path.join(root, "index.html"), INDEX)
    write_file(os.path.join(root, "app.js"), APP_JS)
    write_file(os.path.join(root, "style.css"), b"body { margin: 0 }\n")
    write_file(os.path.join(root, "about.html"), b"<p>about</p>")
    write_file(os.path.join(root, "module.wasm"), b"\0asm\x01\0\0\0")
    write_file(os.path.join(root, "data.unknownext"), b"opaque")
    write_file(os.path.join(root, "LICENSE"), b"MIT")
    write_file(os.path.join(root, "notes.txt"), b"notes")
    write_file(os.path.join(root, "digits.txt"), DIGITS)
    write_file(os.path.join(root, "empty.txt"), b"")
    write_file(os.path.join(root, "\u00e9t\u00e9.txt"), b"summer")
    write_file(os.path.join(root, "docs", "index.html"), b"docs index")
    write_file(os.path.join(root, "docs", "guide.txt"), b"guide")
    os.makedirs(os.path.join(root, "empty"))
    write_file(os.path.join(root, ".env"), b"ENV-SECRET=1")
    write_file(os.path.join(root, ".git", "config"), b"GIT-SECRET")
    write_file(os.path.join(root, "etc", "passwd"), b"PASSWD-SECRET")
    write_file(os.path.join(base, "secret.txt"), b"OUTSIDE-SECRET")
    write_file(os.path.join(outside, "secret.txt"), b"OUTSIDE-SECRET")
    os.symlink(os.path.join(base, "secret.txt"), os.path.join(root, "escape.txt"))
    os.symlink(outside, os.path.join(root, "escape-dir"))
    os.symlink("app.js", os.path.join(root, "inside-link.js"))
    os.symlink("docs", os.path.join(root, "docs-link"))
    os.mkfifo(os.path.join(root, "pipe.txt"))
    big = os.urandom(BIG_SIZE)
    write_file(os.path.join(root, "big.bin"), big)
    return SiteTree(root, big)


class StaticHandlerTests(TestCase):
    """
    The handler behind a real Site, with the default spec unless a test says otherwise.
    """

    def setUp(self) -> None:
        base = self.mktemp()
        os.makedirs(base)
        tree = make_tree(os.path.abspath(base))
        self.root = tree.root
        self.big = tree.big
        self.port = self.listen()

    def listen(self, **spec: Any) -> int:
        """
        Serve the tree with a handler built from C{spec}; return the port.
        """
        self.site = ObservedSite(StaticHandler(StaticHandlerSpec(dir=self.root, **spec)))
        return listen(self, self.site)

    async def fetch(
        self,
        target: bytes,
        method: bytes = b"GET",
        headers: dict[bytes, bytes] | None = None,
        port: int | None = None,
    ) -> RawResponse:
        """
        Send one request on a fresh connection and parse the response.
        """
        request = build_request(method, target, headers or {})
        client = await connect(self.port if port is None else port, request)
        response = parse_response(await client.received)
        length = response.header(b"content-length")
        if length is not None and method != b"HEAD" and response.status != 304:
            self.assertEqual(len(response.body), int(length))
        return response

    def assertNotFound(self, response: RawResponse) -> None:
        self.assertEqual(response.status, 404)
        self.assertEqual(response.body, b"not found")
        self.assertEqual(response.header(b"content-type"), b"text/plain; charset=utf-8")
        self.assertEqual(response.header(b"content-length"), b"9")
        self.assertIsNone(response.header(b"etag"))
        self.assertIsNone(response.header(b"cache-control"))

    # -- index, fallback, caching --------------------------------------------------------

    async def test_root_serves_index_without_caching(self) -> None:
        response = await self.fetch(b"/")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, INDEX)
        self.assertEqual(response.header(b"content-type"), b"text/html; charset=utf-8")
        self.assertEqual(response.header(b"content-length"), b"%d" % len(INDEX))
        self.assertEqual(response.header(b"cache-control"), b"no-cache")
        self.assertEqual(response.header(b"accept-ranges"), b"bytes")
        etag = response.header(b"etag")
        assert etag is not None
        self.assertRegex(etag, ETAG_FORMAT)
        mtime = os.stat(os.path.join(self.root, "index.html")).st_mtime
        self.assertEqual(response.header(b"last-modified"), datetimeToString(int(mtime)))

    async def test_a_large_file_streams_whole(self) -> None:
        """
        A file of several MiB arrives whole (written through the producer Twisted drives
        from timed calls; tests.test_daemon.LargeFileTests checks the same from a twistd
        process, where a stall between timers showed).
        """
        response = await self.fetch(b"/big.bin")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, self.big)

    test_a_large_file_streams_whole.timeout = 10  # type: ignore[attr-defined]

    async def test_index_requested_by_name_is_not_cached(self) -> None:
        response = await self.fetch(b"/index.html")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, INDEX)
        self.assertEqual(response.header(b"cache-control"), b"no-cache")

    async def test_index_never_gets_configured_cache_control(self) -> None:
        port = self.listen(cache_control="public, max-age=31536000, immutable")
        for target in (b"/", b"/index.html", b"/client/route", b"/docs/"):
            response = await self.fetch(target, port=port)
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.header(b"cache-control"), b"no-cache", target)

    async def test_asset_gets_configured_cache_control(self) -> None:
        port = self.listen(cache_control="public, max-age=31536000, immutable")
        response = await self.fetch(b"/app.js", port=port)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)
        self.assertEqual(response.header(b"cache-control"), b"public, max-age=31536000, immutable")

    async def test_asset_without_configured_cache_control(self) -> None:
        response = await self.fetch(b"/app.js")
        self.assertEqual(response.status, 200)
        self.assertIsNone(response.header(b"cache-control"))

    async def test_spa_fallback_for_client_route(self) -> None:
        for target in (b"/some/client/route", b"/login", b"/v1.2/settings", b"/route/"):
            response = await self.fetch(target)
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.body, INDEX, target)
            self.assertEqual(response.header(b"cache-control"), b"no-cache", target)
            self.assertEqual(response.header(b"content-type"), b"text/html; charset=utf-8", target)

    async def test_missing_file_with_extension(self) -> None:
        for target in (b"/missing.js", b"/assets/missing.css", b"/app.js/"):
            self.assertNotFound(await self.fetch(target))
        head = await self.fetch(b"/missing.js", method=b"HEAD")
        self.assertEqual(head.status, 404)
        self.assertEqual(head.header(b"content-length"), b"9")
        self.assertEqual(head.body, b"")

    async def test_spa_fallback_disabled(self) -> None:
        port = self.listen(spa_fallback=False)
        for target in (b"/some/client/route", b"/empty/", b"/missing.js"):
            self.assertNotFound(await self.fetch(target, port=port))
        response = await self.fetch(b"/", port=port)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, INDEX)

    async def test_fallback_without_root_index(self) -> None:
        os.remove(os.path.join(self.root, "index.html"))
        for target in (b"/", b"/client/route"):
            self.assertNotFound(await self.fetch(target))

    async def test_custom_index_name(self) -> None:
        write_file(os.path.join(self.root, "app.html"), b"custom index")
        port = self.listen(index="app.html", cache_control="max-age=60")
        for target in (b"/", b"/client/route", b"/app.html"):
            response = await self.fetch(target, port=port)
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.body, b"custom index", target)
            self.assertEqual(response.header(b"cache-control"), b"no-cache", target)
        response = await self.fetch(b"/index.html", port=port)
        self.assertEqual(response.header(b"cache-control"), b"max-age=60")

    async def test_directory_serves_its_index(self) -> None:
        for target in (b"/docs", b"/docs/", b"/docs-link/"):
            response = await self.fetch(target)
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.body, b"docs index", target)
            self.assertEqual(response.header(b"cache-control"), b"no-cache", target)
        response = await self.fetch(b"/docs/guide.txt")
        self.assertEqual(response.body, b"guide")

    async def test_directory_without_index_is_a_miss(self) -> None:
        for target in (b"/empty", b"/empty/"):
            response = await self.fetch(target)
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.body, INDEX, target)

    async def test_query_string_is_not_part_of_the_path(self) -> None:
        response = await self.fetch(b"/app.js?v=123&x=.env")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)

    async def test_percent_encoded_name(self) -> None:
        response = await self.fetch(b"/%C3%A9t%C3%A9.txt")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, b"summer")

    async def test_fifo_is_a_miss(self) -> None:
        self.assertNotFound(await self.fetch(b"/pipe.txt"))

    # -- stripPrefix -------------------------------------------------------------------------

    async def test_strip_prefix(self) -> None:
        port = self.listen(strip_prefix="/app")
        cases = [
            (b"/app/app.js", 200, APP_JS),
            (b"/app", 200, INDEX),
            (b"/app/", 200, INDEX),
            (b"/app/docs/guide.txt", 200, b"guide"),
            (b"/app/client/route", 200, INDEX),
            (b"/app/missing.js", 404, b"not found"),
            (b"/app/.env", 404, b"not found"),
        ]
        for target, status, body in cases:
            response = await self.fetch(target, port=port)
            self.assertEqual((response.status, response.body), (status, body), target)

    async def test_path_outside_strip_prefix_is_looked_up_unchanged(self) -> None:
        port = self.listen(strip_prefix="/app")
        response = await self.fetch(b"/docs/guide.txt", port=port)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, b"guide")

    # -- dotfiles, traversal, separators, symlinks ---------------------------------------

    async def test_dot_segments_are_rejected_before_the_filesystem(self) -> None:
        touched: list[str] = []
        realpath = os.path.realpath
        open_ = os.open
        lstat = os.lstat

        def spy_realpath(path: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append(str(path))
            return realpath(path, *args, **kwargs)

        def spy_open(path: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append(str(path))
            return open_(path, *args, **kwargs)

        def spy_lstat(path: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append(str(path))
            return lstat(path, *args, **kwargs)

        self.patch(os.path, "realpath", spy_realpath)
        self.patch(os, "open", spy_open)
        self.patch(os, "lstat", spy_lstat)
        targets = [
            b"/.env",
            b"/%2Eenv",
            b"/%2eenv",
            b"/.git/config",
            b"/.git/",
            b"/a/../etc/passwd",
            b"/docs/../../secret.txt",
            b"/../../../../../../../../etc/passwd",
            b"/%2e%2e/secret.txt",
            b"/%2E%2E/%2e%2E/secret.txt",
            b"/docs/%2e%2e/%2e%2e/secret.txt",
            b"/..",
            b"/.",
            b"/./index.html",
            b"/.well-known/client-route",
            b"/..%2fsecret.txt",
        ]
        for target in targets:
            response = await self.fetch(target)
            self.assertNotFound(response)
            for secret in SECRETS:
                self.assertNotIn(secret, response.body)
        self.assertEqual([path for path in touched if path.startswith(self.root)], [])

    async def test_hidden_separators_and_bad_encoding(self) -> None:
        # All extensionless, so each would get the index if it were treated as a miss.
        for target in (
            b"/docs%2fguide",
            b"/docs%2Fguide",
            b"/a%5cb",
            b"/a\\b",
            b"/a%00b",
            b"/%ff",
            b"/%c3",
        ):
            self.assertNotFound(await self.fetch(target))

    async def test_symlink_leaving_root(self) -> None:
        for target in (b"/escape.txt", b"/escape-dir/secret.txt"):
            response = await self.fetch(target)
            self.assertNotFound(response)
            self.assertNotIn(b"OUTSIDE-SECRET", response.body)

    async def test_symlink_inside_root(self) -> None:
        response = await self.fetch(b"/inside-link.js")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)
        self.assertEqual(response.header(b"content-type"), b"text/javascript; charset=utf-8")

    async def test_symlinked_root(self) -> None:
        link = os.path.join(os.path.dirname(self.root), "current")
        os.symlink(self.root, link)
        port = listen(self, Site(StaticHandler(StaticHandlerSpec(dir=link))))
        response = await self.fetch(b"/app.js", port=port)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)

    # -- methods ------------------------------------------------------------------------

    async def test_other_methods(self) -> None:
        for method in (b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"):
            response = await self.fetch(b"/app.js", method=method)
            self.assertEqual(response.status, 405, method)
            self.assertEqual(response.header(b"allow"), b"GET, HEAD")
            self.assertEqual(response.body, b"method not allowed")
            self.assertEqual(response.header(b"content-type"), b"text/plain; charset=utf-8")

    async def test_head_has_get_headers_and_no_body(self) -> None:
        get = await self.fetch(b"/app.js")
        head = await self.fetch(b"/app.js", method=b"HEAD")
        self.assertEqual(head.status, 200)
        self.assertEqual(head.body, b"")
        self.assertEqual(head.header(b"content-length"), b"%d" % len(APP_JS))
        without_date = {name: value for name, value in get.headers.items() if name != b"date"}
        self.assertEqual(
            {name: value for name, value in head.headers.items() if name != b"date"},
            without_date,
        )

    async def test_head_of_large_file(self) -> None:
        response = await self.fetch(b"/big.bin", method=b"HEAD")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"content-length"), b"%d" % BIG_SIZE)
        self.assertEqual(response.body, b"")

    # -- content types --------------------------------------------------------------------

    async def test_content_types(self) -> None:
        expected = {
            b"/app.js": b"text/javascript; charset=utf-8",
            b"/style.css": b"text/css; charset=utf-8",
            b"/about.html": b"text/html; charset=utf-8",
            b"/module.wasm": b"application/wasm",
            b"/notes.txt": b"text/plain; charset=utf-8",
            b"/data.unknownext": b"application/octet-stream",
            b"/LICENSE": b"application/octet-stream",
            b"/big.bin": b"application/octet-stream",
        }
        for target, content_type in expected.items():
            response = await self.fetch(target, method=b"HEAD")
            self.assertEqual(response.status, 200, target)
            self.assertEqual(response.header(b"content-type"), content_type, target)

    async def test_empty_file(self) -> None:
        response = await self.fetch(b"/empty.txt")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"content-length"), b"0")
        self.assertEqual(response.body, b"")

    # -- validators and conditional requests ------------------------------------------

    async def validators(self, target: bytes) -> tuple[bytes, bytes]:
        response = await self.fetch(target, method=b"HEAD")
        etag = response.header(b"etag")
        last_modified = response.header(b"last-modified")
        assert etag is not None and last_modified is not None
        return etag, last_modified

    def assertNotModified(self, response: RawResponse, etag: bytes, modified: bytes) -> None:
        self.assertEqual(response.status, 304)
        self.assertEqual(response.body, b"")
        self.assertEqual(response.header(b"etag"), etag)
        self.assertEqual(response.header(b"last-modified"), modified)
        self.assertIsNone(response.header(b"content-range"))

    async def test_etag_changes_with_the_file(self) -> None:
        etag, _ = await self.validators(b"/app.js")
        write_file(os.path.join(self.root, "app.js"), APP_JS + b"// more\n")
        changed, _ = await self.validators(b"/app.js")
        self.assertNotEqual(etag, changed)

    async def test_etag_is_the_same_on_every_host(self) -> None:
        # Issue 10, point 12: two hosts behind a load balancer hold the same files under
        # other inodes (and, after a git checkout, other modification times).
        other_base = os.path.abspath(self.mktemp())
        other = make_tree(other_base).root
        small = os.path.join(other, "app.js")
        os.utime(small, ns=(1_000_000_000, 1_000_000_000))
        big = os.path.join(other, "big.bin")
        write_file(big, self.big)
        stamp = os.stat(os.path.join(self.root, "big.bin")).st_mtime_ns
        os.utime(big, ns=(stamp, stamp))
        self.assertNotEqual(
            os.stat(small).st_ino, os.stat(os.path.join(self.root, "app.js")).st_ino
        )
        other_port = listen(self, ObservedSite(StaticHandler(StaticHandlerSpec(dir=other))))
        for target in (b"/app.js", b"/big.bin", b"/index.html"):
            here = await self.fetch(target, method=b"HEAD")
            there = await self.fetch(target, method=b"HEAD", port=other_port)
            self.assertEqual(here.header(b"etag"), there.header(b"etag"), target)
            self.assertRegex(here.header(b"etag") or b"", ETAG_FORMAT)
            # A validator from one host revalidates on the other.
            revalidated = await self.fetch(
                target, headers={b"If-None-Match": here.header(b"etag") or b""}, port=other_port
            )
            self.assertEqual(revalidated.status, 304, target)
        # The small file's tag follows its content, not its timestamps.
        self.assertNotEqual(
            (await self.fetch(b"/app.js", method=b"HEAD")).header(b"last-modified"),
            (await self.fetch(b"/app.js", method=b"HEAD", port=other_port)).header(
                b"last-modified"
            ),
        )

    async def test_small_files_with_same_size_and_time_differ(self) -> None:
        first = os.path.join(self.root, "a.txt")
        second = os.path.join(self.root, "b.txt")
        write_file(first, b"aaaa")
        write_file(second, b"bbbb")
        for path in (first, second):
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        etag_a, _ = await self.validators(b"/a.txt")
        etag_b, _ = await self.validators(b"/b.txt")
        self.assertNotEqual(etag_a, etag_b)

    async def test_if_none_match(self) -> None:
        port = self.listen(cache_control="max-age=60")
        etag, modified = await self.validators(b"/app.js")
        for value in (etag, b"W/" + etag, b'"other", ' + etag, b"*"):
            for method in (b"GET", b"HEAD"):
                response = await self.fetch(
                    b"/app.js", method=method, headers={b"If-None-Match": value}, port=port
                )
                self.assertNotModified(response, etag, modified)
                self.assertEqual(response.header(b"cache-control"), b"max-age=60")
        response = await self.fetch(b"/app.js", headers={b"If-None-Match": b'"other"'})
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)

    async def test_index_revalidates_with_no_cache(self) -> None:
        etag, modified = await self.validators(b"/")
        response = await self.fetch(b"/client/route", headers={b"If-None-Match": etag})
        self.assertNotModified(response, etag, modified)
        self.assertEqual(response.header(b"cache-control"), b"no-cache")

    async def test_if_modified_since(self) -> None:
        etag, modified = await self.validators(b"/app.js")
        response = await self.fetch(b"/app.js", headers={b"If-Modified-Since": modified})
        self.assertNotModified(response, etag, modified)
        for value in (LONG_AGO, b"not a date", b""):
            response = await self.fetch(b"/app.js", headers={b"If-Modified-Since": value})
            self.assertEqual(response.status, 200, value)
            self.assertEqual(response.body, APP_JS)

    async def test_if_none_match_wins_over_if_modified_since(self) -> None:
        _, modified = await self.validators(b"/app.js")
        response = await self.fetch(
            b"/app.js", headers={b"If-None-Match": b'"other"', b"If-Modified-Since": modified}
        )
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, APP_JS)

    async def test_if_match_and_if_unmodified_since(self) -> None:
        etag, modified = await self.validators(b"/app.js")
        for headers in (
            {b"If-Match": b'"other"'},
            {b"If-Match": b"W/" + etag},
            {b"If-Unmodified-Since": LONG_AGO},
        ):
            response = await self.fetch(b"/app.js", headers=headers)
            self.assertEqual(response.status, 412, headers)
            self.assertEqual(response.body, b"precondition failed")
        for headers in (
            {b"If-Match": etag},
            {b"If-Match": b"*"},
            {b"If-Unmodified-Since": modified},
        ):
            response = await self.fetch(b"/app.js", headers=headers)
            self.assertEqual(response.status, 200, headers)
            self.assertEqual(response.body, APP_JS)

    # -- ranges ---------------------------------------------------------------------------

    async def assertRange(self, value: bytes, start: int, end: int, **headers: bytes) -> None:
        sent = {b"Range": value}
        sent.update((name.replace("_", "-").encode(), header) for name, header in headers.items())
        response = await self.fetch(b"/digits.txt", headers=sent)
        self.assertEqual(response.status, 206, value)
        self.assertEqual(response.body, DIGITS[start : end + 1], value)
        self.assertEqual(
            response.header(b"content-range"), b"bytes %d-%d/%d" % (start, end, len(DIGITS))
        )
        self.assertEqual(response.header(b"content-length"), b"%d" % (end + 1 - start))
        self.assertEqual(response.header(b"content-type"), b"text/plain; charset=utf-8")
        self.assertEqual(response.header(b"accept-ranges"), b"bytes")
        self.assertIsNotNone(response.header(b"etag"))

    async def assertFull(self, headers: dict[bytes, bytes]) -> None:
        response = await self.fetch(b"/digits.txt", headers=headers)
        self.assertEqual(response.status, 200, headers)
        self.assertEqual(response.body, DIGITS, headers)
        self.assertIsNone(response.header(b"content-range"))

    async def test_range(self) -> None:
        await self.assertRange(b"bytes=10-19", 10, 19)
        await self.assertRange(b"bytes=0-0", 0, 0)
        await self.assertRange(b"bytes=90-200", 90, 99)
        await self.assertRange(b"bytes = 5 - 6", 5, 6)
        await self.assertRange(b"Bytes=5-6", 5, 6)

    async def test_suffix_range(self) -> None:
        await self.assertRange(b"bytes=-7", 93, 99)
        await self.assertRange(b"bytes=-500", 0, 99)
        await self.assertRange(b"bytes=-99999999999999999999999999", 0, 99)

    async def test_open_range(self) -> None:
        await self.assertRange(b"bytes=95-", 95, 99)
        await self.assertRange(b"bytes=0-", 0, 99)

    async def test_unsatisfiable_range(self) -> None:
        for value in (b"bytes=100-", b"bytes=100-200", b"bytes=-0", b"bytes=99999999999999999999-"):
            response = await self.fetch(b"/digits.txt", headers={b"Range": value})
            self.assertEqual(response.status, 416, value)
            self.assertEqual(response.header(b"content-range"), b"bytes */100")
            self.assertEqual(response.body, b"range not satisfiable")
            self.assertEqual(response.header(b"content-type"), b"text/plain; charset=utf-8")
            self.assertIsNone(response.header(b"cache-control"))
        response = await self.fetch(b"/empty.txt", headers={b"Range": b"bytes=0-"})
        self.assertEqual(response.status, 416)
        self.assertEqual(response.header(b"content-range"), b"bytes */0")

    async def test_invalid_or_multiple_ranges_give_the_whole_file(self) -> None:
        for value in (
            b"bytes=abc",
            b"bytes=5-2",
            b"bytes=",
            b"bytes=-",
            b"bytes=1",
            b"bytes=+1-2",
            b"items=0-1",
            b"0-1",
            b"bytes=0-1,5-6",
            b"bytes=0-1, 200-300",
        ):
            await self.assertFull({b"Range": value})

    async def test_if_range(self) -> None:
        etag, modified = await self.validators(b"/digits.txt")
        await self.assertRange(b"bytes=1-2", 1, 2, If_Range=etag)
        await self.assertRange(b"bytes=1-2", 1, 2, If_Range=modified)
        for validator in (b'"other"', b"W/" + etag, LONG_AGO, b"garbage"):
            await self.assertFull({b"Range": b"bytes=1-2", b"If-Range": validator})

    async def test_head_with_range(self) -> None:
        response = await self.fetch(
            b"/digits.txt", method=b"HEAD", headers={b"Range": b"bytes=1-2"}
        )
        self.assertEqual(response.status, 206)
        self.assertEqual(response.header(b"content-range"), b"bytes 1-2/100")
        self.assertEqual(response.header(b"content-length"), b"2")
        self.assertEqual(response.body, b"")

    async def test_range_of_large_file(self) -> None:
        start, end = 1_000_000, 3_000_000
        response = await self.fetch(b"/big.bin", headers={b"Range": b"bytes=%d-%d" % (start, end)})
        self.assertEqual(response.status, 206)
        self.assertEqual(
            response.header(b"content-range"), b"bytes %d-%d/%d" % (start, end, BIG_SIZE)
        )
        self.assertEqual(
            hashlib.sha256(response.body).hexdigest(),
            hashlib.sha256(self.big[start : end + 1]).hexdigest(),
        )

    # -- streaming ------------------------------------------------------------------------

    async def test_large_file_streams_byte_exact(self) -> None:
        response = await self.fetch(b"/big.bin")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"content-length"), b"%d" % BIG_SIZE)
        self.assertEqual(
            hashlib.sha256(response.body).hexdigest(), hashlib.sha256(self.big).hexdigest()
        )
        await self.site.ended[-1]
        self.assertEqual(open_descriptors_for(os.path.join(self.root, "big.bin")), [])

    async def test_large_file_through_agent(self) -> None:
        pool = HTTPConnectionPool(_reactor)
        self.addCleanup(pool.closeCachedConnections)
        agent: Any = Agent(_reactor, pool=pool)
        client = HTTPClient(agent)
        for _ in range(2):  # the second one reuses the kept-alive connection
            response = await client.get(f"http://127.0.0.1:{self.port}/big.bin")
            body = await response.content()
            self.assertEqual(response.code, 200)
            self.assertEqual(response.length, BIG_SIZE)
            self.assertEqual(hashlib.sha256(body).hexdigest(), hashlib.sha256(self.big).hexdigest())
        small = await client.get(f"http://127.0.0.1:{self.port}/app.js")
        self.assertEqual(await small.content(), APP_JS)

    async def test_file_at_fast_path_limit(self) -> None:
        for size in (SMALL_FILE_LIMIT, SMALL_FILE_LIMIT + 1):
            data = os.urandom(size)
            write_file(os.path.join(self.root, "edge.bin"), data)
            response = await self.fetch(b"/edge.bin")
            self.assertEqual(response.status, 200)
            self.assertEqual(response.body, data)
        self.assertEqual(open_descriptors_for(os.path.join(self.root, "edge.bin")), [])

    async def test_client_disconnect_closes_the_file(self) -> None:
        path = os.path.join(self.root, "huge.bin")
        with open(path, "wb") as f:
            f.truncate(256 * 1024 * 1024)
        client = await connect(self.port, build_request(b"GET", b"/huge.bin", {}))
        await client.first_data
        self.assertEqual(len(open_descriptors_for(path)), 1)
        client.connection.abortConnection()
        await client.received
        await self.site.ended[-1]
        self.assertEqual(open_descriptors_for(path), [])

    def test_cancellation_closes_the_file(self) -> None:
        """
        Cancelling C{respond} (what a route's chain does when it gives up on a request)
        in the middle of a streamed body closes the file, detaches the producer so that
        nothing more is read or written, and leaves the response unfinished for the
        caller.
        """
        path = os.path.join(self.root, "huge.bin")
        with open(path, "wb") as f:
            f.truncate(256 * 1024 * 1024)
        channel = DummyChannel()
        request = get_request(channel, b"/huge.bin")
        responding = Deferred.fromCoroutine(
            StaticHandler(StaticHandlerSpec(dir=self.root)).respond(request)
        )
        # DummyChannel records the producer and never pulls it: the test pulls.
        [(producer, streaming)] = channel.transport.producers
        self.assertFalse(streaming)
        producer.resumeProducing()
        sent = channel.transport.written.getvalue()
        self.assertTrue(sent.startswith(b"HTTP/1.1 200 OK\r\n"), sent[:100])
        self.assertEqual(len(open_descriptors_for(path)), 1)
        self.assertNoResult(responding)

        responding.cancel()
        self.failureResultOf(responding, CancelledError)
        self.assertEqual(open_descriptors_for(path), [])
        self.assertIsNone(request.producer)
        self.assertFalse(request.finished)
        # A late pull (the consumer had already asked for more) reads and writes nothing.
        producer.resumeProducing()
        self.assertEqual(channel.transport.written.getvalue(), sent)
        self.assertFalse(request.finished)

    async def test_file_shrinking_while_streaming_cuts_the_connection(self) -> None:
        path = os.path.join(self.root, "shrinking.bin")
        size = 64 * 1024 * 1024
        with open(path, "wb") as f:
            f.truncate(size)
        client = await connect(self.port, build_request(b"GET", b"/shrinking.bin", {}))
        await client.first_data
        client.connection.pauseProducing()
        os.truncate(path, 1024 * 1024)
        client.connection.resumeProducing()
        response = parse_response(await client.received)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"content-length"), b"%d" % size)
        self.assertLess(len(response.body), size)
        await self.site.ended[-1]
        self.assertEqual(open_descriptors_for(path), [])


class AccessRecords:
    """
    The gateway's access-log records (logged to Twisted's logger), collected for a test.
    """

    def __init__(self, test: TestCase) -> None:
        self.records: list[dict[str, Any]] = []
        self._waiters: list[Deferred[dict[str, Any]]] = []
        observer = cast(ILogObserver, self._observe)
        globalLogPublisher.addObserver(observer)
        test.addCleanup(globalLogPublisher.removeObserver, observer)

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_namespace") != "edgegw.access":
            return
        self.records.append(event["access"])
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(event["access"])

    def next(self) -> Deferred[dict[str, Any]]:
        """
        Fire with the next record logged.
        """
        waiter: Deferred[dict[str, Any]] = Deferred()
        self._waiters.append(waiter)
        return waiter


class StaticRouteTests(TestCase):
    """
    The static terminal at the end of a real route's chain, as L{build_gateway} wires it
    (edge, mux, request-id, access-log and projection stages).
    """

    def setUp(self) -> None:
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        tree = make_tree(base)
        self.root = tree.root
        self.big = tree.big
        self.access = AccessRecords(self)

    def gateway(self, reactor: Any) -> Gateway:
        """
        A gateway with one static route, C{/app/}, serving the tree without the prefix.
        """
        config = load_text(
            self.mktemp(),
            f"""\
            kind: Route
            metadata: {{name: app}}
            spec:
              match: /app/
              handler:
                type: static
                dir: "{self.root}"
                stripPrefix: /app
                cacheControl: "max-age=60"
            """,
        )
        return build_gateway(config, reactor)

    def test_served_through_the_route_chain(self) -> None:
        gateway = self.gateway(Clock())
        client = MemoryClient(gateway.site)
        asset = client.request("GET", "/app/app.js", {"X-Request-Id": "asset-1"})
        self.assertEqual(asset.status, 200)
        self.assertEqual(asset.body, APP_JS)
        self.assertEqual(asset.header("Content-Type"), "text/javascript; charset=utf-8")
        self.assertEqual(asset.header("Cache-Control"), "max-age=60")
        self.assertEqual(asset.header("X-Request-Id"), "asset-1")
        page = client.request("GET", "/app/client/route")
        self.assertEqual(page.status, 200)
        self.assertEqual(page.body, INDEX)
        self.assertEqual(page.header("Cache-Control"), "no-cache")
        hidden = client.request("GET", "/app/.env")
        self.assertEqual((hidden.status, hidden.body), (404, b"not found"))
        post = client.request("POST", "/app/app.js", body=b"x")
        self.assertEqual((post.status, post.header("Allow")), (405, "GET, HEAD"))
        self.assertEqual(
            [
                (record["method"], record["path"], record["status"], record["route"])
                for record in self.access.records
            ],
            [
                ("GET", "/app/app.js", 200, "/app/"),
                ("GET", "/app/client/route", 200, "/app/"),
                ("GET", "/app/.env", 404, "/app/"),
                ("POST", "/app/app.js", 405, "/app/"),
            ],
        )
        self.assertEqual(self.access.records[0]["request_id"], "asset-1")
        self.assertEqual(self.access.records[0]["bytes"], len(APP_JS))
        self.assertEqual(gateway.inflight.count, 0)

    async def test_large_file_through_the_route_chain(self) -> None:
        gateway = self.gateway(_reactor)
        port = listen(self, gateway.site)
        client = await connect(port, build_request(b"GET", b"/app/big.bin", {}))
        response = parse_response(await client.received)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header(b"content-length"), b"%d" % BIG_SIZE)
        self.assertEqual(
            hashlib.sha256(response.body).hexdigest(), hashlib.sha256(self.big).hexdigest()
        )
        self.assertEqual(gateway.inflight.count, 0)
        self.assertEqual(open_descriptors_for(os.path.join(self.root, "big.bin")), [])
        [record] = self.access.records
        self.assertEqual((record["status"], record["bytes"]), (200, BIG_SIZE))
        self.assertNotIn("client_gone", record)

    async def test_client_disconnect_through_the_route_chain(self) -> None:
        path = os.path.join(self.root, "huge.bin")
        with open(path, "wb") as f:
            f.truncate(256 * 1024 * 1024)
        gateway = self.gateway(_reactor)
        port = listen(self, gateway.site)
        client = await connect(port, build_request(b"GET", b"/app/huge.bin", {}))
        await client.first_data
        self.assertEqual(gateway.inflight.count, 1)
        self.assertEqual(len(open_descriptors_for(path)), 1)
        logged = self.access.next()
        ended = gateway.inflight.drained()
        client.connection.abortConnection()
        await client.received
        # Both the request's end and the access-log line (which the chain writes as it
        # winds down), in whichever order they come.
        record = await logged
        await ended
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(gateway.inflight.count, 0)
        self.assertEqual(open_descriptors_for(path), [])
        self.assertEqual((record["path"], record["status"]), ("/app/huge.bin", 200))
        self.assertLess(record["bytes"], 256 * 1024 * 1024)
        self.assertIs(record.get("client_gone"), True)


class BareResourceTests(TestCase):
    """
    The static terminal rendered as a plain Resource without any route or exchange, in
    memory (treq's StubTreq).
    """

    async def test_rendered_without_a_route(self) -> None:
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        stub: Any = StubTreq(StaticHandler(StaticHandlerSpec(dir=make_tree(base).root)))
        asset = await stub.get("http://gateway.test/app.js")
        self.assertEqual(asset.code, 200)
        self.assertEqual(await stub.content(asset), APP_JS)
        self.assertEqual(
            asset.headers.getRawHeaders(b"content-type"), [b"text/javascript; charset=utf-8"]
        )
        page = await stub.get("http://gateway.test/client/route")
        self.assertEqual((page.code, await stub.content(page)), (200, INDEX))
        missing = await stub.get("http://gateway.test/missing.js")
        self.assertEqual((missing.code, await stub.content(missing)), (404, b"not found"))
        post = await stub.post("http://gateway.test/app.js", data=b"x")
        self.assertEqual(post.code, 405)
        self.assertEqual(post.headers.getRawHeaders(b"allow"), [b"GET, HEAD"])
        self.assertEqual(await stub.content(post), b"method not allowed")


class ConstructionTests(TestCase):
    """
    What L{StaticHandler} works out at load: its route-table line and its index.
    """

    def test_describe(self) -> None:
        self.assertEqual(
            StaticHandler(StaticHandlerSpec(dir="/srv/app")).describe(),
            "static /srv/app (index index.html, spa fallback)",
        )
        spec = StaticHandlerSpec(
            dir="/srv/app",
            index="main.html",
            spa_fallback=False,
            strip_prefix="/app",
            cache_control="public, max-age=60",
        )
        self.assertEqual(
            StaticHandler(spec).describe(),
            'static /srv/app (index main.html, strip /app, cache-control "public, max-age=60")',
        )

    def test_index_must_stay_inside_dir(self) -> None:
        for index in ("../index.html", "", "/", "a/../../b"):
            self.assertRaises(ValueError, StaticHandler, StaticHandlerSpec(dir="/srv", index=index))
        handler = StaticHandler(StaticHandlerSpec(dir="/srv", index="./public/index.html"))
        self.assertIn("index ./public/index.html", handler.describe())


class LookupSyscallTests(SynchronousTestCase):
    """
    L{StaticTree}'s look-ups: the file named last is opened without an C{lstat} first
    (C{O_NOFOLLOW} refuses a link there, which is then resolved), its parents are looked
    at as before.
    """

    def setUp(self) -> None:
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        self.root = make_tree(base).root
        self.tree = StaticTree(self.root, "index.html")
        self.looked: list[str] = []
        real_lstat = os.lstat

        def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            self.looked.append(str(path))
            return real_lstat(path, *args, **kwargs)

        self.patch(os, "lstat", lstat)

    def open(self, *names: str) -> bytes | None:
        target = self.tree.open_target(list(names), False)
        if target is None:
            return None
        fd = target[0]
        try:
            return os.read(fd, 100)
        finally:
            os.close(fd)

    def test_a_plain_file_is_opened_without_a_look(self) -> None:
        self.assertEqual(self.open("app.js"), APP_JS[:100])
        self.assertEqual(self.looked, [])
        self.assertEqual(self.open("docs", "guide.txt"), b"guide")
        self.assertEqual(self.looked, [os.path.join(self.root, "docs")])

    def test_links_and_misses_still_looked_at(self) -> None:
        self.assertEqual(self.open("inside-link.js"), APP_JS[:100])
        self.assertIsNone(self.open("escape.txt"))
        self.assertIsNone(self.open("escape-dir", "secret.txt"))
        self.assertIsNone(self.open("missing.txt"))
        self.assertEqual(self.open("docs-link", "guide.txt"), b"guide")
