"""
C{python -m bench tls}: HTTPS at the edge, edgegw beside nginx and Caddy, each one
serving process proxying the same small response (the 100-byte JSON of C{proxy}) from
the same nginx backend.

Rows, every round loading each in turn:

  - C{h2-*}: HTTP/2 over TLS, C{h2load -c10 -m5} (50 streams over 10 connections);
  - C{tls-*}: HTTP/1.1 over TLS with keep-alive, C{wrk -c50 https://...};
  - C{plain-*}: plain HTTP/1.1, C{wrk -c50 http://...};
  - C{new-tls-*}: a new TLS connection for every request (C{wrk -c10} sending
    C{Connection: close}, no session resumption): full handshakes per second.

edgegw runs three ways: with C{Gateway.spec.tls} (ALPN h2 and http/1.1: the h2, tls and
new-tls rows), with a Twisted C{ssl:} endpoint string as C{listen} (HTTP/1.1 over TLS,
no ALPN: the C{*-edgegw-ssl} rows), and plain. A version without C{spec.tls} reports
those rows unavailable with C{edgegw check}'s reason. Targets: edgegw's h2 CPU per
request at most 1.3x its HTTP/1.1-over-TLS row's, and that at most 1.15x its plain
row's (same round, median over rounds).
"""

from __future__ import annotations

import datetime
import statistics
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, h2load, report, tls_servers, wrk
from bench.processes import StartupError, scratch, warn_if_busy
from bench.rounds import say
from bench.targets import PAYLOADS, Target, expect, start_backend
from bench.tools import Tools, ensure, version
from tests.support.processes import free_port

SMALL = PAYLOADS[0]


@attrs.frozen
class TlsTools(Tools):
    """
    The programs this benchmark runs: wrk and nginx, and h2load and Caddy.

    @ivar h2load: The h2load load generator (Debian's C{nghttp2-client}).
    @ivar caddy: The caddy binary.
    """

    h2load: str
    caddy: str


H2_CPU_SHARE = 1.3
"""edgegw's h2 CPU per request over its HTTP/1.1-over-TLS row's: at most this."""
TLS_CPU_SHARE = 1.15
"""edgegw's HTTP/1.1-over-TLS CPU per request over its plain row's: at most this."""


@attrs.frozen
class Settings:
    """
    The options of one run.

    @ivar duration: Seconds per load run.
    @ivar connections: wrk's connections on the keep-alive rows.
    @ivar rounds: Interleaved rounds.
    @ivar warmup: Unrecorded seconds per row before round 1 (0: none).
    @ivar h2_clients: h2load's connections on the h2 rows.
    @ivar h2_streams: h2load's concurrent streams per connection.
    @ivar handshake_connections: wrk's connections on the new-tls rows.
    @ivar keep_tmp: Keep the temporary directory (configurations, logs).
    """

    duration: int = 5
    connections: int = 50
    rounds: int = 3
    warmup: int = 1
    h2_clients: int = 10
    h2_streams: int = 5
    handshake_connections: int = 10
    keep_tmp: bool = False


@attrs.define
class Row:
    """
    One load on one server.

    @ivar key: Its name in the table (C{h2-nginx}).
    @ivar kind: C{h2}, C{tls}, C{plain} or C{new-tls}.
    @ivar server: Which server (C{edgegw}, C{edgegw-ssl}, C{nginx}, C{caddy}).
    @ivar target: The server's port and processes (its own copy: availability is the
        row's).
    @ivar baseline: The row its CPU per request is compared with.
    @ivar limit: The most that ratio may be (a target of the issue), or L{None}.
    @ivar protocol: What the server negotiated, as the load generator saw it.
    @ivar samples: Each round's figures (C{rps}, C{latency}, C{cpu_us}, C{errors}).
    """

    key: str
    kind: str
    server: str
    target: Target
    baseline: str | None = None
    limit: float | None = None
    protocol: str = ""
    samples: list[dict[str, float]] = attrs.Factory(list)

    def url(self) -> str:
        scheme = "http" if self.kind == "plain" else "https"
        return f"{scheme}://127.0.0.1:{self.target.port}{SMALL.path}"


def _row(key: str, kind: str, server: str, target: Target, **kwargs: Any) -> Row:
    return Row(key, kind, server, attrs.evolve(target, key=key), **kwargs)


def start_rows(stack: ExitStack, tools: TlsTools, tmp: Path, settings: Settings) -> list[Row]:
    """
    Start the backend, edgegw (three ways), nginx and Caddy; make the rows in round order.

    @raise StartupError: If the backend does not start.
    """
    cert = tls_servers.certificate(tmp / "certificate", "localhost")
    backend = start_backend(stack, tools, tmp)
    upstream = f"http://127.0.0.1:{backend.port}"
    route = gateway.reverse_proxy("backend", "/", upstream)
    keepalive = max(64, settings.connections)

    def edgegw(label: str, fields: dict[str, Any] | None, port: int | None = None) -> Target:
        target = Target(label, label, f"edgegw {label}", port=port or free_port())
        tls_servers.edgegw(stack, tmp, label, target, route, fields)
        return target

    edgegw_tls = edgegw("edgegw-tls", tls_servers.edgegw_tls_fields(cert))
    ssl_port = free_port()
    edgegw_ssl = edgegw(
        "edgegw-ssl", {"listen": tls_servers.ssl_endpoint(ssl_port, cert)}, ssl_port
    )
    edgegw_plain = edgegw("edgegw-plain", None)

    def external(name: str, start: Callable[[int, int], list[int]]) -> tuple[Target, Target]:
        tls = Target(name, name, name, port=free_port())
        plain = Target(name, name, name, port=free_port())
        try:
            pids = start(tls.port, plain.port)
        except StartupError as e:
            tls.unavailable = plain.unavailable = f"did not start: {e}"
        else:
            tls.pids = plain.pids = pids
        return tls, plain

    def nginx(tls_port: int, plain_port: int) -> list[int]:
        process = tls_servers.nginx_tls_proxy(
            stack, tools.nginx, tmp / "nginx", cert, tls_port, plain_port, backend.port, keepalive
        )
        return tls_servers.nginx_worker(process)

    def caddy(tls_port: int, plain_port: int) -> list[int]:
        process = tls_servers.caddy_tls_proxy(
            stack, tools.caddy, tmp / "caddy", cert, tls_port, plain_port, backend.port, keepalive
        )
        return [process.pid]

    nginx_tls, nginx_plain = external("nginx", nginx)
    caddy_tls, caddy_plain = external("caddy", caddy)
    h2 = {"edgegw": edgegw_tls, "nginx": nginx_tls, "caddy": caddy_tls}
    tls = {"edgegw": edgegw_tls, "edgegw-ssl": edgegw_ssl, "nginx": nginx_tls, "caddy": caddy_tls}
    plain = {"edgegw": edgegw_plain, "nginx": nginx_plain, "caddy": caddy_plain}
    rows: list[Row] = []
    for server, target in h2.items():
        limit = H2_CPU_SHARE if server == "edgegw" else None
        rows.append(
            _row(f"h2-{server}", "h2", server, target, baseline=f"tls-{server}", limit=limit)
        )
    for server, target in tls.items():
        base = "edgegw" if server.startswith("edgegw") else server
        limit = TLS_CPU_SHARE if server.startswith("edgegw") else None
        rows.append(
            _row(f"tls-{server}", "tls", server, target, baseline=f"plain-{base}", limit=limit)
        )
    for server, target in plain.items():
        rows.append(_row(f"plain-{server}", "plain", server, target))
    for server, target in tls.items():
        rows.append(_row(f"new-tls-{server}", "new-tls", server, target))
    for row in rows:
        if row.target.unavailable is None:
            row.target.unavailable = check(row)
    return rows


def check(row: Row) -> str | None:
    """
    Ask C{row}'s server once for the small response in the row's way.

    @return: L{None} if it answered C{200} with the exact bytes (and, for an h2 row,
        chose h2 with ALPN), else what was wrong.
    """
    port = row.target.port
    if row.kind == "plain":
        return expect(port, SMALL.path, 200, SMALL.body)
    if row.kind == "h2":
        try:
            chosen = tls_servers.negotiated(port)
        except OSError as e:
            return f"TLS handshake failed: {e}"
        if chosen != "h2":
            return f"offered h2 and http/1.1 with ALPN, the server chose {chosen}"
    return tls_servers.expect_https(port, SMALL.path, 200, SMALL.body)


def _load(tools: TlsTools, row: Row, settings: Settings, duration: int) -> dict[str, float]:
    """
    One run of C{row}'s load for C{duration} seconds; its figures.

    @raise wrk.WrkError: If wrk fails.
    @raise h2load.H2loadError: If h2load fails.
    """
    pids = row.target.pids
    if row.kind == "h2":
        result, cpu = h2load.measure(
            tools.h2load, row.url(), settings.h2_clients, settings.h2_streams, duration, pids
        )
        row.protocol = f"{result.protocol} {result.tls}".strip()
        return _figures(result.rps, result.mean, cpu, result.requests, result.errors)
    if row.kind == "new-tls":
        url = wrk.Url(row.url(), ["Connection: close"])
        connections = settings.handshake_connections
    else:
        url, connections = wrk.Url(row.url()), settings.connections
    done, cpu = wrk.measure(tools.wrk, url, connections, duration, pids)
    row.protocol = "http/1.1" + (" TLS" if row.kind != "plain" else "")
    return _figures(done.rps, done.latency[50.0], cpu, done.requests, done.errors)


def _figures(
    rps: float, latency: float, cpu: float, requests: int, errors: int
) -> dict[str, float]:
    return {
        "rps": rps,
        "latency": latency,
        "cpu_us": cpu / max(requests, 1) * 1e6,
        "errors": float(errors),
    }


def measure(tools: TlsTools, rows: Sequence[Row], settings: Settings) -> None:
    """The warm-up, then every round; a row that fails is unavailable from then on."""

    def ready() -> list[Row]:
        return [row for row in rows if row.target.unavailable is None]

    def attempt(row: Row, duration: int) -> dict[str, float] | None:
        try:
            figures = _load(tools, row, settings, duration)
        except (wrk.WrkError, h2load.H2loadError) as e:
            row.target.unavailable = str(e)
            return None
        if not row.target.alive():
            row.target.check_alive()
            return None
        if row.kind == "h2" and not row.protocol.startswith("h2"):
            row.target.unavailable = f"h2load negotiated {row.protocol or 'nothing'}, not h2"
            return None
        return figures

    if settings.warmup > 0:
        say(f"warm-up: {settings.warmup}s per row")
        for row in ready():
            attempt(row, settings.warmup)
    for round_ in range(1, settings.rounds + 1):
        for row in ready():
            figures = attempt(row, settings.duration)
            if figures is None:
                continue
            row.samples.append(figures)
            say(
                f"round {round_}/{settings.rounds} {row.key:<18} {figures['rps']:>9,.0f} "
                f"req/s  {figures['cpu_us']:7.1f} µs CPU/req"
                + (f"  {figures['errors']:.0f} errors" if figures["errors"] else "")
            )


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@attrs.frozen
class Line:
    """One row of the table: medians over rounds."""

    key: str
    protocol: str
    rps: float | None
    latency: float | None
    cpu_us: float | None
    baseline: str | None
    vs_baseline: float | None
    target: str
    verdict: str
    errors: int
    unavailable: str | None


def summarize(rows: Sequence[Row]) -> list[Line]:
    """Medians over rounds; CPU ratios as medians of same-round ratios."""
    by_key = {row.key: row for row in rows}
    lines = []
    for row in rows:
        base = by_key.get(row.baseline) if row.baseline else None
        share = None
        if base is not None and row.samples and base.samples:
            # Rounds line up: a row that failed mid-run stops adding samples.
            pairs = zip(row.samples, base.samples, strict=False)
            share = _median([a["cpu_us"] / b["cpu_us"] for a, b in pairs if b["cpu_us"] > 0])
        target, verdict = "", ""
        if row.limit is not None:
            target = f"CPU at most {row.limit:.2f}x {row.baseline}"
            verdict = "-" if share is None else ("OK" if share <= row.limit else "MISSED")
        lines.append(
            Line(
                row.key,
                row.protocol,
                _median([s["rps"] for s in row.samples]),
                _median([s["latency"] for s in row.samples]),
                _median([s["cpu_us"] for s in row.samples]),
                row.baseline,
                share,
                target,
                verdict,
                int(sum(s["errors"] for s in row.samples)),
                row.target.unavailable,
            )
        )
    return lines


def table(lines: Sequence[Line]) -> str:
    """The results as a text table; unavailable rows say why."""
    header = (
        "row",
        "protocol",
        "req/s",
        "latency",
        "CPU µs/req",
        "vs baseline (CPU)",
        "target",
        "measured",
        "errors",
    )
    out: list[tuple[str, ...] | str] = []
    for line in lines:
        if line.unavailable is not None:
            out.append(f"{line.key}: unavailable: {line.unavailable.splitlines()[0][:200]}")
            continue
        vs = "-"
        if line.vs_baseline is not None:
            vs = f"{line.vs_baseline:.2f}x {line.baseline}"
        out.append(
            (
                line.key,
                line.protocol,
                "-" if line.rps is None else f"{line.rps:,.0f}",
                "-" if line.latency is None else report.format_duration(line.latency),
                "-" if line.cpu_us is None else f"{line.cpu_us:.1f}",
                vs,
                line.target or "-",
                line.verdict or "-",
                str(line.errors),
            )
        )
    return report.render(header, out, left=2)


def notes(settings: Settings) -> list[str]:
    """How to read the table; printed under it and saved with the results."""
    return [
        f"Every row proxies the same {len(SMALL.body)}-byte JSON from one nginx backend "
        "(plain HTTP/1.1, upstream keep-alive). One serving process each: edgegw one "
        "process, nginx worker_processes 1, Caddy GOMAXPROCS=1 (one OS thread running Go "
        "code at a time; its runtime's other threads are counted too).",
        f"h2 rows: h2load -c{settings.h2_clients} -m{settings.h2_streams} "
        f"({settings.h2_clients * settings.h2_streams} streams); latency is h2load's mean "
        f"time per request. tls and plain rows: wrk -c{settings.connections}, keep-alive; "
        "latency is wrk's p50. new-tls rows: wrk "
        f"-c{settings.handshake_connections} with Connection: close, so req/s is new TLS "
        "connections (full handshakes, no resumption) per second, each with one request, "
        "and CPU µs/req is the server's CPU per handshake and request.",
        "CPU µs/req: utime+stime of the server's process (nginx: its worker) over the run "
        "over requests completed, median over rounds; vs baseline: the median of "
        "same-round ratios. The backend's CPU is not counted.",
        f"Medians over {settings.rounds} round(s) of {settings.duration}s; nothing is "
        "pinned: the load generator, the server and the backend share this machine's "
        "cores.",
        "edgegw-ssl: listen as a Twisted ssl: endpoint string (HTTP/1.1 only, no ALPN); "
        "edgegw: Gateway.spec.tls (ALPN h2, http/1.1).",
    ]


def run(settings: Settings) -> int:
    """Run the benchmark, print the table and write the JSON and Markdown results."""
    found = ensure(("wrk", "nginx", "h2load", "caddy"))
    tools = TlsTools(
        wrk=found["wrk"], nginx=found["nginx"], h2load=found["h2load"], caddy=found["caddy"]
    )
    busy = warn_if_busy()
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with scratch("edgegw-bench-tls-", settings.keep_tmp) as tmp, ExitStack() as stack:
        say(f"bench: starting edgegw, nginx and Caddy in {tmp}")
        try:
            rows = start_rows(stack, tools, tmp, settings)
        except StartupError as e:
            say(f"bench: {e}")
            return 1
        for row in rows:
            state = row.target.unavailable
            say(f"  {row.key:<18} {'ready' if state is None else state.splitlines()[0]}")
        measure(tools, rows, settings)
        lines = summarize(rows)
    text = table(lines)
    print()
    print(text)
    print()
    for note in notes(settings):
        print(f"* {note}")
    machine = report.machine()
    versions = {
        "wrk": version([tools.wrk, "-v"]),
        "h2load": version([tools.h2load, "--version"]),
        "nginx": version([tools.nginx, "-v"]),
        "caddy": "caddy " + version([tools.caddy, "version"]),
        "openssl": version(["openssl", "version"]),
    }
    path = report.write_json(
        "tls",
        {
            "benchmark": "tls",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**machine, "busy_before_start": round(busy, 3)},
            "versions": versions,
            "rows": [
                {
                    "key": row.key,
                    "kind": row.kind,
                    "server": row.server,
                    "protocol": row.protocol,
                    "baseline": row.baseline,
                    "samples": row.samples,
                    "unavailable": row.target.unavailable,
                }
                for row in rows
            ],
            "summary": [attrs.asdict(line) for line in lines],
            "notes": notes(settings),
        },
    )
    markdown = path.with_suffix(".md")
    markdown.write_text(
        f"# edgegw bench tls, {started_at}\n\n"
        f"`python -m bench tls --duration {settings.duration} --rounds {settings.rounds}` at "
        f"{machine.get('edgegw_commit', '?')} on {machine.get('cpu', '?')} "
        f"({machine.get('cpus', '?')} CPUs); "
        + ", ".join(versions.values())
        + f"\n\n```\n{text}\n```\n\n"
        + "".join(f"* {note}\n" for note in notes(settings))
    )
    print(f"\nresults: {path} (and {markdown.name})", file=sys.stderr)
    return 1 if any(row.target.unavailable is not None for row in rows) else 0


__all__ = ["Settings", "run"]
