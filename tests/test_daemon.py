"""
The daemon as operators run it: C{twistd -n edgegw --config PATH}, C{--check}, the
C{edgegw check} command, and graceful shutdown.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.error import ConnectionRefusedError, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from edgegw.chain.exchange import Exchange
from edgegw.config.parse import load_config
from edgegw.gateway import build_gateway
from edgegw.service import GatewayService
from tests.support.configs import GATEWAY, write_tree
from tests.support.processes import http_get, kill, port_of, raw_exchange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "etc", "edgegw")
BIN = os.path.dirname(sys.executable)
ENV = {**os.environ, "PYTHONPATH": ROOT}


class DaemonProtocol(ProcessProtocol):
    """
    Collects a twistd child's output; fires C{listening} with the bound port.
    """

    def __init__(self) -> None:
        self.output = b""
        self.listening: Deferred[int] = Deferred()
        self.ended: Deferred[BaseException] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output += data
        found = re.search(rb"edgegw listening on .*?port=(\d+)", self.output)
        if found and not self.listening.called:
            self.listening.callback(int(found.group(1)))

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        if not self.listening.called:
            self.listening.errback(RuntimeError(self.output.decode(errors="replace")))
        self.ended.callback(reason.value or Exception("process ended"))


def twistd(config: str, env: dict[str, str] | None = None) -> tuple[DaemonProtocol, Any]:
    protocol = DaemonProtocol()
    process = reactor.spawnProcess(
        protocol,
        os.path.join(BIN, "twistd"),
        ["twistd", "-n", "--pidfile=", "edgegw", "--config", config],
        env=env or ENV,
        path=ROOT,
    )
    return protocol, process


class CommandLineTests(TestCase):
    @inlineCallbacks
    def test_check_prints_route_table(self) -> Any:
        out, err, code = yield getProcessOutputAndValue(
            os.path.join(BIN, "edgegw"), ["check", EXAMPLE], env=ENV
        )
        self.assertEqual(code, 0, err)
        text = out.decode()
        self.assertIn("configuration " + EXAMPLE + " is valid", text)
        self.assertRegex(
            text, r"PATTERN\s+NAME\s+TYPE\s+AUTH\s+GROUPS\s+POLICIES\s+ON-DENY\s+HANDLER"
        )
        self.assertRegex(text, r"GET /healthz\s+health\s+app\s+public\s+-\s+-\s+-\s+health")
        self.assertRegex(text, r"GET /\s+spa\s+app\s+public\s+-\s+-\s+-\s+static ")

    @inlineCallbacks
    def test_twistd_check_flag(self) -> Any:
        out, err, code = yield getProcessOutputAndValue(
            os.path.join(BIN, "twistd"),
            ["-n", "--pidfile=", "edgegw", "--config", EXAMPLE, "--check"],
            env=ENV,
            path=ROOT,
        )
        self.assertEqual(code, 0, err)
        self.assertIn(b"GET /healthz", out)

    @inlineCallbacks
    def test_bad_config_exits_1_without_traceback(self) -> Any:
        root = write_tree(
            self.mktemp(),
            {"a.yaml": GATEWAY + "---\nkind: Route\nmetadata: {name: r}\nspec: {match: /}\n"},
        )
        for argv in (
            [os.path.join(BIN, "edgegw"), "check", root],
            [os.path.join(BIN, "twistd"), "-n", "--pidfile=", "edgegw", "--config", root],
        ):
            out, err, code = yield getProcessOutputAndValue(argv[0], argv[1:], env=ENV, path=ROOT)
            self.assertEqual(code, 1, argv)
            text = (out + err).decode()
            self.assertIn(
                f'{root}/a.yaml, document 2, Route "r": spec.handler: required field is missing',
                text,
            )
            self.assertNotIn("Traceback", text)

    @inlineCallbacks
    def test_usage(self) -> Any:
        _, err, code = yield getProcessOutputAndValue(os.path.join(BIN, "edgegw"), [], env=ENV)
        self.assertEqual(code, 2)
        self.assertIn(b"usage: edgegw check", err)


class ServeExampleTests(TestCase):
    """
    The example configuration served by a real twistd process.
    """

    @inlineCallbacks
    def test_serves_spa_and_health_then_stops_on_sigterm(self) -> Any:
        env = {**ENV, "EDGEGW_LISTEN": "127.0.0.1:0"}
        protocol, process = twistd(EXAMPLE, env)
        self.addCleanup(kill, process)
        port = yield protocol.listening
        base = f"http://127.0.0.1:{port}"
        health = yield http_get(base + "/healthz")
        self.assertEqual(health.code, 200)
        self.assertEqual((yield health.json()), {"status": "ok"})
        page = yield http_get(base + "/users/42")
        self.assertEqual(page.code, 200)
        self.assertEqual(page.headers.getRawHeaders("cache-control"), ["no-cache"])
        self.assertIn(b"<title>edgegw example app</title>", (yield page.content()))
        script = yield http_get(base + "/assets/app.js")
        self.assertEqual(script.code, 200)
        yield script.content()
        missing = yield http_get(base + "/assets/missing.js")
        self.assertEqual(missing.code, 404)
        yield missing.content()
        process.signalProcess("TERM")
        reason = yield protocol.ended
        # twistd re-raises the signal it stopped on, so systemd sees a clean SIGTERM exit.
        self.assertIsInstance(reason, ProcessTerminated, protocol.output)
        self.assertEqual(reason.signal, signal.SIGTERM)
        self.assertIn(b"Received SIGTERM, shutting down.", protocol.output)
        self.assertIn(b"Server Shut Down.", protocol.output)
        self.assertNotIn(b"Traceback", protocol.output)


class DrainTests(TestCase):
    """
    Graceful shutdown: stop accepting, let in-flight requests finish, bounded.
    """

    def service(self, drain: str) -> tuple[GatewayService, list[Deferred[None]]]:
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY.replace(
                    'listen: "127.0.0.1:0"', f'listen: "127.0.0.1:0"\n  drainTimeout: {drain}'
                )
                + "---\nkind: Route\nmetadata: {name: r}\n"
                + "spec: {match: /, handler: {type: health}}\n"
            },
        )
        gateway = build_gateway(load_config(root, {}), reactor)
        gates: list[Deferred[None]] = []
        runner = gateway.site.resource.dispatcher.mux.route("GET", "", "/").target
        inner = runner._handler

        async def gated(exchange: Exchange) -> None:
            gate: Deferred[None] = Deferred()
            gates.append(gate)
            await gate
            await inner(exchange)

        runner._handler = gated
        service = GatewayService(gateway, reactor)
        service.privilegedStartService()
        service.startService()
        return service, gates

    @inlineCallbacks
    def test_in_flight_request_finishes_before_stop(self) -> Any:
        service, gates = self.service("5s")
        assert service.port is not None
        port = port_of(service)
        # A keep-alive client: the gateway itself must decide to close the connection.
        pending = raw_exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        while not gates:
            yield deferLater(0.01)
        stopped = service.stopService()
        self.assertNoResult(stopped)
        gates[0].callback(None)
        raw = yield pending
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw)
        self.assertIn(b"\r\nConnection: close\r\n", raw)
        self.assertTrue(raw.endswith(b'{"status":"ok"}'), raw)
        yield stopped
        refused = yield http_get(f"http://127.0.0.1:{port}/").addErrback(lambda f: f.value)
        self.assertIsInstance(refused, ConnectionRefusedError)

    @inlineCallbacks
    def test_drain_is_bounded(self) -> Any:
        service, gates = self.service("200ms")
        assert service.port is not None
        url = f"http://127.0.0.1:{port_of(service)}/"
        pending = http_get(url).addErrback(lambda f: None)
        while not gates:
            yield deferLater(0.01)
        yield service.stopService()
        self.assertEqual(service.gateway.inflight.count, 1)
        gates[0].callback(None)
        yield pending


def deferLater(seconds: float) -> Deferred[None]:
    from twisted.internet import task

    return task.deferLater(reactor, seconds, lambda: None)
