"""
Reading compressed responses in tests: each content coding decoded by its own library
(C{zlib} for C{gzip}, C{brotli} for C{br}, C{zstandard} for C{zstd}), whole or as far as
a stream has come; HTTP/1.1 responses read off a raw socket with their framing kept
apart from their body (L{Reply}); and a gateway built from YAML documents on 127.0.0.1.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

import attrs
import brotli  # type: ignore[import-untyped]
import zstandard
from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.support.configs import write_tree
from tests.support.processes import connections_closed, listen_local, port_of
from tests.support.rawclient import connect

__all__ = [
    "CODINGS",
    "Reply",
    "dechunk_prefix",
    "decode",
    "decode_prefix",
    "exchange",
    "parse_reply",
    "request_bytes",
    "serve_documents",
]

reactor: Any = _reactor

CODINGS = ("zstd", "br", "gzip")
"""The codings the gateway compresses with."""


class IncompleteStreamError(AssertionError):
    """
    A compressed body ended before its coding's end of stream (or had bytes after it).
    """


def decode(coding: str, data: bytes) -> bytes:
    """
    The whole body C{data} in C{coding} decoded by that coding's own library; fails
    (L{IncompleteStreamError}) unless C{data} is exactly one complete stream.
    """
    if coding == "gzip":
        z = zlib.decompressobj(31)
        out = z.decompress(data) + z.flush()
        if not z.eof or z.unused_data:
            raise IncompleteStreamError(f"gzip stream incomplete or followed by bytes: {data!r}")
        return out
    if coding == "br":
        b = brotli.Decompressor()
        decoded: bytes = b.process(data)
        if not b.is_finished():
            raise IncompleteStreamError(f"brotli stream incomplete: {data!r}")
        return decoded
    if coding == "zstd":
        d = zstandard.ZstdDecompressor().decompressobj()
        out = d.decompress(data)
        if not d.eof or d.unused_data:
            raise IncompleteStreamError(f"zstd frame incomplete or followed by bytes: {data!r}")
        return out
    raise ValueError(f"unknown coding {coding!r}")


def decode_prefix(coding: str, data: bytes) -> bytes:
    """
    What the start C{data} of a body in C{coding} decodes to so far (no end needed).
    """
    if coding == "gzip":
        return zlib.decompressobj(31).decompress(data)
    if coding == "br":
        out: bytes = brotli.Decompressor().process(data)
        return out
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise ValueError(f"unknown coding {coding!r}")


def dechunk_prefix(data: bytes) -> tuple[bytes, bool]:
    """
    The data of the complete chunks at the start of the chunked body C{data}, and
    whether the last chunk (size 0) and the blank line after it have arrived.
    """
    out = b""
    rest = data
    while True:
        line_end = rest.find(b"\r\n")
        if line_end < 0:
            return out, False
        size = int(rest[:line_end].split(b";")[0], 16)
        if size == 0:
            return out, rest[line_end + 2 :].startswith(b"\r\n")
        if len(rest) < line_end + 2 + size + 2:
            return out, False
        out += rest[line_end + 2 : line_end + 2 + size]
        rest = rest[line_end + 2 + size + 2 :]


@attrs.frozen
class Reply:
    """
    One HTTP/1.1 response as a client read it.

    @ivar status: The status code.
    @ivar headers: Every field, by lowercased name, values in order.
    @ivar raw: The bytes after the head, as they came (chunk framing included).
    @ivar body: The body, without chunk framing (still content-coded).
    """

    status: int
    headers: dict[str, list[str]]
    raw: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        """
        The only value of field C{name}; L{None} when absent (fails when repeated).
        """
        values = self.headers.get(name.lower())
        if values is None:
            return None
        assert len(values) == 1, f"{name} repeated: {values}"
        return values[0]

    @property
    def chunked(self) -> bool:
        """
        Whether the body was chunked.
        """
        return self.headers.get("transfer-encoding") == ["chunked"]

    def decoded(self) -> bytes:
        """
        The body decoded by its C{Content-Encoding}'s library (as it is without one).
        """
        coding = self.header("content-encoding")
        return self.body if coding is None else decode(coding, self.body)

    def vary(self) -> list[str]:
        """
        The C{Vary} field's members, in order, over all its lines.
        """
        return [
            member.strip()
            for value in self.headers.get("vary", [])
            for member in value.split(",")
            if member.strip()
        ]


def parse_reply(data: bytes, head_only: bool = False) -> Reply:
    """
    The response at the start of C{data} (all of it read: the server closed).

    @param head_only: The response has no body whatever its fields say (C{HEAD}).
    """
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    status = int(lines[0].split(" ")[1])
    body = rest
    if not head_only and headers.get("transfer-encoding") == ["chunked"]:
        body, complete = dechunk_prefix(rest)
        assert complete, f"chunked body incomplete: {rest[-200:]!r}"
    return Reply(status, headers, rest, body)


def request_bytes(
    method: str, target: str, headers: Sequence[tuple[str, str]] = (), body: bytes | None = None
) -> bytes:
    """
    One HTTP/1.1 request with C{Connection: close} (and C{Content-Length} when C{body}
    is given).
    """
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway.test", "Connection: close"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def exchange(
    port: int,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> Reply:
    """
    One request over a fresh connection to 127.0.0.1:C{port}; the response, read until
    the gateway closes the connection.
    """
    client = await connect(port)
    client.send(request_bytes(method, target, headers, body))
    await client.closed
    return parse_reply(client.received, head_only=method == "HEAD")


def serve_documents(test: TestCase, documents: str, files: dict[str, bytes] | None = None) -> int:
    """
    Build a gateway from C{documents} (whole YAML documents, the Gateway's included;
    C{ROOT} in them stands for a directory holding C{files}), listen on 127.0.0.1 until
    C{test} ends, and return the port.
    """
    root = os.path.abspath(test.mktemp())
    os.makedirs(root)
    for name, content in (files or {}).items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(content)
    tree = write_tree(test.mktemp(), {"a.yaml": documents.replace("ROOT", root)})
    client = UpstreamClient(reactor)
    built = build_gateway(load_config(tree, {}), reactor, client)
    listening = listen_local(built.site)
    test.addCleanup(connections_closed)
    test.addCleanup(client.close)
    test.addCleanup(listening.stopListening)
    return port_of(listening)
