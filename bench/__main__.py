"""
The benchmark harness's command line: C{python -m bench COMMAND}, where COMMAND is one of
proxy, memory, api, authz, telemetry, session, server-session, bearer, plugins, metrics,
workers, suite, tls, compression, pageload, soak, reload, profile, chain.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, Protocol

from bench import (
    api,
    authz,
    bearer,
    chain,
    compression,
    memory,
    metrics,
    pageload,
    plugins,
    profile,
    proxy,
    reload,
    server_session,
    session,
    soak,
    suite,
    telemetry,
    tls,
    variants,
    workers,
)
from bench.tools import MissingToolsError

MEMORY_DESCRIPTION = """\
Measure edgegw's memory on reverse-proxy routes, each with a fresh edgegw process:

  1. RSS growth (peak minus baseline) while a client downloads a 1 GiB response
     through the route as fast as it can. Target: < 32 MiB.
  2. RSS growth while a client uploads a 1 GiB request body through the route.
     Target: < 32 MiB.
  3. RSS while holding 10,000 idle keep-alive connections and 5,000 concurrent idle
     server-sent-event streams through the route. Target: < 300 MiB.
  5. RSS growth while a client downloads a 1 GiB text/plain response through the
     route, compressed by edgegw (gzip, br, zstd: one row each), decoding and checking
     it. Target: < 32 MiB.

--only NAMES runs some of them: download, upload, idle, sse, text-gzip, text-br,
text-zstd.

Reported as unavailable while `edgegw check` refuses reverse-proxy routes.
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def _delays(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(values) != 3 or any(not 0 <= value < 10_000 for value in values):
        raise argparse.ArgumentTypeError(
            f"three delays in milliseconds (groups a, b, c) such as 0,2,5, got {text!r}"
        )
    return values[0], values[1], values[2]


def _servers(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in pageload.SERVERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"servers are among {','.join(pageload.SERVERS)}, got {text!r}"
        )
    return tuple(name for name in pageload.SERVERS if name in names)


def _measurements(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in memory.MEASUREMENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"measurements are among {','.join(memory.MEASUREMENTS)}, got {text!r}"
        )
    return names


def _targets(text: str) -> str:
    try:
        return proxy.target_letters(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _WrkDefaults(Protocol):
    """The defaults of an interleaved wrk benchmark's settings."""

    @property
    def duration(self) -> int: ...
    @property
    def connections(self) -> int: ...
    @property
    def rounds(self) -> int: ...
    @property
    def warmup(self) -> int: ...


def _wrk_options(
    p: argparse.ArgumentParser, defaults: _WrkDefaults, connections_help: str
) -> argparse.ArgumentParser:
    """
    Add the options of an interleaved wrk benchmark, with their C{defaults}, and
    C{--keep-tmp}; return C{p}.
    """
    p.add_argument(
        "--duration", type=_positive, default=defaults.duration, help="seconds per wrk run"
    )
    p.add_argument(
        "--connections", type=_positive, default=defaults.connections, help=connections_help
    )
    p.add_argument("--rounds", type=_positive, default=defaults.rounds, help="interleaved rounds")
    p.add_argument(
        "--warmup",
        type=_non_negative,
        default=defaults.warmup,
        help="unrecorded seconds per target, for each payload or load, before round 1 (0: none)",
    )
    p.add_argument("--keep-tmp", action="store_true", help="keep configurations and logs")
    return p


def _before_option(p: argparse.ArgumentParser, compared: str) -> None:
    """Add C{--before REV}: edgegw at git revision REV as one more target."""
    p.add_argument(
        "--before",
        metavar="REV",
        help=(
            "also run edgegw at git revision REV (a temporary git worktree) with the "
            f"configuration of {compared}, as target edgegw-before in the same rounds, "
            "and compare their CPU per request"
        ),
    )


def _wrk_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The values of the options L{_wrk_options} adds, as settings' keyword arguments."""
    names = ("duration", "connections", "rounds", "warmup", "keep_tmp")
    return {name: getattr(args, name) for name in names}


def parser() -> argparse.ArgumentParser:
    """The argument parser with its subcommands."""
    top = argparse.ArgumentParser(
        prog="python -m bench",
        description="edgegw benchmarks on loopback (never part of the test suite).",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    defaults = proxy.Settings()
    p = commands.add_parser(
        "proxy",
        help="reverse-proxy throughput, latency and CPU/request, side by side",
        description=(
            "Measure, interleaved over rounds: (a) an nginx backend directly, (b) nginx "
            "proxying to it, (c) a minimal Twisted Agent proxy, (d) edgegw's reverse-proxy "
            "route, (e) edgegw's static route; for a ~100-byte JSON and a 64 KiB file; "
            "with --before REV, (f) d on edgegw at git revision REV."
        ),
    )
    _wrk_options(p, defaults, "wrk connections (also the proxies' upstream pool size)")
    p.add_argument(
        "--targets",
        type=_targets,
        default=defaults.targets,
        help="which targets to run, as letters (default abcde)",
    )
    _before_option(p, "d (edgegw-proxy)")
    m = commands.add_parser(
        "memory",
        help="edgegw RSS: streaming 1 GiB down and up, holding 10,000 idle connections and "
        "5,000 idle SSE streams, streaming 1 GiB of text compressed",
        description=MEMORY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mem_defaults = memory.Settings()
    m.add_argument(
        "--download-size",
        type=_positive,
        default=mem_defaults.download_size,
        help="bytes streamed through edgegw (default 1 GiB)",
    )
    m.add_argument(
        "--sse-connections",
        type=_positive,
        default=mem_defaults.sse_connections,
        help="concurrent idle event streams (default 5000)",
    )
    m.add_argument(
        "--idle-connections",
        type=_positive,
        default=mem_defaults.idle_connections,
        help="idle keep-alive connections held beside the streams (default 10000)",
    )
    m.add_argument("--keep-tmp", action="store_true", help="keep configuration and logs")
    m.add_argument(
        "--only",
        type=_measurements,
        default=mem_defaults.only,
        metavar="NAMES",
        help="comma-separated, among " + ",".join(memory.MEASUREMENTS) + " (default: all)",
    )
    api_defaults = api.Settings()
    a = commands.add_parser(
        "api",
        help="api fan-out to 3 delayed backends: latency added over the slowest, CPU/request",
        description=(
            "Measure, interleaved over rounds and at a low and the default concurrency: "
            "(1) the slowest of three delayed JSON backends directly, (2) edgegw's api "
            "route fanning out to all three, (3) with --before REV, the same on edgegw at git "
            "revision REV, (4) the same fan-out on stock treq over Twisted's Agent, (5) the "
            "backend's capacity; report the p50/p99 latency each fan-out adds over (1) and "
            "their CPU per request side by side."
        ),
    )
    _wrk_options(a, api_defaults, "wrk connections at the default load")
    a.add_argument(
        "--low-connections",
        type=_positive,
        default=api_defaults.low_connections,
        help="wrk connections at the low load, where the added latency is edgegw's own",
    )
    a.add_argument(
        "--delays",
        type=_delays,
        default=api_defaults.delays,
        metavar="A,B,C",
        help="the backend's delays in ms for groups a (/a/{id}), b (/b), c (/c) (default "
        + ",".join(f"{delay:g}" for delay in api_defaults.delays)
        + ")",
    )
    _before_option(a, "edgegw-api")
    authz_defaults = authz.Settings()
    z = _wrk_options(
        commands.add_parser(
            "authz",
            help="authorization policies (none, Rego, require, a 20-rule Rego): CPU/request",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant serving the same "
                "health route: (a) no policies, (b) a Rego policy that allows, (c) a "
                "require policy that denies (no IdP: 403), (d) a ~20-rule Rego policy that "
                "allows; and the time per Rego evaluation, in-process."
            ),
        ),
        authz_defaults,
        "wrk connections",
    )
    z.add_argument(
        "--evaluations",
        type=_positive,
        default=authz_defaults.evaluations,
        help="in-process Rego evaluations timed per policy (default %(default)s)",
    )
    _wrk_options(
        commands.add_parser(
            "telemetry",
            help="tracing with OTLP export (none, http/protobuf, grpc): CPU/request, spans",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant proxying to an "
                "nginx backend: (a) no Telemetry, (b) OTLP/HTTP export to a local receiver, "
                "(c) OTLP/gRPC export to a local receiver; and the spans each receiver got."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    _wrk_options(
        commands.add_parser(
            "session",
            help="a valid session cookie on an app route (none, 1 cookie, 2 chunks): CPU/request",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant with the same "
                "session block and IdP, serving the same app route: (a) public, no cookie, "
                "(b) auth required with a valid session cookie, (c) the same with a "
                "session large enough for two cookie chunks; and the session read path "
                "in-process. Target: b at least 0.9x a's throughput."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    server_defaults = server_session.Settings()
    ss = _wrk_options(
        commands.add_parser(
            "server-session",
            help="a server-side session in Redis against a cookie-only one: CPU, latency/request",
            description=(
                "Measure, interleaved over rounds and at a low and the default concurrency, "
                "one edgegw per variant serving the same app route (auth required, "
                "reverse-proxied to a backend): (a) a cookie-only session, (b) a "
                "server-side session in a redis-server the harness starts (stateProvider "
                "kvstore); report the gateway CPU and the latency b adds per request, "
                "Redis's own CPU and commands per request, and the read paths in-process. "
                "Needs redis-server on the PATH."
            ),
        ),
        server_defaults,
        "wrk connections at the default load",
    )
    ss.add_argument(
        "--low-connections",
        type=_positive,
        default=server_defaults.low_connections,
        help="wrk connections at the low load, where the added latency is the session's own",
    )
    _wrk_options(
        commands.add_parser(
            "bearer",
            help="a Bearer token on a service route (none, cached, uncached): CPU/request",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant with the same "
                "verificationOnly IdP (a static OpenID provider in the harness, one RSA "
                "key), serving the same service route: (a) public, no Authorization "
                "header, (b) auth required with a valid RS256 token and the verified-token "
                "cache at its default, (c) the same with bearer.cacheTTL: 0s (every request "
                "verifies the signature); and the Bearer path in-process. Target: b at "
                "least 0.9x a's throughput."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    _wrk_options(
        commands.add_parser(
            "plugins",
            help="request and response plugins (none, request, response, both): CPU/request",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant serving the same "
                "health route: (a) no plugins, (b) a request plugin (headers), (c) a "
                "header-only response plugin (headers), (d) body-limit and headers on the "
                "request and headers on the response."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    _wrk_options(
        commands.add_parser(
            "metrics",
            help="the gateway's metrics (off, on with Prometheus): CPU/request",
            description=(
                "Measure, interleaved over rounds, one edgegw per variant proxying to an "
                "nginx backend with the same Telemetry resource: (a) without a metrics "
                "block, (b) with metrics served for Prometheus (scraped after each run)."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    _wrk_options(
        commands.add_parser(
            "workers",
            help="one edgegw process against two worker processes on one socket: req/s",
            description=(
                "Measure, interleaved over rounds, the same health route served by (a) one "
                "edgegw process, (b) two processes sharing one listening socket passed in "
                "as systemd passes it. Target: b at least 1.8x a (needs a core per worker "
                "besides wrk's)."
            ),
        ),
        variants.Settings(),
        "wrk connections",
    )
    in_suite = _wrk_options(
        commands.add_parser(
            "suite",
            help="every scenario in one interleaved run, nginx and an Agent proxy as anchors",
            description=suite.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        suite.Settings(),
        "wrk connections (every row; the c1 rows are also loaded at 1)",
    )
    in_suite.add_argument(
        "--only",
        metavar="ROWS",
        type=_names,
        default=(),
        help=(
            "measure only the rows whose key starts with one of these, comma-separated "
            "(e.g. ratelimit); every process is still started"
        ),
    )
    tls_defaults = tls.Settings()
    secure = _wrk_options(
        commands.add_parser(
            "tls",
            help="HTTPS: h2, HTTP/1.1 over TLS, plain and new handshakes; edgegw, nginx, Caddy",
            description=tls.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        tls_defaults,
        "wrk connections on the keep-alive rows (tls, plain)",
    )
    secure.add_argument(
        "--h2-clients",
        type=_positive,
        default=tls_defaults.h2_clients,
        help="h2load connections on the h2 rows (default %(default)s)",
    )
    secure.add_argument(
        "--h2-streams",
        type=_positive,
        default=tls_defaults.h2_streams,
        help="h2load concurrent streams per connection (default %(default)s)",
    )
    secure.add_argument(
        "--handshake-connections",
        type=_positive,
        default=tls_defaults.handshake_connections,
        help="wrk connections on the new-tls rows (default %(default)s)",
    )
    compressing = _wrk_options(
        commands.add_parser(
            "compression",
            help="CPU per request of a 64 KiB JSON response compressed with zstd, br, gzip "
            "through a reverse-proxy route, beside nginx with gzip on",
            description=compression.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        compression.Settings(),
        "wrk connections",
    )
    compressing.add_argument(
        "--app",
        action="store_true",
        help="also time the encoders on the pageload app's text files (npm fetches it once)",
    )
    loaded = pageload.Settings()
    page = commands.add_parser(
        "pageload",
        help="a real single-page app in headless Chromium over HTTPS through an emulated "
        "100 ms / 10 Mbit/s link: edgegw, nginx, Caddy",
        description=pageload.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    page.add_argument("--rounds", type=_positive, default=loaded.rounds, help="loads per server")
    page.add_argument(
        "--servers",
        type=_servers,
        default=loaded.servers,
        help="comma-separated, among " + ",".join(pageload.SERVERS) + " (default: all)",
    )
    page.add_argument(
        "--delay-ms", type=float, default=loaded.delay_ms, help="the link's delay each way"
    )
    page.add_argument("--down-mbit", type=float, default=loaded.down_mbit, help="downstream rate")
    page.add_argument("--up-mbit", type=float, default=loaded.up_mbit, help="upstream rate")
    page.add_argument(
        "--timeout", type=_positive, default=loaded.timeout, help="seconds a load may take"
    )
    page.add_argument("--keep-tmp", action="store_true", help="keep configurations and logs")
    page.add_argument(
        "--screenshots", metavar="DIR", help="save each load's page as DIR/SERVER-roundN.png"
    )
    soaking = commands.add_parser(
        "soak",
        help="a session route at 80 %% of capacity for 30 minutes: RSS flat, no errors",
        description=soak.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    soaked = soak.Settings()
    soaking.add_argument("--minutes", type=_positive, default=soaked.minutes)
    soaking.add_argument("--warmup-minutes", type=_positive, default=soaked.warmup_minutes)
    soaking.add_argument("--connections", type=_positive, default=soaked.connections)
    soaking.add_argument("--keep-tmp", action="store_true")
    reloading = commands.add_parser(
        "reload",
        help="req/s and p99 under load with a reload every second, against none; failures",
        description=reload.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reloaded = reload.Settings()
    reloading.add_argument("--duration", type=_positive, default=reloaded.duration)
    reloading.add_argument("--connections", type=_positive, default=reloaded.connections)
    reloading.add_argument("--rounds", type=_positive, default=reloaded.rounds)
    reloading.add_argument("--reloads-per-second", type=float, default=reloaded.reloads_per_second)
    reloading.add_argument("--keep-tmp", action="store_true")
    profiling = commands.add_parser(
        "profile",
        help="where edgegw's CPU goes on one scenario's route under load (py-spy)",
        description=profile.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    spied = profile.Settings()
    profiling.add_argument(
        "scenario", nargs="?", default="proxy", choices=sorted(profile.SCENARIOS)
    )
    profiling.add_argument("--duration", type=_positive, default=spied.duration)
    profiling.add_argument("--connections", type=_positive, default=spied.connections)
    profiling.add_argument("--rate", type=_positive, default=spied.rate, help="samples/s")
    profiling.add_argument("--top", type=_positive, default=spied.top, help="functions listed")
    profiling.add_argument("--keep-tmp", action="store_true")
    profiling.add_argument(
        "--nonblocking",
        action="store_true",
        help="sample without pausing edgegw (its stacks come back inconsistent)",
    )
    chaining = commands.add_parser(
        "chain",
        help="Python CPU of one proxied request in process, no sockets (steady to ~1 %%)",
        description=chain.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chained = chain.Settings()
    chaining.add_argument("--requests", type=_positive, default=chained.requests)
    chaining.add_argument("--repeats", type=_positive, default=chained.repeats)
    chaining.add_argument("--processes", type=_positive, default=chained.processes)
    chaining.add_argument("--before", metavar="REV", help="also measure edgegw at git revision REV")
    chaining.add_argument("--profile", action="store_true", help="print a cProfile listing")
    return top


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so that every started process is cleaned up.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run one benchmark."""
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.command == "chain":
            return chain.run(
                chain.Settings(
                    requests=args.requests,
                    repeats=args.repeats,
                    processes=args.processes,
                    before=args.before,
                    profile=args.profile,
                )
            )
        if args.command == "proxy":
            return proxy.run(
                proxy.Settings(**_wrk_settings(args), targets=args.targets, before=args.before)
            )
        if args.command == "api":
            return api.run(
                api.Settings(
                    **_wrk_settings(args),
                    low_connections=args.low_connections,
                    delays=args.delays,
                    before=args.before,
                )
            )
        if args.command == "authz":
            return authz.run(authz.Settings(**_wrk_settings(args), evaluations=args.evaluations))
        if args.command == "telemetry":
            return telemetry.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "session":
            return session.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "server-session":
            return server_session.run(
                server_session.Settings(**_wrk_settings(args), low_connections=args.low_connections)
            )
        if args.command == "bearer":
            return bearer.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "plugins":
            return plugins.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "metrics":
            return metrics.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "workers":
            return workers.run(variants.Settings(**_wrk_settings(args)))
        if args.command == "suite":
            return suite.run(suite.Settings(**_wrk_settings(args), only=args.only))
        if args.command == "tls":
            return tls.run(
                tls.Settings(
                    **_wrk_settings(args),
                    h2_clients=args.h2_clients,
                    h2_streams=args.h2_streams,
                    handshake_connections=args.handshake_connections,
                )
            )
        if args.command == "compression":
            return compression.run(compression.Settings(**_wrk_settings(args), app=args.app))
        if args.command == "pageload":
            return pageload.run(
                pageload.Settings(
                    rounds=args.rounds,
                    delay_ms=args.delay_ms,
                    down_mbit=args.down_mbit,
                    up_mbit=args.up_mbit,
                    servers=args.servers,
                    timeout=args.timeout,
                    keep_tmp=args.keep_tmp,
                    screenshots=args.screenshots,
                )
            )
        if args.command == "reload":
            return reload.run(
                reload.Settings(
                    duration=args.duration,
                    connections=args.connections,
                    rounds=args.rounds,
                    reloads_per_second=args.reloads_per_second,
                    keep_tmp=args.keep_tmp,
                )
            )
        if args.command == "soak":
            return soak.run(
                soak.Settings(
                    minutes=args.minutes,
                    warmup_minutes=args.warmup_minutes,
                    connections=args.connections,
                    keep_tmp=args.keep_tmp,
                )
            )
        if args.command == "profile":
            return profile.run(
                profile.Settings(
                    scenario=args.scenario,
                    duration=args.duration,
                    connections=args.connections,
                    rate=args.rate,
                    top=args.top,
                    keep_tmp=args.keep_tmp,
                    nonblocking=args.nonblocking,
                )
            )
        return memory.run(
            memory.Settings(
                download_size=args.download_size,
                sse_connections=args.sse_connections,
                idle_connections=args.idle_connections,
                keep_tmp=args.keep_tmp,
                only=args.only,
            )
        )
    except MissingToolsError as e:
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
