"""
C{python -m bench soak}: edgegw under steady load for a long time, RSS and errors watched.

One edgegw process serves L{bench.session}'s app route with a valid session cookie (the
route that keeps per-session state: the cookie's record, the principal's memo). The
harness first finds its capacity (req/s at C{--connections}, a short wrk run), then the
number of connections at which it serves about C{--load} (80 %) of that, and loads it
there for C{--minutes} in one-minute wrk runs. After each run it reads edgegw's RSS and
asks the route once (it must still answer 200: a lapsed session would show up as
redirects, which wrk counts as successes). Reported: the RSS after the warm-up (the
first C{--warmup-minutes}) and at the end, the growth between them (target: under 10 %),
and every error (target: none).
"""

from __future__ import annotations

import secrets
import time
from contextlib import ExitStack
from typing import Any

import attrs

from bench import report, session, variants, wrk
from bench.processes import MIB, rss_bytes, scratch
from bench.rounds import say
from bench.tools import ensure_wrk

GROWTH_TARGET = 0.10
"""The most RSS may grow between the end of the warm-up and the end of the soak."""


@attrs.frozen
class Settings:
    """
    @ivar minutes: How long the load lasts.
    @ivar warmup_minutes: The first minutes, after which RSS is the baseline.
    @ivar load: The share of capacity to hold.
    @ivar connections: wrk's connections when finding the capacity.
    """

    minutes: int = 30
    warmup_minutes: int = 2
    load: float = 0.8
    connections: int = 50
    keep_tmp: bool = False


def _rate(wrk_path: str, url: wrk.Url, connections: int, seconds: int) -> float:
    return wrk.run(wrk_path, url, connections, seconds).rps


def run(settings: Settings) -> int:
    """Soak, print the figures and write the JSON results; 1 if a target is missed."""
    wrk_path = ensure_wrk()
    key = secrets.token_hex(16)
    spec = session.session_spec(key)
    cookies = {
        "b": session.make_cookie(spec, session.GROUPS),
        "c": session.make_cookie(spec, session.large_groups()),
    }
    variant = session.make_variants(key, cookies)[1]
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    minutes: list[dict[str, Any]] = []
    with scratch("edgegw-bench-soak-", settings.keep_tmp) as tmp, ExitStack() as stack:
        (target,) = variants.start(stack, tmp, [variant], session.ROUTE_PATH, "soak")
        if target.unavailable is not None:
            say(f"bench: edgegw unavailable: {target.unavailable}")
            return 1
        headers = [f"{name}: {value}" for name, value in variant.headers]
        url = wrk.Url(f"http://127.0.0.1:{target.port}{session.ROUTE_PATH}", headers)
        capacity = _rate(wrk_path, url, settings.connections, 10)
        wanted = capacity * settings.load
        # Fewer connections, less throughput: the most that stays at or under the load.
        connections = 1
        for candidate in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48):
            if candidate >= settings.connections or _rate(wrk_path, url, candidate, 3) > wanted:
                break
            connections = candidate
        say(
            f"capacity {capacity:,.0f} req/s at c{settings.connections}; soaking at "
            f"c{connections} for {settings.minutes} min (aiming at {wanted:,.0f} req/s)"
        )
        for minute in range(1, settings.minutes + 1):
            result, cpu = wrk.measure(wrk_path, url, connections, 60, target.pids)
            target.check_alive()
            wrong = variant.expect(target.port, session.ROUTE_PATH)
            rss = rss_bytes(target.pids[0]) if target.alive() else 0
            minutes.append(
                {
                    "minute": minute,
                    "rps": round(result.rps, 1),
                    "errors": result.errors,
                    "cpu_us_per_request": round(cpu / max(1, result.requests) * 1e6, 1),
                    "rss_mib": round(rss / MIB, 2),
                    "check": wrong,
                }
            )
            say(
                f"minute {minute}/{settings.minutes}: {result.rps:,.0f} req/s, "
                f"{result.errors} errors, RSS {rss / MIB:.1f} MiB"
                + (f", WRONG: {wrong}" if wrong else "")
            )
            if target.unavailable is not None or wrong is not None:
                break
    warm = minutes[min(settings.warmup_minutes, len(minutes)) - 1]["rss_mib"]
    end = minutes[-1]["rss_mib"]
    growth = (end - warm) / warm if warm else 0.0
    errors = sum(m["errors"] for m in minutes) + sum(1 for m in minutes if m["check"])
    complete = len(minutes) == settings.minutes
    ok = complete and errors == 0 and growth < GROWTH_TARGET
    print()
    median = sorted(m["rps"] for m in minutes)[len(minutes) // 2]
    print(
        f"soak: {len(minutes)} of {settings.minutes} minutes at c{connections} "
        f"(capacity {capacity:,.0f} req/s, median {median:,.0f} req/s)"
    )
    print(
        f"RSS after {settings.warmup_minutes} min {warm:.1f} MiB, at the end {end:.1f} MiB: "
        f"{growth:+.1%} (target under {GROWTH_TARGET:.0%}); errors {errors} (target 0): "
        + ("OK" if ok else "MISSED")
    )
    path = report.write_json(
        "soak",
        {
            "benchmark": "soak",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": report.machine(),
            "capacity_rps": capacity,
            "connections": connections,
            "minutes": minutes,
            "rss_growth": growth,
            "errors": errors,
            "ok": ok,
        },
    )
    print(f"\nresults: {path}")
    return 0 if ok else 1
