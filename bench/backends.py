"""
The upstream servers of C{python -m bench memory}, each run as its own process:

  - C{zeros}: a plain-socket HTTP/1.1 server answering C{GET /zeros/N} with N zero
    bytes and a C{Content-Length}; the bytes are generated as they are sent, never
    stored, and C{sendall} blocks while the peer's buffers are full, so the server
    goes exactly as fast as the proxy reads.
  - C{sse}: a Twisted server answering C{GET /events} with a C{text/event-stream}
    response head and then nothing, keeping every stream open; C{GET /stats} says how
    many are open.

Run as C{python -m bench.backends zeros|sse --port PORT}.
"""

from __future__ import annotations

import argparse
import json
import socketserver
from collections.abc import Sequence

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from bench.agent_proxy import QuietSite, listen

_ZEROS = memoryview(bytes(256 * 1024))


class ZerosHandler(socketserver.StreamRequestHandler):
    """
    Serves C{GET /zeros/N} (and C{HEAD}) on a keep-alive connection, one request after
    another, until the client closes.
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
        while True:
            line = self.rfile.readline(65536)
            if not line:
                return False
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                close = True
        parts = request_line.split()
        method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
        size_text = target.removeprefix(b"/zeros/")
        if method not in (b"GET", b"HEAD") or not size_text.isdigit():
            self.wfile.write(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n"
                b"Content-Type: text/plain\r\n\r\nnot found\n"
            )
            return not close
        size = int(size_text)
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (size, b"Connection: close\r\n" if close else b"")
        )
        self.connection.sendall(head)
        if method == b"GET":
            remaining = size
            while remaining:
                chunk = _ZEROS[: min(remaining, len(_ZEROS))]
                self.connection.sendall(chunk)
                remaining -= len(chunk)
        return not close


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


def main(argv: Sequence[str] | None = None) -> None:
    """
    Serve one backend on 127.0.0.1 until killed.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__)
    parser.add_argument("kind", choices=("zeros", "sse"))
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.kind == "zeros":
        with ZerosServer(("127.0.0.1", args.port), ZerosHandler) as server:
            server.serve_forever()
        return
    listen(args.port, QuietSite(EventStream()))
    reactor.run()


if __name__ == "__main__":
    main()
