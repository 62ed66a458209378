"""
Caddy as an anchor of C{python -m bench suite} (issue 39): the compiled gateway users
weigh edgegw against, measured in the same interleaved rounds as nginx, the Agent proxy
and edgegw.

Debian's C{caddy}, one process with C{GOMAXPROCS=1}, plain HTTP on 127.0.0.1, started
with the HTTPS benchmarks' global options (L{bench.tls_servers.start_caddy}: admin
endpoint off, no automatic HTTPS). Two processes, like edgegw's two targets:

  - C{caddy-proxy}: C{reverse_proxy} to the nginx backend with Caddy's defaults but one:
    its idle upstream pool is as large as nginx's C{keepalive} (C{max(64,
    connections)}), where Caddy's default keeps 32 and would close and reopen upstream
    connections under wrk's 50;
  - C{caddy-static}: C{file_server} on the directory edgegw's static row serves.

Neither writes an access log (Caddy logs requests only with a C{log} directive).

L{comparisons} gives what issue 39 asks of edgegw beside Caddy: CPU per request at most
Caddy's for the small and the 64 KiB proxied responses and for the static file, and at
one connection an added p50 over the backend at most Caddy's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import attrs

from bench.processes import StartupError
from bench.report import render
from bench.targets import Target, verify
from bench.tls_servers import start_caddy
from bench.tools import MissingToolsError, ensure, version
from tests.support.processes import free_port

_PROXY = """\
http://:{port} {{
\tbind 127.0.0.1
\treverse_proxy 127.0.0.1:{backend_port} {{
\t\ttransport http {{
\t\t\tkeepalive_idle_conns_per_host {keepalive}
\t\t}}
\t}}
}}
"""

_STATIC = """\
http://:{port} {{
\tbind 127.0.0.1
\troot * {root}
\tfile_server
}}
"""

PROXY = "caddy-proxy"
"""The key of the reverse-proxy target in L{start}'s answer."""
STATIC = "caddy-static"
"""The key of the static-file target in L{start}'s answer."""


def start(
    stack: ExitStack, tmp: Path, backend_port: int, www: Path, connections: int
) -> dict[str, Target]:
    """
    Start Caddy proxying to the backend on C{backend_port} and Caddy serving C{www}
    (each its own process, stopped when C{stack} closes), each checked to serve the
    payloads. A target that cannot run (no caddy binary, a failed start, a wrong answer)
    comes back with C{unavailable} saying why; nothing raises.
    """
    proxy = Target(PROXY, PROXY, "Caddy reverse_proxy -> backend (GOMAXPROCS=1)", free_port())
    files = Target(STATIC, STATIC, "Caddy file_server, same files (GOMAXPROCS=1)", free_port())
    try:
        binary = ensure(("caddy",))["caddy"]
    except MissingToolsError as e:
        proxy.unavailable = files.unavailable = str(e).splitlines()[0]
        return {PROXY: proxy, STATIC: files}
    keepalive = max(64, connections)
    bodies = {
        PROXY: _PROXY.format(port=proxy.port, backend_port=backend_port, keepalive=keepalive),
        STATIC: _STATIC.format(port=files.port, root=www),
    }
    for target in (proxy, files):
        try:
            process = start_caddy(stack, binary, tmp / target.key, target.key, bodies[target.key])
            target.process = process
            process.wait_for_port(target.port)
        except StartupError as e:
            target.unavailable = f"did not start: {e}"
            continue
        target.pids = [process.pid]
        target.unavailable = verify(target)
    return {PROXY: proxy, STATIC: files}


def caddy_version() -> str:
    """Caddy's version as C{caddy version} prints it, or why it is unknown."""
    try:
        binary = ensure(("caddy",))["caddy"]
    except MissingToolsError:
        return "not installed"
    return "caddy " + version([binary, "version"])


Samples = Mapping[str, Mapping[int, Sequence[Mapping[str, float]]]]
"""Each row's figures (C{rps}, C{p50}, C{p99}, C{cpu_us}) per load, one per round."""

CPU_PAIRS = (
    ("small proxied", "proxy-small", "caddy-small"),
    ("64 KiB proxied", "proxy-64k", "caddy-64k"),
    ("static file", "static", "caddy-static"),
)
"""The rows whose CPU per request issue 39 compares: (what, edgegw's row, Caddy's row)."""

LIMIT = 1.0
"""edgegw's figure over Caddy's: at most this (issue 39's targets)."""


@attrs.frozen
class Comparison:
    """
    One of issue 39's targets, measured.

    @ivar what: What is compared.
    @ivar edgegw: edgegw's figure (CPU µs/req, or seconds added at c1), median over
        rounds.
    @ivar caddy: Caddy's, likewise.
    @ivar ratio: The median over rounds of the same-round ratio edgegw/Caddy (for the c1
        latency, of the medians' ratio), or L{None} when either is missing.
    @ivar unit: C{cpu} or C{latency}.
    """

    what: str
    edgegw: float | None
    caddy: float | None
    ratio: float | None
    unit: str

    @property
    def verdict(self) -> str:
        """C{OK} when edgegw's is at most Caddy's, C{MISSED} otherwise, C{-} if unmeasured."""
        if self.ratio is None:
            return "-"
        return "OK" if self.ratio <= LIMIT else "MISSED"

    def text(self) -> str:
        """One line of the report."""
        if self.edgegw is None or self.caddy is None or self.ratio is None:
            return f"  {self.what:<28} not measured"
        if self.unit == "cpu":
            figures = f"edgegw {self.edgegw:6.1f} µs, Caddy {self.caddy:6.1f} µs CPU/req"
        else:
            figures = f"edgegw {self.edgegw * 1e6:+6.0f} µs, Caddy {self.caddy * 1e6:+6.0f} µs"
        return (
            f"  {self.what:<28} {figures}  {self.ratio:.2f}x "
            f"(target at most {LIMIT:.2f}x): {self.verdict}"
        )


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _rounds(
    samples: Samples,
    mine: str,
    theirs: str,
    load: int,
    combine: Callable[[Mapping[str, float], Mapping[str, float]], float],
) -> float | None:
    # Rounds line up: a row that failed mid-run stops adding samples.
    pairs = zip(
        samples.get(mine, {}).get(load, []), samples.get(theirs, {}).get(load, []), strict=False
    )
    return _median([combine(a, b) for a, b in pairs])


def comparisons(samples: Samples, connections: int) -> list[Comparison]:
    """
    edgegw beside Caddy in one run: CPU per request at C{connections} for
    L{CPU_PAIRS}, and the p50 each adds over the direct backend at one connection.
    """
    out = []
    for what, edgegw, caddy in CPU_PAIRS:

        def cpu(row: str) -> float | None:
            return _median([s["cpu_us"] for s in samples.get(row, {}).get(connections, [])])

        ratio = _rounds(
            samples,
            edgegw,
            caddy,
            connections,
            lambda a, b: a["cpu_us"] / b["cpu_us"] if b["cpu_us"] else float("inf"),
        )
        out.append(Comparison(f"{what}, c{connections}", cpu(edgegw), cpu(caddy), ratio, "cpu"))

    def added(row: str) -> float | None:
        return _rounds(samples, row, "direct-small", 1, lambda a, b: a["p50"] - b["p50"])

    mine, theirs = added("proxy-small"), added("caddy-small")
    ratio = None
    if mine is not None and theirs is not None:
        ratio = mine / theirs if theirs > 0 else float("inf")
    out.append(Comparison("c1 p50 added over direct", mine, theirs, ratio, "latency"))
    return out


SERVERS = ("nginx", "Caddy", "edgegw", "Agent proxy")
"""The columns of issue 39's table."""

_TABLE = (
    (
        "small JSON, µs CPU/request",
        "cpu",
        ("nginx-small", "caddy-small", "proxy-small", "agent-small"),
    ),
    ("64 KiB, µs CPU/request", "cpu", ("nginx-64k", "caddy-64k", "proxy-64k", "agent-64k")),
    (
        "one connection, p50 added",
        "added",
        ("nginx-small", "caddy-small", "proxy-small", "agent-small"),
    ),
    ("static file, µs CPU/request", "cpu", ("direct-small", "caddy-static", "static", None)),
)


def issue_table(samples: Samples, connections: int) -> list[tuple[str, ...]]:
    """
    Issue 39's table from one run: per server, CPU per request at C{connections}
    (medians over rounds) and the p50 added over the direct backend at one connection
    (medians of same-round differences); nginx's static file is the backend itself.
    """
    out = []
    for what, kind, keys in _TABLE:
        cells = [what]
        for key in keys:
            value: float | None = None
            if key is not None and kind == "cpu":
                value = _median([s["cpu_us"] for s in samples.get(key, {}).get(connections, [])])
            elif key is not None:
                value = _rounds(samples, key, "direct-small", 1, lambda a, b: a["p50"] - b["p50"])
            if value is None:
                cells.append("-")
            elif kind == "cpu":
                cells.append(f"{value:.1f}")
            else:
                cells.append(f"{value * 1e3:+.3f} ms")
        out.append(tuple(cells))
    return out


def report(samples: Samples, connections: int) -> str:
    """Issue 39's table and the comparisons, as the suite prints them under its tables."""
    table = render(("", *SERVERS), issue_table(samples, connections), left=1)
    lines = [
        f"issue 39's table (CPU at c{connections}; p50 added over direct-small at c1; "
        "nginx's static file is the backend's, direct-small):",
        table,
        "",
        "edgegw beside Caddy (issue 39: edgegw's at most Caddy's, same run):",
    ]
    lines += [c.text() for c in comparisons(samples, connections)]
    return "\n".join(lines)


__all__ = [
    "CPU_PAIRS",
    "PROXY",
    "SERVERS",
    "STATIC",
    "Comparison",
    "caddy_version",
    "comparisons",
    "issue_table",
    "report",
    "start",
]
