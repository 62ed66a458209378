"""
The upstream servers of C{python -m bench memory} and C{python -m bench api}, each run as
its own process:

  - C{zeros}: a plain-socket HTTP/1.1 server answering C{GET /zeros/N} with N zero
    bytes and a C{Content-Length}; the bytes are generated as they are sent, never
    stored, and C{sendall} blocks while the peer's buffers are full, so the server
    goes exactly as fast as the proxy reads. C{GET /text/N} answers N bytes of
    C{text/plain} the same way: log lines, L{text_block} over and over.
  - C{sse}: a Twisted server answering C{GET /events} with a C{text/event-stream}
    response head and then nothing, keeping every stream open; C{GET /stats} says how
    many are open.
  - C{json}: an asyncio HTTP/1.1 keep-alive server answering C{GET} on each configured
    path prefix with a small JSON document (L{json_document}) after that prefix's fixed
    delay, e.g. C{--delay /a=0 --delay /b=2 --delay /c=5} (milliseconds).

Run as C{python -m bench.backends zeros|sse|json --port PORT [--delay PREFIX=MS ...]}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socketserver
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from bench.agent_proxy import QuietSite, listen
from bench.processes import Process

_ZEROS = memoryview(bytes(256 * 1024))
TEXT_BLOCK_SIZE = 8 * 1024 * 1024
"""The size of L{text_block}: more than any compressor's window here (brotli's is 4 MiB,
zstd's 2 MiB at edgegw's level), so that the repetition is not what compresses."""
_TEXT: list[memoryview] = []


def text_block() -> memoryview:
    """
    L{TEXT_BLOCK_SIZE} bytes of access-log lines, pseudo-random from a fixed seed (the
    same in every process): what C{GET /text/N} repeats, and what its client checks the
    decoded body against.
    """
    if not _TEXT:
        rng = random.Random(34)
        methods = ("GET", "GET", "GET", "POST", "PUT", "DELETE")
        paths = ("/api/v1/items", "/api/v1/users", "/static/app.js", "/healthz", "/auth/login")
        levels = ("INFO", "INFO", "INFO", "WARN", "DEBUG")
        lines = []
        size = 0
        while size < TEXT_BLOCK_SIZE:
            line = (
                f"2026-11-29T{rng.randrange(24):02d}:{rng.randrange(60):02d}:"
                f"{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z {rng.choice(levels)} "
                f"edgegw.access request_id={rng.getrandbits(64):016x} "
                f"method={rng.choice(methods)} path={rng.choice(paths)}/{rng.randrange(10**6)} "
                f"status={rng.choice((200, 200, 200, 204, 304, 404, 502))} "
                f"duration_ms={rng.uniform(0.1, 250):.3f} bytes={rng.randrange(10**6)} "
                f'ua="Mozilla/5.0 (X11; Linux x86_64) bench/{rng.randrange(100)}"\n'
            ).encode()
            lines.append(line)
            size += len(line)
        _TEXT.append(memoryview(b"".join(lines)[:TEXT_BLOCK_SIZE]))
    return _TEXT[0]


class ZerosHandler(socketserver.StreamRequestHandler):
    """
    Serves C{GET /zeros/N} (and C{HEAD}) on a keep-alive connection, one request after
    another, until the client closes; C{POST /sink} reads its body (C{Content-Length})
    and discards it, answering how many bytes arrived.
    """

    def handle(self) -> None:
        """Answer requests until the connection ends."""
        try:
            while self._one_request():
                pass
        except (ConnectionError, TimeoutError):
            pass

    def _one_request(self) -> bool:
        request_line = self.rfile.readline(65536)
        if not request_line:
            return False
        close = False
        length = 0
        while True:
            line = self.rfile.readline(65536)
            if not line:
                return False
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"content-length":
                length = int(value.strip())
        parts = request_line.split()
        method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
        if method == b"POST" and target == b"/sink":
            received = 0
            while received < length:
                data = self.rfile.read(min(length - received, 1 << 20))
                if not data:
                    return False
                received += len(data)
            body = b'{"received":%d}\n' % received
            self.connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return not close
        text = target.startswith(b"/text/")
        size_text = target.removeprefix(b"/text/" if text else b"/zeros/")
        if method not in (b"GET", b"HEAD") or not size_text.isdigit():
            self.wfile.write(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n"
                b"Content-Type: text/plain\r\n\r\nnot found\n"
            )
            return not close
        size = int(size_text)
        content_type = b"text/plain; charset=utf-8" if text else b"application/octet-stream"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            content_type,
            size,
            b"Connection: close\r\n" if close else b"",
        )
        self.connection.sendall(head)
        if method == b"GET":
            if text:
                self._send_text(size)
                return not close
            remaining = size
            while remaining:
                chunk = _ZEROS[: min(remaining, len(_ZEROS))]
                self.connection.sendall(chunk)
                remaining -= len(chunk)
        return not close

    def _send_text(self, size: int) -> None:
        block = text_block()
        offset = 0
        while offset < size:
            start = offset % len(block)
            chunk = block[start : start + min(size - offset, 256 * 1024)]
            self.connection.sendall(chunk)
            offset += len(chunk)


class ZerosServer(socketserver.ThreadingTCPServer):
    """One thread per connection; threads never keep the process alive."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


class EventStream(Resource):
    """
    C{GET /events}: a C{text/event-stream} head, then silence; C{GET /stats}: how many
    streams are open.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.open: set[Request] = set()

    def render_GET(self, request: Request) -> bytes | int:
        """Start a silent stream, or report the open ones."""
        if request.path == b"/stats":
            request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
            return json.dumps({"open": len(self.open)}).encode() + b"\n"
        if request.path != b"/events":
            request.setResponseCode(404)
            return b"not found\n"
        request.responseHeaders.setRawHeaders(b"content-type", [b"text/event-stream"])
        request.responseHeaders.setRawHeaders(b"cache-control", [b"no-cache"])
        request.write(b"")  # the head only: no event follows
        self.open.add(request)
        request.notifyFinish().addBoth(lambda _: self.open.discard(request))
        return NOT_DONE_YET


def json_document(path: str, delay_ms: float) -> dict[str, Any]:
    """
    What the C{json} backend answers for the request path C{path} (without its query) on
    a prefix delayed by C{delay_ms}: a small document naming the path, so that a fan-out's
    merged answer shows which path each backend call used.
    """
    return {"path": path, "delay_ms": delay_ms}


def _response(status: bytes, content_type: bytes, body: bytes, close: bool) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        content_type,
        len(body),
        b"Connection: close\r\n" if close else b"",
        body,
    )


_MAX_HEAD = 65536


class DelayedJson(asyncio.Protocol):
    """
    One connection to the C{json} backend. Each C{GET} on a configured prefix is
    answered with L{json_document} once the prefix's delay has passed since the request
    arrived; responses leave in request order (a pipelined request waits for the one
    before it) and the connection stays open unless the client asks to close it.

    @param delays: Path prefix (C{b"/a"}: C{/a} and everything under C{/a/}) and its
        delay in milliseconds, first match wins.
    """

    def __init__(self, delays: Sequence[tuple[bytes, float]]) -> None:
        self.delays = delays
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.closing = False
        # (due time, response bytes, close after it), oldest first.
        self.pending: deque[tuple[float, bytes, bool]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Queue a response for every complete request head received."""
        self.buffer += data
        while not self.closing:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEAD:
                    self._queue(0.0, b"431 Request Header Fields Too Large", b"", close=True)
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            self._request(head)

    def _request(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split()
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get(b"connection", b"")
        close = connection == b"close" or (
            parts[2:] == [b"HTTP/1.0"] and connection != b"keep-alive"
        )
        if (
            len(parts) != 3
            or headers.get(b"content-length", b"0") != b"0"
            or (b"transfer-encoding" in headers)
        ):
            # A body is never read: close rather than take it for the next request.
            self._queue(0.0, b"400 Bad Request", b"", close=True)
            return
        if parts[0] != b"GET":
            self._queue(0.0, b"405 Method Not Allowed", b"", close)
            return
        path = parts[1].split(b"?", 1)[0]
        for prefix, delay_ms in self.delays:
            if path == prefix or path.startswith(prefix + b"/"):
                document = json_document(path.decode("latin-1"), delay_ms)
                body = json.dumps(document, separators=(",", ":")).encode()
                self._queue(delay_ms / 1000, b"200 OK", body, close)
                return
        self._queue(0.0, b"404 Not Found", b"", close)

    def _queue(self, delay: float, status: bytes, body: bytes, close: bool) -> None:
        content_type = b"application/json" if body else b"text/plain"
        response = _response(status, content_type, body, close)
        self.closing = self.closing or close
        self.pending.append((self.loop.time() + delay, response, close))
        if self.timer is None:
            self._send_due()

    def _send_due(self) -> None:
        self.timer = None
        while self.pending and self.transport is not None:
            due, response, close = self.pending[0]
            # The loop may run a timer a clock tick early; a microsecond is no delay.
            if due > self.loop.time() + 1e-6:
                self.timer = self.loop.call_at(due, self._send_due)
                return
            self.pending.popleft()
            self.transport.write(response)
            if close:
                self.transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop what was still waiting."""
        self.transport = None
        self.pending.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def serve_json(port: int, delays: Sequence[tuple[str, float]]) -> None:
    """
    Serve the C{json} backend on 127.0.0.1:C{port} until cancelled; C{delays} as for
    L{DelayedJson}, with text prefixes.
    """
    encoded = [(prefix.encode("ascii"), delay) for prefix, delay in delays]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: DelayedJson(encoded), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def delay_option(text: str) -> tuple[str, float]:
    """
    Parse a C{--delay PREFIX=MS} value, e.g. C{/b=2.5}.

    @raise ValueError: If it is not that.
    """
    prefix, sep, ms = text.partition("=")
    delay = float(ms) if sep else -1.0
    if not prefix.startswith("/") or prefix.endswith("/") or delay < 0:
        raise ValueError(f"expected PREFIX=MS such as /a=2, got {text!r}")
    return prefix, delay


def start(kind: str, port: int, log: Path, delays: Sequence[tuple[str, float]] = ()) -> Process:
    """
    Start one backend (C{zeros}, C{sse} or C{json}) as C{python -m bench.backends}, on
    127.0.0.1:C{port}, its output going to C{log}; C{delays} are the C{json} backend's
    prefixes and milliseconds.
    """
    argv = [sys.executable, "-m", "bench.backends", kind, "--port", str(port)]
    for prefix, delay in delays:
        argv.append(f"--delay={prefix}={delay:g}")
    return Process(f"{kind} backend", argv, log)


def main(argv: Sequence[str] | None = None) -> None:
    """
    Serve one backend on 127.0.0.1 until killed.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__)
    parser.add_argument("kind", choices=("zeros", "sse", "json"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--delay",
        type=delay_option,
        action="append",
        default=[],
        metavar="PREFIX=MS",
        help="json: answer GET PREFIX and PREFIX/... after MS milliseconds (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.kind == "json":
        if not args.delay:
            parser.error("json needs at least one --delay PREFIX=MS")
        asyncio.run(serve_json(args.port, args.delay))
        return
    if args.kind == "zeros":
        with ZerosServer(("127.0.0.1", args.port), ZerosHandler) as server:
            server.serve_forever()
        return
    listen(args.port, QuietSite(EventStream()))
    reactor.run()


if __name__ == "__main__":
    main()
