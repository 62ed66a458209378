"""
Terminals as Resources: rendered bare by Twisted, or as the last stage of a route's
chain; and the mux's two kinds of target (a route's chain, a plain Resource).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from twisted.web.test.requesthelper import DummyChannel

from edgegw.assembly.edge_site import edge_site
from edgegw.assembly.route_chains import RouteWiring, route_runner
from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import InFlight
from edgegw.chain.resource_target import ResourceTarget
from edgegw.config.effective import effective_routes
from edgegw.config.model import GatewaySpec
from edgegw.edge.site import MuxDispatcher
from edgegw.routing.mux import Mux
from edgegw.terminal.exchange import exchange_of
from edgegw.terminal.resource import TerminalResource
from edgegw.terminal.route import CompiledRoute
from tests.support.configs import load_text
from tests.support.log_capture import capture_log
from tests.support.memory import MemoryClient


class Scripted(TerminalResource):
    """
    A terminal whose response waits for the test: C{release} fires it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.release: Deferred[bytes] = Deferred()
        self.cancelled = False
        self.routes: list[str] = []

    async def respond(self, request: Request) -> None:
        try:
            body = await self.release
        except CancelledError:
            self.cancelled = True
            raise
        if body == b"fail":
            raise ZeroDivisionError("secret detail")
        if body == b"fail late":
            request.write(b"partial")
            raise ZeroDivisionError("secret detail")
        if body == b"route":
            self.routes.append(exchange_of(request).route.pattern)
        request.write(body)
        request.finish()

    def describe(self) -> str:
        return "scripted"


class Plain(Resource):
    """
    An ordinary Twisted Resource (no chain needed).
    """

    isLeaf = True

    def __init__(self, later: bool = False) -> None:
        super().__init__()
        self.later = later
        self.pending: list[Request] = []

    def render_GET(self, request: Request) -> bytes | int:
        if self.later:
            self.pending.append(request)
            return NOT_DONE_YET
        return b"plain answer"


def gateway_with(
    test: SynchronousTestCase, routes: dict[str, Any], plain: dict[str, Resource]
) -> tuple[MemoryClient, list[dict[str, Any]], InFlight]:
    """
    The real edge and mux: each pattern in C{routes} runs its terminal through a route
    chain; each in C{plain} is a Resource mounted without one.
    """
    documents = "\n---\n".join(
        f"kind: Route\nmetadata: {{name: r{index}}}\nspec:\n"
        f'  match: "{pattern}"\n  handler: {{type: health}}\n'
        for index, pattern in enumerate(routes)
    )
    config = load_text(test.mktemp(), documents)
    logged: list[dict[str, Any]] = []
    access = AccessLog()
    access.emit = logged.append  # type: ignore[method-assign,assignment]
    mux: Mux[Any] = Mux()
    inflight = InFlight()
    for effective, (pattern, terminal) in zip(
        effective_routes(config), routes.items(), strict=True
    ):
        route = CompiledRoute(effective.spec.name, pattern, effective, "test terminal")
        wiring = RouteWiring(inflight, access.stage, "groups")
        mux.register(pattern, route_runner(route, terminal, wiring))
    for pattern, resource in plain.items():
        mux.register(pattern, ResourceTarget(pattern, resource, access, inflight))
    site = edge_site(GatewaySpec(), MuxDispatcher(mux), Clock(), access)
    return MemoryClient(site), logged, inflight


class BareTerminalTests(SynchronousTestCase):
    """
    A terminal rendered by Twisted as any Resource, with no route chain around it.
    """

    def test_answers_later(self) -> None:
        terminal = Scripted()
        client = MemoryClient(Site(terminal, reactor=Clock()))
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(client.transport.value(), b"")
        terminal.release.callback(b"done")
        self.assertIn(b"\r\ndone\r\n", client.transport.value())

    def test_failure_is_a_logged_500(self) -> None:
        events = capture_log(self)
        terminal = Scripted()
        client = MemoryClient(Site(terminal, reactor=Clock()))
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        terminal.release.callback(b"fail")
        raw = client.transport.value()
        self.assertTrue(raw.startswith(b"HTTP/1.1 500 "))
        self.assertNotIn(b"secret", raw)
        failures = [e for e in events if e.get("log_namespace") == "edgegw.recover"]
        self.assertEqual(len(failures), 1)
        self.assertTrue(failures[0]["log_failure"].check(ZeroDivisionError))
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_failure_after_the_head_aborts(self) -> None:
        capture_log(self)
        terminal = Scripted()
        client = MemoryClient(Site(terminal, reactor=Clock()))
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        terminal.release.callback(b"fail late")
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertTrue(client.transport.disconnecting or client.transport.disconnected)
        self.assertNotIn(b"500", client.transport.value().split(b"\r\n")[0])

    def test_client_gone_cancels(self) -> None:
        terminal = Scripted()
        client = MemoryClient(Site(terminal, reactor=Clock()))
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.channel.connectionLost(Exception("gone"))
        self.assertTrue(terminal.cancelled)

    def test_no_route_exchange_outside_a_chain(self) -> None:
        with self.assertRaises(TypeError):
            exchange_of(Request(DummyChannel()))


class ChainTerminalTests(SynchronousTestCase):
    """
    The same terminal as the last stage of a route's chain: the route's stages see its
    outcome.
    """

    def test_terminal_reads_the_route_exchange(self) -> None:
        terminal = Scripted()
        client, logged, _ = gateway_with(self, {"/t/": terminal}, {})
        client.send(b"GET /t/x HTTP/1.1\r\nHost: x\r\n\r\n")
        terminal.release.callback(b"route")
        self.assertEqual(terminal.routes, ["/t/"])
        self.assertEqual([record["status"] for record in logged], [200])

    def test_failure_goes_through_the_route_stages(self) -> None:
        capture_log(self)
        terminal = Scripted()
        client, logged, _ = gateway_with(self, {"/": terminal}, {})
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        terminal.release.callback(b"fail")
        self.assertTrue(client.transport.value().startswith(b"HTTP/1.1 500 "))
        self.assertEqual([(r["status"], r.get("error")) for r in logged], [(500, "internal")])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_client_gone_cancels_terminal_before_the_line_is_logged(self) -> None:
        terminal = Scripted()
        client, logged, _ = gateway_with(self, {"/": terminal}, {})
        client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.channel.connectionLost(Exception("gone"))
        self.assertTrue(terminal.cancelled)
        self.assertEqual([record.get("client_gone") for record in logged], [True])

    def test_plain_resource_ends_a_chain(self) -> None:
        later = Plain(later=True)
        client, logged, _ = gateway_with(self, {"/now": Plain(), "/later": later}, {})
        client.send(b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(client.transport.value().endswith(b"plain answer"))
        self.assertIn(b"X-Request-Id:", client.transport.value())
        client.transport.clear()
        client.send(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(len(logged), 1)  # still waiting for the resource
        later.pending[0].write(b"at last")
        later.pending[0].finish()
        self.assertIn(b"\r\nat last\r\n", client.transport.value())
        self.assertEqual([record["status"] for record in logged], [200, 200])


class ResourceTargetTests(SynchronousTestCase):
    def test_resource_answering_later_is_logged_once(self) -> None:
        later = Plain(later=True)
        client, logged, inflight = gateway_with(self, {}, {"/callback": later})
        client.send(b"GET /callback HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(logged, [])
        # In flight like a route's request: a shutdown drain waits for it.
        self.assertEqual(inflight.count, 1)
        later.pending[0].write(b"welcome")
        later.pending[0].finish()
        self.assertIn(b"welcome", client.transport.value())
        self.assertEqual([(r["route"], r["status"]) for r in logged], [("/callback", 200)])
        self.assertEqual(inflight.count, 0)

    def test_plain_resource_skips_the_route_chain(self) -> None:
        client, logged, _ = gateway_with(self, {"/routed": Plain()}, {"/login": Plain()})
        client.send(b"GET /login HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = client.transport.value()
        self.assertTrue(raw.endswith(b"plain answer"))
        # No per-route stage ran: no request id, and the route chain logged nothing.
        self.assertNotIn(b"X-Request-Id", raw)
        self.assertEqual((logged[0]["route"], logged[0]["request_id"]), ("/login", ""))
        client.transport.clear()
        client.send(b"GET /routed HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"X-Request-Id", client.transport.value())
        self.assertEqual(logged[1]["route"], "/routed")
