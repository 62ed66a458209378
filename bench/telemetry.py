"""
C{python -m bench telemetry}: what tracing and OTLP export cost edgegw per request.

Three edgegw processes, one per variant, each with the same public C{reverse-proxy}
route C{/} to the nginx backend of C{bench proxy} (L{bench.targets.start_backend}), on
which wrk loads the 100-byte C{/small.json} in interleaved rounds (L{bench.variants}):

  - a. C{no-telemetry}: no Telemetry resource (no tracing code runs at all).
  - b. C{otlp-http}: a Telemetry resource exporting spans over OTLP/HTTP
    (C{http/protobuf}) to a local receiver.
  - c. C{otlp-grpc}: the same over OTLP/gRPC.

The receivers (L{bench.otlp_sink}) are processes of their own, so that receiving is not
charged to the gateway. After each run the harness waits until the receiver has the
run's spans (or none arrive for a while) before reading edgegw's CPU time again, so that
the export of the run's last spans is charged to it, and reports the spans received
against the two (SERVER and CLIENT) expected per request wrk completed.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, variants, wrk
from bench.otlp_sink import STATS_PATH, Sink
from bench.processes import started
from bench.rounds import say
from bench.targets import PAYLOADS, Target, fetch, start_backend
from bench.tools import ensure_tools, version
from tests.support.processes import free_port

PAYLOAD = PAYLOADS[0]
"""The 100-byte JSON document every run asks for."""
SPANS_PER_REQUEST = 2
"""A proxied request's spans: edgegw's SERVER span and its upstream call's CLIENT span."""
QUIET_SECONDS = 7.0
"""How long no new span must arrive before the harness stops waiting for a run's spans:
the SDK's batch processor exports a partial batch every 5 s (its schedule delay)."""
LIMIT_SECONDS = 30.0
"""The longest wait for a run's spans."""


class SpanCounter:
    """
    Reads how many spans a receiver has had, and waits for those of a run.

    @ivar sink: The receiver.
    @ivar mark: Its span count when the last wait ended: where the next run starts.
    """

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.mark = 0

    def count(self) -> int:
        """
        The spans the receiver has had so far.

        @raise OSError: If it cannot be reached.
        @raise ValueError: If it answers something else than its counts.
        """
        try:
            status, _, body = fetch(self.sink.stats_port, STATS_PATH)
        except http.client.HTTPException as e:
            raise ValueError(f"bad answer from the receiver: {e}") from None
        if status != 200:
            raise ValueError(f"the receiver answered {status} to GET {STATS_PATH}")
        spans: int = json.loads(body)["spans"]
        return spans

    def wait(self, expected: int) -> int:
        """
        Wait until the receiver has C{expected} spans beyond L{mark}, or none has arrived
        for L{QUIET_SECONDS}, or L{LIMIT_SECONDS} have passed; move L{mark} to its count.

        @return: The spans received beyond the previous mark.
        """
        start = changed = time.monotonic()
        last = self.count()
        while last - self.mark < expected:
            now = time.monotonic()
            if now - changed >= QUIET_SECONDS or now - start >= LIMIT_SECONDS:
                break
            time.sleep(0.2)
            current = self.count()
            if current != last:
                last, changed = current, time.monotonic()
        received, self.mark = last - self.mark, last
        return received

    def after(self, result: wrk.WrkResult) -> dict[str, Any]:
        """
        The L{variants.AfterRun} of a variant exporting to this receiver: wait for the
        run's spans; return how many arrived and how many were expected.
        """
        expected = SPANS_PER_REQUEST * result.requests
        try:
            received: int | None = self.wait(expected)
        except (OSError, ValueError) as e:
            say(f"bench: the otlp {self.sink.kind} receiver cannot be read: {e}")
            received = None
        return {"spans_received": received, "spans_expected": expected}


@attrs.frozen
class SpanTotals:
    """
    A variant's spans over every round.

    @ivar received: Spans the receiver got.
    @ivar expected: L{SPANS_PER_REQUEST} times the requests wrk completed.
    """

    received: int
    expected: int

    @property
    def ratio(self) -> float | None:
        """Received over expected."""
        return self.received / self.expected if self.expected else None

    @classmethod
    def of(cls, figures: list[dict[str, Any]]) -> SpanTotals | None:
        """The totals of a variant's recorded runs; L{None} when nothing was counted."""
        counted = [f for f in figures if f.get("spans_received") is not None]
        if not counted:
            return None
        return cls(
            sum(f["spans_received"] for f in counted), sum(f["spans_expected"] for f in counted)
        )


def make_variants(upstream: str, sinks: Mapping[str, Sink]) -> list[variants.Variant]:
    """
    The three variants, in round order: a with no Telemetry, then one per receiver in
    C{sinks} (by variant key).
    """
    routes = [gateway.reverse_proxy("backend", "/", upstream)]
    names = {"http": "otlp-http", "grpc": "otlp-grpc"}
    configs = [
        variants.Variant(
            "a",
            "no-telemetry",
            "reverse-proxy route to nginx, no Telemetry resource",
            routes,
            body=PAYLOAD.body,
        )
    ]
    for key, sink in sinks.items():
        configs.append(
            variants.Variant(
                key,
                names[sink.kind],
                f"+ Telemetry, OTLP {sink.protocol} to {sink.endpoint} (separate process)",
                routes,
                [gateway.telemetry("bench", sink.endpoint, sink.protocol)],
                body=PAYLOAD.body,
            )
        )
    return configs


def start_sink(stack: ExitStack, tmp: Path, sink: Sink) -> None:
    """
    Start a receiver (stopped when C{stack} closes) and wait until it listens.

    @raise StartupError: If it does not.
    """
    process = stack.enter_context(started(sink.start(tmp / f"otlp-{sink.kind}.log")))
    for port in {sink.port, sink.stats_port}:
        process.wait_for_port(port)


def first_spans(counter: SpanCounter) -> str | None:
    """
    Wait for the spans of the check request edgegw has answered (so that they do not
    land in the first measured run).

    @return: L{None} when they arrived, else what was wrong.
    """
    try:
        received = counter.wait(SPANS_PER_REQUEST)
    except (OSError, ValueError) as e:
        return f"the otlp {counter.sink.kind} receiver cannot be read: {e}"
    if received == 0:
        return (
            f"no span reached the otlp {counter.sink.kind} receiver within "
            f"{QUIET_SECONDS:.0f}s of GET {PAYLOAD.path} (see edgegw's log)"
        )
    return None


def spans_cell(totals: SpanTotals | None, ratio: bool) -> str:
    """A table cell: the spans received, or their ratio to those expected."""
    if totals is None:
        return "-"
    if not ratio:
        return f"{totals.received:,}"
    return "-" if totals.ratio is None else f"{totals.ratio:.0%}"


def notes(settings: variants.Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Every variant proxies GET {PAYLOAD.path} ({len(PAYLOAD.body)} bytes) to one "
        "nginx backend (1 worker, keepalive; its CPU is not counted); only the Telemetry "
        "resource differs. +CPU µs/req is then what tracing and export cost per request: "
        "a SERVER and a CLIENT span, traceparent injection, and the SDK's batch export "
        "(protobuf encoding and HTTP or gRPC calls, on its own thread in edgegw's process).",
        "The receivers (bench/otlp_sink.py) are separate processes: http a threaded "
        "HTTP/1.1 server, grpc a grpcio server; both decode each export just enough to "
        "count its spans. They share the cores with edgegw, wrk and nginx, but their CPU "
        "is not charged to edgegw.",
        "For b and c, edgegw's CPU is read after its receiver has the run's spans (or none "
        f"arrived for {QUIET_SECONDS:.0f}s: the batch processor exports a partial batch "
        "every 5s), so that exporting the run's last spans is charged to the run.",
        f"spans: received by the receiver for the run, over {SPANS_PER_REQUEST} per "
        "request wrk completed (SERVER + CLIENT), all rounds. Under 100%: the batch "
        "processor's queue (2,048 spans) was full and it dropped spans (the SDK warns "
        "'Queue full, dropping' in edgegw's log; --keep-tmp keeps it): export could not "
        "keep up. A little over 100%: requests "
        "still in flight when wrk stopped, which wrk does not count.",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Run the whole benchmark, print the table and write the JSON results.

    @return: The exit status: 0, or 1 if the backend could not be started or a variant
        could not be measured.
    """
    tools = ensure_tools()
    sinks: dict[str, Sink] = {}
    counters: dict[str, SpanCounter] = {}
    configs: list[variants.Variant] = []

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        backend = start_backend(stack, tools, tmp)
        http_port, grpc_port = free_port(), free_port()
        sinks.update(b=Sink("http", http_port, http_port), c=Sink("grpc", grpc_port, free_port()))
        for sink in sinks.values():
            start_sink(stack, tmp, sink)
        configs.extend(make_variants(f"http://127.0.0.1:{backend.port}", sinks))
        targets = variants.start(stack, tmp, configs, PAYLOAD.path, "edgegw")
        for target in targets:
            if target.key not in sinks:
                continue
            counter = counters[target.key] = SpanCounter(sinks[target.key])
            if target.unavailable is None:
                target.unavailable = first_spans(counter)
        return configs, targets, {key: counter.after for key, counter in counters.items()}

    done = variants.measure("telemetry", settings, tools.wrk, PAYLOAD.path, prepare)
    if done is None:
        return 1
    totals = {key: SpanTotals.of(done.runner.figures(key)) for key in counters}
    columns: list[variants.Column] = [
        ("spans", lambda key: spans_cell(totals.get(key), ratio=False)),
        (f"of {SPANS_PER_REQUEST}/req", lambda key: spans_cell(totals.get(key), ratio=True)),
    ]
    variants.print_results(done, columns, (), notes(settings))
    variants.write_results(
        "telemetry",
        done,
        settings,
        tools.wrk,
        configs,
        notes(settings),
        {"nginx": version([tools.nginx, "-v"])},
        {
            "payload": {"path": PAYLOAD.path, "bytes": len(PAYLOAD.body)},
            "receivers": {
                key: {**attrs.asdict(sink), "protocol": sink.protocol, "endpoint": sink.endpoint}
                for key, sink in sinks.items()
            },
            "spans": {
                key: None if t is None else {**attrs.asdict(t), "ratio": t.ratio}
                for key, t in totals.items()
            },
        },
    )
    return variants.exit_status(done)
