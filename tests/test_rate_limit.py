"""
The C{rate-limit} plugin, per process: a real gateway on a loopback socket whose reactor
is a L{Clock} the test moves (so that counts are exact), in front of a recording
backend.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from edgegw.config.errors import ConfigError
from edgegw.identity.principal import Principal
from edgegw.plugins.interfaces import IRequestHook, IRequestPlugin, PluginConfigError
from edgegw.plugins.messages import PluginRequest, Reply
from edgegw.plugins.plugin_context import PluginContext
from edgegw.plugins.rate_limit import GcraTable, RateLimit, parse_rate, plugin
from tests.support.backends import SiteBackend, answer
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls
from tests.support.plugin_dists import install_plugins
from tests.support.processes import refused_port
from tests.test_plugins import Response, fetch, fetch_raw, request_plugin

RATE_LIMIT = {"rate-limit": "edgegw.plugins.rate_limit:plugin"}
"""The shipped plugin's entry point (as setup.py registers it), for a checkout whose
installed metadata predates it."""

# RFC 8941 sf-string and the parameters the draft uses.
_SF_ITEM = re.compile(
    r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"((?:;[a-z*][a-z0-9_.*-]*=\d+)*)'
)


def parse_sf_item(value: str) -> tuple[str, dict[str, int]]:
    """
    An RFC 8941 item whose bare item is a string and whose parameters are integers, as
    C{RateLimit-Policy} and C{RateLimit} carry one policy.

    @raise ValueError: It is not one.
    """
    found = _SF_ITEM.fullmatch(value)
    if found is None:
        raise ValueError(f"{value!r} is not a string item with integer parameters")
    params: dict[str, int] = {}
    for param in found.group(2).split(";")[1:]:
        name, _, number = param.partition("=")
        if name in params:
            raise ValueError(f"parameter {name} twice in {value!r}")
        params[name] = int(number)
    return found.group(1), params


def hook(config: Mapping[str, Any], clock: Clock | None = None) -> RateLimit:
    """The plugin's hook for C{config}, on C{clock}."""
    return plugin.request_hook_in(config, PluginContext("rl", clock or Clock()))


def problems_of(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (field, message) pairs the plugin refuses C{config} with."""
    try:
        hook(config)
    except PluginConfigError as e:
        return list(e.problems)
    raise AssertionError(f"{config!r} was accepted")


class ConfigTests(SynchronousTestCase):
    """
    The config is checked whole, each problem at its field.
    """

    def test_rates(self) -> None:
        self.assertEqual(parse_rate("100/s"), (100, 1))
        self.assertEqual(parse_rate("6000/m"), (6000, 60))
        self.assertEqual(parse_rate("10/h"), (10, 3600))
        for bad in ("0/s", "10/d", "ten/s", 10, "/s", "1.5/s"):
            self.assertRaises(ValueError, parse_rate, bad)

    def test_problems_located(self) -> None:
        self.assertEqual(
            [field for field, _ in problems_of({"key": ["client", "ip", "header:bad name"]})],
            ["key[1]", "key[2]", "rate"],
        )
        fields = [
            field
            for field, _ in problems_of(
                {
                    "rate": "1/x",
                    "burst": 0,
                    "ipv6Prefix": 129,
                    "maxKeys": True,
                    "onStoreDown": "maybe",
                    "shared": True,
                    "headers": "sometimes",
                    "extra": 1,
                }
            )
        ]
        self.assertEqual(
            sorted(fields),
            sorted(
                [
                    "extra",
                    "rate",
                    "burst",
                    "ipv6Prefix",
                    "maxKeys",
                    "onStoreDown",
                    "shared",
                    "headers",
                ]
            ),
        )

    def test_shared_needs_a_store(self) -> None:
        self.assertEqual(
            problems_of({"rate": "1/s", "shared": True}),
            [("shared", "needs the Gateway's stateProvider")],
        )

    def test_defaults(self) -> None:
        limiter = hook({"rate": "10/s"})
        self.assertEqual(
            (limiter.burst, limiter.interval, limiter.table.max_keys), (1, 100_000, 100_000)
        )


class TableTests(SynchronousTestCase):
    """
    The GCRA table alone.
    """

    def test_burst_then_rate(self) -> None:
        """
        N + burst + 1 requests spread over one period from an idle key: exactly
        burst + N pass (burst at once, then one per interval).
        """
        clock = Clock()
        table = GcraTable(100_000, 2 * 100_000, 10, clock)  # 10/s, burst 3
        passed = sum(table.take(b"k")[0] for _ in range(14))
        self.assertEqual(passed, 3)
        for _ in range(10):
            clock.advance(0.1)
            passed += sum(table.take(b"k")[0] for _ in range(2))
        self.assertEqual(passed, 3 + 10)

    def test_lru_bound(self) -> None:
        """
        Spraying keys never grows the table past its ceiling; the least recently used
        key goes first.
        """
        clock = Clock()
        table = GcraTable(1_000_000, 0, 100, clock)
        table.take(b"keep")
        for i in range(10_000):
            table.take(b"spray%d" % i)
            if i % 50 == 0:
                table.take(b"keep")
            self.assertLessEqual(len(table), 100)
        self.assertEqual(len(table), 100)
        self.assertFalse(table.take(b"keep")[0])  # still remembered: limited
        self.assertTrue(table.take(b"spray0")[0])  # forgotten: passes again

    def test_memory_ceiling(self) -> None:
        """
        The docs' ceiling: a full table of 100 000 keys holds under 25 MB.
        """
        import tracemalloc

        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            table = GcraTable(1_000_000, 0, 100_000, Clock())
            limiter = hook({"rate": "1/s"})
            for i in range(120_000):
                table.take(limiter.key_of(_FakeRequest(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")))  # type: ignore[arg-type]
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        self.assertEqual(len(table), 100_000)
        sys.stdout.write(f"\n  table of 100000 keys: {used / 1e6:.1f} MB\n")
        self.assertLess(used, 25_000_000)


APP_ROUTE = (
    "---\nkind: Route\nmetadata: {name: app}\nspec:\n"
    '  match: "/app/"\n  type: app\n  handler:\n    type: reverse-proxy\n'
    '    upstream: "http://127.0.0.1:%d"\n'
)
"""An app route (C{/app/}) to the backend at a port."""

DEAD_ROUTE = (
    "---\nkind: Route\nmetadata: {name: dead}\nspec:\n"
    '  match: "/dead/"\n  type: app\n  handler:\n    type: reverse-proxy\n'
    '    upstream: "http://127.0.0.1:%d"\n'
)
"""An app route (C{/dead/}) to a port nothing listens on."""


@implementer(IRequestHook)
class _ClientEcho:
    def on_request(self, request: PluginRequest) -> Reply:
        return Reply(200, request.client_address)


@implementer(IRequestPlugin)
class _ClientEchoPlugin:
    def request_hook(self, config: Mapping[str, Any]) -> _ClientEcho:
        return _ClientEcho()


client_echo = _ClientEchoPlugin()
"""A test plugin answering with C{PluginRequest.client_address}."""


@implementer(IRequestHook)
class _HeaderAdder:
    """Tries L{PluginRequest.add_response_header} with bad inputs, then a good one."""

    refused: list[str] = []

    def on_request(self, request: PluginRequest) -> None:
        for name, value in (
            ("Content-Length", "1"),
            ("server", "x"),
            ("Transfer-Encoding", "chunked"),
            ("Bad Name", "x"),
            ("X-Ok", "a\r\nInjected: 1"),
            ("Content-Type", "text/html"),
            ("ETag", '"x"'),
            ("X-Padded", " v"),
        ):
            try:
                request.add_response_header(name, value)
            except ValueError as e:
                _HeaderAdder.refused.append(str(e))
        request.add_response_header("X-Added", "1")
        request.add_response_header("X-Added", "2")


@implementer(IRequestPlugin)
class _HeaderAdderPlugin:
    def request_hook(self, config: Mapping[str, Any]) -> _HeaderAdder:
        return _HeaderAdder()


header_adder = _HeaderAdderPlugin()
"""A test plugin adding response fields, the bad ones refused."""


class _FakeRequest:
    """Only what key_of reads."""

    def __init__(
        self, address: str, subject: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        self.client_address = address
        self.principal = None if subject is None else Principal(subject=subject)
        self.headers = _FakeHeaders(headers or {})
        self.route = "/"


class _FakeHeaders:
    """One value per name, read as L{HeaderView.get_all} reads them."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)

    def get_all(self, name: str) -> list[str]:
        value = self._values.get(name)
        return [] if value is None else [value]


class KeyTests(SynchronousTestCase):
    """
    Keys made of several parts never collide across kinds or part boundaries.
    """

    def key(self, kinds: list[str], request: _FakeRequest) -> bytes:
        return hook({"rate": "1/s", "key": kinds}).key_of(request)  # type: ignore[arg-type]

    def test_subject_and_client_apart(self) -> None:
        """
        Attack: a subject spelled like a client's key does not share that client's
        key; two subjects from one address have keys of their own.
        """
        anonymous = self.key(["subject"], _FakeRequest("192.0.2.1"))
        self.assertNotEqual(
            anonymous, self.key(["subject"], _FakeRequest("192.0.2.9", "192.0.2.1/32"))
        )
        self.assertNotEqual(
            self.key(["subject"], _FakeRequest("192.0.2.1", "alice")),
            self.key(["subject"], _FakeRequest("192.0.2.1", "bob")),
        )
        self.assertEqual(
            self.key(["subject"], _FakeRequest("192.0.2.1", "alice")),
            self.key(["subject"], _FakeRequest("198.51.100.1", "alice")),
        )

    def test_part_boundaries(self) -> None:
        kinds = ["header:A", "header:B"]
        self.assertNotEqual(
            self.key(kinds, _FakeRequest("x", headers={"A": "ab", "B": "c"})),
            self.key(kinds, _FakeRequest("x", headers={"A": "a", "B": "bc"})),
        )


class GatewayTests(TestCase):
    """
    Through a real gateway: counts, answers, headers, the backend, key kinds.
    """

    def setUp(self) -> None:
        install_plugins(self, RATE_LIMIT, name="edgegw-rate-limit-test")
        self.backend = SiteBackend().start()
        self.addCleanup(self.backend.stop)
        self.clock = Clock()

    def serve(self, config: Mapping[str, Any], gateway_spec: str = "", routes: str = "") -> int:
        _, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            gateway_spec=gateway_spec,
            clock=self.clock,
            routes=request_plugin("limit", "rate-limit", config=dict(config)) + routes,
        )
        return port

    async def burst(
        self, port: int, n: int, headers: Sequence[tuple[str, str]] = (), target: str = "/x"
    ) -> list[Response]:
        """C{n} requests at once, each on its own connection."""
        return list(
            await gatherResults(
                [ensureDeferred(fetch(port, "GET", target, headers)) for _ in range(n)]
            )
        )

    async def test_exact_burst_and_rate(self) -> None:
        """
        10/s, burst 3: 14 requests at once from an idle key, exactly 3 pass; then two
        requests every 0.1 s for one second, exactly one of each pair passes: 3 + 10
        in the period; the backend saw exactly those.
        """
        port = self.serve({"rate": "10/s", "burst": 3})
        statuses = [r[0] for r in await self.burst(port, 14)]
        self.assertEqual((statuses.count(200), statuses.count(429)), (3, 11))
        for _ in range(10):
            self.clock.advance(0.1)
            statuses = [r[0] for r in await self.burst(port, 2)]
            self.assertEqual(sorted(statuses), [200, 429])
        self.assertEqual(len(self.backend.requests), 13)

    async def test_limited_answer(self) -> None:
        """
        The 429: Retry-After in whole seconds (rounded up), the draft's structured
        fields, a short text body; the backend never called for it.
        """
        port = self.serve({"rate": "6/m", "burst": 2}, routes=APP_ROUTE % self.backend.port)
        responses = await self.burst(port, 3, target="/app/x")
        self.assertEqual(sorted(r[0] for r in responses), [200, 200, 429])
        for response in responses:
            if response[0] == 200:
                self.assertNotIn("ratelimit", response[1])  # passing responses: none (docs)
        self.clock.advance(0.5)
        status, headers, body = await fetch(port, "GET", "/app/x")
        self.assertEqual(status, 429)
        self.assertEqual(body, b"too many requests\n")
        self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
        # TAT is 20 s ahead of 0 (two passes of 10 s), the tolerance 10 s: at 0.5 s a
        # request passes in 9.5 s, so 10.
        self.assertEqual(headers["retry-after"], ["10"])
        self.assertEqual(
            parse_sf_item(headers["ratelimit-policy"][0]), ("limit", {"q": 6, "w": 60})
        )
        self.assertEqual(parse_sf_item(headers["ratelimit"][0]), ("limit", {"r": 0, "t": 20}))
        self.assertEqual(len(self.backend.requests), 2)

    async def test_passing_headers_always(self) -> None:
        """
        C{headers: always}: passing responses carry C{RateLimit-Policy} and C{RateLimit}
        too, counting down; a backend's own C{RateLimit} is kept beside the gateway's
        (a structured-field list split over lines), and an error answer of the gateway
        carries them as well.
        """
        self.backend.responder = answer(body=b"ok", headers=[(b"RateLimit", b'"app";r=9;t=1')])
        dead = await refused_port()
        port = self.serve(
            {"rate": "6/m", "burst": 3, "headers": "always"},
            routes=APP_ROUTE % self.backend.port + DEAD_ROUTE % dead,
        )
        seen = []
        for _ in range(2):
            status, headers, _ = await fetch(port, "GET", "/app/x")
            self.assertEqual(status, 200)
            self.assertEqual(headers["ratelimit"][0], '"app";r=9;t=1')
            self.assertEqual(len(headers["ratelimit"]), 2)
            seen.append(parse_sf_item(headers["ratelimit"][1]))
            self.assertEqual(
                [parse_sf_item(v) for v in headers["ratelimit-policy"]],
                [("limit", {"q": 6, "w": 60})],
            )
        # Burst 3 at 10 s an interval: 2 left (whole burst back in 10 s), then 1 (20 s).
        self.assertEqual(seen, [("limit", {"r": 2, "t": 10}), ("limit", {"r": 1, "t": 20})])
        status, headers, _ = await fetch(port, "GET", "/dead/x")
        self.assertEqual(status, 502)
        self.assertEqual(
            [parse_sf_item(v) for v in headers["ratelimit"]], [("limit", {"r": 0, "t": 30})]
        )
        status, headers, _ = await fetch(port, "GET", "/app/x")
        self.assertEqual(status, 429)
        self.assertEqual(
            [parse_sf_item(v) for v in headers["ratelimit"]], [("limit", {"r": 0, "t": 30})]
        )
        self.assertEqual(len(self.backend.requests), 2)

    async def test_passing_headers_over_http2(self) -> None:
        """
        The same fields on an HTTP/2 response (lower-case names, after the response's
        own fields).
        """
        gateway, _ = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            clock=self.clock,
            routes=request_plugin(
                "limit", "rate-limit", config={"rate": "6/m", "burst": 3, "headers": "always"}
            ),
        )
        client = await connect_h2(self, listen_tls(self, gateway.site))
        response = await client.request(b"GET", b"/api/x")
        self.assertEqual(response.status, 200)
        self.assertEqual(
            parse_sf_item((response.header(b"ratelimit") or b"").decode()),
            ("limit", {"r": 2, "t": 10}),
        )
        self.assertEqual(response.headers[-1][0], b"ratelimit")

    async def test_passing_headers_default_limited(self) -> None:
        """
        By default (C{headers: limited}) passing responses carry neither field.
        """
        port = self.serve({"rate": "6/m", "burst": 3})
        status, headers, _ = await fetch(port, "GET", "/api/x")
        self.assertEqual(status, 200)
        self.assertNotIn("ratelimit", headers)
        self.assertNotIn("ratelimit-policy", headers)

    async def test_status_line_names_429(self) -> None:
        """
        The 429's status line says C{Too Many Requests} (Twisted knows no phrase for it:
        it wrote C{Unknown Status}).
        """
        port = self.serve({"rate": "1/h"})
        await fetch(port, "GET", "/api/a")
        raw = await fetch_raw(port, b"GET /api/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertTrue(raw.startswith(b"HTTP/1.1 429 Too Many Requests\r\n"), raw[:40])

    def test_sf_parser_refuses(self) -> None:
        for bad in ("limit;q=1", '"a";q=1.5', '"a";Q=1', '"a" ;q=1', '"a";q=1;q=2'):
            self.assertRaises(ValueError, parse_sf_item, bad)

    async def test_service_route_json(self) -> None:
        """
        On a service route (a reverse proxy's default type) the body is JSON.
        """
        port = self.serve({"rate": "1/h"})
        await fetch(port, "GET", "/api/a")
        status, headers, body = await fetch(port, "GET", "/api/a")
        self.assertEqual((status, body), (429, b'{"error": "too many requests"}\n'))
        self.assertEqual(headers["content-type"], ["application/json"])

    async def test_client_keys_and_ipv6_grouping(self) -> None:
        """
        Clients are told apart by the address the forwarded layer established; IPv6
        addresses in one /64 share a key, another /64 has its own; an IPv4-mapped
        IPv6 address is its IPv4 client.
        """
        port = self.serve({"rate": "1/h"}, gateway_spec='trustedProxies: ["127.0.0.1"]\n')

        async def status(client: str) -> int:
            return (await fetch(port, "GET", "/x", [("X-Forwarded-For", client)]))[0]

        self.assertEqual(await status("192.0.2.1"), 200)
        self.assertEqual(await status("192.0.2.1"), 429)
        self.assertEqual(await status("::ffff:192.0.2.1"), 429)
        self.assertEqual(await status("192.0.2.2"), 200)
        self.assertEqual(await status("2001:db8:0:1::1"), 200)
        self.assertEqual(await status("2001:db8:0:1:ffff::2"), 429)  # same /64
        self.assertEqual(await status("2001:db8:0:2::1"), 200)

    async def test_spoofed_forwarded_for(self) -> None:
        """
        Attack: a client behind a trusted proxy writes addresses of its own into
        C{X-Forwarded-For} to get a fresh key each time; the key is the rightmost
        address not a trusted proxy (the one the proxy appended), so it stays limited.
        A peer that is not trusted gets no say at all.
        """
        port = self.serve({"rate": "1/h"}, gateway_spec='trustedProxies: ["127.0.0.1"]\n')
        statuses = [
            (await fetch(port, "GET", "/x", [("X-Forwarded-For", f"198.51.100.{i}, 192.0.2.7")]))[0]
            for i in range(3)
        ]
        self.assertEqual(statuses, [200, 429, 429])

    async def test_untrusted_peer_forwarded_for_ignored(self) -> None:
        port = self.serve({"rate": "1/h"})
        statuses = [
            (await fetch(port, "GET", "/x", [("X-Forwarded-For", f"198.51.100.{i}")]))[0]
            for i in range(2)
        ]
        self.assertEqual(statuses, [200, 429])

    async def test_plugin_request_client_address(self) -> None:
        """
        C{PluginRequest.client_address} is the client after C{trustedProxies}: behind a
        trusted proxy, the address it forwarded (it was the peer: every client read as
        the proxy).
        """
        install_plugins(
            self, {"client-echo": "tests.test_rate_limit:client_echo"}, name="echo-dist"
        )
        _, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            gateway_spec='trustedProxies: ["127.0.0.1"]\n',
            clock=self.clock,
            routes=request_plugin("echo", "client-echo"),
        )
        _, _, body = await fetch(port, "GET", "/x", [("X-Forwarded-For", "192.0.2.7")])
        self.assertEqual(body, b"192.0.2.7")

    async def test_add_response_header(self) -> None:
        """
        C{PluginRequest.add_response_header}: framing and gateway-owned names, invalid
        names and values with CR/LF are refused; added fields come after the response's
        own, repeated names kept.
        """
        install_plugins(
            self, {"header-adder": "tests.test_rate_limit:header_adder"}, name="adder-dist"
        )
        _HeaderAdder.refused = []
        self.backend.responder = answer(body=b"ok", headers=[(b"X-Added", b"backend")])
        _, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            clock=self.clock,
            routes=request_plugin("adder", "header-adder"),
        )
        status, headers, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (200, b"ok"))
        self.assertEqual(headers["x-added"], ["backend", "1", "2"])
        self.assertEqual(len(_HeaderAdder.refused), 8, _HeaderAdder.refused)
        self.assertNotIn("injected", headers)
        self.assertEqual(headers["content-length"], ["2"])

    async def test_ipv6_prefix_configurable(self) -> None:
        port = self.serve(
            {"rate": "1/h", "ipv6Prefix": 128}, gateway_spec='trustedProxies: ["127.0.0.1"]\n'
        )
        for client in ("2001:db8::1", "2001:db8::2"):
            self.assertEqual(
                (await fetch(port, "GET", "/x", [("X-Forwarded-For", client)]))[0], 200
            )

    async def test_header_and_route_keys(self) -> None:
        routes = (
            "---\nkind: Route\nmetadata: {name: other}\nspec:\n"
            '  match: "/other/"\n  handler:\n    type: reverse-proxy\n'
            f'    upstream: "http://127.0.0.1:{self.backend.port}"\n'
        )
        port = self.serve({"rate": "1/h", "key": ["header:X-Api-Key", "route"]}, routes=routes)

        async def status(key: str, target: str = "/x") -> int:
            return (await fetch(port, "GET", target, [("X-Api-Key", key)]))[0]

        self.assertEqual(await status("a"), 200)
        self.assertEqual(await status("a"), 429)
        self.assertEqual(await status("b"), 200)
        self.assertEqual(await status("a", "/other/y"), 200)  # another route: its own key
        self.assertEqual(await status("a", "/other/z"), 429)

    async def test_repeated_header_not_charged_to_the_first_value(self) -> None:
        """
        Attack: a client repeats the key's header, another client's value first and its
        own after (a backend reading the last one serves it as itself): the request
        counts against neither key alone, so the other client keeps its quota.
        """
        port = self.serve({"rate": "1/h", "key": ["header:X-Api-Key"]})
        spoofed = [("X-Api-Key", "victim"), ("X-Api-Key", "attacker")]
        self.assertEqual((await fetch(port, "GET", "/x", spoofed))[0], 200)
        self.assertEqual((await fetch(port, "GET", "/x", spoofed))[0], 429)
        self.assertEqual((await fetch(port, "GET", "/x", [("X-Api-Key", "victim")]))[0], 200)

    async def test_subject_falls_back_to_client(self) -> None:
        """
        C{subject} on an anonymous request keys by client address.
        """
        port = self.serve(
            {"rate": "1/h", "key": ["subject"]}, gateway_spec='trustedProxies: ["127.0.0.1"]\n'
        )

        async def status(client: str) -> int:
            return (await fetch(port, "GET", "/x", [("X-Forwarded-For", client)]))[0]

        self.assertEqual(await status("192.0.2.1"), 200)
        self.assertEqual(await status("192.0.2.1"), 429)
        self.assertEqual(await status("192.0.2.9"), 200)

    async def test_limited_counted_per_route(self) -> None:
        """
        C{edgegw.rate_limit.limited} counts 429s by route pattern, never by key; two
        rate-limit resources share the instrument (a second one used to fail the load).
        """
        routes = (
            APP_ROUTE % self.backend.port
            + request_plugin("limit2", "rate-limit", config={"rate": "1/h", "key": ["route"]})
            + "---\nkind: Telemetry\nmetadata: {name: t}\n"
            + 'spec: {service: {name: edge}, metrics: {prometheus: {listen: "127.0.0.1:0"}}}\n'
        )
        built, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            clock=self.clock,
            routes=request_plugin("limit", "rate-limit", config={"rate": "1/h"}) + routes,
        )
        for target in ("/x", "/x", "/x", "/app/a"):
            await fetch(port, "GET", target)
        assert built.metrics is not None
        [counter] = [
            i for i in built.metrics.registry.instruments if i.name == "edgegw.rate_limit.limited"
        ]
        self.assertEqual(counter.attribute_names, ("http.route",))
        self.assertEqual(
            sorted((values, value) for _, values, value in counter.points()),
            # /app/a: the first resource (no selector, key client) refuses it.
            [(("/",), 2), (("/app/",), 1)],
        )

    def test_config_error_located(self) -> None:
        """
        A bad config stops the build, located at the resource's field.
        """
        error = self.assertRaises(ConfigError, self.serve, {"rate": "fast"})
        self.assertIn('RequestPlugin "limit": spec.config.rate:', str(error))
