"""
C{python -m bench memory}: edgegw's memory figures on reverse-proxy routes.

  1. Streaming: the RSS growth of the edgegw process while a client downloads a 1 GiB
     response through a reverse-proxy route as fast as it can (peak RSS during the
     download minus the RSS before it). A proxy that streams with back-pressure stays
     flat; one that buffers grows with the response. Target: < 32 MiB.
  2. Streaming up: the same while a client uploads a 1 GiB request body (Content-Length)
     through a reverse-proxy route to a backend that reads and discards it. Target:
     < 32 MiB.
  3. Idle connections: the RSS of the edgegw process holding 10,000 idle keep-alive
     client connections (each has made one small request) through a reverse-proxy
     route. Target: < 300 MiB.
  4. Idle streams: the same holding 5,000 concurrent idle server-sent-event responses
     (a client and an upstream connection each). Target: < 300 MiB. Then the RSS of one
     process holding both, estimated from the two (their growths added to one
     baseline): a process holding both at once needs more open files than many
     machines allow one process (30,000 here, with this benchmark's own ends).
  5. Streaming compressed: the RSS growth while a client downloads a 1 GiB C{text/plain}
     response (the backend sends it with a C{Content-Length}) through a reverse-proxy
     route, edgegw compressing it on the fly (C{Accept-Encoding: gzip}, then C{br},
     then C{zstd}, one row each) and the client decoding it with the coding's own
     library, checking every byte and discarding it. Target: < 32 MiB.

Each measurement uses a fresh edgegw process, configured without connection caps (every
client here is 127.0.0.1, and limits.maxConnectionsPerAddress would refuse the rest).
All need the C{reverse-proxy} handler: when C{edgegw check} refuses the configuration
they are reported as unavailable. C{only} (C{--only}) runs some of them, by name.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import brotli  # type: ignore[import-untyped]
import zstandard

from bench import backends, gateway, report
from bench.processes import (
    MIB,
    Process,
    StartupError,
    peak_rss_bytes,
    raise_fd_limit,
    reset_peak_rss,
    rss_bytes,
    started,
)
from tests.support.processes import free_port

GIB = 1024 * MIB
DOWNLOAD_TARGET = 32 * MIB
"""The streaming target: RSS growth below this while 1 GiB passes through."""
SSE_TARGET = 300 * MIB
"""The idle target: RSS below this with 10,000 keep-alive connections and 5,000 streams."""
UNCAPPED = {"maxConnections": 0, "maxConnectionsPerAddress": 0, "maxConnectionsPerUpstream": 0}
"""The Gateway's limits here: one client address opens every connection."""
TEXT_CODINGS = ("gzip", "br", "zstd")
"""The codings of the compressed streaming rows (C{text-gzip}, ...), in order."""
MEASUREMENTS = ("download", "upload", "idle", "sse", *(f"text-{c}" for c in TEXT_CODINGS))
"""Every measurement C{--only} can name, in the order they run."""


@attrs.frozen
class Settings:
    """
    The options of one memory benchmark run.

    @ivar download_size: Bytes of the streamed response.
    @ivar sse_connections: Concurrent idle event streams.
    @ivar idle_connections: Idle keep-alive connections held beside the streams.
    @ivar keep_tmp: Keep the temporary directory (configuration and logs).
    @ivar only: The measurements to run (names of L{MEASUREMENTS}); empty: all.
    """

    download_size: int = GIB
    sse_connections: int = 5000
    idle_connections: int = 10_000
    keep_tmp: bool = False
    only: tuple[str, ...] = ()

    def runs(self, name: str) -> bool:
        """Whether measurement C{name} is run."""
        return not self.only or name in self.only


class ClientError(Exception):
    """The client got something other than the expected response."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _read_head(stream: Any) -> tuple[int, dict[bytes, bytes]]:
    status_line = stream.readline(65536)
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ClientError(f"bad status line {status_line!r}")
    headers = {}
    while True:
        line = stream.readline(65536)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _drain(stream: Any, count: int, buffer: memoryview) -> int:
    """Read and discard exactly C{count} bytes; return how many arrived before EOF."""
    done = 0
    while done < count:
        n = stream.readinto(buffer[: min(len(buffer), count - done)])
        if not n:
            break
        done += n
    return done


def download(port: int, path: str) -> int:
    """
    GET C{path} from 127.0.0.1:C{port} over a plain socket, reading the body as fast as
    possible and discarding it (Content-Length, chunked, or until close).

    @return: The number of body bytes received.
    @raise ClientError: If the status is not 200.
    """
    buffer = memoryview(bytearray(MIB))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        with sock.makefile("rb", buffering=MIB) as stream:
            status, headers = _read_head(stream)
            if status != 200:
                raise ClientError(f"GET {path} answered {status}")
            if b"content-length" in headers:
                return _drain(stream, int(headers[b"content-length"]), buffer)
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                total = 0
                while True:
                    size = int(stream.readline(1024).split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        return total
                    total += _drain(stream, size, buffer)
                    stream.readline(1024)
            return _drain(stream, 1 << 62, buffer)


class _Decoder:
    """
    Decodes one coding's stream piece by piece with the coding's own library, keeping
    only the decoded length and its CRC-32.
    """

    def __init__(self, coding: str) -> None:
        self.encoded = 0
        self.decoded = 0
        self.crc = 0
        self._decode: Callable[[bytes], bytes]
        if coding == "gzip":
            self._decode = zlib.decompressobj(31).decompress
        elif coding == "br":
            self._decode = brotli.Decompressor().process
        elif coding == "zstd":
            self._decode = zstandard.ZstdDecompressor().decompressobj().decompress
        else:
            raise ValueError(coding)

    def feed(self, data: bytes) -> None:
        self.encoded += len(data)
        out = self._decode(data)
        self.decoded += len(out)
        self.crc = zlib.crc32(out, self.crc)


def download_decoded(port: int, path: str, coding: str) -> _Decoder:
    """
    GET C{path} from 127.0.0.1:C{port} with C{Accept-Encoding: coding} over a plain
    socket, decoding the body as it arrives (Content-Length, chunked, or until close)
    and discarding it.

    @return: The decoder, with the encoded and decoded byte counts and the CRC-32 of
        the decoded bytes.
    @raise ClientError: If the status is not 200 or the body is not in C{coding}.
    """
    decoder = _Decoder(coding)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Accept-Encoding: {coding}\r\n\r\n".encode()
        )
        with sock.makefile("rb", buffering=MIB) as stream:
            status, headers = _read_head(stream)
            if status != 200:
                raise ClientError(f"GET {path} answered {status}")
            got = headers.get(b"content-encoding", b"").decode("latin-1")
            if got != coding:
                raise ClientError(f"GET {path} answered Content-Encoding {got or 'none'}")
            if b"content-length" in headers:
                _feed(stream, int(headers[b"content-length"]), decoder)
            elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                while True:
                    size = int(stream.readline(1024).split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        break
                    _feed(stream, size, decoder)
                    stream.readline(1024)
            else:
                _feed(stream, 1 << 62, decoder)
    return decoder


def _feed(stream: Any, count: int, decoder: _Decoder) -> None:
    """Read up to C{count} bytes (until EOF) into C{decoder}."""
    done = 0
    while done < count:
        data = stream.read1(min(MIB, count - done))
        if not data:
            return
        decoder.feed(data)
        done += len(data)


def text_crc(size: int) -> int:
    """The CRC-32 of the first C{size} bytes of C{GET /text/N}'s body (any N >= size)."""
    block = backends.text_block()
    whole, rest = divmod(size, len(block))
    crc = 0
    for _ in range(whole):
        crc = zlib.crc32(block, crc)
    return zlib.crc32(block[:rest], crc)


def measure_text(edgegw: Process, port: int, size: int, coding: str) -> dict[str, Any]:
    """
    Measure the RSS growth of C{edgegw} while it compresses a C{size}-byte text
    response with C{coding} and the client decodes it; check every decoded byte.
    """
    last: list[_Decoder] = []

    def transfer(n: int) -> int:
        decoder = download_decoded(port, f"/text/{n}", coding)
        last[:] = [decoder]
        return decoder.decoded

    result = _measure_stream(edgegw, size, transfer)
    decoder = last[0]
    if decoder.crc != text_crc(size):
        raise ClientError(f"the decoded {coding} body is not the backend's text (CRC-32)")
    result["coding"] = coding
    result["encoded_bytes"] = decoder.encoded
    result["ratio"] = round(decoder.decoded / max(decoder.encoded, 1), 2)
    return result


def upload(port: int, path: str, size: int) -> int:
    """
    POST C{size} zero bytes (C{Content-Length}) to C{path} on 127.0.0.1:C{port} as fast
    as the connection takes them.

    @return: The bytes the backend says it received.
    @raise ClientError: If the status is not 200.
    """
    chunk = bytes(MIB)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        remaining = size
        while remaining:
            part = chunk if remaining >= len(chunk) else chunk[:remaining]
            sock.sendall(part)
            remaining -= len(part)
        with sock.makefile("rb") as stream:
            status, headers = _read_head(stream)
            body = stream.read(int(headers.get(b"content-length", b"0")))
    if status != 200:
        raise ClientError(f"POST {path} answered {status}")
    received: int = json.loads(body)["received"]
    return received


class RssSampler:
    """
    Samples a process's RSS every few milliseconds in a thread and keeps the maximum.
    """

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


def measure_download(edgegw: Process, port: int, size: int) -> dict[str, Any]:
    """
    Measure the RSS growth of C{edgegw} while C{size} bytes stream through it.
    """
    return _measure_stream(edgegw, size, lambda n: download(port, f"/zeros/{n}"))


def measure_upload(edgegw: Process, port: int, size: int) -> dict[str, Any]:
    """
    Measure the RSS growth of C{edgegw} while a C{size}-byte request body streams up
    through it.
    """
    return _measure_stream(edgegw, size, lambda n: upload(port, "/sink", n))


def _measure_stream(edgegw: Process, size: int, transfer: Callable[[int], int]) -> dict[str, Any]:
    # Warm up the route (imports, first connection) so that the baseline is the
    # process's steady state rather than its cold start.
    warm = transfer(MIB)
    if warm != MIB:
        raise ClientError(f"warm-up transfer moved {warm} of {MIB} bytes")
    time.sleep(0.5)
    baseline = rss_bytes(edgegw.pid)
    hwm_reset = reset_peak_rss(edgegw.pid)
    started_at = time.monotonic()
    with RssSampler(edgegw.pid) as sampler:
        received = transfer(size)
    seconds = time.monotonic() - started_at
    peak = sampler.peak
    if hwm_reset:
        # VmHWM catches a spike between two samples.
        peak = max(peak, peak_rss_bytes(edgegw.pid))
    if received != size:
        raise ClientError(f"moved {received} of {size} bytes")
    growth = peak - baseline
    return {
        "bytes": received,
        "seconds": round(seconds, 3),
        "mib_per_second": round(received / MIB / seconds, 1),
        "baseline_rss_mib": round(baseline / MIB, 2),
        "peak_rss_mib": round(peak / MIB, 2),
        "growth_mib": round(growth / MIB, 2),
        "peak_from_vmhwm": hwm_reset,
        "target_mib": DOWNLOAD_TARGET // MIB,
        "ok": growth < DOWNLOAD_TARGET,
    }


HEAD_TIMEOUT = 30.0
"""Seconds to wait for an event stream's response head."""


class StreamOpener:
    """
    Opens C{GET /events} streams, at most C{concurrency} connecting at once, and gives
    up on the rest once C{max_failures} have failed (rather than waiting out a timeout
    for each of thousands).
    """

    def __init__(self, port: int, concurrency: int = 100, max_failures: int = 50) -> None:
        self.port = port
        self.limit = asyncio.Semaphore(concurrency)
        self.failures = 0
        self.max_failures = max_failures

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """
        Open one stream and wait for its C{200 text/event-stream} head.

        @raise ClientError: On any other answer, no head within L{HEAD_TIMEOUT}, or
            after too many failures.
        """
        async with self.limit:
            if self.failures >= self.max_failures:
                raise ClientError(f"not attempted after {self.failures} failures")
            try:
                return await self._open()
            except (ClientError, OSError, EOFError):
                self.failures += 1
                raise

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(
                f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            except TimeoutError:
                raise ClientError(
                    f"GET /events: no response head within {HEAD_TIMEOUT:.0f}s (the backend "
                    "sends its head at once and then nothing: the proxy must not hold the "
                    "head back until body bytes arrive)"
                ) from None
            except asyncio.IncompleteReadError:
                raise ClientError("GET /events: connection closed before the head") from None
            status_line, _, headers = head.partition(b"\r\n")
            if status_line.split()[1:2] != [b"200"] or b"text/event-stream" not in headers.lower():
                raise ClientError(f"GET /events answered {status_line.decode('latin-1')!r}")
        except BaseException:
            writer.close()
            raise
        return reader, writer


def _backend_open(backend_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{backend_port}/stats", timeout=10) as r:
        count: int = json.load(r)["open"]
        return count


async def _keep_alive(
    port: int, limit: asyncio.Semaphore
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """
    A connection that has made one small request (keep-alive) and stays open, idle.
    """
    async with limit:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET /zeros/16 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            if head.split()[1:2] != [b"200"]:
                raise ClientError(f"GET /zeros/16 answered {head[:40]!r}")
            await asyncio.wait_for(reader.readexactly(16), HEAD_TIMEOUT)
        except BaseException:
            writer.close()
            raise
        return reader, writer


async def _hold_streams(
    edgegw: Process, port: int, backend_port: int, count: int, idle: int
) -> dict[str, Any]:
    # One stream first, closed again, so that the baseline has the route warmed up.
    _, writer = await StreamOpener(port, max_failures=1).open()
    writer.close()
    await asyncio.sleep(0.5)
    baseline = rss_bytes(edgegw.pid)
    limit = asyncio.Semaphore(100)
    started_at = time.monotonic()
    kept = await asyncio.gather(
        *(_keep_alive(port, limit) for _ in range(idle)), return_exceptions=True
    )
    opener = StreamOpener(port)
    outcomes = await asyncio.gather(*(opener.open() for _ in range(count)), return_exceptions=True)
    opening = time.monotonic() - started_at
    connections = [k for k in kept if not isinstance(k, BaseException)]
    streams = [o for o in outcomes if not isinstance(o, BaseException)]
    failures = [o for o in [*kept, *outcomes] if isinstance(o, BaseException)]
    try:
        await asyncio.sleep(2)  # let the process settle with everything open
        samples = []
        for _ in range(10):
            samples.append(rss_bytes(edgegw.pid))
            await asyncio.sleep(0.1)
        rss = max(samples)
        still_open = sum(1 for reader, _ in streams if not reader.at_eof())
        idle_open = sum(1 for reader, _ in connections if not reader.at_eof())
        at_backend = await asyncio.get_running_loop().run_in_executor(
            None, _backend_open, backend_port
        )
    finally:
        for _, writer in [*streams, *connections]:
            writer.close()
    result: dict[str, Any] = {
        "idle_requested": idle,
        "idle_opened": len(connections),
        "idle_still_open": idle_open,
        "requested": count,
        "opened": len(streams),
        "still_open": still_open,
        "open_at_backend": at_backend,
        "seconds_to_open": round(opening, 2),
        "baseline_rss_mib": round(baseline / MIB, 2),
        "rss_mib": round(rss / MIB, 2),
        "kib_per_connection": round(
            (rss - baseline) / 1024 / max(1, len(streams) + len(connections)), 1
        ),
        "target_mib": SSE_TARGET // MIB,
        "ok": rss < SSE_TARGET and still_open == count and idle_open == idle,
    }
    if failures:
        result["failures"] = len(failures)
        result["first_failure"] = repr(failures[0])
    return result


def measure_sse(
    edgegw: Process, port: int, backend_port: int, count: int, idle: int
) -> dict[str, Any]:
    """
    Open C{idle} keep-alive connections (one small request each) and C{count} idle
    event streams through C{edgegw} from this one asyncio process and measure edgegw's
    RSS while they are all open.
    """
    return asyncio.run(_hold_streams(edgegw, port, backend_port, count, idle))


def _with_processes(
    label: str,
    tmp: Path,
    config: Path,
    port: int,
    upstreams: Sequence[tuple[str, int]],
    measure: Callable[[Process], dict[str, Any]],
) -> dict[str, Any]:
    """
    Start the backends and a fresh edgegw, run C{measure(edgegw)}, stop them all.

    @return: The measurement, or C{{"failed": reason}}.
    """
    _say(f"bench: {label} ...")
    kinds = "-".join(kind for kind, _ in upstreams)
    try:
        with ExitStack() as stack:
            for kind, backend_port in upstreams:
                upstream = stack.enter_context(
                    started(backends.start(kind, backend_port, tmp / f"{kind}.log"))
                )
                upstream.wait_for_port(backend_port)
            edgegw = stack.enter_context(
                started(gateway.start(config, tmp / f"edgegw-{kinds}.log"))
            )
            edgegw.wait_for_port(port)
            return measure(edgegw)
    except (StartupError, ClientError, OSError, EOFError) as e:
        return {"failed": f"{type(e).__name__}: {e}"}


def run(settings: Settings) -> int:
    """
    Run the measurements (all, or C{settings.only}), print them, and write the JSON
    results.

    @return: The exit status: 0, also when edgegw cannot proxy yet (the results say
        "unavailable"); 1 when a measurement failed.
    """
    count = settings.sse_connections
    idle = settings.idle_connections
    # edgegw holds a client and an upstream socket per stream, or a socket per idle
    # connection; this process holds the other ends of the client connections.
    needed = max(2 * count, idle) + 1024
    fd_limit = raise_fd_limit(needed)
    tmp = Path(tempfile.mkdtemp(prefix="edgegw-bench-memory-"))
    results: dict[str, dict[str, Any]] = {}
    try:
        zeros_port, sse_port, port = free_port(), free_port(), free_port()
        zeros = f"http://127.0.0.1:{zeros_port}"
        config = gateway.write_config(
            tmp / "edgegw",
            port,
            [
                gateway.reverse_proxy("zeros", "GET /zeros/", zeros),
                gateway.reverse_proxy("text", "GET /text/", zeros),
                gateway.reverse_proxy("sink", "POST /sink", zeros),
                gateway.reverse_proxy("events", "GET /events", f"http://127.0.0.1:{sse_port}"),
            ],
            [gateway.gateway_fields({"limits": UNCAPPED})],
        )
        reason = gateway.check(config)
        size = settings.download_size

        def stream(label: str, measure: Callable[[Process], dict[str, Any]]) -> dict[str, Any]:
            return _with_processes(label, tmp, config, port, [("zeros", zeros_port)], measure)

        for name in MEASUREMENTS:
            if not settings.runs(name):
                continue
            if reason is not None:
                results[name] = {"unavailable": reason}
            elif name == "download":
                results[name] = stream(
                    f"streaming {size / MIB:.0f} MiB through edgegw",
                    lambda edgegw: measure_download(edgegw, port, size),
                )
            elif name == "upload":
                results[name] = stream(
                    f"uploading {size / MIB:.0f} MiB through edgegw",
                    lambda edgegw: measure_upload(edgegw, port, size),
                )
            elif name.startswith("text-"):
                coding = name.removeprefix("text-")
                results[name] = stream(
                    f"streaming {size / MIB:.0f} MiB of text through edgegw, {coding}",
                    functools.partial(measure_text, port=port, size=size, coding=coding),
                )
            elif fd_limit < needed:
                results[name] = {
                    "unavailable": f"the open-file limit is {fd_limit}, below the {needed} "
                    "needed (raise it with ulimit -n, or run as root)"
                }
            else:
                streams, connections = (0, idle) if name == "idle" else (count, 0)
                what = (
                    f"{connections} idle keep-alive connections"
                    if connections
                    else f"{streams} idle event streams"
                )
                results[name] = _with_processes(
                    f"holding {what} through edgegw",
                    tmp,
                    config,
                    port,
                    [("zeros", zeros_port), ("sse", sse_port)],
                    functools.partial(
                        measure_sse,
                        port=port,
                        backend_port=sse_port,
                        count=streams,
                        idle=connections,
                    ),
                )
    finally:
        if settings.keep_tmp:
            print(f"bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(table(settings, results))
    path = report.write_json(
        "memory",
        {
            "benchmark": "memory",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "settings": attrs.asdict(settings),
            "machine": report.machine(),
            "fd_limit": fd_limit,
            "results": results,
        },
    )
    print(f"\nresults: {path}")
    return 1 if any("failed" in result for result in results.values()) else 0


def table(settings: Settings, results: dict[str, dict[str, Any]]) -> str:
    """
    The figures run against their targets, with the details under each.
    """
    size = f"{settings.download_size / MIB:,.0f} MiB"
    lines: list[str] = []
    for number, name, title in (
        ("1.", "download", f"streaming a {size} response down through reverse-proxy"),
        ("2.", "upload", f"streaming a {size} request body up through reverse-proxy"),
    ):
        if name in results:
            lines += _stream_lines(number, title, results[name])
    for number, name, title in (
        ("3.", "idle", f"{settings.idle_connections:,} idle keep-alive connections"),
        ("4.", "sse", f"{settings.sse_connections:,} idle SSE streams"),
    ):
        if name not in results:
            continue
        held = results[name]
        lines.append(f"{number} edgegw RSS holding {title} through reverse-proxy")
        if "rss_mib" not in held:
            lines.append(f"   {_not_measured(held)}")
            continue
        verdict = "ok" if held["ok"] else "OVER TARGET or connections lost"
        open_now = held["idle_still_open"] + held["still_open"]
        lines.append(
            f"   RSS {held['rss_mib']:.1f} MiB with {open_now:,} open (target < "
            f"{held['target_mib']} MiB with all open): {verdict}"
        )
        lines.append(
            f"   baseline {held['baseline_rss_mib']:.1f} MiB, "
            f"{held['kib_per_connection']:.1f} KiB per connection, opened in "
            f"{held['seconds_to_open']:.1f}s; {held['open_at_backend']:,} streams open at "
            "the backend"
        )
        if "first_failure" in held:
            lines.append(f"   {held['failures']} failed, first: {held['first_failure']}")
    idle, sse = results.get("idle", {}), results.get("sse", {})
    if "rss_mib" in idle and "rss_mib" in sse:
        both = idle["rss_mib"] + sse["rss_mib"] - sse["baseline_rss_mib"]
        verdict = "ok" if both < SSE_TARGET / MIB and idle["ok"] and sse["ok"] else "OVER"
        lines.append(
            f"   both at once (3's RSS plus 4's growth): ~{both:.1f} MiB "
            f"(target < {SSE_TARGET // MIB} MiB): {verdict}"
        )
    for index, coding in enumerate(TEXT_CODINGS):
        name = f"text-{coding}"
        if name in results:
            title = (
                f"streaming a {size} text/plain response down through reverse-proxy, "
                f"compressed with {coding} (the client decoding it)"
            )
            lines += _stream_lines(f"5{'abc'[index]}.", title, results[name])
    return "\n".join(lines)


def _stream_lines(number: str, title: str, stream: dict[str, Any]) -> list[str]:
    """One streaming figure against its target, with its details."""
    lines = [f"{number} edgegw RSS growth while {title}"]
    if "growth_mib" not in stream:
        return [*lines, f"   {_not_measured(stream)}"]
    verdict = "ok" if stream["ok"] else "OVER TARGET"
    lines.append(
        f"   growth {stream['growth_mib']:.1f} MiB (target < {stream['target_mib']} MiB): {verdict}"
    )
    lines.append(
        f"   baseline {stream['baseline_rss_mib']:.1f} MiB, peak "
        f"{stream['peak_rss_mib']:.1f} MiB, {stream['seconds']:.1f}s at "
        f"{stream['mib_per_second']:,.0f} MiB/s"
    )
    if "encoded_bytes" in stream:
        lines.append(
            f"   {stream['bytes'] / MIB:,.0f} MiB sent as {stream['encoded_bytes'] / MIB:,.1f} "
            f"MiB of {stream['coding']} ({stream['ratio']:.2f}x), decoded and checked (CRC-32)"
        )
    return lines


def _not_measured(result: dict[str, Any]) -> str:
    if "unavailable" in result:
        return f"unavailable: {result['unavailable']}"
    return f"failed: {result.get('failed', 'not run')}"
