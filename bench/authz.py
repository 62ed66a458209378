"""
C{python -m bench authz}: what authorization policies cost edgegw per request.

Four edgegw processes, one per variant, each serving the same C{health} route
C{GET /x} (labelled C{{tier: edge, team: platform, env: bench}}), loaded with wrk in
interleaved rounds (L{bench.variants}):

  - a. C{no-policy}: no policies.
  - b. C{rego-allow}: one Rego policy (L{NO_DELETES}: deny only C{DELETE}) in
    C{access.authorize}; it allows every request.
  - c. C{require-deny}: a C{require} policy (groups C{[admin]}) and then the same Rego
    policy. With no IdP there is no principal, so C{require} denies every request
    (C{403}) and the Rego policy, listed after it, is never evaluated.
  - d. C{rego-realistic}: as b with L{REALISTIC}, about twenty rules over request
    attributes and labels, which also allows every request.

Before the load, each Rego policy is also evaluated in-process, with no HTTP, through
C{edgegw.authz.rego.RegoPolicy(path).evaluate(document)} on the input document edgegw
builds for C{GET /x}: the time per evaluation, which the issue requires to stay well
under a millisecond.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, variants
from bench.rounds import say
from bench.targets import Target
from bench.tools import ensure_wrk
from edgegw.authz.rego import RegoLoadError, RegoPolicy
from edgegw.handlers.health import BODY as HEALTH_BODY

POLICIES = Path(__file__).resolve().parent / "policies"
NO_DELETES = POLICIES / "no-deletes.rego"
"""The one-rule Rego policy of variants b and c."""
REALISTIC = POLICIES / "realistic.rego"
"""The Rego policy of variant d, of a realistic size."""

ROUTE_NAME = "x"
ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
LABELS = {"tier": "edge", "team": "platform", "env": "bench"}
"""The route's labels, the same in every variant (Rego policies see them)."""
FORBIDDEN = b"forbidden\n"
"""The body of edgegw's 403 on an authorization denial."""
EVALUATION_BUDGET_US = 1000.0
"""The issue's bound on Rego evaluation per request: well under a millisecond."""
WARMUP_EVALUATIONS = 100
"""Unrecorded evaluations before the timed ones."""
BATCHES = 5
"""The timed evaluations run in this many equal batches, each timed too."""


@attrs.frozen
class Settings(variants.Settings):
    """
    The options of one authz benchmark run (those of L{variants.Settings}, and:)

    @ivar evaluations: How many in-process evaluations each Rego policy's time per
        evaluation is measured over.
    """

    evaluations: int = 5000


def input_document(method: str = "GET") -> dict[str, Any]:
    """
    The Rego input edgegw builds for an anonymous C{METHOD /x} on the benchmark's route
    (C{edgegw.authz.policy.RoutePolicies.input_document}).
    """
    return {
        "subject": "",
        "groups": [],
        "claims": {},
        "request": {
            "method": method,
            "path": ROUTE_PATH,
            "route": ROUTE_MATCH,
            "route_name": ROUTE_NAME,
            "labels": dict(LABELS),
        },
    }


def deny_rules(path: Path) -> int:
    """How many C{deny} rules a Rego file defines (0 when it cannot be read)."""
    try:
        source = path.read_text()
    except OSError:
        return 0
    return len(re.findall(r"^deny contains\b", source, re.MULTILINE))


def make_variants() -> list[variants.Variant]:
    """The four variants, in round order."""
    no_deletes = gateway.rego_policy("no-deletes", NO_DELETES)
    realistic = gateway.rego_policy("realistic", REALISTIC)
    admins = gateway.require_policy("require-admin", ["admin"])

    def route(*authorize: str) -> list[gateway.RouteConfig]:
        return [gateway.health(ROUTE_NAME, ROUTE_MATCH, authorize, LABELS)]

    return [
        variants.Variant("a", "no-policy", "health route, no policies", route(), body=HEALTH_BODY),
        variants.Variant(
            "b",
            "rego-allow",
            f"+ Rego policy no-deletes ({deny_rules(NO_DELETES)} rule), allows",
            route("no-deletes"),
            [no_deletes],
            body=HEALTH_BODY,
        ),
        variants.Variant(
            "c",
            "require-deny",
            "+ require groups [admin], then no-deletes: no principal, 403",
            route("require-admin", "no-deletes"),
            [admins, no_deletes],
            status=403,
            body=FORBIDDEN,
        ),
        variants.Variant(
            "d",
            "rego-realistic",
            f"+ Rego policy realistic ({deny_rules(REALISTIC)} rules), allows",
            route("realistic"),
            [realistic],
            body=HEALTH_BODY,
        ),
    ]


@attrs.frozen
class RegoTiming:
    """
    A Rego policy evaluated in-process, with no HTTP.

    @ivar key: The variant it belongs to.
    @ivar file: The policy file's name.
    @ivar rules: Its number of C{deny} rules.
    @ivar evaluations: How many evaluations were timed.
    @ivar wall_us: Wall-clock microseconds per evaluation.
    @ivar cpu_us: This process's CPU microseconds per evaluation.
    @ivar fastest_batch_us: Wall-clock microseconds per evaluation in the fastest of the
        L{BATCHES} equal batches the evaluations ran in: on a machine shared with other
        work, closer to the policy's own cost than the mean.
    @ivar unavailable: Why it could not be measured, or L{None}.
    """

    key: str
    file: str
    rules: int
    evaluations: int
    wall_us: float | None = None
    cpu_us: float | None = None
    fastest_batch_us: float | None = None
    unavailable: str | None = None

    @property
    def within_budget(self) -> bool | None:
        """Whether an evaluation takes less than L{EVALUATION_BUDGET_US}."""
        return None if self.wall_us is None else self.wall_us < EVALUATION_BUDGET_US


def time_policy(key: str, path: Path, evaluations: int) -> RegoTiming:
    """
    Compile the Rego policy C{path} as edgegw does and time C{evaluations} evaluations
    of L{input_document}, after L{WARMUP_EVALUATIONS} unrecorded ones. The policy must
    allow that document and deny the same request with C{DELETE}, or it is reported as
    unavailable.
    """
    timing = RegoTiming(key, path.name, deny_rules(path), evaluations)
    try:
        policy = RegoPolicy(str(path))
    except RegoLoadError as e:
        return attrs.evolve(timing, unavailable=f"does not compile: {e}")
    document = input_document()
    denied = policy.evaluate(document)
    if denied is not None:
        return attrs.evolve(timing, unavailable=f"denies GET {ROUTE_PATH}: {denied}")
    if policy.evaluate(input_document("DELETE")) is None:
        return attrs.evolve(timing, unavailable=f"allows DELETE {ROUTE_PATH}")
    for _ in range(WARMUP_EVALUATIONS):
        policy.evaluate(document)
    sizes = [evaluations // BATCHES + (i < evaluations % BATCHES) for i in range(BATCHES)]
    batches = []
    wall, cpu = time.perf_counter(), time.process_time()
    for size in filter(None, sizes):
        started = time.perf_counter()
        for _ in range(size):
            policy.evaluate(document)
        batches.append((time.perf_counter() - started) / size * 1e6)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return attrs.evolve(
        timing,
        wall_us=wall / evaluations * 1e6,
        cpu_us=cpu / evaluations * 1e6,
        fastest_batch_us=min(batches),
    )


def timing_lines(timings: Sequence[RegoTiming]) -> list[str]:
    """The in-process Rego figures, for under the table."""
    count = max((t.evaluations for t in timings), default=0)
    lines = [
        f"REGO EVALUATION in-process: RegoPolicy.evaluate on GET {ROUTE_PATH}'s input "
        f"document, {count:,} evaluations per policy",
        f"(the issue: well under {EVALUATION_BUDGET_US / 1000:g} ms per request)",
    ]
    for t in timings:
        rules = f"{t.rules} deny rule" + ("" if t.rules == 1 else "s")
        head = f"  {t.key} {t.file:<16} {rules:>13}"
        if t.wall_us is None or t.cpu_us is None or t.fastest_batch_us is None:
            lines.append(f"{head}  unavailable: {t.unavailable}")
            continue
        verdict = "OK" if t.within_budget else "OVER BUDGET"
        lines.append(
            f"{head}  {t.wall_us:7.1f} µs per evaluation: "
            f"{t.wall_us / EVALUATION_BUDGET_US:.0%} of 1 ms, {verdict}  "
            f"(CPU {t.cpu_us:.1f} µs; fastest fifth {t.fastest_batch_us:.1f} µs)"
        )
    return lines


def notes(settings: Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Every variant serves the same health route {ROUTE_MATCH} (200 "
        f"{HEALTH_BODY.decode()}), labelled {LABELS}; only the policies differ. +CPU "
        "µs/req is then what authorization costs per request: the authz stage, building "
        "the Rego input document, and the policies' evaluation.",
        "c measures the require check plus the 403 path, not Rego: policies are checked in "
        "the order the route lists them and the first denial answers. require-admin comes "
        "first and, with no IdP configured, there is no principal, so it denies every "
        "request (403 forbidden, authz_denied in the access log); no-deletes is never "
        "evaluated (its input document is still built). Its 403s are what is expected: "
        "its errors column counts responses that were not errors.",
        "The in-process Rego figure is RegoPolicy.evaluate alone (rego-cpp through regopy, "
        "input conversion and result parsing included), in the harness process, with no "
        f"HTTP; {WARMUP_EVALUATIONS} unrecorded evaluations first. µs per evaluation is the "
        f"mean over all of them; the fastest fifth is the mean of the fastest of {BATCHES} "
        "equal batches, less disturbed by other work on a shared machine. Compare them "
        "with b's and d's +CPU µs/req.",
        *variants.common_notes(settings),
    ]


def run(settings: Settings) -> int:
    """
    Time the Rego policies in-process, run the HTTP benchmark, print both and write the
    JSON results.

    @return: The exit status: 0, or 1 if a variant or a policy could not be measured.
    """
    wrk_path = ensure_wrk()
    configs = make_variants()
    timings: list[RegoTiming] = []

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        # In-process first, while nothing else of the benchmark runs.
        say(f"timing the Rego policies in-process ({settings.evaluations:,} each)")
        for key, path in (("b", NO_DELETES), ("d", REALISTIC)):
            timings.append(time_policy(key, path, settings.evaluations))
        for line in timing_lines(timings):
            say(line)
        return configs, variants.start(stack, tmp, configs, ROUTE_PATH, "edgegw"), {}

    done = variants.measure("authz", settings, wrk_path, ROUTE_PATH, prepare)
    if done is None:
        return 1
    variants.print_results(done, (), timing_lines(timings), notes(settings))
    variants.write_results(
        "authz",
        done,
        settings,
        wrk_path,
        configs,
        notes(settings),
        {},
        {
            "route": {"match": ROUTE_MATCH, "labels": LABELS},
            "policies": {
                "no-deletes": NO_DELETES.read_text(),
                "realistic": REALISTIC.read_text(),
            },
            "rego_evaluation": [
                {**attrs.asdict(t), "within_budget": t.within_budget} for t in timings
            ],
        },
    )
    failed = any(t.unavailable is not None for t in timings)
    return 1 if failed else variants.exit_status(done)
