"""
The rate-limit rows of C{python -m bench suite} (issue 38's targets): the suite's small
proxied route (a C{reverse-proxy} route to the nginx backend, the small JSON document)
on five edgegw processes, one per row, alike but for the C{rate-limit} plugin:

  - C{ratelimit-none}: no plugin (the baseline);
  - C{ratelimit}: C{rate-limit} per process, under its limit (L{UNDER});
  - C{ratelimit-shared}: the same shared through a redis-server the harness starts (the
    Gateway's C{stateProvider}: one EVALSHA per request);
  - C{ratelimit-over}, C{ratelimit-over-shared}: a client over its limit (L{OVER}: after
    its first request, which the harness sends before the load, every request is a 429
    and the backend is never called), per process (compared with C{ratelimit-none}) and
    shared (compared with C{ratelimit-shared}, a request proxied through the same
    shared limit: the script's round trip is paid either way).

The shared rows refuse (503) rather than limit per process while the store is down
(C{onStoreDown: deny}), so that a run that lost Redis cannot pass for a shared one: the
suite's check after every run then marks the row unavailable.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from bench import gateway
from bench.processes import StartupError
from bench.server_session import RedisServer, find_redis
from bench.targets import PAYLOADS, Target, start_edgegw
from bench.tools import MissingToolsError
from tests.support.processes import free_port

if TYPE_CHECKING:
    from bench.suite import Row

SMALL = PAYLOADS[0]
LABELS = {"rate-limit": "bench"}
"""The labels of the route, which the plugin's selector matches."""
UNDER: Mapping[str, Any] = {"key": ["client"], "rate": "1000000/s", "burst": 1_000_000}
"""Far above any load here (the fastest rate the plugin counts, and the largest burst)."""
OVER: Mapping[str, Any] = {"key": ["client"], "rate": "1/h", "burst": 1}
"""One request an hour: after the first one, every request is limited."""
LIMITED_BODY = b'{"error": "too many requests"}\n'
"""The 429's body on a service route (a reverse-proxy route is one)."""
READY_WITHIN = 10.0
"""Seconds a shared row has, after it listens, to connect to Redis (503 until then)."""


@attrs.frozen
class _Spec:
    key: str
    label: str
    config: Mapping[str, Any] | None
    shared: bool = False
    baseline: str | None = None
    goal: tuple[str, float, str] | None = None

    @property
    def over(self) -> bool:
        return self.config is OVER


_SPECS = (
    _Spec("ratelimit-none", "proxied route, no rate-limit plugin", None),
    _Spec(
        "ratelimit",
        "proxied route + rate-limit per process, under its limit",
        UNDER,
        baseline="ratelimit-none",
        goal=("extra-cpu", 0.10, "at most +10 % CPU"),
    ),
    _Spec(
        "ratelimit-shared",
        "proxied route + rate-limit shared in Redis, under its limit",
        UNDER,
        shared=True,
        baseline="ratelimit-none",
        goal=("extra-cpu", 0.30, "at most +30 % CPU"),
    ),
    _Spec(
        "ratelimit-over",
        "client over its limit, per process (429)",
        OVER,
        baseline="ratelimit-none",
        goal=("cpu-share", 1.0, "less CPU than a proxied request"),
    ),
    # A 429 through Redis still costs the script's round trip: it is compared with a
    # request proxied through the same shared limit (what refusing saves there).
    _Spec(
        "ratelimit-over-shared",
        "client over its limit, shared in Redis (429)",
        OVER,
        shared=True,
        baseline="ratelimit-shared",
        goal=("cpu-share", 1.0, "less CPU than one proxied through it"),
    ),
)


def _resources(spec: _Spec, redis: RedisServer | None) -> list[dict[str, Any]]:
    if spec.config is None:
        return []
    config = dict(spec.config)
    resources = []
    if spec.shared:
        assert redis is not None
        config |= {"shared": True, "onStoreDown": "deny"}
        store = {"type": "kvstore", "config": {"address": redis.address}}
        resources.append(gateway.gateway_fields({"stateProvider": store}))
    selector = {"matchLabels": dict(LABELS)}
    plugin = {"plugin": "rate-limit", "selector": selector, "config": config}
    # Named after the row: the shared rows' keys in Redis (which the resource's name
    # prefixes) are then apart, as are two limits in one deployment.
    resources.append(gateway.resource("RequestPlugin", spec.key, plugin))
    return resources


def _status(port: int) -> int | str:
    """The status of one C{GET} of the small payload, or why there was none."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", SMALL.path)
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as e:
        return f"GET {SMALL.path} failed: {e}"
    finally:
        connection.close()


def _prepare(spec: _Spec, target: Target) -> str | None:
    """
    Wait for a shared row's store (its requests answer 503 until it is connected), then
    spend an over-limit row's one request; L{None}, or why the row cannot be measured.
    """
    deadline = time.monotonic() + READY_WITHIN
    while True:
        status = _status(target.port)
        if status != 503 or not spec.shared or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if status == 503 and spec.shared:
        return f"its store did not connect within {READY_WITHIN:g} s (503)"
    if status != 200:
        return f"its first GET {SMALL.path} answered {status} (expected 200)"
    return None


def _redis(stack: ExitStack, tmp: Path) -> RedisServer | str:
    """A redis-server for the shared rows, or why there is none."""
    try:
        return RedisServer(stack, tmp, find_redis())
    except MissingToolsError:
        return "redis-server not found (`make redis` installs it)"
    except StartupError as e:
        return f"redis-server: {e}"


def start_rate_limit_rows(stack: ExitStack, tmp: Path, backend_port: int) -> list[Row]:
    """
    Start the rows' processes (stopped when C{stack} closes; a redis-server for the
    shared ones), against the suite's nginx backend on C{backend_port}, and make the
    rows, in round order. A row whose process cannot run, or whose store cannot be
    reached, comes back unavailable, saying why.
    """
    # bench.suite imports this module: its row types are taken when the rows are made.
    from bench.suite import Goal, Row

    route = attrs.evolve(
        gateway.reverse_proxy("backend", "/", f"http://127.0.0.1:{backend_port}"),
        labels=dict(LABELS),
    )
    redis = _redis(stack, tmp)
    rows = []
    for spec in _SPECS:
        target = Target(spec.key, spec.key, spec.label, port=free_port())
        if spec.shared and isinstance(redis, str):
            target.unavailable = redis
        else:
            store = None if isinstance(redis, str) else redis
            resources = _resources(spec, store)
            start_edgegw(stack, tmp, f"rate-limit-{spec.key}", target, [route], resources)
        if target.unavailable is None:
            target.unavailable = _prepare(spec, target)
        rows.append(
            Row(
                spec.key,
                spec.label,
                target,
                path=SMALL.path,
                status=429 if spec.over else 200,
                body=LIMITED_BODY if spec.over else SMALL.body,
                baseline=spec.baseline,
                goal=None if spec.goal is None else Goal(*spec.goal),
            )
        )
    return rows


__all__ = ["LABELS", "OVER", "UNDER", "start_rate_limit_rows"]
