"""
C{python -m bench server-session}: what a server-side session in Redis costs edgegw per
request, against a cookie-only session on the same route.

A real redis-server (found on the PATH; L{find_redis}) and one backend process
(L{bench.backends}' C{json} server answering C{GET /x} at once) are started, then two
edgegw processes with the same configuration but for the Gateway's C{stateProvider}:
the same C{session} block (a key made for the run), the same C{IdP} resource (its issuer
a closed loopback port, as in L{bench.session}: nothing here needs the IdP) and the same
route, C{GET /x} as an C{app} route, C{auth: required}, reverse-proxied to the backend.
They are loaded with wrk in interleaved rounds (L{bench.variants}), at a low
concurrency (by default one connection: the latency a session adds, without queueing)
and at the default one (the CPU it adds under load):

  - a. C{cookie-session}: no state provider; wrk sends a session cookie that holds the
    whole sealed record (L{bench.session.make_cookie}: what a login writes).
  - b. C{server-session}: C{stateProvider: {type: kvstore, config: {address: ...}}};
    wrk sends the cookie that holds only the sealed session id, and every request reads
    the record from Redis with one C{GET}.

b's session is made with edgegw's own code, as a login's callback makes it
(L{seed_server_session}): C{SessionCookie.new_record} with the tokens an IdP would have
given (an RS256 access token expiring in an hour, so never due for refresh during a run,
a refresh token, an id_token, the IdP's session id), then C{ServerSessions.create} over
the C{kvstore} provider's own store, built by C{find_provider("kvstore").build} as the
gateway builds it: the sealed record under C{keyPrefix + <session id>} with the
session's TTL, the subject and IdP-session indexes, and the C{Set-Cookie} lines turned
back into the C{Cookie} header a browser sends. The harness then reads the key back from
Redis (it must exist, with its TTL) before the load, and again at the end.

Besides the gateway's CPU per request, Redis's own (C{utime + stime} of redis-server
from C{/proc}) is read around every run, and Redis's command counters
(C{INFO commandstats}) give the commands each request cost: one C{GET} for b, nothing
for a, and never a write (a refresh would show as C{SET}s, and is reported as wrong).

Before the load the read path is also timed in-process, with no HTTP and no Redis:
C{Request.parseCookies} and C{SessionCookie.read} (a); C{Request.parseCookies} and
C{ServerSessions.read} over a store that answers the stored record at once (b), so that
what remains of b's extra CPU under load is the Redis round trip itself (txredisapi, the
reactor).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import attrs
from twisted.application.service import IService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from bench import backends, bearer, gateway, report, session, variants, wrk
from bench.processes import Process, StartupError, cpu_seconds, scratch, started, warn_if_busy
from bench.report import Sample
from bench.rounds import say
from bench.targets import Target, announce
from bench.tools import MissingToolsError, ensure_wrk, version
from edgegw.config.model import SessionSpec, StateProviderRef
from edgegw.identity.session_cookie import SessionCookie
from edgegw.sessions.server import ServerSessions, index_key
from edgegw.state.providers import find_provider
from edgegw.state.store import IStateStore, StoreUnavailableError
from tests.support.processes import free_port
from tests.support.redis import (
    INCOMPLETE,
    RedisReplyError,
    encode_command,
    find_redis_server,
    parse_reply,
    server_command,
)

ROUTE_NAME = "x"
ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
BACKEND_DELAY_MS = 0.0
"""The backend answers C{/x} at once."""
BACKEND_BODY = json.dumps(
    backends.json_document(ROUTE_PATH, BACKEND_DELAY_MS), separators=(",", ":")
).encode()
"""What the backend answers, and so what both variants must answer."""
PROVIDER = "kvstore"
_DEFAULTS = StateProviderRef(PROVIDER)
KEY_PREFIX = _DEFAULTS.key_prefix
"""C{stateProvider.keyPrefix}, at its default."""
REFRESH_SKEW = _DEFAULTS.refresh_skew
"""C{stateProvider.refreshSkew}, at its default."""
ACCESS_TOKEN_LIFETIME = 3600
"""Seconds from the login to the access token's expiry: never due for refresh in a run."""
IDP_SESSION = "bench-idp-session-7f3a9c"
"""The id_token's C{sid}: the IdP's session id a back-channel logout may name."""
READY_WITHIN = 10.0
"""Seconds b has, after it listens, to connect to Redis and accept its session."""
REDIS_READY_WITHIN = 10.0
"""Seconds redis-server has to answer PING after it starts."""
READS = 20_000
"""In-process reads timed per variant (after L{WARMUP_READS} unrecorded ones)."""
WARMUP_READS = 500


@attrs.frozen
class Settings(variants.Settings):
    """
    The options of a run: L{variants.Settings}, and the low load.

    @ivar low_connections: wrk's connections at the low load, where the latency a
        session adds is the gateway's and Redis's own rather than queueing.
    """

    low_connections: int = 1

    @property
    def loads(self) -> list[int]:
        """The connection counts measured, lowest first."""
        return sorted({self.low_connections, self.connections})


def load_label(connections: int) -> str:
    """How a load appears in the table and the JSON: C{c1}, C{c50}."""
    return f"c{connections}"


# -- redis-server ---------------------------------------------------------------------------


class RedisError(Exception):
    """Redis answered an error, or the connection to it failed."""


def find_redis() -> str:
    """
    The redis-server binary the tests use too (L{find_redis_server}).

    @raise MissingToolsError: If there is none; the message says how to install it.
    """
    found = find_redis_server()
    if found is None:
        raise MissingToolsError(
            "bench: redis-server not found. Install it, e.g.\n"
            "  sudo apt-get update && sudo apt-get install -y redis-server\n"
            "or run `make redis` (what `make test` runs: as root it installs Debian's "
            "redis-server itself). The benchmark starts its own redis-server on a free "
            "loopback port; a running service is neither needed nor used."
        )
    return found


class RedisClient:
    """
    A minimal blocking Redis client (RESP2 over one loopback connection, in the tests'
    wire format: L{encode_command}, L{parse_reply}), for the harness only: reading keys
    back, C{INFO commandstats}, C{PING}.
    """

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        try:
            self._socket = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError as e:
            raise RedisError(f"cannot connect to redis-server on 127.0.0.1:{port}: {e}") from e
        self._received = b""

    def close(self) -> None:
        """Close the connection."""
        self._socket.close()

    def command(self, *args: str | bytes | int) -> Any:
        """
        Send one command and return its reply: C{bytes} for a status or a bulk string
        (L{None} for a null one), C{int}, a list for an array.

        @raise RedisError: On an error reply or a connection failure.
        """
        try:
            self._socket.sendall(encode_command(args))
            reply = self._reply()
        except OSError as e:
            raise RedisError(f"redis-server connection failed: {e}") from e
        if isinstance(reply, RedisReplyError):
            raise RedisError(str(reply))
        return reply

    def _reply(self) -> Any:
        while True:
            try:
                reply, end = parse_reply(self._received)
            except ValueError as e:
                raise RedisError(f"unexpected reply from redis-server: {e}") from e
            if reply is not INCOMPLETE:
                self._received = self._received[end:]
                return reply
            data = self._socket.recv(65536)
            if not data:
                raise RedisError("redis-server closed the connection")
            self._received += data


def command_calls(info: bytes) -> dict[str, int]:
    """
    The calls of each command since redis-server started, from C{INFO commandstats}
    (C{cmdstat_get:calls=12,usec=...}): C{{"get": 12, ...}}.
    """
    calls = {}
    for line in info.decode(errors="replace").splitlines():
        name, sep, stats = line.partition(":")
        if not sep or not name.startswith("cmdstat_"):
            continue
        fields = dict(part.partition("=")[::2] for part in stats.split(","))
        if fields.get("calls", "").isdigit():
            calls[name.removeprefix("cmdstat_")] = int(fields["calls"])
    return calls


@attrs.frozen
class RedisReading:
    """
    redis-server at one moment: its CPU seconds so far and its command counters.
    """

    cpu_seconds: float
    calls: Mapping[str, int]

    def since(self, before: RedisReading) -> tuple[float, dict[str, int]]:
        """
        CPU seconds and commands from C{before} to this reading, without the C{INFO}
        that took C{before} (the harness's own).
        """
        calls = {
            name: count - before.calls.get(name, 0)
            for name, count in self.calls.items()
            if count != before.calls.get(name, 0)
        }
        if calls.get("info"):
            calls["info"] -= 1
        return self.cpu_seconds - before.cpu_seconds, {k: v for k, v in calls.items() if v}


class RedisServer:
    """
    A redis-server on a free loopback port, keeping nothing on disk, stopped when the
    stack closes; and the harness's connection to it.
    """

    def __init__(self, stack: ExitStack, tmp: Path, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        directory = tmp / "redis"
        directory.mkdir()
        argv = server_command(binary, directory, self.port)
        self.process = stack.enter_context(
            started(Process("redis-server", argv, tmp / "redis.log"))
        )
        self.process.wait_for_port(self.port)
        deadline = time.monotonic() + REDIS_READY_WITHIN
        while True:
            try:
                self.client = RedisClient(self.port)
                if self.client.command("PING") == b"PONG":
                    break
            except RedisError as e:
                if time.monotonic() > deadline:
                    raise StartupError(f"redis-server did not answer PING: {e}") from e
                time.sleep(0.05)
        stack.callback(self.client.close)

    @property
    def pid(self) -> int:
        """redis-server's process id."""
        return self.process.pid

    def reading(self) -> RedisReading:
        """Its CPU time and command counters now."""
        info = self.client.command("INFO", "commandstats")
        return RedisReading(cpu_seconds([self.pid]), command_calls(info or b""))

    def version(self) -> str:
        """C{redis-server --version}."""
        return version([self.binary, "--version"])


SENTINEL_MASTER = "bench"
"""The name the Sentinel of variant c knows the redis-server by."""


class SentinelServer:
    """
    One Redis Sentinel (C{redis-server --sentinel}) on a free loopback port monitoring the
    harness's redis-server as C{SENTINEL_MASTER}, stopped when the stack closes: what
    variant c finds its master through.
    """

    def __init__(self, stack: ExitStack, tmp: Path, binary: str, redis: RedisServer) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        directory = tmp / "sentinel"
        directory.mkdir()
        # Sentinel rewrites its configuration file: it must be its own, writable.
        config = directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {redis.port} 1\n"
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} 60000\n"
        )
        argv = [binary, str(config), "--sentinel"]
        self.process = stack.enter_context(
            started(Process("redis-sentinel", argv, tmp / "sentinel.log"))
        )
        self.process.wait_for_port(self.port)
        deadline = time.monotonic() + REDIS_READY_WITHIN
        while True:
            try:
                client = RedisClient(self.port)
                try:
                    named = client.command("SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER)
                finally:
                    client.close()
                if named == [b"127.0.0.1", str(redis.port).encode()]:
                    break
            except RedisError as e:
                if time.monotonic() > deadline:
                    raise StartupError(f"redis-sentinel did not answer: {e}") from e
            if time.monotonic() > deadline:
                raise StartupError("redis-sentinel does not know the master")
            time.sleep(0.05)


# -- the sessions ---------------------------------------------------------------------------


@attrs.frozen
class ServerSession:
    """
    b's session: the cookie a browser holds and what Redis holds.

    @ivar cookie: The browser's C{Cookie} header (the sealed session id only).
    @ivar session_id: The session id (the store key without L{KEY_PREFIX}).
    @ivar record_bytes: The sealed record's size in Redis.
    @ivar ttl_s: The record's TTL in Redis when it was read back.
    @ivar indexes: The index keys (subject, IdP session) and whether each exists.
    @ivar tokens: The sizes of the tokens the record holds.
    """

    cookie: session.Cookie
    session_id: str
    record_bytes: int
    ttl_s: float
    indexes: Mapping[str, bool]
    tokens: Mapping[str, int]

    @property
    def key(self) -> bytes:
        """Its key in Redis."""
        return (KEY_PREFIX + self.session_id).encode("ascii")


def login_request() -> Request:
    """The callback request of a browser with L{session.USER_AGENT}, carrying no cookie."""
    request = Request(DummyChannel())
    request.requestHeaders.setRawHeaders(b"User-Agent", [session.USER_AGENT.encode("ascii")])
    request.received_cookies = {}
    return request


def idp_tokens(now: float) -> dict[str, str]:
    """
    What a token endpoint would have answered at login: an RS256 access token like the
    one of L{bench.bearer} (with its claims: ~800 bytes), an id_token (with C{sid} and a
    nonce), an opaque refresh token.
    """
    key = bearer.make_key()
    claims = bearer.token_claims(session.ISSUER, now)
    id_claims = {
        **claims,
        "aud": bearer.CLIENT_ID,
        "sid": IDP_SESSION,
        "nonce": os.urandom(16).hex(),
        "auth_time": int(now),
    }
    del id_claims["scope"]
    return {
        "access_token": key.sign(claims),
        "id_token": key.sign(id_claims),
        "refresh_token": os.urandom(32).hex(),
    }


def _run_reactor_once(work: Callable[[], Deferred[Any]], timeout: float) -> Any:
    """
    Run the global reactor until C{work()}'s L{Deferred} fires (or C{timeout} passes),
    without installing signal handlers, and return its result.

    The harness runs the reactor this once only (it cannot be restarted): to write b's
    session through edgegw's own store.

    @raise StartupError: If it failed or did not finish in time.
    """
    from twisted.internet import reactor

    outcome: list[Any] = []

    def start() -> None:
        done = work()
        done.addBoth(outcome.append)
        done.addBoth(lambda _: reactor.stop())

    def give_up() -> None:
        if not outcome:
            reactor.stop()

    reactor.callWhenRunning(start)
    timer = reactor.callLater(timeout, give_up)
    # Not the interface's run(): the harness keeps its own signal handlers.
    cast(Any, reactor).run(installSignalHandlers=False)
    if timer.active():
        timer.cancel()
    if not outcome:
        raise StartupError(f"writing the server-side session did not finish in {timeout:g}s")
    result = outcome[0]
    if isinstance(result, Failure):
        raise StartupError(
            f"writing the server-side session failed: {result.getErrorMessage()}"
        ) from result.value
    return result


def seed_server_session(
    spec: SessionSpec, redis: RedisServer, groups: Sequence[str]
) -> ServerSession:
    """
    Log in as a browser with L{session.USER_AGENT} would on b's gateway: the record
    (L{session.SUBJECT}, L{session.PASSPORT}, C{groups}, the IdP's tokens) stored with
    C{ServerSessions.create} over the C{kvstore} provider's store (built with C{redis}'s
    address and L{KEY_PREFIX}, as the gateway builds it), and the C{Set-Cookie} lines
    turned back into the C{Cookie} header the browser then sends. Then read the record
    back from Redis.

    @raise StartupError: If it cannot be written, or is not in Redis afterwards.
    """
    from twisted.internet import reactor

    tokens = idp_tokens(time.time())
    cookie = SessionCookie(spec, reactor)
    request = login_request()

    async def work() -> str:
        store = find_provider(PROVIDER).build({"address": redis.address}, KEY_PREFIX, reactor)
        service = IService(store)
        service.startService()
        try:
            deadline = time.monotonic() + REDIS_READY_WITHIN
            while True:
                try:
                    await store.get(b"bench:probe")
                    break
                except StoreUnavailableError:
                    # Connecting: the store fails at once until its connection is up.
                    if time.monotonic() > deadline:
                        raise
                    await deferLater(reactor, 0.05, lambda: None)
            # No IdP client: the session is written, never refreshed, here.
            sessions = ServerSessions(store, cookie, KEY_PREFIX, REFRESH_SKEW, None, reactor)
            now = int(reactor.seconds())
            record = cookie.new_record(
                request,
                session.SUBJECT,
                session.PASSPORT,
                groups,
                tokens["access_token"],
                now + ACCESS_TOKEN_LIFETIME,
                refresh_token=tokens["refresh_token"],
                id_token=tokens["id_token"],
                idp_session=IDP_SESSION,
            )
            return await sessions.create(request, record, record.subject)
        finally:
            await service.stopService()

    session_id = _run_reactor_once(lambda: Deferred.fromCoroutine(work()), 30.0)
    lines = request.responseHeaders.getRawHeaders(b"Set-Cookie", [])
    pairs = [line.split(b";", 1)[0].decode("ascii") for line in lines]
    key = (KEY_PREFIX + session_id).encode("ascii")
    try:
        sealed = redis.client.command("GET", key)
        ttl_ms = redis.client.command("PTTL", key)
        indexes = {
            name: redis.client.command("EXISTS", KEY_PREFIX.encode() + index) == 1
            for name, index in (
                ("sub", index_key(b"sub", session.SUBJECT)),
                ("idp", index_key(b"idp", IDP_SESSION)),
            )
        }
    except RedisError as e:
        raise StartupError(f"the session record cannot be read back from Redis: {e}") from e
    if not isinstance(sealed, bytes) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise StartupError(
            f"the session record is not in Redis under {key.decode()} with a TTL "
            f"(GET gave {type(sealed).__name__}, PTTL {ttl_ms})"
        )
    return ServerSession(
        cookie=session.Cookie("; ".join(pairs), len(pairs), len(groups)),
        session_id=session_id,
        record_bytes=len(sealed),
        ttl_s=ttl_ms / 1000,
        indexes=indexes,
        tokens={name: len(value) for name, value in tokens.items()},
    )


# -- the read path in-process --------------------------------------------------------------


class _AnsweringStore:
    """
    A state store that answers C{GET} at once from memory (what Redis holds): the
    server-side read path without the round trip. Nothing else is called by a read.
    """

    timeout = 3.0

    def __init__(self, values: Mapping[bytes, bytes]) -> None:
        self._values = dict(values)

    def get(self, key: bytes) -> Deferred[bytes | None]:
        return succeed(self._values.get(key))


@attrs.frozen
class ReadTiming:
    """
    One variant's read path, in-process (no HTTP, no Redis).

    @ivar key: The variant.
    @ivar what: What was timed after parsing the cookies.
    @ivar reads: How many reads were timed.
    @ivar parse_us: Microseconds per C{Request.parseCookies} of its Cookie header.
    @ivar read_us: Microseconds per read of the session from the parsed cookies.
    @ivar id_us: For b, microseconds per C{ServerSessions.session_id} alone (opening
        the sealed session id), part of C{read_us}.
    @ivar valid: Whether each read gave the session.
    """

    key: str
    what: str
    reads: int
    parse_us: float
    read_us: float
    id_us: float | None
    valid: bool


def _cookie_request(cookie: session.Cookie) -> Request:
    request = session.cookie_request(cookie)
    request.parseCookies()
    return request


def _timed(call: Callable[[], object], count: int) -> tuple[float, bool]:
    """Microseconds per C{call()} over C{count} calls, and whether every one was truthy."""
    for _ in range(WARMUP_READS):
        call()
    ok = True
    started_at = time.perf_counter()
    for _ in range(count):
        ok = bool(call()) and ok
    return (time.perf_counter() - started_at) / count * 1e6, ok


def _parse_us(cookie: session.Cookie, count: int) -> float:
    request = session.cookie_request(cookie)
    for _ in range(WARMUP_READS):
        request.received_cookies = {}
        request.parseCookies()
    started_at = time.perf_counter()
    for _ in range(count):
        request.received_cookies = {}
        request.parseCookies()
    return (time.perf_counter() - started_at) / count * 1e6


def time_reads(
    spec: SessionSpec,
    cookie: session.Cookie,
    server: ServerSession,
    sealed_record: bytes,
    reads: int,
) -> list[ReadTiming]:
    """
    Time, in-process, reading a's session from its cookie (C{SessionCookie.read}) and
    b's through C{ServerSessions.read} over L{_AnsweringStore} holding b's record.
    """
    clock = Clock()
    clock.advance(time.time())
    cookies = SessionCookie(spec, clock)
    a_request = _cookie_request(cookie)
    a_us, a_ok = _timed(lambda: cookies.read(a_request), reads)
    store = _AnsweringStore({server.session_id.encode("ascii"): sealed_record})
    sessions = ServerSessions(
        cast(IStateStore, store), SessionCookie(spec, clock), KEY_PREFIX, REFRESH_SKEW, None, clock
    )
    b_request = _cookie_request(server.cookie)

    def server_read() -> object:
        got: list[object] = []
        Deferred.fromCoroutine(sessions.read(b_request)).addBoth(got.append)
        return got and isinstance(got[0], tuple) and not sessions.refresher.due(got[0][1])

    b_us, b_ok = _timed(server_read, reads)
    id_us, id_ok = _timed(lambda: sessions.session_id(b_request) == server.session_id, reads)
    return [
        ReadTiming("a", "SessionCookie.read", reads, _parse_us(cookie, reads), a_us, None, a_ok),
        ReadTiming(
            "b",
            "ServerSessions.read (store answering at once)",
            reads,
            _parse_us(server.cookie, reads),
            b_us,
            id_us,
            b_ok and id_ok,
        ),
    ]


def read_lines(timings: Sequence[ReadTiming], cookies: Mapping[str, session.Cookie]) -> list[str]:
    """The in-process read figures, for under the table."""
    count = max((t.reads for t in timings), default=0)
    lines = [
        f"SESSION READ in-process, no HTTP, no Redis: Request.parseCookies + the read, "
        f"{count:,} reads per variant"
    ]
    for t in timings:
        size = f"{len(cookies[t.key].header):>5,} B cookie"
        state = "" if t.valid else "  WRONG: the read did not give the session"
        lines.append(
            f"  {t.key} {size} parse {t.parse_us:5.1f} µs + {t.what} {t.read_us:5.1f} µs "
            f"= {t.parse_us + t.read_us:5.1f} µs{state}"
        )
        if t.id_us is not None:
            lines.append(
                f"      of which ServerSessions.session_id (open the sealed id) {t.id_us:.1f} µs"
            )
    return lines


# -- the variants -----------------------------------------------------------------------------


def route(upstream: str) -> gateway.RouteConfig:
    """The route every variant has: an app route, auth required, proxying to C{upstream}."""
    return gateway.RouteConfig(
        ROUTE_NAME,
        ROUTE_MATCH,
        {"type": "reverse-proxy", "upstream": upstream},
        auth="required",
        route_type="app",
    )


def state_provider_block(address: str) -> dict[str, Any]:
    """b's C{stateProvider}: the kvstore at C{address}, every other field at its default."""
    return {"stateProvider": {"type": PROVIDER, "config": {"address": address}}}


def sentinel_provider_block(sentinel_address: str) -> dict[str, Any]:
    """c's C{stateProvider}: the same kvstore found through one Sentinel."""
    config = {"sentinels": [sentinel_address], "masterName": SENTINEL_MASTER}
    return {"stateProvider": {"type": PROVIDER, "config": config}}


def make_variants(
    key: str,
    upstream: str,
    redis_address: str,
    cookies: Mapping[str, session.Cookie],
    sentinel_address: str | None = None,
) -> list[variants.Variant]:
    """
    The variants, in round order; C{cookies} are a's and b's (c, through the Sentinel at
    C{sentinel_address} when given, reads b's session).
    """
    idp = gateway.idp(session.ISSUER, "edgegw-bench", "bench-secret")

    def headers(cookie: session.Cookie) -> tuple[tuple[str, str], ...]:
        return (("User-Agent", session.USER_AGENT), ("Cookie", cookie.header))

    a, b = cookies["a"], cookies["b"]
    found = [
        variants.Variant(
            "a",
            "cookie-session",
            f"no stateProvider: the record in the cookie ({len(a.header):,} B)",
            [route(upstream)],
            [gateway.gateway_fields(session.session_block(key)), idp],
            body=BACKEND_BODY,
            headers=headers(a),
            recheck=True,
        ),
        variants.Variant(
            "b",
            "server-session",
            f"stateProvider kvstore: the sealed id in the cookie ({len(b.header):,} B), "
            "the record in Redis",
            [route(upstream)],
            [
                gateway.gateway_fields(
                    session.session_block(key) | state_provider_block(redis_address)
                ),
                idp,
            ],
            body=BACKEND_BODY,
            headers=headers(b),
            recheck=True,
        ),
    ]
    if sentinel_address is not None:
        found.append(
            variants.Variant(
                "c",
                "sentinel-session",
                "b's store found through Redis Sentinel (discovery on connect only)",
                [route(upstream)],
                [
                    gateway.gateway_fields(
                        session.session_block(key) | sentinel_provider_block(sentinel_address)
                    ),
                    idp,
                ],
                body=BACKEND_BODY,
                headers=headers(b),
                recheck=True,
            )
        )
    return found


def wait_until_accepted(variant: variants.Variant, target: Target, within: float) -> None:
    """
    Ask C{target} again while it answers 302 (its store is still connecting: it fails
    closed), for up to C{within} seconds; then a 302 marks it unavailable.
    """
    deadline = time.monotonic() + within
    while (
        target.unavailable is not None
        and " answered 302" in target.unavailable
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
        target.unavailable = variant.expect(target.port, ROUTE_PATH)
    if target.unavailable is not None and " answered 302" in target.unavailable:
        target.unavailable = (
            f"session not accepted after {within:g}s: {target.unavailable} (edgegw's log "
            "and access log say why: --keep-tmp)"
        )


# -- running --------------------------------------------------------------------------------


class Runner(variants.Runner):
    """
    L{variants.Runner} at two loads, reading redis-server's CPU time and command
    counters around every recorded run (recorded with the run's sample).
    """

    def __init__(
        self,
        wrk_path: str,
        configs: Sequence[variants.Variant],
        targets: Sequence[Target],
        settings: Settings,
        redis: RedisServer,
    ) -> None:
        self.redis = redis
        self._before: RedisReading | None = None
        after = {variant.key: self._redis_figures for variant in configs}
        super().__init__(wrk_path, configs, targets, ROUTE_PATH, settings, after)
        self.loads = settings.loads

    def load(
        self,
        target: Target,
        load: int,
        duration: int,
        settle: Callable[[wrk.WrkResult], object] | None = None,
    ) -> tuple[wrk.WrkResult, float] | None:
        """Read Redis, then run wrk (see L{variants.Runner.load})."""
        self._before = self.redis.reading()
        return super().load(target, load, duration, settle)

    def warmed(self, target: Target, result: wrk.WrkResult) -> None:
        """Nothing after a warm-up (Redis is read around recorded runs only)."""

    def _redis_figures(self, result: wrk.WrkResult) -> dict[str, Any]:
        before = self._before
        if before is None:
            return {}
        cpu, calls = self.redis.reading().since(before)
        return {"redis_cpu_s": round(cpu, 3), "redis_calls": calls}


@attrs.frozen
class Figures:
    """
    The figures of one variant at one load, medians over rounds (same-round differences
    with a for the C{added_} ones).
    """

    key: str
    load: str
    added_p50: float | None
    added_p99: float | None
    added_cpu_us: float | None
    redis_cpu_us: float | None
    redis_calls_per_request: dict[str, float]


def figures(runner: Runner, key: str, load: str) -> Figures:
    """Variant C{key}'s figures at C{load}."""
    samples = runner.samples
    mine = [s for s in samples if s.target == key and s.payload == load]

    def paired(combine: Callable[[Sample, Sample], float | None]) -> float | None:
        if key == variants.BASELINE:
            return None
        return report.per_round(mine, samples, variants.BASELINE, combine)

    def extra_cpu(sample: Sample, base: Sample) -> float | None:
        cpu, base_cpu = sample.cpu_us_per_request, base.cpu_us_per_request
        return None if cpu is None or base_cpu is None else round(cpu - base_cpu, 3)

    records = [r for r in runner.records if r.sample.target == key and r.sample.payload == load]
    redis_us = [
        r.figures["redis_cpu_s"] / r.sample.requests * 1e6
        for r in records
        if r.sample.requests and "redis_cpu_s" in r.figures
    ]
    names = sorted({name for r in records for name in r.figures.get("redis_calls", {})})
    per_request = {
        name: statistics.median(
            r.figures.get("redis_calls", {}).get(name, 0) / r.sample.requests
            for r in records
            if r.sample.requests
        )
        for name in names
    }
    return Figures(
        key=key,
        load=load,
        added_p50=paired(lambda s, b: round(s.p50 - b.p50, 9)),
        added_p99=paired(lambda s, b: round(s.p99 - b.p99, 9)),
        added_cpu_us=paired(extra_cpu),
        redis_cpu_us=statistics.median(redis_us) if redis_us else None,
        redis_calls_per_request=per_request,
    )


def _signed_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else "+"
    return sign + report.format_duration(abs(seconds))


def _calls(per_request: Mapping[str, float]) -> str:
    shown = [f"{count:.2f} {name.upper()}" for name, count in per_request.items() if count >= 0.005]
    return ", ".join(shown) or "0"


def table(runner: Runner, summaries: Sequence[report.Summary], found: Sequence[Figures]) -> str:
    """
    The results as a text table: one block of rows per load, one row per variant;
    unavailable variants get a row saying why.
    """
    header = (
        "load",
        "variant",
        "req/s",
        "vs a",
        "p50",
        "p99",
        "+p50",
        "+p99",
        "CPU µs/req",
        "+CPU µs/req",
        "redis µs/req",
        "redis cmds/req",
        "errors",
    )
    labels = [load_label(load) for load in runner.loads]
    widths = (
        max(len(header[0]), *(len(label) for label in labels)),
        max(len(header[1]), *(len(f"{t.key} {t.name}") for t in runner.targets)),
    )
    rows: list[tuple[str, ...] | str] = []
    for label in labels:
        for target in runner.targets:
            name = f"{target.key} {target.name}"
            if target.unavailable is not None:
                rows.append(report.unavailable_row((label, name), widths, target.unavailable))
                continue
            s = next((x for x in summaries if x.target == target.key and x.payload == label), None)
            f = next((x for x in found if x.key == target.key and x.load == label), None)
            if s is None or f is None:
                continue
            baseline = target.key == variants.BASELINE
            rows.append(
                (
                    label,
                    name,
                    f"{s.rps:,.0f}",
                    "-" if baseline or s.vs_direct is None else f"{s.vs_direct:.2f}x",
                    report.format_duration(s.p50),
                    report.format_duration(s.p99),
                    "-" if baseline else _signed_duration(f.added_p50),
                    "-" if baseline else _signed_duration(f.added_p99),
                    "-" if s.cpu_us_per_request is None else f"{s.cpu_us_per_request:.1f}",
                    "-" if f.added_cpu_us is None else f"{f.added_cpu_us:+.1f}",
                    "-" if f.redis_cpu_us is None else f"{f.redis_cpu_us:.1f}",
                    _calls(f.redis_calls_per_request),
                    str(s.errors),
                )
            )
    return report.render(header, rows)


def verdict_lines(runner: Runner, found: Sequence[Figures]) -> list[str]:
    """What b adds over a, per load, in words; and whether Redis was ever written."""
    lines = []
    for load in runner.loads:
        label = load_label(load)
        b = next((f for f in found if f.key == "b" and f.load == label), None)
        if b is None or b.added_cpu_us is None:
            lines.append(f"b server-session vs a cookie-session at {label}: not measured")
            continue
        redis = "-" if b.redis_cpu_us is None else f"{b.redis_cpu_us:.1f}"
        lines.append(
            f"b server-session vs a cookie-session at {label}: {b.added_cpu_us:+.1f} µs "
            f"gateway CPU/request, {redis} µs Redis CPU/request, p50 "
            f"{_signed_duration(b.added_p50)}, p99 {_signed_duration(b.added_p99)}"
        )
        c = next((f for f in found if f.key == "c" and f.load == label), None)
        if c is not None and c.added_cpu_us is not None:
            # Both against a: their difference is what finding the master costs once
            # connected (target: nothing beyond noise).
            lines.append(
                f"c sentinel-session vs b server-session at {label}: "
                f"{c.added_cpu_us - b.added_cpu_us:+.1f} µs gateway CPU/request "
                "(target: within noise; discovery happens only on connect)"
            )
    return lines


def wrong_writes(runner: Runner) -> list[str]:
    """
    Lines saying which runs wrote to Redis (a refresh, a new session): none should.
    """
    # (c's Sentinel also talks to the redis-server: INFO, PING, and a PUBLISH of its
    # hello every 2 s, which writes no record.)
    reads = {"get", "info", "ping", "exists", "pttl", "subscribe", "hello", "select", "publish"}
    wrong = []
    for record in runner.records:
        writes = {
            name: count
            for name, count in record.figures.get("redis_calls", {}).items()
            if name not in reads
        }
        if writes:
            s = record.sample
            wrong.append(
                f"WRONG: round {s.round} {s.target} {s.payload} wrote to Redis: {writes} "
                "(a refresh or a new session: the run measured more than a read)"
            )
    return wrong


def notes(settings: Settings) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"The variants serve the same app route {ROUTE_MATCH}, auth required, "
        "reverse-proxied to one backend process (bench.backends json, answering at once), "
        "with the same session block and IdP; wrk sends the same User-Agent and each "
        "variant's valid session cookie. a keeps the session in the cookie (the record as a "
        "cookie-only login writes it: no tokens, the route forwards none); b keeps it in "
        "Redis (the record as a server-side login writes it: access, refresh and id tokens "
        "too) and the cookie holds only the sealed session id; c is b with its store "
        "found through one redis-sentinel (sentinels + masterName) instead of an address.",
        "+p50, +p99, +CPU µs/req: b's figure minus a's in the same round and load, "
        "median over rounds: what a server-side session adds per request. At "
        f"{load_label(settings.low_connections)} the added latency is the session's own "
        "(a Redis round trip on loopback, with no queueing); at "
        f"{load_label(settings.connections)} latencies are mostly queueing on this "
        "machine's shared cores.",
        "redis µs/req: redis-server's utime+stime (all its threads) over the run, divided "
        "by the requests wrk completed (a's is Redis idling: its timers); redis cmds/req: "
        "Redis's own command counters (INFO commandstats) over the run, per request, "
        "without the harness's INFO (a little over 1 at the higher load: requests still in "
        "flight when wrk stops, which it does not count). b must cost one GET and nothing "
        "else: any write (a refresh) is reported as WRONG.",
        "The in-process figures are the read path alone, in the harness process: "
        "Request.parseCookies on the variant's Cookie header, then SessionCookie.read (a) "
        "or ServerSessions.read over a store that answers at once from memory (b); what b "
        "adds under load beyond them is the round trip to Redis in the gateway (txredisapi "
        "encoding the command and parsing the reply, the command's timers, the reactor "
        "iterations that send it and receive the reply) and tracking the request as one of "
        "the session's open streams.",
        *variants.common_notes(settings),
    ]


def run(settings: Settings) -> int:
    """
    Start Redis and the backend, write b's session, time the read paths in-process, run
    the HTTP benchmark, print it all and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured or a run was
        not what it should be.
    """
    wrk_path = ensure_wrk()
    redis_binary = find_redis()
    key = os.urandom(16).hex()
    spec = session.session_spec(key)
    a_cookie = session.make_cookie(spec, session.GROUPS)
    busy = warn_if_busy()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    timings: list[ReadTiming] = []
    with (
        scratch("edgegw-bench-server-session-", settings.keep_tmp) as tmp,
        ExitStack() as stack,
    ):
        say(f"bench: starting redis-server, the backend and the variants in {tmp}")
        try:
            redis = RedisServer(stack, tmp, redis_binary)
            say(f"redis-server at {redis.address} (pid {redis.pid}): {redis.version()}")
            sentinel = SentinelServer(stack, tmp, redis_binary, redis)
            say(f"redis-sentinel at {sentinel.address} knows {SENTINEL_MASTER}")
            backend_port = free_port()
            backend = stack.enter_context(
                started(
                    backends.start(
                        "json", backend_port, tmp / "backend.log", [(ROUTE_PATH, BACKEND_DELAY_MS)]
                    )
                )
            )
            backend.wait_for_port(backend_port)
            server = seed_server_session(spec, redis, session.GROUPS)
        except (StartupError, RedisError) as e:
            say(f"bench: {e}")
            return 1
        say(
            f"server-side session {KEY_PREFIX}{server.session_id[:6]}...: "
            f"{server.record_bytes:,} B sealed in Redis, TTL {server.ttl_s:,.0f}s, "
            f"indexes {server.indexes}; cookie {len(server.cookie.header)} B"
        )
        cookies = {"a": a_cookie, "b": server.cookie, "c": server.cookie}
        sealed = redis.client.command("GET", server.key)
        say(f"timing the read paths in-process ({READS:,} reads each)")
        timings.extend(time_reads(spec, a_cookie, server, sealed, READS))
        for line in read_lines(timings, cookies):
            say(line)
        upstream = f"http://127.0.0.1:{backend_port}"
        configs = make_variants(key, upstream, redis.address, cookies, sentinel.address)
        targets = variants.start(stack, tmp, configs, ROUTE_PATH, "edgegw")
        for variant, target in zip(configs, targets, strict=True):
            wait_until_accepted(variant, target, READY_WITHIN)
        announce(targets)
        runner = Runner(wrk_path, configs, targets, settings, redis)
        runner.run()
        still = redis.client.command("PTTL", server.key)
        redis_version = redis.version()
    summaries = report.summarize(runner.samples, direct=variants.BASELINE, nginx=variants.BASELINE)
    found = [
        figures(runner, target.key, load_label(load))
        for load in runner.loads
        for target in runner.targets
    ]
    wrong = wrong_writes(runner)
    if not (isinstance(still, int) and still > 0):
        wrong.append(f"WRONG: the session record was gone from Redis after the run (PTTL {still})")
    wrong += [
        f"WRONG: the in-process read of {t.key} did not give the session"
        for t in timings
        if not t.valid
    ]
    run_notes = notes(settings)
    print()
    print(table(runner, summaries, found))
    print()
    for line in [*verdict_lines(runner, found), *wrong, "", *read_lines(timings, cookies)]:
        print(line)
    print()
    for note in run_notes:
        print(f"* {note}")
    path = report.write_json(
        "server-session",
        {
            "benchmark": "server-session",
            "started": started_at,
            "settings": attrs.asdict(settings),
            "machine": {**report.machine(), "busy_before_start": round(busy, 3)},
            "versions": {"wrk": version([wrk_path, "-v"]), "redis-server": redis_version},
            "url_path": ROUTE_PATH,
            "route": {"match": ROUTE_MATCH, "type": "app", "handler": "reverse-proxy"},
            "variants": [
                {
                    "key": target.key,
                    "name": target.name,
                    "description": target.description,
                    "request_headers": [name for name, _ in config.headers],
                    "cookie_bytes": len(cookies[target.key].header),
                    "resources": [dict(document) for document in config.resources],
                    "unavailable": target.unavailable,
                }
                for config, target in zip(configs, targets, strict=True)
            ],
            "server_session": {
                "key_prefix": KEY_PREFIX,
                "record_bytes": server.record_bytes,
                "ttl_s": server.ttl_s,
                "indexes": dict(server.indexes),
                "token_bytes": dict(server.tokens),
                "access_token_lifetime_s": ACCESS_TOKEN_LIFETIME,
                "refresh_skew_s": REFRESH_SKEW,
                "pttl_after_run_ms": still,
            },
            "samples": [
                report.as_load(
                    {
                        **attrs.asdict(record.sample),
                        "cpu_us_per_request": record.sample.cpu_us_per_request,
                        **record.figures,
                    }
                )
                for record in runner.records
            ],
            "summary": [
                {
                    key: value
                    for key, value in report.as_load(attrs.asdict(summary)).items()
                    if key not in ("vs_direct", "vs_nginx")
                }
                | {f"vs_{variants.BASELINE}": summary.vs_direct}
                for summary in summaries
            ],
            "added": [report.as_load(attrs.asdict(f)) for f in found],
            "session_read": [attrs.asdict(t) for t in timings],
            "wrong": wrong,
            "notes": run_notes,
        },
    )
    print(f"\nresults: {path}")
    unavailable = any(target.unavailable is not None for target in targets)
    return 1 if unavailable or wrong else 0
