"""
The C{rate-limit} plugin (a RequestPlugin): GCRA rate limits per key, per process or
shared by every instance through the state store.

Config::

    key: [client]          # client, subject, header:<Name>, route (one or more)
    rate: 100/s            # <count>/s, /m or /h
    burst: 1               # requests an idle key may send at once
    ipv6Prefix: 64         # client addresses grouped by prefix
    ipv4Prefix: 32
    maxKeys: 100000        # per-process table bound (least recently used go first)
    shared: true           # default: whether the Gateway has a stateProvider
    onStoreDown: allow     # or deny
    headers: limited       # or always: RateLimit-Policy and RateLimit on passing too

GCRA keeps one number per key, its theoretical arrival time (TAT): a request at C{now}
passes when C{TAT - now <= (burst - 1) * interval}, and then moves the TAT one
C{interval} (C{period / count}) on from C{max(TAT, now)}.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.plugins.interfaces import IRequestHook, IRequestPlugin, PluginConfigError
from edgegw.plugins.messages import PluginRequest, Reply
from edgegw.plugins.plugin_context import IContextRequestPlugin, IPluginStore, PluginContext
from edgegw.state.store import StoreError

__all__ = ["GCRA_SCRIPT", "GcraTable", "RateLimit", "RateLimitPlugin", "parse_rate", "plugin"]

_log = Logger(namespace="edgegw.plugins.rate_limit")

_RATE: Final = re.compile(r"\s*(\d+)\s*/\s*(s|m|h)\s*")
_PERIODS: Final = {"s": 1, "m": 60, "h": 3600}
_FIELDS: Final = (
    "key",
    "rate",
    "burst",
    "ipv6Prefix",
    "ipv4Prefix",
    "maxKeys",
    "shared",
    "onStoreDown",
    "headers",
)
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LOG_INTERVAL: Final = 60.0
_JSON: Final = "application/json"
_TEXT: Final = "text/plain; charset=utf-8"

GCRA_SCRIPT: Final = b"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
if tat - now > tau then return {0, tat - now} end
local new = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return {1, new - now}
"""
"""
One GCRA decision in Redis, atomically, on the server's clock (instances' clocks may
differ): times in microseconds; replies C{{passed (1 or 0), TAT - now}}.
"""


MAX_RATE = 1_000_000
"""The fastest rate, per second: one request a microsecond."""


def parse_rate(value: object) -> tuple[int, int]:
    """
    (count, period in seconds) of a rate such as C{"100/s"}, C{"6000/m"}, C{"10/h"}.

    @raise ValueError: It is not one.
    """
    if isinstance(value, str):
        found = _RATE.fullmatch(value)
        if found is not None and int(found.group(1)) > 0:
            count, period = int(found.group(1)), _PERIODS[found.group(2)]
            if count > MAX_RATE * period:
                # The limiter counts in microseconds: a shorter interval would round to
                # one (tighter than asked) or to zero (never limiting).
                raise ValueError(f"{value!r} is faster than {MAX_RATE}/s, the most it counts")
            return count, period
    raise ValueError(f"{value!r} is not a rate (such as 100/s, 6000/m or 10/h)")


class GcraTable:
    """
    The per-process GCRA state: one theoretical arrival time per key (integer
    microseconds, so that decisions are exact), at most C{max_keys} keys (the least
    recently used go first).
    """

    __slots__ = ("_clock", "_table", "interval", "max_keys", "tau")

    def __init__(self, interval: int, tau: int, max_keys: int, clock: IReactorTime) -> None:
        """
        @param interval: Microseconds between requests once the burst is spent.
        @param tau: The burst tolerance, C{(burst - 1) * interval}.
        """
        self.interval = interval
        self.tau = tau
        self.max_keys = max_keys
        self._clock = clock
        self._table: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def take(self, key: bytes) -> tuple[bool, int]:
        """
        Decide one request of C{key}: (whether it passes, its TAT less now afterwards,
        in microseconds).
        """
        now = round(self._clock.seconds() * 1_000_000)
        table = self._table
        tat = table.get(key)
        if tat is None or tat < now:
            tat = now
        if tat - now > self.tau:
            table.move_to_end(key)
            return False, tat - now
        new = tat + self.interval
        table[key] = new
        table.move_to_end(key)
        if len(table) > self.max_keys:
            table.popitem(last=False)
        return True, new - now


def _sf_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _client_grouper(v4_prefix: int, v6_prefix: int) -> Callable[[str], str]:
    def group(address: str) -> str:
        if ":" not in address and v4_prefix == 32:
            return address + "/32"
        try:
            ip: Any = ipaddress.ip_address(address)
        except ValueError:
            return address
        if ip.version == 6 and ip.ipv4_mapped is not None:
            # ::ffff:a.b.c.d is that IPv4 client: not a /64 of its own.
            ip = ip.ipv4_mapped
        prefix = v6_prefix if ip.version == 6 else v4_prefix
        network = ipaddress.ip_network((ip, prefix), strict=False)
        return f"{network.network_address}/{prefix}"

    return group


KeyPart = Callable[[PluginRequest], str]


def _key_parts(
    kinds: Sequence[str], group: Callable[[str], str], client_of: Callable[[PluginRequest], str]
) -> tuple[KeyPart, ...]:
    parts: list[KeyPart] = []
    for kind in kinds:
        if kind == "client":
            parts.append(lambda r: "c" + group(client_of(r)))
        elif kind == "subject":

            def subject(r: PluginRequest) -> str:
                principal = r.principal
                if principal is None:
                    return "c" + group(client_of(r))
                return "s" + principal.subject

            parts.append(subject)
        elif kind == "route":
            parts.append(lambda r: "r" + r.route)
        else:
            parts.append(_header_part(kind.partition(":")[2]))
    return tuple(parts)


def _header_part(name: str) -> KeyPart:
    # A request without the header shares one key with every other one without it.
    # Every value counts, not the first alone: a request repeating the header (someone
    # else's value first, its own after, which a backend may read instead) is not charged
    # to the other's key. LF never occurs in a value.
    return lambda r: "h" + "\n".join(r.headers.get_all(name))


@implementer(IRequestHook)
class RateLimit:
    """
    One C{rate-limit} resource's limiter.
    """

    def __init__(
        self,
        name: str,
        count: int,
        period: int,
        burst: int,
        parts: tuple[KeyPart, ...],
        max_keys: int,
        clock: IReactorTime,
        store: IPluginStore | None,
        deny_when_down: bool,
        count_limited: Callable[[Sequence[str]], None],
        always_headers: bool = False,
    ) -> None:
        """
        @param always_headers: Whether passing responses carry C{RateLimit-Policy} and
            C{RateLimit} too (limited ones always do).
        """
        self.interval = round(period * 1_000_000 / count)
        self.burst = burst
        self.tau = (burst - 1) * self.interval
        self._parts = parts
        self._clock = clock
        #: The per-process table (and the fallback while the store is down).
        self.table = GcraTable(self.interval, self.tau, max_keys, clock)
        self._store = store
        self._deny_when_down = deny_when_down
        self._count_limited = count_limited
        self._name = name
        self._policy_name = _sf_string(name)
        self._policy = f"{self._policy_name};q={count};w={period}"
        self._always_headers = always_headers
        self._script_args: list[bytes | int] = [self.interval, self.tau]
        self._last_logged: float | None = None

    def key_of(self, request: PluginRequest) -> bytes:
        """
        The fixed-size key of C{request} (a digest of its key parts).
        """
        parts = self._parts
        if len(parts) == 1:
            # One part (the usual key): the join of one item is the item (the same digest,
            # so instances of an earlier version share the limit), without the generator.
            part = parts[0](request)
            return hashlib.blake2b(f"{len(part)}:{part}".encode(), digest_size=16).digest()
        joined = "\0".join(f"{len(p)}:{p}" for p in (part(request) for part in parts))
        return hashlib.blake2b(joined.encode("utf-8"), digest_size=16).digest()

    def on_request(self, request: PluginRequest) -> Reply | Deferred[Reply | None] | None:
        """
        Pass the request, or answer 429 when its key is over the limit.
        """
        key = self.key_of(request)
        store = self._store
        if store is None:
            passed, ahead = self.table.take(key)
            return self._outcome(request, passed, ahead)
        d: Deferred[Any] = store.run_script(GCRA_SCRIPT, [key], self._script_args)
        return d.addCallbacks(
            self._decided, self._store_failed, callbackArgs=(request,), errbackArgs=(request, key)
        )

    def _decided(self, reply: object, request: PluginRequest) -> Reply | None:
        passed, ahead_us = cast(Sequence[int], reply)
        return self._outcome(request, bool(passed), int(ahead_us))

    def _store_failed(self, failure: Failure, request: PluginRequest, key: bytes) -> Reply | None:
        failure.trap(StoreError)
        now = self._clock.seconds()
        if self._last_logged is None or now - self._last_logged >= _LOG_INTERVAL:
            self._last_logged = now
            _log.warn(
                'RequestPlugin "{name}": state store unavailable ({why}); {what}',
                name=self._name,
                why=failure.getErrorMessage(),
                what="refusing requests" if self._deny_when_down else "limiting per process",
            )
        if self._deny_when_down:
            return Reply(
                503,
                *self._body(request, "rate limit unavailable"),
                headers={"Retry-After": "1"},
                content_type=_JSON if request.route_type == "service" else _TEXT,
            )
        passed, ahead = self.table.take(key)
        return self._outcome(request, passed, ahead)

    def _outcome(self, request: PluginRequest, passed: bool, ahead: int) -> Reply | None:
        """
        The 429 when C{request} did not pass; else nothing, the draft's fields added to
        its response first when configured (C{headers: always}).
        """
        if not passed:
            return self._limited(request, ahead)
        if self._always_headers:
            request.add_response_header("RateLimit-Policy", self._policy)
            request.add_response_header("RateLimit", self._state(ahead))
        return None

    def _state(self, ahead: int) -> str:
        """
        The C{RateLimit} field of a key whose TAT is C{ahead} microseconds away: the
        requests it may still send now (C{r}) and the seconds until its whole burst is
        back (C{t}, rounded up).
        """
        remaining = max(0, (self.tau + self.interval - ahead) // self.interval)
        reset = -(-ahead // 1_000_000)
        return f"{self._policy_name};r={remaining};t={reset}"

    def _body(self, request: PluginRequest, message: str) -> tuple[str]:
        if request.route_type == "service":
            return (json.dumps({"error": message}) + "\n",)
        return (message + "\n",)

    def _limited(self, request: PluginRequest, ahead: int) -> Reply:
        """
        The 429 for a key whose TAT is C{ahead} microseconds away.
        """
        self._count_limited((request.route,))
        retry = max(1, -(-(ahead - self.tau) // 1_000_000))
        service = request.route_type == "service"
        return Reply(
            429,
            *self._body(request, "too many requests"),
            headers=(
                ("Retry-After", str(retry)),
                ("RateLimit-Policy", self._policy),
                ("RateLimit", self._state(ahead)),
            ),
            content_type=_JSON if service else _TEXT,
        )


def _int_field(
    config: Mapping[str, Any],
    field: str,
    default: int,
    low: int,
    high: int,
    problems: list[tuple[str, str]],
) -> int:
    value = config.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        problems.append((field, f"must be a whole number from {low} to {high}"))
        return default
    return value


@implementer(IRequestPlugin, IContextRequestPlugin)
class RateLimitPlugin:
    """
    The C{rate-limit} plugin, as registered (entry point
    C{rate-limit = edgegw.plugins.rate_limit:plugin}).
    """

    def request_hook(self, config: Mapping[str, Any]) -> RateLimit:
        """
        The limiter of C{config}, per process, on the global reactor.
        """
        return self.request_hook_in(
            config, PluginContext("rate-limit", cast(IReactorTime, _global_reactor))
        )

    def request_hook_in(self, config: Mapping[str, Any], context: PluginContext) -> RateLimit:
        """
        The limiter of C{config}, checked completely, using C{context}'s clock, store
        and metrics.
        """
        problems: list[tuple[str, str]] = [
            (str(field), f"unknown field (expected: {', '.join(_FIELDS)})")
            for field in config
            if field not in _FIELDS
        ]
        kinds = config.get("key", ["client"])
        if not isinstance(kinds, list) or not kinds:
            problems.append(("key", "must be a list of client, subject, route or header:<Name>"))
            kinds = []
        for i, kind in enumerate(kinds):
            if kind in ("client", "subject", "route"):
                continue
            if isinstance(kind, str) and kind.startswith("header:"):
                if _HEADER_NAME.fullmatch(kind[7:]) is None:
                    problems.append((f"key[{i}]", f"{kind[7:]!r} is not a header name"))
                continue
            problems.append(
                (f"key[{i}]", f"{kind!r} is not client, subject, route or header:<Name>")
            )
        count, period = 1, 1
        if "rate" not in config:
            problems.append(("rate", "is required"))
        else:
            try:
                count, period = parse_rate(config["rate"])
            except ValueError as e:
                problems.append(("rate", str(e)))
        burst = _int_field(config, "burst", 1, 1, 1_000_000, problems)
        v6 = _int_field(config, "ipv6Prefix", 64, 1, 128, problems)
        v4 = _int_field(config, "ipv4Prefix", 32, 1, 32, problems)
        max_keys = _int_field(config, "maxKeys", 100_000, 1, 10_000_000, problems)
        on_down = config.get("onStoreDown", "allow")
        if on_down not in ("allow", "deny"):
            problems.append(("onStoreDown", "must be allow or deny"))
        headers = config.get("headers", "limited")
        if headers not in ("limited", "always"):
            problems.append(("headers", "must be limited or always"))
        store = context.store
        shared = config.get("shared", store is not None)
        if not isinstance(shared, bool):
            problems.append(("shared", "must be true or false"))
        elif shared and store is None:
            problems.append(("shared", "needs the Gateway's stateProvider"))
        elif shared and store is not None and not store.can_run_scripts():
            problems.append(("shared", "the Gateway's state store cannot run scripts"))
        if not all(" " <= c <= "~" for c in context.resource):
            # RFC 8941 sf-strings carry printable ASCII only.
            problems.append(
                (
                    "",
                    "the resource's name names the policy in RateLimit-Policy and "
                    "RateLimit: it must be printable ASCII",
                )
            )
        if problems:
            raise PluginConfigError.of(problems)
        count_limited = context.counter(
            "edgegw.rate_limit.limited",
            "Requests refused by a rate-limit plugin (429), by route.",
            ("http.route",),
        )
        return RateLimit(
            context.resource,
            count,
            period,
            burst,
            _key_parts(kinds, _client_grouper(v4, v6), _client_of),
            max_keys,
            context.reactor,
            store if shared else None,
            on_down == "deny",
            count_limited,
            headers == "always",
        )


plugin = RateLimitPlugin()


def _client_of(request: PluginRequest) -> str:
    return request.client_address
