"""
C{python -m bench proxy|memory}: the benchmark harness's command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from bench import memory, proxy
from bench.tools import MissingToolsError

MEMORY_DESCRIPTION = """\
Measure edgegw's memory on reverse-proxy routes, each with a fresh edgegw process:

  1. RSS growth (peak minus baseline) while a client downloads a 1 GiB response
     through the route as fast as it can. Target: < 32 MiB.
  2. RSS while holding 5,000 concurrent idle server-sent-event streams through the
     route. Target: < 300 MiB.

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


def _targets(text: str) -> str:
    try:
        return proxy.target_letters(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    """The argument parser with its two subcommands."""
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
            "route, (e) edgegw's static route; for a ~100-byte JSON and a 64 KiB file."
        ),
    )
    p.add_argument(
        "--duration", type=_positive, default=defaults.duration, help="seconds per wrk run"
    )
    p.add_argument(
        "--connections",
        type=_positive,
        default=defaults.connections,
        help="wrk connections (also the proxies' upstream pool size)",
    )
    p.add_argument("--rounds", type=_positive, default=defaults.rounds, help="interleaved rounds")
    p.add_argument(
        "--warmup",
        type=_non_negative,
        default=defaults.warmup,
        help="unrecorded seconds per target and payload before round 1 (0: none)",
    )
    p.add_argument(
        "--targets",
        type=_targets,
        default=defaults.targets,
        help="which targets to run, as letters (default abcde)",
    )
    p.add_argument("--keep-tmp", action="store_true", help="keep configurations and logs")
    m = commands.add_parser(
        "memory",
        help="edgegw RSS: streaming 1 GiB, and holding 5,000 idle SSE streams",
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
    m.add_argument("--keep-tmp", action="store_true", help="keep configuration and logs")
    return top


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so that every started process is cleaned up.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run one benchmark."""
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.command == "proxy":
            return proxy.run(
                proxy.Settings(
                    duration=args.duration,
                    connections=args.connections,
                    rounds=args.rounds,
                    warmup=args.warmup,
                    targets=args.targets,
                    keep_tmp=args.keep_tmp,
                )
            )
        return memory.run(
            memory.Settings(
                download_size=args.download_size,
                sse_connections=args.sse_connections,
                keep_tmp=args.keep_tmp,
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
