"""
The readiness endpoint (issue 18, point 3): C{Gateway.spec.readiness} mounts it; it
answers 200 only while the gateway listens and does not drain, its IdP's discovery and
keys are loaded and its state store answers — flipping with a real IdP (the fake one,
over HTTP) going down and up and a real redis-server stopped and started — and 503 with
the reasons otherwise.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from edgegw.config.parse import load_config
from edgegw.handlers.readiness import Readiness, ReadinessResource
from edgegw.service import GatewayService
from edgegw.state.store import StoreUnavailableError
from tests.support.configs import load_text, problems_of, write_tree
from tests.support.daemons import http_exchange
from tests.support.fake_idp import FakeIdP
from tests.support.processes import port_of
from tests.support.redis import redis_server

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"


class ConfigTests(SynchronousTestCase):
    def test_off_by_default(self) -> None:
        self.assertIsNone(load_text(self.mktemp(), "").gateway.readiness_path)

    def test_block(self) -> None:
        text = """\
kind: Gateway
metadata: {name: gw}
spec:
  readiness: {}
"""
        self.assertEqual(
            load_text(self.mktemp(), text, gateway=False).gateway.readiness_path, "/readyz"
        )
        custom = text.replace("readiness: {}", "readiness: {path: /ready}")
        self.assertEqual(
            load_text(self.mktemp(), custom, gateway=False).gateway.readiness_path, "/ready"
        )

    def test_errors(self) -> None:
        text = """\
kind: Gateway
metadata: {name: gw}
spec:
  readiness: {path: "ready?x", pth: /r}
"""
        problems = problems_of(self.mktemp(), text, gateway=False)
        self.assertEqual(
            [p.split(": ", 1)[1] for p in problems],
            [
                'spec.readiness.path: "ready?x" is not a plain absolute path (such as /readyz)',
                'spec.readiness.pth: unknown field; did you mean "path"?',
            ],
        )

    def test_a_route_on_the_readiness_path_is_never_reached(self) -> None:
        text = """\
kind: Gateway
metadata: {name: gw}
spec:
  readiness: {}
---
kind: Route
metadata: {name: r}
spec:
  match: GET /readyz
  handler: {type: health}
"""
        problems = problems_of(self.mktemp(), text, gateway=False)
        self.assertEqual(len(problems), 1)
        self.assertIn(
            "spec.match: never reached: /readyz is the gateway's own readiness endpoint "
            "(spec.readiness.path), answered before any Route",
            problems[0],
        )


class _Store:
    """
    A state store whose reads succeed or fail, counting them.
    """

    timeout = 2.0

    def __init__(self) -> None:
        self.reachable = True
        self.reads = 0
        self.pending: list[Deferred[bytes | None]] = []
        self.hold = False

    def get(self, key: bytes) -> Deferred[bytes | None]:
        self.reads += 1
        if self.hold:
            waiting: Deferred[bytes | None] = Deferred()
            self.pending.append(waiting)
            return waiting
        if self.reachable:
            return succeed(None)
        return fail(StoreUnavailableError("down"))


class ResourceTests(SynchronousTestCase):
    def answer(self, resource: ReadinessResource, method: bytes = b"GET") -> DummyRequest:
        request = DummyRequest([b""])
        request.method = method
        result = resource.render(request)  # type: ignore[arg-type]
        self.assertEqual(result, NOT_DONE_YET)
        return request

    def held(self) -> tuple[_Store, Clock, ReadinessResource]:
        """
        A listening gateway's endpoint whose store holds its answers.
        """
        store = _Store()
        store.hold = True
        clock = Clock()
        resource = ReadinessResource(Readiness(listening=True), clock, store=store)  # type: ignore[arg-type]
        return store, clock, resource

    def test_reasons(self) -> None:
        state = Readiness()
        store = _Store()
        clock = Clock()
        resource = ReadinessResource(state, clock, store=store)  # type: ignore[arg-type]
        request = self.answer(resource)
        self.assertEqual(request.responseCode, 503)
        self.assertEqual(
            json.loads(b"".join(request.written)),
            {"status": "not ready", "reasons": ["not listening yet"]},
        )
        state.listening = True
        clock.advance(1)
        request = self.answer(resource)
        self.assertEqual(
            (request.responseCode, b"".join(request.written)), (200, b'{"status":"ready"}')
        )
        self.assertEqual(request.responseHeaders.getRawHeaders(b"cache-control"), [b"no-store"])
        store.reachable = False
        clock.advance(1)
        state.draining = True
        request = self.answer(resource)
        self.assertEqual(
            json.loads(b"".join(request.written))["reasons"],
            ["draining", "the state store cannot be reached"],
        )
        head = self.answer(resource, b"HEAD")
        self.assertEqual((head.responseCode, head.written), (503, []))

    def test_the_store_is_asked_at_most_once_a_second(self) -> None:
        store, clock, resource = self.held()
        held = [self.answer(resource) for _ in range(20)]
        self.assertEqual(store.reads, 1)  # one check for all of them
        store.pending[0].callback(None)
        self.assertEqual({request.responseCode for request in held}, {200})
        for _ in range(20):
            self.answer(resource)
        clock.advance(0.5)
        self.answer(resource)
        self.assertEqual(store.reads, 1)
        clock.advance(0.6)
        store.hold = False
        self.answer(resource)
        self.assertEqual(store.reads, 2)

    def test_a_store_that_never_answers_is_unreachable(self) -> None:
        store, clock, resource = self.held()
        held = [self.answer(resource) for _ in range(3)]
        clock.advance(store.timeout + 1)
        self.assertEqual({request.responseCode for request in held}, {503})
        self.assertEqual(
            json.loads(b"".join(held[0].written))["reasons"], ["the state store cannot be reached"]
        )


class FlipTests(TestCase):
    """
    A gateway service (as the daemon runs it) with an IdP and Redis, on real sockets.
    """

    async def test_flips_with_the_idp_and_redis(self) -> None:
        idp = FakeIdP()
        idp.discovery_status = 503
        await idp.start(self)
        redis = await redis_server(self)
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  readiness: {{}}
  session: {{key: "{KEY}"}}
  stateProvider:
    type: kvstore
    config: {{address: "{redis.address}", timeout: 1s}}
---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{idp.issuer}"
  clientID: gw
  clientSecret: gw-secret
---
kind: Route
metadata: {{name: health}}
spec:
  match: /healthz
  handler: {{type: health}}
"""
        from edgegw.assembly.assemble import build_gateway

        root = write_tree(self.mktemp(), {"a.yaml": text})
        gateway = build_gateway(
            load_config(root, {}),
            reactor,
            state_options={"first_retry": 0.05, "retry_cap": 0.3},
        )
        assert gateway.idp is not None
        gateway.idp.first_retry = 0.05
        gateway.idp.retry_cap = 0.2
        service = GatewayService(gateway, reactor)
        service.startService()
        self.addCleanup(service.stopService)
        assert service.port is not None
        port = port_of(service.port)

        async def readiness() -> tuple[int, Any]:
            reply = await http_exchange(port, "GET", "/readyz")
            return reply.status, json.loads(reply.body)

        async def until(status: int, reason: str | None = None) -> Any:
            for _ in range(300):
                got, body = await readiness()
                if got == status and (reason is None or reason in body.get("reasons", [])):
                    return body
                await deferLater(reactor, 0.05, lambda: None)
            self.fail(f"readiness never {status} {reason}: last {got} {body}")

        body = await until(503)
        self.assertIn("the IdP's discovery document is not loaded", body["reasons"])
        post = await http_exchange(port, "POST", "/readyz")
        self.assertEqual((post.status, post.header(b"Allow")), (405, b"GET, HEAD"))
        idp.discovery_status = 200
        await until(200)
        self.assertEqual((await http_exchange(port, "GET", "/healthz")).status, 200)

        await redis.stop()
        body = await until(503, "the state store cannot be reached")
        self.assertEqual(body["reasons"], ["the state store cannot be reached"])
        # Alive all the same.
        self.assertEqual((await http_exchange(port, "GET", "/healthz")).status, 200)
        await redis.start()
        await until(200)
        stopping = service.stopService()
        assert gateway.readiness is not None
        self.assertTrue(gateway.readiness.draining)
        await stopping
