"""
Tests for the per-route pipeline: composition, recover, request-id, access-log,
cancellation and in-flight tracking (the projection stage's are in test_projection.py).
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request

from edgegw.assembly.edge_site import edge_site
from edgegw.assembly.route_chains import RouteWiring, route_runner
from edgegw.chain.access_log import AccessLog, _encode
from edgegw.chain.pipeline import InFlight, RouteRunner, compose
from edgegw.chain.render import render_stage
from edgegw.chain.request_id import new_request_id, sane_request_id
from edgegw.config.effective import effective_routes
from edgegw.config.model import GatewaySpec
from edgegw.edge.site import MuxDispatcher
from edgegw.line_writer import LineWriter
from edgegw.routing.mux import Mux
from edgegw.terminal.exchange import Exchange, Handler, Stage, exchange_of
from edgegw.terminal.resource import TerminalResource
from edgegw.terminal.route import CompiledRoute
from tests.support.configs import load_text
from tests.support.log_capture import capture_log
from tests.support.memory import MemoryClient


class FunctionTerminal(TerminalResource):
    """
    A terminal Resource that runs a test function with the route's exchange.
    """

    def __init__(self, function: Handler) -> None:
        super().__init__()
        self.function = function

    async def respond(self, request: Request) -> None:
        await self.function(exchange_of(request))

    def describe(self) -> str:
        return "test terminal"


class Harness:
    """
    One route with a test terminal behind the real edge and chain.
    """

    def __init__(
        self,
        test: SynchronousTestCase,
        terminal: Handler,
        pattern: str = "/",
        access: str = "",
        level: str = "info",
        stages: list[Stage] | None = None,
    ) -> None:
        config = load_text(
            test.mktemp(),
            f"""\
            kind: Route
            metadata: {{name: test}}
            spec:
              match: "{pattern}"
              handler: {{type: health}}
              {access}
            """,
        )
        effective = effective_routes(config)[0]
        route = CompiledRoute("test", pattern, effective, "test terminal")
        self.inflight = InFlight()
        mux: Mux[Any] = Mux()
        resource = FunctionTerminal(terminal)
        runner = (
            route_runner(
                route, resource, RouteWiring(self.inflight, AccessLog(level).stage, "groups")
            )
            if stages is None
            else RouteRunner(route, compose(stages, render_stage(resource)), self.inflight)
        )
        mux.register(pattern, runner)
        self.site = edge_site(GatewaySpec(), MuxDispatcher(mux), Clock())
        self.client = MemoryClient(self.site)


async def ok_terminal(exchange: Exchange) -> None:
    exchange.request.write(b"ok")
    exchange.request.finish()


class ComposeTests(SynchronousTestCase):
    def test_onion_order(self) -> None:
        seen: list[str] = []

        def stage(name: str) -> Any:
            async def run(exchange: Exchange, next: Handler) -> None:
                seen.append(f"{name} in")
                await next(exchange)
                seen.append(f"{name} out")

            return run

        async def terminal(exchange: Exchange) -> None:
            seen.append("terminal")

        handler = compose([stage("a"), stage("b")], terminal)
        Deferred.fromCoroutine(handler(None))  # type: ignore[arg-type]
        self.assertEqual(seen, ["a in", "b in", "terminal", "b out", "a out"])


class RecoverTests(SynchronousTestCase):
    def test_exception_becomes_500_and_is_logged(self) -> None:
        events = capture_log(self)

        async def broken(exchange: Exchange) -> None:
            raise ZeroDivisionError("secret detail")

        response = Harness(self, broken).client.request("GET", "/")
        self.assertEqual(response.status, 500)
        self.assertEqual(response.body, b"internal server error\n")
        self.assertNotIn(b"secret", response.body)
        failures = [e for e in events if e.get("log_namespace") == "edgegw.recover"]
        self.assertEqual(len(failures), 1)
        self.assertTrue(failures[0]["log_failure"].check(ZeroDivisionError))
        self.assertEqual(failures[0]["route"], "/")
        self.assertEqual(len(failures[0]["request_id"]), 32)
        self.flushLoggedErrors(ZeroDivisionError)

    def test_failure_after_response_started_aborts(self) -> None:
        async def half(exchange: Exchange) -> None:
            exchange.request.write(b"partial")
            raise RuntimeError("late")

        harness = Harness(self, half)
        harness.client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(harness.client.transport.disconnecting)
        self.flushLoggedErrors(RuntimeError)


class RequestIdTests(SynchronousTestCase):
    def test_generated_and_echoed(self) -> None:
        seen: list[str] = []

        async def terminal(exchange: Exchange) -> None:
            seen.append(exchange.request.getHeader(b"x-request-id").decode())  # type: ignore[union-attr]
            await ok_terminal(exchange)

        response = Harness(self, terminal).client.request("GET", "/")
        rid = response.header("X-Request-Id")
        assert rid is not None
        self.assertRegex(rid, r"\A[0-9a-f]{32}\Z")
        self.assertEqual(seen, [rid])

    def test_sane_inbound_kept(self) -> None:
        response = Harness(self, ok_terminal).client.request(
            "GET", "/", {"X-Request-Id": "abc-123_XYZ.7"}
        )
        self.assertEqual(response.header("X-Request-Id"), "abc-123_XYZ.7")

    def test_insane_inbound_replaced(self) -> None:
        client = Harness(self, ok_terminal).client
        for bad in ["has space", "x" * 129, "tab\there", "caf\xe9"]:
            response = client.request("GET", "/", {"X-Request-Id": bad})
            self.assertRegex(response.header("X-Request-Id") or "", r"\A[0-9a-f]{32}\Z")

    def test_new_ids_are_distinct_across_batches(self) -> None:
        """
        Fresh ids are 32 hex digits, none twice, across the batches of random bytes
        they are cut from.
        """
        ids = [new_request_id() for _ in range(1000)]
        for each in ids:
            self.assertRegex(each, r"\A[0-9a-f]{32}\Z")
        self.assertEqual(len(set(ids)), len(ids))

    def test_a_forked_child_draws_its_own_ids(self) -> None:
        """
        A process forked after ids were drawn does not hand out the ones its parent
        will (the batch is dropped in the child).
        """
        new_request_id()
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                os.write(writing, new_request_id().encode("ascii"))
            finally:
                os._exit(0)
        os.close(writing)
        self.addCleanup(os.close, reading)
        os.waitpid(child, 0)
        theirs = os.read(reading, 64).decode("ascii")
        self.assertRegex(theirs, r"\A[0-9a-f]{32}\Z")
        self.assertNotEqual(theirs, new_request_id())

    def test_sanity_rules(self) -> None:
        self.assertEqual(sane_request_id(b"x" * 128), "x" * 128)
        self.assertIsNone(sane_request_id(b"x" * 129))
        self.assertIsNone(sane_request_id(b""))
        self.assertIsNone(sane_request_id(b"a\r\nb"))


class AccessLogTests(SynchronousTestCase):
    def test_one_json_line_per_request(self) -> None:
        events = capture_log(self)
        client = Harness(self, ok_terminal, pattern="GET /items/{id}", level="warn").client
        client.request("GET", "/items/7?token=secret", {"X-Request-Id": "req-1"})
        lines = [e for e in events if e.get("log_namespace") == "edgegw.access"]
        self.assertEqual(len(lines), 1)
        event = lines[0]
        self.assertEqual(event["log_level"], LogLevel.warn)
        record = json.loads(event["access_line"])
        self.assertEqual(record, event["access"])
        duration = record.pop("duration_ms")
        self.assertIsInstance(duration, float)
        self.assertEqual(
            record,
            {
                "method": "GET",
                "path": "/items/7",
                "protocol": "HTTP/1.1",
                "status": 200,
                "bytes": 2,
                "request_id": "req-1",
                "route": "GET /items/{id}",
            },
        )

    def test_logged_for_failures(self) -> None:
        events = capture_log(self)

        async def broken(exchange: Exchange) -> None:
            raise ValueError("x")

        Harness(self, broken).client.request("GET", "/")
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        self.assertEqual([(r["status"], r["error"]) for r in records], [(500, "internal")])
        self.flushLoggedErrors(ValueError)


class LineCollector:
    """
    Stands for the access log's file writer: keeps the lines.
    """

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, line: bytes) -> None:
        self.lines.append(line)


class AccessFileLineTests(SynchronousTestCase):
    """
    Lines written to a file (or standard output): the standard fields, the upstream
    calls and other notes; a cancelled chain stays cancelled.
    """

    def harness(self, terminal: Handler, **options: Any) -> tuple[LineCollector, Harness]:
        writer = LineCollector()
        access = AccessLog(writer=cast(LineWriter, writer), **options)
        return writer, Harness(self, terminal, pattern="GET /items/{id}", stages=[access.stage])

    def test_plain_line(self) -> None:
        async def terminal(exchange: Exchange) -> None:
            exchange.add_call({"name": "upstream", "upstream": "b:1", "status": 201, "ms": 0.5})
            exchange.add_call(
                {"name": "g", "upstream": "c", "status": None, "ms": 2.0, "error": "x"}
            )
            await ok_terminal(exchange)

        writer, harness = self.harness(terminal)
        harness.client.request("GET", "/items/%C3%A9?q=1")
        (line,) = writer.lines
        record = json.loads(line)
        self.assertIsInstance(record.pop("duration_ms"), float)
        self.assertIsInstance(record.pop("request_id"), str)
        self.assertEqual(
            record,
            {
                "method": "GET",
                "path": "/items/%C3%A9",
                "protocol": "HTTP/1.1",
                "status": 200,
                "bytes": 2,
                "route": "GET /items/{id}",
                "upstream_calls": [
                    {"name": "upstream", "upstream": "b:1", "status": 201, "ms": 0.5},
                    {"name": "g", "upstream": "c", "status": None, "ms": 2.0, "error": "x"},
                ],
            },
        )

    def test_other_notes_and_options(self) -> None:
        async def terminal(exchange: Exchange) -> None:
            exchange.note("auth", "none")
            await ok_terminal(exchange)

        writer, harness = self.harness(terminal, fields={"env": "test"})
        harness.client.request("GET", "/items/1")
        record = json.loads(writer.lines[0])
        self.assertEqual((record["auth"], record["env"]), ("none", "test"))

    def test_a_cancelled_chain_stays_cancelled(self) -> None:
        """
        A chain cancelled inside (a route timeout) still raises CancelledError out of
        the access-log stage once its line is written.
        """
        waiting: Deferred[None] = Deferred()
        seen: list[type[BaseException]] = []

        async def terminal(exchange: Exchange) -> None:
            await waiting

        async def outer(exchange: Exchange, next: Handler) -> None:
            try:
                await next(exchange)
            except BaseException as e:
                seen.append(type(e))
                raise

        writer = LineCollector()
        access = AccessLog(writer=cast(LineWriter, writer))
        harness = Harness(self, terminal, stages=[outer, access.stage])
        harness.client.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        waiting.cancel()
        self.assertEqual(seen, [CancelledError])
        self.assertEqual(len(writer.lines), 1)


class AccessLineEncodingTests(SynchronousTestCase):
    """
    The access log's prebuilt JSON encoder writes what C{json.dumps} would.
    """

    def test_same_as_json(self) -> None:
        reference = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
        records: list[dict[str, Any]] = [
            {},
            {"method": "GET", "path": '/é\u2028\x00"\\', "status": None, "duration_ms": 0.053},
            {"upstream_calls": [{"status": 200, "ms": 1e-7}, {"error": "x"}], "ok": True},
            {"big": 10**30, "neg": -0.0, "nested": {"a": [[], {}, [1.5, False]]}},
        ]
        for record in records:
            self.assertEqual(_encode(record), reference(record))

    def test_a_failed_line_does_not_affect_the_next(self) -> None:
        record: dict[str, Any] = {"notes": {"a": [1]}}
        self.assertRaises(TypeError, _encode, {"notes": {"a": [object()]}})
        self.assertEqual(_encode(record), '{"notes":{"a":[1]}}')


class CancellationTests(SynchronousTestCase):
    def test_client_gone_cancels_chain(self) -> None:
        waiting: list[Deferred[None]] = []
        outcome: list[str] = []

        async def slow(exchange: Exchange) -> None:
            d: Deferred[None] = Deferred()
            waiting.append(d)
            try:
                await d
            except CancelledError:
                outcome.append("cancelled")
                raise

        harness = Harness(self, slow)
        harness.client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(harness.inflight.count, 1)
        harness.client.channel.connectionLost(Exception("client went away"))
        self.assertEqual(outcome, ["cancelled"])
        self.assertEqual(harness.inflight.count, 0)

    def test_drained_fires_when_idle(self) -> None:
        waiting: list[Deferred[None]] = []

        async def slow(exchange: Exchange) -> None:
            d: Deferred[None] = Deferred()
            waiting.append(d)
            await d
            await ok_terminal(exchange)

        harness = Harness(self, slow)
        harness.client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        drained = harness.inflight.drain()
        self.assertNoResult(drained)
        waiting[0].callback(None)
        self.successResultOf(drained)
        self.assertIn(b"Connection: close", harness.client.transport.value())
        self.assertTrue(harness.client.transport.disconnecting)

    def test_draining_closes_connections(self) -> None:
        harness = Harness(self, ok_terminal)
        harness.inflight.draining = True
        response = harness.client.request("GET", "/")
        self.assertEqual(response.header("Connection"), "close")
