"""
C{python -m bench session}: what a valid session cookie costs edgegw per request.

Three edgegw processes, one per variant, with the same configuration but for the route's
C{access.auth}: a Gateway C{session} block (a key made for the run) and an C{IdP}
resource whose issuer is a closed loopback port (L{ISSUER}: nothing listens there, so
discovery fails and is retried with backoff in edgegw's own log, and the login endpoint
answers 503; the rest of the gateway serves as usual). Each serves the same C{health}
route C{GET /x} as an C{app} route, loaded with wrk in interleaved rounds
(L{bench.variants}):

  - a. C{public}: C{access: {auth: public}}, wrk without a cookie (with the same
    User-Agent as b and c, as the browser sends it). The session stage still runs (it
    finds no cookie).
  - b. C{session}: C{access: {auth: required}}, wrk sending a valid session cookie (one
    cookie) and the User-Agent it was fingerprinted with.
  - c. C{session-large}: as b, with a session that holds L{LARGE_GROUPS} groups, which
    needs two cookie chunks (C{gw_session.0}, C{gw_session.1}).

The cookies are made in the harness with edgegw's own code (L{make_cookie}:
C{SessionCookie.new_record} and C{write} with the run's key), exactly as the callback of
a login writes them. A variant whose cookie edgegw does not accept answers 302 to the
login instead of 200: it is reported unavailable (before the load, and after every run),
never measured, since wrk counts redirects as successes.

Before the load, the session stage's read path is also timed in-process, with no HTTP:
parsing the Cookie header (C{Request.parseCookies}) and C{SessionCookie.read} for each
variant's request.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.task import Clock
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from bench import gateway, variants
from bench.rounds import say
from bench.targets import Target
from bench.tools import ensure_wrk
from edgegw.config.model import SessionSpec
from edgegw.handlers.health import BODY as HEALTH_BODY
from edgegw.identity.cookies import MAX_CHUNK
from edgegw.identity.principal import ClaimValue
from edgegw.identity.session_cookie import SessionCookie

ROUTE_NAME = "x"
ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
ISSUER = "http://127.0.0.1:9"
"""The IdP's issuer: the discard port on loopback, where nothing listens."""
USER_AGENT = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 "
    "(KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
)
"""The browser's User-Agent: the session is fingerprinted with it (the default
C{fingerprintHeaders}), and wrk sends it with the cookie."""
SUBJECT = "00u1a2b3c4d5e6f7g8h9"
"""The session's subject (an IdP user id)."""
PASSPORT: Mapping[str, ClaimValue] = {
    "email": "jane.doe@example.com",
    "name": "Jane Doe",
    "given_name": "Jane",
    "family_name": "Doe",
}
"""The session's passport: the default C{identity.claims}."""
GROUPS = ("platform-engineers", "billing-readers", "vpn-users")
"""The groups of b's session."""
LARGE_GROUPS = 150
"""How many groups c's session holds: enough for two cookie chunks."""
TARGET_RATIO = 0.9
"""The issue's target: b's throughput at least this much of a's."""
READS = 20_000
"""In-process reads timed per variant (after L{WARMUP_READS} unrecorded ones)."""
WARMUP_READS = 500


def large_groups(count: int = LARGE_GROUPS) -> tuple[str, ...]:
    """
    C{count} group names of a large directory (C{<department>-<system>-<role>}), b's
    three first.
    """
    departments = ("platform", "billing", "identity", "payments", "support", "data")
    systems = ("grafana", "kafka", "postgres", "vault", "jenkins", "k8s-prod", "k8s-dev")
    roles = ("readers", "writers", "admins", "oncall")
    names = [f"{d}-{s}-{r}" for d in departments for s in systems for r in roles]
    extra = [name for name in names if name not in GROUPS]
    return (*GROUPS, *extra[: count - len(GROUPS)])


@attrs.frozen
class Cookie:
    """
    A session cookie as a browser holds it after logging in.

    @ivar header: The C{Cookie} request header's value (every chunk).
    @ivar chunks: How many cookies it takes (1: the plain C{gw_session}).
    @ivar groups: How many groups the session holds.
    """

    header: str
    chunks: int
    groups: int


def session_spec(key: str) -> SessionSpec:
    """The session block every variant's Gateway has (L{session_block}), as edgegw reads it."""
    return SessionSpec(key=key.encode("ascii"))


def session_block(key: str) -> dict[str, Any]:
    """The Gateway's C{session} block: the key, every other field at its default."""
    return {"session": {"key": key}}


def make_cookie(spec: SessionSpec, groups: Sequence[str]) -> Cookie:
    """
    Log in as a browser with L{USER_AGENT} would: the record of a session beginning now
    (L{SUBJECT}, L{PASSPORT}, C{groups}), written by C{SessionCookie.write} onto a
    request that carries no cookie, and the C{Set-Cookie} lines turned back into the
    C{Cookie} header the browser then sends.
    """
    clock = Clock()
    clock.advance(time.time())
    sessions = SessionCookie(spec, clock)
    request = Request(DummyChannel())
    request.requestHeaders.setRawHeaders(b"User-Agent", [USER_AGENT.encode("ascii")])
    request.received_cookies = {}
    record = sessions.new_record(request, SUBJECT, PASSPORT, groups)
    sessions.write(request, record)
    lines = request.responseHeaders.getRawHeaders(b"Set-Cookie", [])
    pairs = [line.split(b";", 1)[0].decode("ascii") for line in lines]
    return Cookie("; ".join(pairs), len(pairs), len(groups))


def cookie_request(cookie: Cookie | None) -> Request:
    """A request with L{USER_AGENT} and C{cookie}'s header (none when L{None}), unparsed."""
    request = Request(DummyChannel())
    request.requestHeaders.setRawHeaders(b"User-Agent", [USER_AGENT.encode("ascii")])
    if cookie is not None:
        request.requestHeaders.setRawHeaders(b"Cookie", [cookie.header.encode("ascii")])
    return request


def make_variants(key: str, cookies: Mapping[str, Cookie]) -> list[variants.Variant]:
    """The three variants, in round order; C{cookies} are b's and c's."""
    resources = [
        gateway.gateway_fields(session_block(key)),
        gateway.idp(ISSUER, "edgegw-bench", "bench-secret"),
    ]

    def route(auth: str) -> list[gateway.RouteConfig]:
        return [gateway.health(ROUTE_NAME, ROUTE_MATCH, auth=auth, route_type="app")]

    def headers(cookie: Cookie) -> tuple[tuple[str, str], ...]:
        return (("User-Agent", USER_AGENT), ("Cookie", cookie.header))

    def described(cookie: Cookie) -> str:
        chunks = "1 cookie" if cookie.chunks == 1 else f"{cookie.chunks} chunks"
        size = f"{len(cookie.header):,} B"
        return f"auth required, valid session: {cookie.groups} groups, {chunks}, {size}"

    b, c = cookies["b"], cookies["c"]
    return [
        variants.Variant(
            "a",
            "public",
            "app route, auth public, no cookie (the same User-Agent)",
            route("public"),
            resources,
            body=HEALTH_BODY,
            headers=(("User-Agent", USER_AGENT),),
        ),
        variants.Variant(
            "b",
            "session",
            described(b),
            route("required"),
            resources,
            body=HEALTH_BODY,
            headers=headers(b),
            recheck=True,
        ),
        variants.Variant(
            "c",
            "session-large",
            described(c),
            route("required"),
            resources,
            body=HEALTH_BODY,
            headers=headers(c),
            recheck=True,
        ),
    ]


@attrs.frozen
class ReadTiming:
    """
    The session stage's read path for one variant's request, in-process (no HTTP).

    @ivar key: The variant.
    @ivar reads: How many reads were timed.
    @ivar parse_us: Microseconds per C{Request.parseCookies} of its Cookie header.
    @ivar read_us: Microseconds per C{SessionCookie.read} of the parsed cookies (no
        cookie: looking for one).
    @ivar valid: Whether the read gave a session (b, c) or none (a), as expected.
    """

    key: str
    reads: int
    parse_us: float
    read_us: float
    valid: bool


def time_read(key: str, spec: SessionSpec, cookie: Cookie | None, reads: int) -> ReadTiming:
    """
    Time parsing C{cookie}'s header and reading the session from it with a
    C{SessionCookie} of C{spec}, L{WARMUP_READS} unrecorded times first.
    """
    clock = Clock()
    clock.advance(time.time())
    sessions = SessionCookie(spec, clock)
    request = cookie_request(cookie)
    request.parseCookies()
    valid = (sessions.read(request) is not None) == (cookie is not None)
    for _ in range(WARMUP_READS):
        sessions.read(request)
    started = time.perf_counter()
    for _ in range(reads):
        request.received_cookies = {}
        request.parseCookies()
    parse = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(reads):
        sessions.read(request)
    read = time.perf_counter() - started
    return ReadTiming(key, reads, parse / reads * 1e6, read / reads * 1e6, valid)


def read_lines(timings: Sequence[ReadTiming], cookies: Mapping[str, Cookie]) -> list[str]:
    """The in-process read figures, for under the table."""
    count = max((t.reads for t in timings), default=0)
    lines = [
        f"SESSION READ in-process: Request.parseCookies + SessionCookie.read, {count:,} "
        "reads per variant"
    ]
    for t in timings:
        cookie = cookies.get(t.key)
        what = "no cookie" if cookie is None else f"{len(cookie.header):>6,} B cookie"
        state = "" if t.valid else "  WRONG: the read did not give the expected session"
        lines.append(
            f"  {t.key} {what:<15} parse {t.parse_us:6.1f} µs + read {t.read_us:6.1f} µs "
            f"= {t.parse_us + t.read_us:6.1f} µs{state}"
        )
    return lines


def notes(settings: variants.Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Every variant serves the same health route {ROUTE_MATCH} as an app route (200 "
        f"{HEALTH_BODY.decode()}) with the same Gateway session block and IdP, and wrk sends "
        "the same User-Agent to all; a is public "
        "and gets no cookie (its session stage looks for one and finds none), b and c "
        "require authentication and send a valid session cookie with the User-Agent it is "
        "bound to. +CPU µs/req is what a session costs per request: parsing the larger "
        "Cookie header, unsealing it (AES-256-GCM), decoding the record, the fingerprint, "
        "the auth gate and projecting the identity headers (X-User-*).",
        f"The IdP's issuer ({ISSUER}) is a closed port: edgegw starts anyway, retries "
        "discovery with backoff (its log, not this output) and answers its login endpoint "
        "503. A cookie edgegw does not accept would be answered 302 to the login: b and c "
        "are asked once before the load and after every run, and reported unavailable "
        "if so.",
        "The in-process figures are the read path alone, in the harness process: Twisted's "
        "Request.parseCookies on the variant's Cookie header and SessionCookie.read on the "
        "result (no HTTP, no chain).",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Make the cookies, time the read path in-process, run the HTTP benchmark, print both
    and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured.
    """
    wrk_path = ensure_wrk()
    key = secrets.token_hex(16)
    spec = session_spec(key)
    cookies = {"b": make_cookie(spec, GROUPS), "c": make_cookie(spec, large_groups())}
    configs = make_variants(key, cookies)
    timings: list[ReadTiming] = []

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        say(f"timing the session read path in-process ({READS:,} reads each)")
        for variant_key in ("a", "b", "c"):
            timings.append(time_read(variant_key, spec, cookies.get(variant_key), READS))
        for line in read_lines(timings, cookies):
            say(line)
        targets = variants.start(stack, tmp, configs, ROUTE_PATH, "edgegw")
        for target in targets:
            if target.unavailable is not None and " answered 302" in target.unavailable:
                target.unavailable = f"session cookie not accepted: {target.unavailable}"
        large = targets[2]
        if large.unavailable is None and cookies["c"].chunks != 2:
            large.unavailable = f"its cookie takes {cookies['c'].chunks} chunk(s), not 2"
        return configs, targets, {}

    done = variants.measure("session", settings, wrk_path, ROUTE_PATH, prepare)
    if done is None:
        return 1
    ratio, reached, lines = variants.target_verdict(done, "b session vs a public", TARGET_RATIO)
    variants.print_results(done, (), [*lines, "", *read_lines(timings, cookies)], notes(settings))
    variants.write_results(
        "session",
        done,
        settings,
        wrk_path,
        configs,
        notes(settings),
        {},
        {
            "route": {"match": ROUTE_MATCH, "type": "app"},
            "idp_issuer": ISSUER,
            "user_agent": USER_AGENT,
            "session": {
                "subject": SUBJECT,
                "passport": dict(PASSPORT),
                "groups": {"b": list(GROUPS), "c": list(large_groups())},
            },
            "cookies": {
                variant_key: {
                    "chunks": cookie.chunks,
                    "groups": cookie.groups,
                    "header_bytes": len(cookie.header),
                    "max_chunk": MAX_CHUNK,
                }
                for variant_key, cookie in cookies.items()
            },
            "target": {"ratio": TARGET_RATIO, "b_vs_a": ratio, "reached": reached},
            "session_read": [attrs.asdict(t) for t in timings],
        },
    )
    wrong = any(not t.valid for t in timings)
    return 1 if wrong else variants.exit_status(done)
