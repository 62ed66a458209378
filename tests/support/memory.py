"""
Driving a Twisted Site in memory: raw HTTP bytes in, parsed responses out.

No sockets and no reactor turns: the request is fed to a real L{HTTPChannel} over a
L{StringTransport}, so everything the gateway does synchronously is observable at once.
"""

from __future__ import annotations

import attrs
from twisted.internet import reactor as _global_reactor
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel
from twisted.web.server import Site


@attrs.define
class Response:
    """
    A parsed HTTP/1.1 response.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """
        The first value of header C{name} (case-insensitive), or L{None}.
        """
        values = self.all(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        """
        Every value of header C{name}, in order.
        """
        lowered = name.lower()
        return [value for key, value in self.headers if key.lower() == lowered]


def parse_responses(data: bytes) -> list[Response]:
    """
    Split C{data} into responses (Content-Length or chunked bodies).
    """
    out: list[Response] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError(f"incomplete response head: {data!r}")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = [tuple(line.split(": ", 1)) for line in lines[1:]]
        response = Response(status, headers, b"")  # type: ignore[arg-type]
        length = response.header("content-length")
        if response.header("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    rest = rest[2:]
                    break
                body += rest[:size]
                rest = rest[size + 2 :]
            response.body = body
        elif length is not None and status not in (204, 304):
            response.body = rest[: int(length)]
            rest = rest[int(length) :]
        data = rest
        out.append(response)
    return out


class MemoryClient:
    """
    One client connection to C{site}, in memory.

    C{site} must run on a test clock (C{Site(resource, reactor=Clock())}): the
    connection is never closed, so on the global reactor its channel's idle timeout
    would stay pending there, where no synchronous test looks, and fail whichever
    real-reactor test runs next in the same process.

    @param peer: The client's address, as the gateway sees it.
    @raise ValueError: C{site} runs on the global reactor.
    """

    def __init__(self, site: Site, peer: str = "192.0.2.10") -> None:
        if site.reactor is _global_reactor:
            raise ValueError("MemoryClient needs a Site on a test clock, not the global reactor")
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", peer, 40000))
        self.channel: HTTPChannel = site.buildProtocol(IPv4Address("TCP", peer, 40000))
        self.channel.makeConnection(self.transport)

    def send(self, raw: bytes) -> None:
        """
        Feed raw bytes to the server.
        """
        self.channel.dataReceived(raw)

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        body: bytes = b"",
        host: str | None = "gateway.test",
    ) -> Response:
        """
        Send one request and return its (complete) response.
        """
        lines = [f"{method} {target} HTTP/1.1"]
        if host is not None:
            lines.append(f"Host: {host}")
        items = headers.items() if isinstance(headers, dict) else (headers or [])
        lines.extend(f"{name}: {value}" for name, value in items)
        if body:
            lines.append(f"Content-Length: {len(body)}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        self.transport.clear()
        self.send(raw)
        responses = parse_responses(self.transport.value())
        if len(responses) != 1:
            raise AssertionError(f"expected one response, got {self.transport.value()!r}")
        return responses[0]
