"""
C{python -m bench compression}: what compressing a response costs edgegw, beside nginx
with C{gzip on}, each one serving process proxying the same 64 KiB JSON document from
the same nginx backend (which sends it with a C{Content-Length}).

Rows, every round loading each in turn with C{wrk -t1 -cN --latency} and the row's
C{Accept-Encoding}:

  - C{edgegw-zstd}, C{edgegw-br}, C{edgegw-gzip}: edgegw's default compression (zstd 6,
    brotli 4, gzip 5), the client accepting only that coding;
  - C{edgegw-identity}: the same edgegw, the client sending no C{Accept-Encoding}
    (the identity answer: the compression stage still runs and adds C{Vary});
  - C{edgegw-off}: another edgegw with C{compression: {enabled: false}}, no
    C{Accept-Encoding}: what a response costs without the stage;
  - C{nginx-gzip1}: nginx with C{gzip on} at its default level (C{gzip_comp_level 1});
  - C{nginx-gzip5}: the same nginx at C{gzip_comp_level 5}, edgegw's gzip level;
  - C{nginx-identity}: the same nginx without gzip, no C{Accept-Encoding}.

and the same document as a static file (C{/static/app.js}, C{text/javascript}), served
by the compressing edgegw's C{static} route and by nginx's C{root}:

  - C{edgegw-static-zstd}: zstd, from edgegw's static cache of compressed bodies (each
    file compressed once per process and coding: the rounds measure hits);
  - C{edgegw-static-nocache}: zstd, from a third edgegw with
    C{compression: {staticCacheSize: 0}}: the file compressed on every request, as
    before the cache;
  - C{edgegw-static-identity}: the compressing edgegw's static file, no
    C{Accept-Encoding};
  - C{nginx-static-gzip5}, C{nginx-static-identity}: nginx serving the file with
    C{gzip on} at level 5 / without gzip.

Before the load every row is asked once: it must answer C{200} with the expected
C{Content-Encoding} (none for the identity rows), and the body, decoded with its own
library (zstandard, brotli, zlib), must be the document byte for byte. Then it is asked
L{CONCURRENT} times at once, on as many connections, and every answer must decode so
too (wrk does not look at bodies: a coding whose streams mix up under concurrency would
otherwise be measured as if it worked); a row that fails this is still measured, marked
C{WRONG}, and the command exits 1. Then the
encoders are timed in process on the same document, at edgegw's levels and around them,
which is what the levels were chosen by; with C{--app}, also on the text files of
C{pageload}'s single-page app (what a browser's first load is mostly made of).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import http.client
import json
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import brotli  # type: ignore[import-untyped]
import zstandard

from bench import gateway, nginx, report, spa, wrk
from bench.processes import StartupError, children, scratch, started, warn_if_busy
from bench.rounds import say
from bench.targets import Target, start_edgegw
from bench.tools import ensure, ensure_tools, version
from edgegw.compression.codings import BROTLI_QUALITY, GZIP_LEVEL, ZSTD_LEVEL
from tests.support.processes import free_port

PATH = "/api.json"
"""The document's URL path, on the backend and through every proxy."""
STATIC_PATH = "/static/app.js"
"""The same document as a static file, on the static rows."""
SIZE = 64 * 1024
"""The document's size in bytes."""

_VOCABULARY = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
    "zulu gateway edge route proxy static session policy token upstream backend cache "
    "stream header request response cluster region zone tenant project service"
)
_WORDS = tuple(_VOCABULARY.split(" "))


def document(size: int = SIZE, seed: int = 34) -> bytes:
    """
    A JSON array of API records (ids, names, e-mail addresses, timestamps, tags,
    numbers, nested objects), pseudo-random from C{seed}, exactly C{size} bytes: what
    an API answers, compressing about as much as such answers do.
    """
    rng = random.Random(seed)
    records: list[str] = []
    length = 2  # the brackets
    # The last record pads the array to exactly size with a string field.
    reserve = len('{"id":0,"pad":""}') + 1
    index = 0
    while True:
        index += 1
        first, last = rng.choice(_WORDS), rng.choice(_WORDS)
        record = {
            "id": 100000 + index * 7 + rng.randrange(7),
            "uuid": f"{rng.getrandbits(128):032x}",
            "name": f"{first.title()} {last.title()}",
            "email": f"{first}.{last}{rng.randrange(100)}@example.{rng.choice(('com', 'org'))}",
            "created": f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T"
            f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z",
            "active": rng.random() < 0.8,
            "score": round(rng.uniform(0, 100), 3),
            "tags": rng.sample(_WORDS, rng.randrange(1, 5)),
            "address": {
                "city": rng.choice(_WORDS).title(),
                "zip": f"{rng.randrange(100000):05d}",
                "geo": [round(rng.uniform(-90, 90), 5), round(rng.uniform(-180, 180), 5)],
            },
        }
        text = json.dumps(record, separators=(",", ":"))
        extra = len(text) + (1 if records else 0)
        if length + extra + reserve > size:
            break
        records.append(text)
        length += extra
    pad = size - length - reserve
    records.append('{"id":0,"pad":"' + "x" * pad + '"}')
    body = ("[" + ",".join(records) + "]").encode()
    assert len(body) == size, len(body)
    return body


def decode(encoding: str | None, body: bytes) -> bytes:
    """C{body} decoded from C{encoding} with its own library (L{None}: as it is)."""
    if encoding is None:
        return body
    if encoding == "gzip":
        return zlib.decompress(body, 31)
    if encoding == "br":
        out: bytes = brotli.decompress(body)
        return out
    if encoding == "zstd":
        # A streamed frame has no content size in its header: decompress as a stream.
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    raise ValueError(f"unknown encoding {encoding!r}")


@attrs.frozen
class Settings:
    """
    The options of one run.

    @ivar duration: Seconds per load run.
    @ivar connections: wrk's connections.
    @ivar rounds: Interleaved rounds.
    @ivar warmup: Unrecorded seconds per row before round 1 (0: none).
    @ivar keep_tmp: Keep the temporary directory (configurations, logs).
    @ivar app: Also time the encoders on the single-page app's text files.
    @ivar only: The rows measured (L{None}: all of L{ROWS}).
    """

    duration: int = 10
    connections: int = 50
    rounds: int = 3
    warmup: int = 1
    keep_tmp: bool = False
    app: bool = False
    only: tuple[str, ...] | None = None


@attrs.define
class Row:
    """
    One server answering with one encoding.

    @ivar key: Its name in the table (C{edgegw-br}).
    @ivar server: C{edgegw} or C{nginx}.
    @ivar encoding: The coding the client accepts and the answer must have, or L{None}
        (no C{Accept-Encoding}; the identity answer).
    @ivar baseline: The row of the same server answering identity (the compression's
        added CPU is measured against it).
    @ivar description: What the row is, in a few words.
    @ivar target: The server's port and processes (its own copy: availability is the
        row's).
    @ivar answer: What the check saw: the encoded body's bytes, the framing.
    @ivar samples: Each round's figures.
    """

    key: str
    server: str
    encoding: str | None
    baseline: str | None
    description: str
    target: Target
    path: str = PATH
    answer: dict[str, Any] = attrs.Factory(dict)
    samples: list[dict[str, float]] = attrs.Factory(list)

    def headers(self) -> list[str]:
        return [] if self.encoding is None else [f"Accept-Encoding: {self.encoding}"]

    def url(self) -> wrk.Url:
        return wrk.Url(f"http://127.0.0.1:{self.target.port}{self.path}", self.headers())


_NGINX_PROXY = """\
    upstream backend {{
        server 127.0.0.1:{backend_port};
        keepalive {keepalive};
        keepalive_requests 1000000000;
    }}
{servers}"""

_NGINX_SERVER = """\
    server {{
        listen 127.0.0.1:{port} backlog=4096;
{gzip}        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""

_NGINX_STATIC_SERVER = """\
    server {{
        listen 127.0.0.1:{port} backlog=4096;
{gzip}        location / {{
            root {root};
            types {{
                text/javascript js;
            }}
        }}
    }}
"""

NGINX_GZIP = {"nginx-gzip1": None, "nginx-gzip5": 5, "nginx-identity": -1}
"""The nginx rows' C{gzip_comp_level}: L{None} for nginx's default (1), -1 for no gzip."""
NGINX_STATIC_GZIP = {"nginx-static-gzip5": 5, "nginx-static-identity": -1}
"""The same for nginx's static rows."""

ROWS = (
    "edgegw-zstd",
    "edgegw-br",
    "edgegw-gzip",
    "edgegw-identity",
    "edgegw-off",
    "nginx-gzip1",
    "nginx-gzip5",
    "nginx-identity",
    "edgegw-static-zstd",
    "edgegw-static-nocache",
    "edgegw-static-identity",
    "nginx-static-gzip5",
    "nginx-static-identity",
)
"""Every row, in round order (C{--only} names some)."""


def _nginx_gzip(level: int | None) -> str:
    if level == -1:
        return ""
    types = "application/json application/javascript text/javascript"
    lines = ["gzip on;", "gzip_vary on;", f"gzip_types {types};"]
    if level is not None:
        lines.append(f"gzip_comp_level {level};")
    return "".join(f"        {line}\n" for line in lines)


def start_rows(stack: ExitStack, tmp: Path, settings: Settings) -> list[Row]:
    """
    Start the backend, the two edgegw processes and nginx; make the rows in round order.

    @raise StartupError: If the backend does not start.
    """
    tools = ensure_tools()
    www = tmp / "www"
    www.mkdir()
    body = document()
    (www / PATH.lstrip("/")).write_bytes(body)
    site = tmp / "site"
    (site / "static").mkdir(parents=True)
    (site / STATIC_PATH.lstrip("/")).write_bytes(body)
    backend_port = free_port()
    nginx.start_backend(stack, tools.nginx, tmp, www, backend_port)
    upstream = f"http://127.0.0.1:{backend_port}"
    routes = [
        gateway.reverse_proxy("api", "/", upstream),
        gateway.static("static", "/static/", site),
    ]

    def edgegw(label: str, compression: dict[str, Any] | None) -> Target:
        target = Target(label, label, f"edgegw {label}", port=free_port())
        resources = [gateway.gateway_fields({"compression": compression})] if compression else []
        start_edgegw(stack, tmp, label, target, routes, resources)
        return target

    wanted = set(settings.only or ROWS)
    compressing = edgegw("edgegw", None)
    off = edgegw("edgegw-off", {"enabled": False}) if "edgegw-off" in wanted else compressing
    nocache = (
        edgegw("edgegw-nocache", {"staticCacheSize": 0})
        if "edgegw-static-nocache" in wanted
        else compressing
    )
    ports = {key: free_port() for key in (*NGINX_GZIP, *NGINX_STATIC_GZIP)}
    servers = "".join(
        _NGINX_SERVER.format(port=ports[key], gzip=_nginx_gzip(level))
        for key, level in NGINX_GZIP.items()
    ) + "".join(
        _NGINX_STATIC_SERVER.format(port=ports[key], gzip=_nginx_gzip(level), root=site)
        for key, level in NGINX_STATIC_GZIP.items()
    )
    config_body = _NGINX_PROXY.format(
        backend_port=backend_port, keepalive=max(64, settings.connections), servers=servers
    )
    proxy_prefix = tmp / "nginx-proxy"
    proxy_prefix.mkdir()
    nginx_target = Target("nginx", "nginx", "nginx proxy")
    try:
        process = stack.enter_context(
            started(
                nginx.start(
                    tools.nginx,
                    "nginx proxy",
                    proxy_prefix,
                    nginx.write(proxy_prefix, config_body),
                )
            )
        )
        for port in ports.values():
            process.wait_for_port(port)
        nginx_target.process = process
        nginx_target.pids = children(process.pid)
        if not nginx_target.pids:
            nginx_target.unavailable = "nginx has no worker process"
    except StartupError as e:
        nginx_target.unavailable = f"did not start: {e}"

    def row(
        key: str,
        target: Target,
        encoding: str | None,
        baseline: str | None,
        description: str,
        port: int | None = None,
        path: str = PATH,
    ) -> Row:
        own = attrs.evolve(target, key=key, port=port or target.port)
        return Row(key, key.partition("-")[0], encoding, baseline, description, own, path)

    rows = [
        row(
            "edgegw-zstd",
            compressing,
            "zstd",
            "edgegw-identity",
            f"edgegw, zstd level {ZSTD_LEVEL}",
        ),
        row("edgegw-br", compressing, "br", "edgegw-identity", "edgegw, brotli quality 4"),
        row("edgegw-gzip", compressing, "gzip", "edgegw-identity", "edgegw, gzip level 5"),
        row("edgegw-identity", compressing, None, None, "edgegw, no Accept-Encoding"),
        row("edgegw-off", off, None, None, "edgegw, compression.enabled: false"),
        row(
            "nginx-gzip1",
            nginx_target,
            "gzip",
            "nginx-identity",
            "nginx gzip on, gzip_comp_level 1 (default)",
            ports["nginx-gzip1"],
        ),
        row(
            "nginx-gzip5",
            nginx_target,
            "gzip",
            "nginx-identity",
            "nginx gzip on, gzip_comp_level 5",
            ports["nginx-gzip5"],
        ),
        row(
            "nginx-identity",
            nginx_target,
            None,
            None,
            "nginx without gzip",
            ports["nginx-identity"],
        ),
        row(
            "edgegw-static-zstd",
            compressing,
            "zstd",
            "edgegw-static-identity",
            "edgegw static file, zstd, static cache on (hits)",
            path=STATIC_PATH,
        ),
        row(
            "edgegw-static-nocache",
            nocache,
            "zstd",
            "edgegw-static-identity",
            "edgegw static file, zstd, staticCacheSize: 0",
            path=STATIC_PATH,
        ),
        row(
            "edgegw-static-identity",
            compressing,
            None,
            None,
            "edgegw static file, no Accept-Encoding",
            path=STATIC_PATH,
        ),
        row(
            "nginx-static-gzip5",
            nginx_target,
            "gzip",
            "nginx-static-identity",
            "nginx static file, gzip on, gzip_comp_level 5",
            ports["nginx-static-gzip5"],
            STATIC_PATH,
        ),
        row(
            "nginx-static-identity",
            nginx_target,
            None,
            None,
            "nginx static file without gzip",
            ports["nginx-static-identity"],
            STATIC_PATH,
        ),
    ]
    rows = [each for each in rows if each.key in wanted]
    for each in rows:
        if each.target.unavailable is None:
            each.target.unavailable = check(each, body)
    return rows


CONCURRENT = 16
"""How many requests the concurrent check sends at once."""


def _ask(row: Row, expected: bytes) -> tuple[str | None, http.client.HTTPResponse | None, bytes]:
    """
    C{GET} the document once from C{row}'s server with its C{Accept-Encoding}.

    @return: What was wrong (L{None}: it answered C{200} with the row's
        C{Content-Encoding} and a body that decodes to C{expected}), the response and
        its (encoded) body.
    """
    connection = http.client.HTTPConnection("127.0.0.1", row.target.port, timeout=10)
    try:
        headers = dict(h.split(": ", 1) for h in row.headers())
        connection.request("GET", row.path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as e:
        return f"GET {row.path} failed: {e}", None, b""
    finally:
        connection.close()
    coding = response.getheader("Content-Encoding")
    if response.status != 200 or coding != row.encoding:
        return (
            f"GET {row.path} answered {response.status}, Content-Encoding {coding}",
            response,
            body,
        )
    try:
        decoded = decode(coding, body)
    except Exception as e:
        return f"the {coding} body does not decode: {type(e).__name__}: {e}", response, body
    if decoded != expected:
        wrong = f"the body decodes to {len(decoded)} bytes, not the document's {len(expected)}"
        return wrong, response, body
    return None, response, body


def check(row: Row, expected: bytes) -> str | None:
    """
    Ask C{row}'s server once, then L{CONCURRENT} times at once; record the answer's
    encoded size and framing, and how many concurrent answers were right, in
    C{row.answer}.

    @return: L{None} if the single answer was right (see L{_ask}), else what was wrong.
    """
    wrong, response, body = _ask(row, expected)
    if wrong is not None or response is None:
        return wrong
    length = response.getheader("Content-Length")
    row.answer = {
        "encoded_bytes": len(body),
        "ratio": round(len(expected) / len(body), 2),
        "framing": f"Content-Length {length}" if length else "chunked",
        "vary": response.getheader("Vary"),
    }
    with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(lambda _: _ask(row, expected)[0], range(CONCURRENT)))
    failures = [answer for answer in answers if answer is not None]
    row.answer["concurrent_ok"] = CONCURRENT - len(failures)
    if failures:
        row.answer["concurrent_failure"] = failures[0]
    return None


def measure(wrk_path: str, rows: Sequence[Row], settings: Settings) -> None:
    """The warm-up, then every round; a row that fails is unavailable from then on."""

    def ready() -> list[Row]:
        return [row for row in rows if row.target.unavailable is None]

    if settings.warmup > 0:
        say(f"warm-up: {settings.warmup}s per row")
        for row in ready():
            try:
                wrk.run(wrk_path, row.url(), settings.connections, settings.warmup)
            except wrk.WrkError as e:
                row.target.unavailable = f"wrk failed during warm-up: {e}"
            row.target.check_alive()
    for round_ in range(1, settings.rounds + 1):
        for row in ready():
            try:
                done, cpu = wrk.measure(
                    wrk_path, row.url(), settings.connections, settings.duration, row.target.pids
                )
            except wrk.WrkError as e:
                row.target.unavailable = f"wrk failed: {e}"
                continue
            row.target.check_alive()
            if row.target.unavailable is not None:
                continue
            figures = {
                "rps": done.rps,
                "p50": done.latency[50.0],
                "cpu_us": cpu / max(done.requests, 1) * 1e6,
                "wire_bytes": done.bytes_read / max(done.requests, 1),
                "requests": float(done.requests),
                "errors": float(done.errors),
            }
            row.samples.append(figures)
            say(
                f"round {round_}/{settings.rounds} {row.key:<15} {figures['rps']:>8,.0f} req/s "
                f"{figures['cpu_us']:7.1f} µs CPU/req  {figures['wire_bytes']:8,.0f} B/req"
                + (f"  {figures['errors']:.0f} errors" if figures["errors"] else "")
            )


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@attrs.frozen
class Line:
    """One row of the table: medians over rounds."""

    key: str
    description: str
    encoding: str
    encoded_bytes: int | None
    ratio: float | None
    framing: str
    concurrent: str
    wire_bytes: float | None
    rps: float | None
    p50: float | None
    cpu_us: float | None
    added_cpu_us: float | None
    baseline: str | None
    errors: int
    unavailable: str | None


def _concurrent_text(answer: dict[str, Any]) -> str:
    if "concurrent_ok" not in answer:
        return "-"
    ok = answer["concurrent_ok"]
    return f"{ok}/{CONCURRENT}" + ("" if ok == CONCURRENT else " WRONG")


def summarize(rows: Sequence[Row]) -> list[Line]:
    """Medians over rounds; the added CPU as the median of same-round differences."""
    by_key = {row.key: row for row in rows}
    lines = []
    for row in rows:
        base = by_key.get(row.baseline) if row.baseline else None
        added = None
        if base is not None and row.samples and base.samples:
            pairs = zip(row.samples, base.samples, strict=False)
            added = _median([a["cpu_us"] - b["cpu_us"] for a, b in pairs])
        lines.append(
            Line(
                row.key,
                row.description,
                row.encoding or "identity",
                row.answer.get("encoded_bytes"),
                row.answer.get("ratio"),
                row.answer.get("framing", ""),
                _concurrent_text(row.answer),
                _median([s["wire_bytes"] for s in row.samples]),
                _median([s["rps"] for s in row.samples]),
                _median([s["p50"] for s in row.samples]),
                _median([s["cpu_us"] for s in row.samples]),
                added,
                row.baseline,
                int(sum(s["errors"] for s in row.samples)),
                row.target.unavailable,
            )
        )
    return lines


def table(lines: Sequence[Line]) -> str:
    """The results as a text table; unavailable rows say why."""
    header = (
        "row",
        "encoding",
        "body bytes",
        "ratio",
        "framing",
        "at once",
        "wire B/req",
        "req/s",
        "p50",
        "CPU µs/req",
        "+CPU µs/req",
        "errors",
    )
    out: list[tuple[str, ...] | str] = []
    for line in lines:
        if line.unavailable is not None and line.rps is None:
            out.append(f"{line.key}: unavailable: {line.unavailable.splitlines()[0][:200]}")
            continue
        added = "-"
        if line.added_cpu_us is not None:
            added = f"{line.added_cpu_us:+.1f}"
        out.append(
            (
                line.key,
                line.encoding,
                "-" if line.encoded_bytes is None else f"{line.encoded_bytes:,}",
                "-" if line.ratio is None else f"{line.ratio:.2f}x",
                line.framing.replace("Content-Length", "length") or "-",
                line.concurrent,
                "-" if line.wire_bytes is None else f"{line.wire_bytes:,.0f}",
                "-" if line.rps is None else f"{line.rps:,.0f}",
                "-" if line.p50 is None else report.format_duration(line.p50),
                "-" if line.cpu_us is None else f"{line.cpu_us:.1f}",
                added,
                str(line.errors),
            )
        )
    return report.render(header, out, left=2)


# In process: the encoders alone, on the same document.

LEVELS: dict[str, tuple[int, ...]] = {
    "gzip": (1, 3, 4, 5, 6, 9),
    "br": (0, 1, 2, 3, 4, 5, 6, 11),
    "zstd": (1, 2, 3, 4, 5, 6, 9, 19),
}
"""The levels timed in process for each coding (edgegw's: L{EDGEGW_LEVELS})."""
EDGEGW_LEVELS = {"gzip": GZIP_LEVEL, "br": BROTLI_QUALITY, "zstd": ZSTD_LEVEL}
"""The levels edgegw compresses with (L{edgegw.compression.codings})."""


def _compressor(coding: str, level: int) -> Callable[[bytes], bytes]:
    if coding == "gzip":
        return lambda data: zlib.compress(data, level, 31)
    if coding == "br":
        return lambda data: bytes(brotli.compress(data, quality=level, lgwin=22))
    return zstandard.ZstdCompressor(level=level).compress


def _best_time(compress: Callable[[bytes], bytes], body: bytes, budget: float = 0.4) -> float:
    """The fastest of repeated one-shot compressions of C{body}, within C{budget} seconds."""
    compress(body)
    best = float("inf")
    spent = 0.0
    runs = 0
    while runs < 5 or (spent < budget and runs < 200):
        start = time.process_time()
        compress(body)
        took = time.process_time() - start
        best = min(best, took)
        spent += took
        runs += 1
    return best


def streaming_time(coding: str, body: bytes, piece: int) -> tuple[float, int]:
    """
    CPU seconds and encoded bytes of edgegw's own streaming encoder on C{body}, given in
    pieces of C{piece} bytes (each flushed, as edgegw flushes after every write), the
    fastest of a few runs.
    """
    from edgegw.compression.codings import CODINGS

    pieces = [body[i : i + piece] for i in range(0, len(body), piece)]

    def run(_: bytes) -> bytes:
        encoder = CODINGS[coding].encoder(None)
        out = [encoder.compress(p) for p in pieces]
        out.append(encoder.finish())
        return b"".join(out)

    return _best_time(run, body), len(run(body))


def encoder_table(body: bytes) -> tuple[str, list[dict[str, Any]]]:
    """Time every coding at the levels of L{LEVELS} on C{body} in process."""
    records: list[dict[str, Any]] = []
    for coding, levels in LEVELS.items():
        for level in levels:
            compress = _compressor(coding, level)
            seconds = _best_time(compress, body)
            encoded = len(compress(body))
            records.append(
                {
                    "coding": coding,
                    "level": level,
                    "how": "one-shot",
                    "us": seconds * 1e6,
                    "bytes": encoded,
                    "edgegw": level == EDGEGW_LEVELS[coding],
                }
            )
        for piece in (16384, SIZE):
            seconds, encoded = streaming_time(coding, body, piece)
            records.append(
                {
                    "coding": coding,
                    "level": EDGEGW_LEVELS[coding],
                    "how": f"edgegw's encoder, {piece // 1024} KiB writes",
                    "us": seconds * 1e6,
                    "bytes": encoded,
                    "edgegw": True,
                }
            )
    header = ("coding", "level", "how", "µs per 64 KiB", "MB/s", "bytes", "ratio")
    out: list[tuple[str, ...] | str] = []
    for record in records:
        mark = " *" if record["edgegw"] and record["how"] == "one-shot" else ""
        out.append(
            (
                record["coding"],
                f"{record['level']}{mark}",
                record["how"],
                f"{record['us']:.0f}",
                f"{len(body) / record['us']:.0f}",
                f"{record['bytes']:,}",
                f"{len(body) / record['bytes']:.2f}x",
            )
        )
    return report.render(header, out, left=2), records


APP_LEVELS: dict[str, tuple[int, ...]] = {
    "gzip": (1, 5, 6),
    "br": (3, 4, 5),
    "zstd": (3, 4, 5, 6, 7, 9),
}
"""The levels timed on the app's files."""
APP_SUFFIXES = (".js", ".mjs", ".css", ".html", ".svg", ".json")
"""The app's files that every server here compresses."""


def app_table(files: Sequence[bytes]) -> tuple[str, list[dict[str, Any]]]:
    """
    Compress each of C{files} once with each coding at the levels of L{APP_LEVELS}:
    the total encoded bytes and the CPU it took.
    """
    raw = sum(map(len, files))
    records: list[dict[str, Any]] = []
    for coding, levels in APP_LEVELS.items():
        for level in levels:
            compress = _compressor(coding, level)
            start = time.process_time()
            encoded = sum(len(compress(body)) for body in files)
            seconds = time.process_time() - start
            records.append(
                {
                    "coding": coding,
                    "level": level,
                    "bytes": encoded,
                    "cpu_ms": seconds * 1e3,
                    "edgegw": level == EDGEGW_LEVELS[coding],
                }
            )
    header = ("coding", "level", "encoded", "ratio", "CPU ms", "MB/s")
    out: list[tuple[str, ...] | str] = [
        (
            r["coding"],
            f"{r['level']}{' *' if r['edgegw'] else ''}",
            f"{r['bytes'] / 1e6:.2f} MB",
            f"{raw / r['bytes']:.2f}x",
            f"{r['cpu_ms']:.0f}",
            f"{raw / r['cpu_ms'] / 1e3:.0f}",
        )
        for r in records
    ]
    return report.render(header, out, left=2), records


def app_files() -> list[bytes]:
    """
    The single-page app's text files of at least 1 KiB (L{APP_SUFFIXES}; fetched with
    npm on first use, as C{pageload} does).

    @raise spa.SpaError: If it cannot be fetched.
    """
    root = spa.root(ensure(("npm",))["npm"])
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in APP_SUFFIXES:
            body = path.read_bytes()
            if len(body) >= 1024:
                files.append(body)
    return files


def notes(settings: Settings) -> list[str]:
    """How to read the tables; printed under them and saved with the results."""
    return [
        f"Every row proxies the same {SIZE // 1024} KiB JSON document (API records) from "
        "one nginx backend (plain HTTP/1.1, Content-Length, upstream keep-alive); the "
        f"static rows serve it as a file ({STATIC_PATH}; edgegw's static-zstd row from its "
        "static cache, static-nocache compressing it per request). One "
        "serving process each: edgegw one process (its JSON access log to a file), nginx "
        "worker_processes 1 (its three rows are three server blocks of one worker).",
        f"wrk -t1 -c{settings.connections} with the row's Accept-Encoding (only that "
        "coding; none on the identity rows). body bytes, ratio, framing: the check's "
        "answer (the encoded body, the document's size over it; chunked or Content-Length "
        f"on HTTP/1.1). at once: of {CONCURRENT} requests sent at once on as many "
        "connections, how many answers decoded to the document (WRONG: not all). wire "
        "B/req: wrk's bytes read over requests (heads, chunk framing and bodies).",
        "CPU µs/req: utime+stime of the serving process (nginx: its worker) over the run "
        "over requests completed, median over rounds; +CPU µs/req: minus the same "
        "server's identity row in the same round, median over rounds: what compressing "
        "costs per response. The backend's CPU is not counted.",
        f"Medians over {settings.rounds} round(s) of {settings.duration}s; nothing is "
        "pinned: wrk, the server and the backend share this machine's cores.",
        "The encoder table: each coding timed in this process on the same document "
        "(CPU time, the fastest of repeated runs): one-shot at several levels (* edgegw's), "
        "and edgegw's streaming encoder flushing after each write as it does on a proxied "
        "body.",
    ]


def run(settings: Settings) -> int:
    """Run the benchmark, print the tables and write the JSON and Markdown results."""
    tools = ensure_tools()
    busy = warn_if_busy()
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = document()
    with scratch("edgegw-bench-compression-", settings.keep_tmp) as tmp, ExitStack() as stack:
        say(f"bench: starting the backend, edgegw and nginx in {tmp}")
        try:
            rows = start_rows(stack, tmp, settings)
        except StartupError as e:
            say(f"bench: {e}")
            return 1
        for row in rows:
            state = row.target.unavailable
            say(f"  {row.key:<15} {'ready' if state is None else state.splitlines()[0]}")
        measure(tools.wrk, rows, settings)
        lines = summarize(rows)
    say("bench: timing the encoders in process")
    encoders, records = encoder_table(body)
    app_text, app_size = "", (0, 0)
    app_records: list[dict[str, Any]] = []
    if settings.app:
        try:
            files = app_files()
        except spa.SpaError as e:
            say(f"bench: {e}")
            return 1
        app_size = (len(files), sum(map(len, files)))
        app_text, app_records = app_table(files)
    app_title = (
        f"ENCODERS in process on {spa.PACKAGE}@{spa.VERSION}'s {app_size[0]} text files of "
        f"1 KiB or more ({app_size[1] / 1e6:.1f} MB), each compressed once, one-shot"
    )
    text = table(lines)
    print()
    print(text)
    print()
    print(f"ENCODERS in process on the same {len(body) // 1024} KiB document")
    print(encoders)
    print()
    if app_text:
        print(app_title)
        print(app_text)
        print()
    for note in notes(settings):
        print(f"* {note}")
    machine = report.machine()
    versions = {
        "wrk": version([tools.wrk, "-v"]),
        "nginx": version([tools.nginx, "-v"]),
        "zlib": f"zlib {zlib.ZLIB_RUNTIME_VERSION}",
        "brotli": f"brotli {getattr(brotli, '__version__', '?')}",
        "zstandard": f"zstandard {zstandard.__version__} (libzstd "
        + ".".join(map(str, zstandard.ZSTD_VERSION))
        + ")",
    }
    path = report.write_json(
        "compression",
        {
            "benchmark": "compression",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**machine, "busy_before_start": round(busy, 3)},
            "versions": versions,
            "rows": [
                {
                    "key": row.key,
                    "description": row.description,
                    "encoding": row.encoding,
                    "baseline": row.baseline,
                    "answer": row.answer,
                    "samples": row.samples,
                    "unavailable": row.target.unavailable,
                }
                for row in rows
            ],
            "summary": [attrs.asdict(line) for line in lines],
            "encoders": records,
            "app_encoders": app_records,
            "notes": notes(settings),
        },
    )
    markdown = path.with_suffix(".md")
    markdown.write_text(
        f"# edgegw bench compression, {started_at}\n\n"
        f"`python -m bench compression --duration {settings.duration} --rounds "
        f"{settings.rounds} --connections {settings.connections}"
        f"{' --app' if settings.app else ''}"
        f"{' --only ' + ','.join(settings.only) if settings.only else ''}` at "
        f"{machine.get('edgegw_commit', '?')} on {machine.get('cpu', '?')} "
        f"({machine.get('cpus', '?')} CPUs); "
        + ", ".join(versions.values())
        + f"\n\n```\n{text}\n```\n\nEncoders in process:\n\n```\n{encoders}\n```\n\n"
        + (f"{app_title}:\n\n```\n{app_text}\n```\n\n" if app_text else "")
        + "".join(f"* {note}\n" for note in notes(settings))
    )
    print(f"\nresults: {path} (and {markdown.name})", file=sys.stderr)
    wrong = [row for row in rows if row.answer.get("concurrent_ok", CONCURRENT) < CONCURRENT]
    for row in wrong:
        say(
            f"bench: {row.key}: {CONCURRENT - row.answer['concurrent_ok']} of {CONCURRENT} "
            f"answers asked at once were wrong: {row.answer['concurrent_failure']}"
        )
    return 1 if wrong or any(row.target.unavailable is not None for row in rows) else 0


__all__ = ["ROWS", "Settings", "document", "run"]
