"""
The api (aggregation) handler: concurrent fan-out, merged JSON, partial results.
"""

from __future__ import annotations

import gzip
import json
import textwrap
from collections.abc import Sequence
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.assembly.assemble import build_gateway
from edgegw.handlers.api import ApiHandler, UnsafeWildcardError, fill_path, parse_template
from edgegw.identity.principal import Principal
from edgegw.terminal.exchange import Exchange, IExchange
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.shared import NotJSONError, parse_json
from edgegw.upstream.upstreams import Upstream
from tests.support.backends import SiteBackend
from tests.support.configs import GATEWAY, load_text
from tests.support.gateways import serve_yaml
from tests.support.memory import MemoryClient
from tests.support.processes import refused_port
from tests.support.rawclient import connect, response_complete
from tests.test_proxy import parse


class ScriptedResponse:
    """
    An upstream response whose body is delivered at once.
    """

    version = b"HTTP/1.1"
    phrase = b"OK"

    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.body = body
        self.length: int | None = len(body)
        self.has_body = bool(body)
        self.headers = [(b"Content-Length", b"%d" % len(body))]
        self.aborted = False

    def deliver(self, sink: Any) -> Deferred[None]:
        if self.body:
            sink.write(self.body)
        return succeed(None)

    def abort(self) -> None:
        self.aborted = True


class ScriptedClient:
    """
    An upstream client (test double) whose calls answer when the test clock says so.
    """

    def __init__(self, clock: Clock, script: dict[str, tuple[float, int, bytes]]) -> None:
        self.clock = clock
        self.script = script
        self.calls: list[tuple[str, bytes]] = []
        self.headers: dict[str, list[tuple[bytes, bytes]]] = {}
        self.cancelled: list[str] = []

    def request(
        self,
        upstream: Upstream,
        method: bytes,
        target: bytes,
        headers: Any,
        body: Any = None,
        **kw: Any,
    ) -> Deferred[Any]:
        host = upstream.host
        self.calls.append((host, target))
        self.headers[host] = list(headers)
        delay, code, payload = self.script[host]

        def cancel(d: Deferred[Any]) -> None:
            self.cancelled.append(host)
            call.cancel()

        answer: Deferred[Any] = Deferred(cancel)
        call = self.clock.callLater(delay, lambda: answer.callback(ScriptedResponse(code, payload)))
        return answer


FANOUT = """\
kind: Route
metadata: {name: dash}
spec:
  match: "GET /dash/{id}"
  access: {auth: public}
  handler:
    type: api
    %s
    backends:
      - {group: user, upstream: "http://user.test", path: "/users/{id}"}
      - {group: orders, upstream: "http://orders.test", path: "/orders"}
      - {group: recs, upstream: "http://recs.test", path: "/recs", required: false}
"""


class ConcurrencyTests(SynchronousTestCase):
    """
    Driven by a test clock: the fan-out takes the slowest backend's time, not the sum.
    """

    def gateway(
        self, script: dict[str, tuple[float, int, bytes]], timeout: str = ""
    ) -> tuple[MemoryClient, Clock, ScriptedClient]:
        config = load_text(self.mktemp(), FANOUT % (f"timeout: {timeout}" if timeout else ""))
        clock = Clock()
        client = ScriptedClient(clock, script)
        gateway = build_gateway(config, clock, client)  # type: ignore[arg-type]
        return MemoryClient(gateway.site), clock, client

    def test_slowest_not_sum(self) -> None:
        http, clock, client = self.gateway(
            {
                "user.test": (1.0, 200, b'{"name":"ann"}'),
                "orders.test": (3.0, 200, b"[1,2]"),
                "recs.test": (2.0, 200, b'{"r":true}'),
            }
        )
        http.send(b"GET /dash/7 HTTP/1.1\r\nHost: gw\r\n\r\n")
        self.assertEqual(len(client.calls), 3)  # all three started at once
        clock.advance(2.999)
        self.assertEqual(http.transport.value(), b"")
        clock.advance(0.001)
        response = parse(http.transport.value())
        self.assertEqual(clock.seconds(), 3.0)
        self.assertEqual(response[0], 200)
        self.assertEqual(
            json.loads(response[2]),
            {"user": {"name": "ann"}, "orders": [1, 2], "recs": {"r": True}},
        )
        self.assertEqual(list(json.loads(response[2])), ["user", "orders", "recs"])
        self.assertEqual(response[1]["content-type"], ["application/json"])
        self.assertNotIn("x-gw-partial", response[1])
        self.assertIn((b"user.test", b"/users/7"), [(h.encode(), t) for h, t in client.calls])

    def test_timeout_cancels_what_is_still_running(self) -> None:
        http, clock, client = self.gateway(
            {
                "user.test": (0.5, 200, b"{}"),
                "orders.test": (0.5, 200, b"[]"),
                "recs.test": (10.0, 200, b"{}"),
            },
            timeout="2s",
        )
        http.send(b"GET /dash/7 HTTP/1.1\r\nHost: gw\r\n\r\n")
        clock.advance(2.0)
        status, headers, body = parse(http.transport.value())
        self.assertEqual((status, headers["x-gw-partial"]), (200, ["recs"]))
        self.assertEqual(json.loads(body), {"user": {}, "orders": []})
        self.assertEqual(client.cancelled, ["recs.test"])

    def test_required_timeout_is_504(self) -> None:
        http, clock, client = self.gateway(
            {
                "user.test": (5.0, 200, b"{}"),
                "orders.test": (0.1, 200, b"[]"),
                "recs.test": (5.0, 200, b"{}"),
            },
            timeout="1s",
        )
        http.send(b"GET /dash/7 HTTP/1.1\r\nHost: gw\r\n\r\n")
        clock.advance(1.0)
        status, _, body = parse(http.transport.value())
        self.assertEqual((status, body), (504, b"gateway timeout\n"))
        self.assertEqual(sorted(client.cancelled), ["recs.test", "user.test"])

    def test_required_failure_answers_at_once_and_cancels_the_rest(self) -> None:
        http, clock, client = self.gateway(
            {
                "user.test": (0.1, 500, b"boom"),
                "orders.test": (5.0, 200, b"[]"),
                "recs.test": (5.0, 200, b"{}"),
            }
        )
        http.send(b"GET /dash/7 HTTP/1.1\r\nHost: gw\r\n\r\n")
        clock.advance(0.1)
        status, _, body = parse(http.transport.value())
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        self.assertEqual(sorted(client.cancelled), ["orders.test", "recs.test"])

    def test_client_gone_cancels_calls(self) -> None:
        http, _, client = self.gateway(
            {
                "user.test": (5.0, 200, b"{}"),
                "orders.test": (5.0, 200, b"[]"),
                "recs.test": (5.0, 200, b"{}"),
            }
        )
        http.send(b"GET /dash/7 HTTP/1.1\r\nHost: gw\r\n\r\n")
        http.channel.connectionLost(Exception("gone"))
        self.assertEqual(sorted(client.cancelled), ["orders.test", "recs.test", "user.test"])


class PathTemplateTests(SynchronousTestCase):
    def test_hostile_values_stay_one_segment(self) -> None:
        template = parse_template("/users/{id}/items")
        cases = {
            "7": b"/users/7/items",
            "a/b": b"/users/a%2Fb/items",
            "x?admin=1": b"/users/x%3Fadmin%3D1/items",
            "frag#x": b"/users/frag%23x/items",
            "%2e%2e": b"/users/%252e%252e/items",
            "caf\u00e9": b"/users/caf%C3%A9/items",
            "a b": b"/users/a%20b/items",
            "...": b"/users/.../items",
        }
        for value, expected in cases.items():
            self.assertEqual(fill_path(template, {"id": value}), expected, value)

    def test_dot_segments_refused(self) -> None:
        template = parse_template("/users/{id}")
        for value in (".", "..", "../admin", "a/..", "a/./b", "..\\admin"):
            self.assertRaises(UnsafeWildcardError, fill_path, template, {"id": value})
        for value in ("a/b", "...", "..a", "a.."):
            fill_path(template, {"id": value})


class HeaderTests(SynchronousTestCase):
    def test_projection_and_token_only_where_asked(self) -> None:
        config = load_text(
            self.mktemp(),
            """\
            kind: Route
            metadata: {name: a}
            spec:
              match: GET /a
              handler:
                type: api
                backends:
                  - {group: one, upstream: "http://one.test", path: /x, forwardAccessToken: true}
                  - {group: two, upstream: "http://two.test", path: /y}
            """,
        )
        spec = config.routes[0].handler
        clock = Clock()
        client = ScriptedClient(
            clock, {"one.test": (0.0, 200, b"{}"), "two.test": (0.0, 200, b"{}")}
        )
        handler = ApiHandler(spec, UpstreamAgent(client, clock), clock)  # type: ignore[arg-type]
        # The terminal rendered as a bare Resource, its request carrying a route exchange.
        request = Request(DummyChannel())
        request.method = b"GET"
        request.uri = request.path = b"/a"
        request.requestHeaders.setRawHeaders(b"x-user-id", [b"u1"])
        request.requestHeaders.setRawHeaders(b"cookie", [b"sid=secret"])
        request.requestHeaders.setRawHeaders(b"authorization", [b"Basic xxx"])
        exchange = Exchange(request, None, {}, 0.0)  # type: ignore[arg-type]
        exchange.principal = Principal("u1", access_token="tok")
        request.setComponent(IExchange, exchange)
        self.assertEqual(handler.render(request), NOT_DONE_YET)
        clock.advance(0)
        self.assertEqual(request.code, 200)
        one = dict(client.headers["one.test"])
        two = dict(client.headers["two.test"])
        self.assertEqual(one[b"Authorization"], b"Bearer tok")
        self.assertNotIn(b"Authorization", two)
        self.assertEqual(one[b"X-User-Id"], b"u1")
        self.assertEqual((one[b"Host"], two[b"Host"]), (b"one.test", b"two.test"))
        for headers in (one, two):
            self.assertNotIn(b"cookie", {k.lower() for k in headers})


class Backends(Resource):
    """
    Real backends on one port, chosen by path.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes, dict[bytes, Sequence[bytes]]]] = []
        self.held: list[Request] = []
        self.lost: list[bytes] = []
        # Path -> a 200 body given as it is (application/json).
        self.bodies: dict[bytes, bytes] = {}

    def render(self, request: Request) -> bytes | int:
        path = request.path
        self.seen.append(
            (request.uri, {k.lower(): v for k, v in request.requestHeaders.getAllRawHeaders()})
        )
        if path in self.bodies:
            request.setHeader(b"content-type", b"application/json")
            return self.bodies[path]
        if path.startswith(b"/json"):
            request.setHeader(b"set-cookie", b"tracking=user-a")
            return json.dumps(
                {"uri": request.uri.decode(), "method": request.method.decode()}
            ).encode()
        if path == b"/fail":
            request.setResponseCode(500)
            return b'{"error":"internal details"}'
        if path == b"/notjson":
            return b"<html>hello</html>"
        if path == b"/empty":
            return b""
        if path == b"/redirect":
            request.setResponseCode(302)
            request.setHeader(b"location", b"/json")
            return b"{}"
        if path == b"/gzip":
            request.setHeader(b"content-encoding", b"gzip")
            return gzip.compress(b'{"a":1}')
        if path == b"/declared-huge":
            # Declares more than the cap, sends a little, then holds the connection.
            request.setHeader(b"content-length", b"20000000")
            request.write(b"[0,")
            self.held.append(request)
            return NOT_DONE_YET
        if path == b"/huge":
            # Chunked, so that only reading it shows the size: 11 MiB of JSON-ish bytes.
            request.write(b"[" + b"0," * (5 * 1024 * 1024))
            request.write(b"0," * (512 * 1024) + b"0]")
            request.finish()
            return NOT_DONE_YET
        if path == b"/slow":
            self.held.append(request)
            request.notifyFinish().addErrback(lambda _: self.lost.append(path))
            return NOT_DONE_YET
        request.setResponseCode(404)
        return b"{}"


class LiveTestCase(TestCase):
    """
    Real backends (L{Backends}) and gateways over real sockets.
    """

    def setUp(self) -> None:
        self.backends = Backends()
        # A tracked backend: stopping it drops (and waits for) every connection the
        # gateway's pool still holds to it, so no server-side timer outlives the test.
        self.site_backend = SiteBackend(self.backends.render).start()
        self.addCleanup(self.site_backend.stop)

    def gateway(
        self, backends: str, match: str = "GET /a/{id}", timeout: str = "", gateway_spec: str = ""
    ) -> int:
        upstream = f"http://127.0.0.1:{self.site_backend.port}"
        body = textwrap.indent(textwrap.dedent(backends).replace("UP", upstream), "      ")
        return serve_yaml(
            self,
            GATEWAY + gateway_spec + "---\nkind: Route\nmetadata: {name: a}\nspec:\n"
            f'  match: "{match}"\n  access: {{auth: public}}\n  handler:\n    type: api\n'
            + (f"    timeout: {timeout}\n" if timeout else "")
            + "    backends:\n"
            + body,
        )

    async def get(self, port: int, target: str) -> tuple[int, dict[str, list[str]], bytes]:
        client = await connect(port)
        client.send(f"GET {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
        data = await client.until(response_complete)
        await client.close()
        return parse(data)


class LiveTests(LiveTestCase):
    async def test_merge_placeholders_query_and_method(self) -> None:
        port = self.gateway(
            """\
            - {group: first, upstream: "UP", path: "/json/{id}", forwardQuery: true}
            - {group: second, upstream: "UP", path: "/json/b", method: POST}
            """,
            gateway_spec="  security: {encodedSlashes: keep}\n",
        )
        status, headers, body = await self.get(port, "/a/a%2Fb?x=1")
        self.assertEqual(status, 200)
        self.assertEqual(
            json.loads(body),
            {
                "first": {"uri": "/json/a%2Fb?x=1", "method": "GET"},
                "second": {"uri": "/json/b", "method": "POST"},
            },
        )
        self.assertNotIn("set-cookie", headers)

    async def test_failures_of_required_and_optional(self) -> None:
        kinds = ["/fail", "/notjson", "/empty", "/redirect", "/gzip", "/huge", "/nothing-here"]
        for kind in kinds:
            port = self.gateway(
                f"""\
                - {{group: ok, upstream: "UP", path: "/json/ok"}}
                - {{group: bad, upstream: "UP", path: "{kind}", required: false}}
                """
            )
            status, headers, body = await self.get(port, "/a/1")
            self.assertEqual((status, headers.get("x-gw-partial")), (200, ["bad"]), kind)
            self.assertEqual(list(json.loads(body)), ["ok"], kind)
            port = self.gateway(
                f"""\
                - {{group: bad, upstream: "UP", path: "{kind}"}}
                - {{group: ok, upstream: "UP", path: "/json/ok"}}
                """
            )
            status, _, body = await self.get(port, "/a/1")
            self.assertEqual((status, body), (502, b"bad gateway\n"), kind)

    async def test_partial_lists_groups_in_declaration_order(self) -> None:
        port = self.gateway(
            """\
            - {group: z, upstream: "UP", path: "/fail", required: false}
            - {group: ok, upstream: "UP", path: "/json/ok"}
            - {group: a, upstream: "UP", path: "/notjson", required: false}
            """
        )
        _, headers, _ = await self.get(port, "/a/1")
        self.assertEqual(headers["x-gw-partial"], ["z,a"])

    async def test_connection_refused_is_a_failure(self) -> None:
        dead_port = await refused_port()
        port = self.gateway(
            f"""\
            - {{group: ok, upstream: "UP", path: "/json/ok"}}
            - {{group: gone, upstream: "http://127.0.0.1:{dead_port}", path: /x, required: false}}
            """
        )
        status, headers, _ = await self.get(port, "/a/1")
        self.assertEqual((status, headers["x-gw-partial"]), (200, ["gone"]))

    async def test_timeout_cancels_backend_call(self) -> None:
        port = self.gateway(
            """\
            - {group: slow, upstream: "UP", path: "/slow"}
            """,
            timeout="200ms",
        )
        status, _, body = await self.get(port, "/a/1")
        self.assertEqual((status, body), (504, b"gateway timeout\n"))
        while not self.backends.lost:
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(self.backends.lost, [b"/slow"])

    async def test_dot_wildcards_are_bad_requests(self) -> None:
        port = self.gateway(
            '- {group: x, upstream: "UP", path: "/json/{id}"}\n', match="GET /a/{id}/z"
        )
        status, _, _ = await self.get(port, "/a/%2e%2e/z")
        self.assertEqual(status, 400)
        self.assertEqual(self.backends.seen, [])

    async def test_wildcards_hiding_dot_segments_behind_slashes(self) -> None:
        """
        With encoded slashes kept inside a segment, a wildcard value may hold a C{/}; one
        that holds a dot segment (C{../admin}) never becomes a backend path.
        """
        port = self.gateway(
            '- {group: x, upstream: "UP", path: "/json/{id}"}\n',
            match="GET /a/{id}/z",
            gateway_spec="  security: {encodedSlashes: keep}\n",
        )
        for target in ("/a/..%2Fadmin/z", "/a/%2e%2e%2fadmin/z", "/a/x%2F..%2F..%2Fadmin/z"):
            status, _, _ = await self.get(port, target)
            self.assertEqual(status, 400, target)
        self.assertEqual(self.backends.seen, [])
        status, _, _ = await self.get(port, "/a/x%2Fy/z")
        self.assertEqual(status, 200)
        self.assertEqual([seen[0] for seen in self.backends.seen], [b"/json/x%2Fy"])

    async def test_backend_cookies_never_reach_another_user(self) -> None:
        port = self.gateway('- {group: x, upstream: "UP", path: "/json/{id}"}\n')
        first = await self.get(port, "/a/1")
        second = await self.get(port, "/a/2")
        self.assertNotIn("set-cookie", first[1])
        self.assertNotIn("set-cookie", second[1])
        for _, headers in self.backends.seen:
            self.assertNotIn(b"cookie", headers)

    async def test_inbound_cookie_not_sent_to_backends(self) -> None:
        port = self.gateway('- {group: x, upstream: "UP", path: "/json/{id}"}\n')
        client = await connect(port)
        client.send(b"GET /a/1 HTTP/1.1\r\nHost: gw\r\nCookie: sid=1\r\nConnection: close\r\n\r\n")
        await client.until(response_complete)
        await client.close()
        self.assertNotIn(b"cookie", self.backends.seen[0][1])

    async def test_client_disconnect_cancels(self) -> None:
        port = self.gateway('- {group: slow, upstream: "UP", path: "/slow"}\n')
        client = await connect(port)
        client.send(b"GET /a/1 HTTP/1.1\r\nHost: gw\r\n\r\n")
        while not self.backends.held:
            await deferLater(reactor, 0.01, lambda: None)
        await client.close()
        while not self.backends.lost:
            await deferLater(reactor, 0.01, lambda: None)
        self.assertEqual(self.backends.lost, [b"/slow"])


class CallRecordTests(LiveTestCase):
    async def test_each_call_in_the_access_log(self) -> None:
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        port = self.gateway(
            """\
            - {group: ok, upstream: "UP", path: "/json/ok"}
            - {group: broken, upstream: "UP", path: "/fail", required: false}
            - {group: odd, upstream: "UP", path: "/notjson", required: false}
            """
        )
        await self.get(port, "/a/1")
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        calls = {call["name"]: call for call in records[0]["upstream_calls"]}
        self.assertEqual(set(calls), {"ok", "broken", "odd"})
        self.assertEqual((calls["ok"]["status"], "error" in calls["ok"]), (200, False))
        self.assertEqual((calls["broken"]["status"], calls["broken"]["error"]), (500, "status 500"))
        self.assertEqual(calls["odd"]["error"], "body is not JSON")
        self.assertIsInstance(calls["ok"]["ms"], float)

    async def test_oversized_bodies_drop_the_backend_connection(self) -> None:
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        port = self.gateway(
            """\
            - {group: ok, upstream: "UP", path: "/json/ok"}
            - {group: declared, upstream: "UP", path: "/declared-huge", required: false}
            - {group: read, upstream: "UP", path: "/huge", required: false}
            """
        )
        lost = [self.site_backend.next_lost(), self.site_backend.next_lost()]
        status, headers, _ = await self.get(port, "/a/1")
        self.assertEqual((status, headers["x-gw-partial"]), (200, ["declared,read"]))
        # Neither connection is left open and paused with nobody to close it.
        for connection_lost in lost:
            await connection_lost
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        calls = {call["name"]: call for call in records[0]["upstream_calls"]}
        self.assertEqual(calls["declared"]["error"], "body of 20000000 bytes")
        self.assertEqual(calls["read"]["error"], f"body over {10 * 1024 * 1024} bytes")


class BackendCallTests(LiveTestCase):
    """
    How each backend call is built (a backend's path literals are checked at load, its
    static query is merged with the forwarded one) and recorded (a cancelled call is in
    the access log).
    """

    async def test_path_literals_validated_at_load(self) -> None:
        from tests.support.configs import problems_of

        problems = problems_of(
            self.mktemp(),
            """\
            kind: Route
            metadata: {name: a}
            spec:
              match: GET /a/{id}
              handler:
                type: api
                backends:
                  - {group: x, upstream: "http://127.0.0.1:1", path: "/\u00e9/{id}"}
                  - {group: y, upstream: "http://127.0.0.1:1", path: "/e/a b"}
                  - {group: z, upstream: "http://127.0.0.1:1", path: "/ok/{id}?expand=1&v=%20"}
            """,
        )
        self.assertEqual(
            problems,
            [
                'document 2, Route "a": spec.handler.backends[0].path: "/\u00e9/{id}": "\u00e9" '
                '(U+00E9) is not allowed in a path; percent-encode it ("%C3%A9")',
                'document 2, Route "a": spec.handler.backends[1].path: "/e/a b": a space is not '
                'allowed in a path; percent-encode it ("%20")',
            ],
        )

    async def test_static_query_merged_with_forwarded_query(self) -> None:
        port = self.gateway(
            '- {group: x, upstream: "UP", path: "/json/{id}?expand=1", forwardQuery: true}\n'
        )
        _, _, body = await self.get(port, "/a/7?page=2")
        self.assertEqual(json.loads(body)["x"]["uri"], "/json/7?expand=1&page=2")

    async def test_cancelled_calls_are_in_the_access_log(self) -> None:
        from tests.support.log_capture import capture_log

        events = capture_log(self)
        port = self.gateway(
            """\
            - {group: bad, upstream: "UP", path: "/fail"}
            - {group: slow, upstream: "UP", path: "/slow", required: false}
            """
        )
        status, _, _ = await self.get(port, "/a/1")
        self.assertEqual(status, 502)
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        calls = {call["name"]: call for call in records[0]["upstream_calls"]}
        self.assertEqual(calls["slow"]["error"], "cancelled")
        while not self.backends.lost:
            await deferLater(reactor, 0.01, lambda: None)


def strict_json(body: bytes) -> Any:
    """
    C{body} parsed as strict JSON: UTF-8, no NaN or infinities.
    """

    def refuse(name: str) -> Any:
        raise ValueError(name)

    return json.loads(body.decode("utf-8"), parse_constant=refuse)


class StrictJsonTests(LiveTestCase):
    """
    Issue 10, point 6: a backend body that the gateway could not write back as valid JSON
    (NaN, infinities, a number that overflows to infinity, a lone surrogate, bytes that
    are not UTF-8) is a failed call: required, 502; optional, left out and named in
    X-Gw-Partial. Never a 500, never invalid JSON served as application/json.
    """

    HOSTILE = {
        b"/nan": b'{"v": NaN}',
        b"/infinity": b'{"v": Infinity}',
        b"/negative-infinity": b'{"v": [-Infinity]}',
        b"/overflow": b'{"v": 1e999}',
        b"/negative-overflow": b'{"v": -1.5e400}',
        b"/lone-surrogate": b'{"v": "\\ud800"}',
        b"/lone-low-surrogate-key": b'{"\\udc00x": 1}',
        b"/reversed-pair": b'["\\ude00\\ud83d"]',
        b"/encoded-surrogate": b'{"v": "\xed\xa0\x80"}',
        b"/latin-1": b'{"v": "caf\xe9"}',
        b"/utf-16": '{"v": 1}'.encode("utf-16"),
    }

    async def test_hostile_json_is_a_failed_call(self) -> None:
        self.backends.bodies.update(self.HOSTILE)
        self.backends.bodies[b"/fine"] = b'{"v": 1}'
        for path in self.HOSTILE:
            kind = path.decode()
            port = self.gateway(
                f"""\
                - {{group: ok, upstream: "UP", path: "/fine"}}
                - {{group: bad, upstream: "UP", path: "{kind}", required: false}}
                """
            )
            status, headers, body = await self.get(port, "/a/1")
            self.assertEqual((status, headers.get("x-gw-partial")), (200, ["bad"]), kind)
            self.assertEqual(headers["content-type"], ["application/json"], kind)
            self.assertEqual(strict_json(body), {"ok": {"v": 1}}, kind)
            port = self.gateway(
                f"""\
                - {{group: bad, upstream: "UP", path: "{kind}"}}
                - {{group: ok, upstream: "UP", path: "/fine"}}
                """
            )
            status, _, body = await self.get(port, "/a/1")
            self.assertEqual((status, body), (502, b"bad gateway\n"), kind)
        # Every hostile backend was called (twice): the refusal is the gateway's reading.
        called = [uri for uri, _ in self.backends.seen]
        for path in self.HOSTILE:
            self.assertEqual(called.count(path), 2, path)

    async def test_deep_nesting_is_a_failed_call(self) -> None:
        # Around the interpreter's recursion limit, a body parses but the merged answer
        # (one level deeper, elsewhere on the stack) cannot be written: whichever step
        # refuses it, the call fails like any other and the answer is never a 500.
        self.backends.bodies[b"/fine"] = b"{}"
        port = self.gateway(
            """\
            - {group: ok, upstream: "UP", path: "/fine"}
            - {group: deep, upstream: "UP", path: "/deep", required: false}
            """
        )
        required = self.gateway('- {group: deep, upstream: "UP", path: "/deep"}\n')
        for depth in range(940, 1000, 2):
            self.backends.bodies[b"/deep"] = b"[" * depth + b"]" * depth
            status, headers, body = await self.get(port, "/a/1")
            self.assertEqual((status, headers.get("x-gw-partial")), (200, ["deep"]), depth)
            self.assertEqual(strict_json(body), {"ok": {}})
            status, _, body = await self.get(required, "/a/1")
            self.assertEqual((status, body), (502, b"bad gateway\n"), depth)

    async def test_valid_json_passes_exactly(self) -> None:
        self.backends.bodies[b"/valid"] = (
            b'{"pair": "\\ud83d\\ude00", "escaped": "\\\\ud800", "raw": "caf\xc3\xa9",'
            b' "big": 123456789012345678901234567890, "tiny": 1e-400,'
            b' "largest": 1.7976931348623157e308, "negative": -2.5E3}'
        )
        port = self.gateway('- {group: x, upstream: "UP", path: "/valid"}\n')
        status, headers, body = await self.get(port, "/a/1")
        self.assertEqual(status, 200)
        self.assertNotIn("x-gw-partial", headers)
        self.assertEqual(
            strict_json(body),
            {
                "x": {
                    "pair": "\U0001f600",
                    "escaped": "\\ud800",
                    "raw": "caf\u00e9",
                    "big": 123456789012345678901234567890,
                    "tiny": 0.0,
                    "largest": 1.7976931348623157e308,
                    "negative": -2500.0,
                }
            },
        )


class ParseJsonTests(SynchronousTestCase):
    """
    L{parse_json} on its own: what it refuses, and that whatever it returns can be
    written back as strict JSON in UTF-8.
    """

    def test_refused(self) -> None:
        for body in (
            *StrictJsonTests.HOSTILE.values(),
            b"",
            b"\xef\xbb\xbf{}",
            b"[1, 2",
            b"[" * 100_000 + b"]" * 100_000,
            b'["\\ud83d"]',
        ):
            self.assertRaises(NotJSONError, parse_json, body)

    def test_accepted_values_write_back(self) -> None:
        for body, expected in (
            (b'"\\ud83d\\ude00"', "\U0001f600"),
            (b'["\\\\ud800"]', ["\\ud800"]),
            (b"1e308", 1e308),
            (b"-0.0", -0.0),
            (b"12345678901234567890123", 12345678901234567890123),
        ):
            value = parse_json(body)
            self.assertEqual(value, expected)
            json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
