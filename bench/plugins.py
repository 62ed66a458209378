"""
C{python -m bench plugins}: what request and response plugins cost edgegw per request.

Four edgegw processes, one per variant, each serving the same C{health} route C{GET /x}
(labelled C{{tier: bench}}), loaded with wrk in interleaved rounds (L{bench.variants}):

  - a. C{none}: no plugins.
  - b. C{request}: one RequestPlugin (the shipped C{headers}, setting one request
    header).
  - c. C{response}: one ResponsePlugin (C{headers}, setting one response header: a
    header-only hook, run as the head goes out).
  - d. C{both}: C{body-limit} and C{headers} as RequestPlugins and C{headers} as a
    ResponsePlugin, as a production route might have them.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import gateway, variants
from bench.targets import Target
from bench.tools import ensure_wrk
from edgegw.handlers.health import BODY as HEALTH_BODY

ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
LABELS = {"tier": "bench"}


def _plugin(kind: str, name: str, plugin: str, config: Mapping[str, Any]) -> dict[str, Any]:
    spec = {"plugin": plugin, "selector": {"matchLabels": dict(LABELS)}, "config": dict(config)}
    return gateway.resource(kind, name, spec)


def make_variants() -> list[variants.Variant]:
    """The four variants, in round order."""
    route = [gateway.health("x", ROUTE_MATCH, (), LABELS)]
    request_headers = _plugin("RequestPlugin", "tag-request", "headers", {"set": {"X-Bench": "1"}})
    response_headers = _plugin(
        "ResponsePlugin", "tag-response", "headers", {"set": {"X-Bench": "1"}}
    )
    limit = _plugin("RequestPlugin", "limit", "body-limit", {"maxBytes": "1MiB"})
    return [
        variants.Variant("a", "none", "health route, no plugins", route, body=HEALTH_BODY),
        variants.Variant(
            "b",
            "request",
            "+ RequestPlugin headers (set 1 request header)",
            route,
            [request_headers],
            body=HEALTH_BODY,
        ),
        variants.Variant(
            "c",
            "response",
            "+ ResponsePlugin headers (set 1 response header)",
            route,
            [response_headers],
            body=HEALTH_BODY,
        ),
        variants.Variant(
            "d",
            "both",
            "+ body-limit, headers (request) and headers (response)",
            route,
            [limit, request_headers, response_headers],
            body=HEALTH_BODY,
        ),
    ]


def notes(settings: variants.Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Every variant serves the same health route {ROUTE_MATCH} (200 "
        f"{HEALTH_BODY.decode()}), labelled {LABELS}; only the plugin resources selecting "
        "it differ. +CPU µs/req is what the plugin stages cost per request: the request "
        "view and the hooks (b), the response watcher installed on the request, the "
        "header-only hooks run at the first write and the watcher removed (c), or all of "
        "them (d).",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Run the benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured.
    """
    wrk_path = ensure_wrk()
    configs = make_variants()

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        return configs, variants.start(stack, tmp, configs, ROUTE_PATH, "edgegw"), {}

    done = variants.measure("plugins", settings, wrk_path, ROUTE_PATH, prepare)
    if done is None:
        return 1
    variants.print_results(done, (), (), notes(settings))
    variants.write_results(
        "plugins",
        done,
        settings,
        wrk_path,
        configs,
        notes(settings),
        {},
        {"route": {"match": ROUTE_MATCH, "labels": LABELS}},
    )
    return variants.exit_status(done)
