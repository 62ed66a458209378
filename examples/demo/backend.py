"""
The demo backend `make run` starts beside the gateway: a tiny JSON API on 127.0.0.1.

  - GET /users/{id}, /users/{id}/orders, /recommendations: small JSON documents, the
    three backends of the example's api fan-out route (GET /dash/{id});
  - anything else under /: an echo of what the gateway forwarded (method, path, the
    X-Forwarded-*, X-Request-Id and X-User-* headers, and for a POST the body's size),
    behind the example's reverse-proxy routes /api/ and /me/ (login required).

Run as `python examples/demo/backend.py --port 8081`.
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_USER = re.compile(r"^/users/([^/]+)$")
_ORDERS = re.compile(r"^/users/([^/]+)/orders$")
_ECHOED = ("host", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-request-id")


class DemoHandler(BaseHTTPRequestHandler):
    """
    Answers every request with JSON.
    """

    server_version = "edgegw-demo"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if found := _USER.match(path):
            self.answer({"id": found.group(1), "name": f"User {found.group(1)}"})
        elif found := _ORDERS.match(path):
            self.answer([{"order": 1, "user": found.group(1)}, {"order": 2}])
        elif path == "/recommendations":
            self.answer({"items": ["tea", "biscuits"]})
        else:
            self.echo()

    def do_POST(self) -> None:
        self.echo(len(self.read_body()))

    def read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailer fields
        return body

    def echo(self, received: int | None = None) -> None:
        headers = {name: self.headers[name] for name in _ECHOED if name in self.headers}
        # The identity the gateway projects for a logged-in user (route /me/).
        for name, value in self.headers.items():
            if name.lower().startswith("x-user-"):
                headers[name.lower()] = value
        answer: dict[str, object] = {"method": self.command, "path": self.path, "headers": headers}
        if received is not None:
            answer["bytes"] = received
        self.answer(answer)

    def answer(self, document: object) -> None:
        data = json.dumps(document).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """
        Quiet: the gateway's access log shows every request.
        """


def main() -> None:
    """
    Serve on 127.0.0.1 until interrupted.
    """
    parser = argparse.ArgumentParser(description="edgegw's demo backend")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), DemoHandler).serve_forever()


if __name__ == "__main__":
    main()
