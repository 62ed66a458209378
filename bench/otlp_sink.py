"""
OTLP trace receivers for C{python -m bench telemetry}, each run as its own process so
that receiving costs nothing in the gateway's CPU accounting:

  - C{http}: OTLP/HTTP (C{http/protobuf}). C{POST /v1/traces} is answered C{200} with an
    empty body of type C{application/x-protobuf}, on keep-alive connections (one thread
    each).
  - C{grpc}: OTLP/gRPC, a C{grpcio} server whose C{TraceService.Export} answers an empty
    C{ExportTraceServiceResponse}.

Both decode each export request only far enough to count its spans (C{resource_spans ->
scope_spans -> spans}) and answer C{GET /stats} with C{{"requests": N, "spans": M}}: on
the OTLP port for C{http}, on C{--stats-port} for C{grpc}.

Run as C{python -m bench.otlp_sink http --port PORT} or C{python -m bench.otlp_sink grpc
--port PORT --stats-port PORT}; it serves on 127.0.0.1 until killed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.processes import Process

TRACES_PATH = "/v1/traces"
"""Where OTLP/HTTP exporters post traces."""
STATS_PATH = "/stats"
"""Where the receiver says how much it received."""
PROTOCOLS = {"http": "http/protobuf", "grpc": "grpc"}
"""The receiver kinds and the C{Telemetry.spec.otlp.protocol} each serves."""


class Counts:
    """
    Export requests and spans received so far; updated from many threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.spans = 0

    def add(self, request: ExportTraceServiceRequest) -> None:
        """Count one export request and its spans."""
        spans = sum(
            len(scope.spans)
            for resource in request.resource_spans
            for scope in resource.scope_spans
        )
        with self._lock:
            self.requests += 1
            self.spans += spans

    def stats(self) -> bytes:
        """The counts as the JSON body of C{GET /stats}."""
        with self._lock:
            return json.dumps({"requests": self.requests, "spans": self.spans}).encode()


_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "": bytes,
    "identity": bytes,
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
}
"""How to undo each C{Content-Encoding} an OTLP/HTTP exporter may use."""


class Handler(BaseHTTPRequestHandler):
    """
    C{POST /v1/traces} (when the server takes traces) and C{GET /stats}, HTTP/1.1
    keep-alive.
    """

    protocol_version = "HTTP/1.1"
    server: SinkServer

    def _answer(self, status: int, content_type: str, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if not size:
                    return b"".join(chunks)
                chunks.append(chunk)
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_GET(self) -> None:
        """C{GET /stats}: the counts."""
        if self.path == STATS_PATH:
            self._answer(200, "application/json", self.server.counts.stats())
        else:
            self._answer(404, "text/plain", b"not found\n")

    def do_POST(self) -> None:
        """C{POST /v1/traces}: count the spans, answer an empty protobuf body."""
        body = self._body()
        if not self.server.traces or self.path != TRACES_PATH:
            self._answer(404, "text/plain", b"not found\n")
            return
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        decode = _DECODERS.get(encoding)
        if decode is None:
            self._answer(415, "text/plain", f"unsupported encoding {encoding!r}\n".encode())
            return
        try:
            request = ExportTraceServiceRequest.FromString(decode(body))
        except (OSError, EOFError, zlib.error, DecodeError) as e:
            self._answer(400, "text/plain", f"undecodable body: {e}\n".encode())
            return
        self.server.counts.add(request)
        self._answer(200, "application/x-protobuf")

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing per request."""


class SinkServer(ThreadingHTTPServer):
    """
    The HTTP server of a receiver: one thread per connection.

    @ivar counts: What it (or the gRPC server next to it) received.
    @ivar traces: Whether it takes C{POST /v1/traces} (the C{http} receiver).
    """

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, port: int, counts: Counts, traces: bool) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.counts = counts
        self.traces = traces


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC C{TraceService}: counts what each C{Export} call carries."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def Export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        """Count the spans; answer an empty response."""
        self.counts.add(request)
        return ExportTraceServiceResponse()


def serve_grpc(port: int, counts: Counts) -> Any:
    """
    Start the OTLP/gRPC receiver on 127.0.0.1:C{port} (insecure, on its own threads).

    @return: The started C{grpc.Server}.
    @raise OSError: If it cannot listen there.
    """
    server = grpc.server(
        ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"),
        options=[("grpc.so_reuseport", 0)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(counts), server)
    if int(server.add_insecure_port(f"127.0.0.1:{port}")) == 0:
        raise OSError(f"grpcio could not listen on 127.0.0.1:{port}")
    server.start()
    return server


@attrs.frozen
class Sink:
    """
    A receiver to start: its kind and ports.

    @ivar kind: C{http} or C{grpc} (a key of L{PROTOCOLS}).
    @ivar port: Where the exporter sends spans.
    @ivar stats_port: Where C{GET /stats} is answered (L{port} for C{http}).
    """

    kind: str
    port: int
    stats_port: int

    @property
    def protocol(self) -> str:
        """The C{otlp.protocol} of a gateway exporting to it."""
        return PROTOCOLS[self.kind]

    @property
    def endpoint(self) -> str:
        """The C{otlp.endpoint} of a gateway exporting to it (http: the base URL)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, log: Path) -> Process:
        """Start it as C{python -m bench.otlp_sink}, its output going to C{log}."""
        argv = [sys.executable, "-m", "bench.otlp_sink", self.kind, "--port", str(self.port)]
        if self.stats_port != self.port:
            argv.append(f"--stats-port={self.stats_port}")
        return Process(f"otlp {self.kind} receiver", argv, log)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve one receiver on 127.0.0.1 until killed."""
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    parser.add_argument("kind", choices=sorted(PROTOCOLS))
    parser.add_argument("--port", type=int, required=True, help="the OTLP port")
    parser.add_argument("--stats-port", type=int, help="grpc: where GET /stats is answered")
    args = parser.parse_args(argv)
    counts = Counts()
    # Held until exit: a grpc.Server that is garbage-collected stops serving.
    grpc_server = None
    if args.kind == "grpc":
        if args.stats_port is None:
            parser.error("grpc needs --stats-port")
        grpc_server = serve_grpc(args.port, counts)
        stats_port = args.stats_port
    else:
        stats_port = args.port
    with SinkServer(stats_port, counts, traces=args.kind == "http") as server:
        try:
            server.serve_forever()
        finally:
            if grpc_server is not None:
                grpc_server.stop(0)


if __name__ == "__main__":
    main()
