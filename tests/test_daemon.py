"""
The daemon as operators run it: C{twistd -n edgegw --config PATH}, C{--check}, the
C{edgegw check} command, the service tree the plugin builds, and graceful shutdown.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import sys
from typing import Any, cast

from twisted.application.service import IService
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred
from twisted.internet.error import ConnectionRefusedError, ProcessTerminated
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.config.parse import load_config
from edgegw.service import GatewayService, build_service
from tests.support.backends import SiteBackend
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import DAEMON_ENV, GatewayProcess, sleep, spawn_twistd
from tests.support.processes import (
    REPO_ROOT,
    ProcessOutput,
    edgegw_twistd_args,
    http_get,
    kill,
    port_of,
    raw_exchange,
    refused_port,
    venv_bin,
)
from twisted.plugins.edgegw_plugin import edgegw

EXAMPLE = str(REPO_ROOT / "etc" / "edgegw")


class CommandLineTests(TestCase):
    @inlineCallbacks
    def test_check_prints_route_table(self) -> Any:
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", EXAMPLE], env=DAEMON_ENV
        )
        self.assertEqual(code, 0, err)
        text = out.decode()
        self.assertIn("configuration " + EXAMPLE + " is valid", text)
        self.assertRegex(
            text,
            r"PATTERN\s+NAME\s+TYPE\s+AUTH\s+GROUPS\s+POLICIES\s+ON-DENY\s+"
            r"REQUEST-PLUGINS\s+RESPONSE-PLUGINS\s+HANDLER",
        )
        self.assertRegex(text, r"GET /healthz\s+health\s+app\s+public\s+-\s+-\s+-\s+-\s+-\s+health")
        self.assertRegex(text, r"GET /\s+spa\s+app\s+public\s+-\s+-\s+-\s+-\s+-\s+static ")

    @inlineCallbacks
    def test_twistd_check_flag(self) -> Any:
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("twistd"),
            [*edgegw_twistd_args(EXAMPLE), "--check"],
            env=DAEMON_ENV,
            path=str(REPO_ROOT),
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
            [venv_bin("edgegw"), "check", root],
            [venv_bin("twistd"), *edgegw_twistd_args(root)],
        ):
            out, err, code = yield getProcessOutputAndValue(
                argv[0], argv[1:], env=DAEMON_ENV, path=str(REPO_ROOT)
            )
            self.assertEqual(code, 1, argv)
            text = (out + err).decode()
            self.assertIn(
                f'{root}/a.yaml, document 2, Route "r": spec.handler: required field is missing',
                text,
            )
            self.assertNotIn("Traceback", text)

    @inlineCallbacks
    def test_check_refuses_a_pattern_that_is_not_text(self) -> Any:
        # Issue 10, point 7: "valid", then a UnicodeEncodeError traceback, before.
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY + "---\nkind: Route\nmetadata: {name: r}\n"
                'spec: {match: "/\\ud800x", handler: {type: health}}\n'
            },
        )
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", root], env=DAEMON_ENV
        )
        text = (out + err).decode()
        self.assertEqual(code, 1, text)
        self.assertEqual(out, b"")
        self.assertIn(
            f'{root}/a.yaml, document 2, Route "r": spec.match: "/\\ud800x" is not valid '
            "Unicode text: U+D800 is a lone surrogate",
            text,
        )
        self.assertNotIn("Traceback", text)

    @inlineCallbacks
    def test_check_creates_no_access_log_and_refuses_a_fifo(self) -> Any:
        # Issue 10, point 7: a FIFO made the check (and ExecStartPre) hang; a file path
        # was created by the check (as root, for a service that then cannot write it).
        self.timeout = 30
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        access_log = os.path.join(directory, "access.log")
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY + f'  accessLog: {{output: "{access_log}"}}\n'
                "---\nkind: Route\nmetadata: {name: r}\n"
                "spec: {match: /, handler: {type: health}}\n"
            },
        )
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", root], env=DAEMON_ENV
        )
        self.assertEqual(code, 0, err)
        self.assertIn(b"is valid", out)
        self.assertFalse(os.path.exists(access_log))
        os.mkfifo(access_log)
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", root], env=DAEMON_ENV
        )
        self.assertEqual(code, 1, out)
        self.assertIn(
            f'{root}/a.yaml, document 1, Gateway "gw": spec.accessLog.output: {access_log} '
            'is not a regular file (use "-" for standard output)',
            err.decode(),
        )

    @inlineCallbacks
    def test_usage(self) -> Any:
        _, err, code = yield getProcessOutputAndValue(venv_bin("edgegw"), [], env=DAEMON_ENV)
        self.assertEqual(code, 2)
        self.assertIn(b"usage: edgegw check", err)


class ServeExampleTests(TestCase):
    """
    The example configuration served by a real twistd process.
    """

    async def test_demo_backend_behind_the_api_routes(self) -> None:
        # What `make run` starts: the demo backend, and the gateway in front of it.
        demo_port = await refused_port()
        demo_protocol = ProcessOutput()
        demo = reactor.spawnProcess(
            demo_protocol,
            sys.executable,
            [
                sys.executable,
                str(REPO_ROOT / "examples" / "demo" / "backend.py"),
                "--port",
                str(demo_port),
            ],
            env=DAEMON_ENV,
        )
        self.addCleanup(lambda: demo_protocol.ended)
        self.addCleanup(kill, demo)
        env = {**DAEMON_ENV, "EDGEGW_LISTEN": "127.0.0.1:0", "EDGEGW_DEMO_PORT": str(demo_port)}
        protocol, process = spawn_twistd(EXAMPLE, env=env)
        self.addCleanup(kill, process)
        port = await protocol.listening
        base = f"http://127.0.0.1:{port}"
        # The demo backend may still be starting: the fan-out answers 502 until it is up.
        for _ in range(400):
            dashboard = await http_get(base + "/dash/7")
            if dashboard.code == 200:
                break
            await dashboard.content()
            await sleep(0.05)
        self.assertEqual(
            await dashboard.json(),
            {
                "user": {"id": "7", "name": "User 7"},
                "orders": [{"order": 1, "user": "7"}, {"order": 2}],
                "recommendations": {"items": ["tea", "biscuits"]},
            },
        )
        echoed = await http_get(base + "/api/hello?x=1")
        self.assertEqual(echoed.code, 200)
        document = await echoed.json()
        self.assertEqual((document["method"], document["path"]), ("GET", "/hello?x=1"))
        self.assertEqual(len(document["headers"]["x-request-id"]), 32)
        # The login-protected route sends an anonymous visitor to the login, which
        # answers 503 here: the example's demo IdP (make run starts it) is not running.
        me = await http_get(base + "/me/", allow_redirects=False)
        self.assertEqual(me.code, 302)
        self.assertEqual(me.headers.getRawHeaders("location"), ["/auth/login?return_to=%2Fme%2F"])
        await me.content()
        login = await http_get(base + "/auth/login?return_to=/me/")
        self.assertEqual(login.code, 503)
        self.assertTrue(login.headers.getRawHeaders("retry-after"))
        await login.content()
        # The example's metrics (on their own listener) counted the fan-out.
        scrape = re.search(r"metrics scrape listener on .*?port=(\d+)", protocol.output.decode())
        assert scrape is not None, protocol.output
        metrics = await http_get(f"http://127.0.0.1:{scrape.group(1)}/metrics")
        self.assertEqual(metrics.code, 200)
        self.assertIn(b'http_route="GET /dash/{id}"', await metrics.content())
        process.signalProcess("TERM")
        await protocol.ended

    @inlineCallbacks
    def test_serves_spa_and_health_then_stops_on_sigterm(self) -> Any:
        env = {**DAEMON_ENV, "EDGEGW_LISTEN": "127.0.0.1:0"}
        protocol, process = spawn_twistd(EXAMPLE, env=env)
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
        yield protocol.ended
        reason = protocol.reason
        # twistd re-raises the signal it stopped on, so systemd sees a clean SIGTERM exit.
        self.assertIsInstance(reason, ProcessTerminated, protocol.output)
        self.assertEqual(cast(ProcessTerminated, reason).signal, signal.SIGTERM)
        self.assertIn(b"Received SIGTERM, shutting down.", protocol.output)
        self.assertIn(b"Server Shut Down.", protocol.output)
        self.assertNotIn(b"Traceback", protocol.output)
        # Without --reactor, twistd edgegw runs on its own reactor (edgegw.reactor).
        self.assertIn(b"(reactor EdgeReactor)", protocol.output)

    @inlineCallbacks
    def test_a_chosen_reactor_is_kept(self) -> Any:
        env = {**DAEMON_ENV, "EDGEGW_LISTEN": "127.0.0.1:0"}
        protocol, process = spawn_twistd(EXAMPLE, "--reactor=poll", env=env)
        self.addCleanup(kill, process)
        port = yield protocol.listening
        health = yield http_get(f"http://127.0.0.1:{port}/healthz")
        self.assertEqual(health.code, 200)
        yield health.content()
        self.assertIn(b"(reactor PollReactor)", protocol.output)
        process.signalProcess("TERM")
        yield protocol.ended


class LargeFileTests(TestCase):
    """
    twistd edgegw (on edgegw's reactor) serving a file of several MiB from a static route:
    Twisted writes it from timed calls, and a write flush that resumed it must not leave
    it waiting for the next unrelated timer (it had taken seconds per MiB).
    """

    timeout = 30

    async def test_large_static_file(self) -> None:
        # 6 MiB: the stall wrote 128 KiB a second, past this test's 30 s timeout.
        data = os.urandom(6 * 1024 * 1024)
        gateway = GatewayProcess(self, {"a.yaml": ""})
        www = os.path.join(gateway.directory, "..", "www")
        os.makedirs(www)
        with open(os.path.join(www, "big.bin"), "wb") as stream:
            stream.write(data)
        with open(os.path.join(gateway.directory, "a.yaml"), "w") as stream:
            stream.write(
                GATEWAY
                + "---\nkind: Route\nmetadata: {name: s}\nspec:\n  match: GET /\n"
                + f'  handler: {{type: static, dir: "{os.path.abspath(www)}"}}\n'
            )
        await gateway.start()
        response = await http_get(gateway.url("/big.bin"))
        body = await response.content()
        self.assertEqual((response.code, len(body)), (200, len(data)))
        self.assertEqual(body, data)


class HeldBackend:
    """
    A real backend on 127.0.0.1:0 that holds every request until the test answers it.
    """

    def __init__(self, test: TestCase) -> None:
        self._arrivals: list[Deferred[Request]] = []
        self.site = SiteBackend(self._hold).start()
        test.addCleanup(self.site.stop)

    @property
    def url(self) -> str:
        """
        The backend's base URL.
        """
        return f"http://127.0.0.1:{self.site.port}"

    def arrival(self) -> Deferred[Request]:
        """
        Fire with the next request that arrives, held.
        """
        arrival: Deferred[Request] = Deferred()
        self._arrivals.append(arrival)
        return arrival

    def _hold(self, request: Request) -> int:
        arrivals, self._arrivals = self._arrivals, []
        for arrival in arrivals:
            arrival.callback(request)
        return NOT_DONE_YET

    @staticmethod
    def answer(request: Request, body: bytes, close: bool = False) -> None:
        """
        Answer a held request: 200 with C{body} (and C{Connection: close} if told).
        """
        request.setHeader(b"Content-Length", b"%d" % len(body))
        if close:
            request.setHeader(b"Connection", b"close")
        request.write(body)
        request.finish()


def write_config(
    test: TestCase,
    upstream: str,
    drain: str,
    access_log: str | None = None,
    telemetry: bool = False,
) -> str:
    """
    A configuration directory: the gateway on 127.0.0.1:0 with C{drainTimeout: drain},
    one reverse-proxy route C{/} to C{upstream}, and optionally an access-log file and a
    Telemetry resource (no exporter).
    """
    gateway = GATEWAY + f"  drainTimeout: {drain}\n"
    if access_log is not None:
        gateway += f'  accessLog: {{output: "{access_log}"}}\n'
    documents = [
        gateway,
        "kind: Route\nmetadata: {name: slow}\n"
        f'spec: {{match: /, handler: {{type: reverse-proxy, upstream: "{upstream}"}}}}\n',
    ]
    if telemetry:
        documents.append("kind: Telemetry\nmetadata: {name: t}\nspec: {service: {name: edge}}\n")
    return write_tree(test.mktemp(), {"gateway.yaml": "---\n".join(documents)})


def stop_if_running(service: IService) -> Any:
    """
    Stop C{service} unless it has stopped (a cleanup for tests that fail half-way).
    """
    return service.stopService() if service.running else None


async def refused(port: int) -> BaseException:
    """
    What a new connection to 127.0.0.1:C{port} gets (the test expects a refusal).
    """
    outcome = await http_get(f"http://127.0.0.1:{port}/").addErrback(lambda f: f.value)
    return cast(BaseException, outcome)


class DrainTests(TestCase):
    """
    Graceful shutdown: stop accepting, let in-flight requests finish, bounded. The
    gateway is built through L{build_service} from a configuration whose route goes to a
    real backend that answers when the test says so.
    """

    def start(self, drain: str) -> tuple[GatewayService, HeldBackend]:
        backend = HeldBackend(self)
        root = write_config(self, backend.url, drain)
        service = build_service(load_config(root, {}), reactor)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(stop_if_running, service)
        return service, backend

    async def test_in_flight_request_finishes_before_stop(self) -> None:
        service, backend = self.start("5s")
        port = port_of(service)
        arrived = backend.arrival()
        # A keep-alive client: the gateway itself must decide to close the connection.
        pending = raw_exchange(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held = await arrived
        stopped = service.stopService()
        self.assertNoResult(stopped)
        self.assertEqual(service.gateway.inflight.count, 1)
        backend.answer(held, b"slow answer")
        raw = await pending
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw)
        self.assertIn(b"\r\nConnection: close\r\n", raw)
        self.assertTrue(raw.endswith(b"\r\n\r\nslow answer"), raw)
        await stopped
        self.assertIsInstance(await refused(port), ConnectionRefusedError)

    async def test_drain_is_bounded(self) -> None:
        service, backend = self.start("200ms")
        arrived = backend.arrival()
        pending = raw_exchange(port_of(service), b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held = await arrived
        # Stopping completes although the request is still in flight upstream.
        await service.stopService()
        self.assertEqual(service.gateway.inflight.count, 1)
        self.assertFalse(held.finished)
        backend.answer(held, b"late answer", close=True)
        raw = await pending
        self.assertIn(b"\r\nConnection: close\r\n", raw)
        self.assertEqual(service.gateway.inflight.count, 0)


class ServiceTreeTests(TestCase):
    """
    The service tree that twistd runs, as the plugin builds it.
    """

    async def test_stop_before_start_stops_nothing(self) -> None:
        root = write_config(self, "http://127.0.0.1:9", "1s")
        service = build_service(load_config(root, {}), reactor)
        events: list[str] = []
        for child in [service.listener, *service.generation]:
            record_stop(child, events)
        await service.stopService()
        self.assertEqual(events, [])

    async def test_stop_asked_twice_is_one_stop(self) -> None:
        backend = HeldBackend(self)
        root = write_config(self, backend.url, "5s")
        service = build_service(load_config(root, {}), reactor)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(stop_if_running, service)
        events: list[str] = []
        for child in [service.listener, *service.generation]:
            record_stop(child, events)
        arrived = backend.arrival()
        pending = raw_exchange(port_of(service), b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held = await arrived
        first = service.stopService()
        second = service.stopService()
        self.assertNoResult(first)
        self.assertNoResult(second)
        backend.answer(held, b"done")
        await pending
        await first
        await second
        self.assertEqual(
            [event for event in events if event.endswith(" stopped")],
            ["listener stopped", "upstream-pool stopped", "access-log stopped"],
        )

    async def test_plugin_tree_and_stop_order(self) -> None:
        backend = HeldBackend(self)
        access_log = os.path.abspath(self.mktemp())
        root = write_config(self, backend.url, "5s", access_log=access_log, telemetry=True)
        options = edgegw.options()
        options.parseOptions(["--config", root])
        # makeService tunes the garbage collector for the daemon; not for this process.
        self.addCleanup(gc.set_threshold, *gc.get_threshold())
        self.addCleanup(gc.unfreeze)
        self.assertFalse(os.path.exists(access_log))
        service = edgegw.makeService(options)
        assert isinstance(service, GatewayService)
        # The daemon creates its access log as it starts (edgegw check does not).
        self.assertTrue(os.path.isfile(access_log))
        # The listener, then the serving configuration's generation of services.
        self.assertEqual(list(service), [service.listener, service.generation])
        children = [service.listener, *service.generation]
        self.assertEqual(
            [child.name for child in children],
            ["listener", "access-log", "upstream-pool", "telemetry"],
        )

        events: list[str] = []
        stops = {child.name: record_stop(child, events) for child in children}
        service.privilegedStartService()
        service.startService()
        self.addCleanup(stop_if_running, service)
        self.assertTrue(all(child.running for child in children))
        port = port_of(service)

        arrived = backend.arrival()
        pending = raw_exchange(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held = await arrived
        # Asked before stopping, so that it is told before the service's own drain.
        service.gateway.inflight.drained().addCallback(
            lambda _: events.append("in-flight request finished")
        )
        stopping = service.stopService()
        await stops["listener"]
        self.assertIsInstance(await refused(port), ConnectionRefusedError)
        events.append("new connection refused")
        self.assertNoResult(stopping)
        self.assertEqual(service.gateway.inflight.count, 1)

        backend.answer(held, b"slow answer")
        raw = await pending
        await stopping
        self.assertEqual(
            events,
            [
                "listener stopping",
                "listener stopped",
                "new connection refused",
                "in-flight request finished",
                "telemetry stopping",
                "telemetry stopped",
                "upstream-pool stopping",
                "upstream-pool stopped",
                "access-log stopping",
                "access-log stopped",
            ],
        )
        self.assertFalse(any(child.running for child in children))
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw)
        self.assertIn(b"\r\nConnection: close\r\n", raw)
        self.assertTrue(raw.endswith(b"\r\n\r\nslow answer"), raw)
        # The access log was flushed on stop, after the drain: the line is there.
        with open(access_log, "rb") as lines:
            records = [json.loads(line) for line in lines]
        self.assertEqual(
            [(r["method"], r["path"], r["status"], r["route"]) for r in records],
            [("GET", "/slow", 200, "/")],
        )
        # The upstream pool closed the connection the answer left idle.
        await backend.site.all_lost()
        self.assertEqual(backend.site.channels, [])


def record_stop(child: IService, events: list[str]) -> Deferred[None]:
    """
    Wrap C{child.stopService} (on the instance) so that it notes in C{events} when it
    is called and when it has finished; return a Deferred that fires then.
    """
    original = child.stopService
    name = child.name
    finished: Deferred[None] = Deferred()

    def stop() -> Deferred[Any]:
        events.append(f"{name} stopping")
        stopped: Deferred[Any] = maybeDeferred(original)

        def done(result: object) -> object:
            events.append(f"{name} stopped")
            finished.callback(None)
            return result

        return stopped.addCallback(done)

    setattr(child, "stopService", stop)  # noqa: B010
    return finished
