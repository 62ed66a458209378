"""
The daemon under systemd's eyes: C{sd_notify} messages (READY once listening,
RELOADING/READY around a reload that switches, STOPPING when it drains; a refused
reload's are in test_reload_notify) on a real datagram socket, and
SIGHUP reloads of a real twistd process with a request in flight.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import DatagramProtocol
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.notify import SystemdNotifier
from tests.support.backends import SiteBackend
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import DAEMON_ENV, sleep, spawn_twistd
from tests.support.processes import http_get, kill, raw_exchange

reactor: Any = _reactor


class _Messages(DatagramProtocol):
    """
    Collects what arrives on the notification socket, one message per datagram.
    """

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._waiters: list[tuple[str, int, Deferred[None]]] = []

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        self.messages.append(datagram.decode())
        for waiter in list(self._waiters):
            key, count, fired = waiter
            if self._count(key) >= count:
                self._waiters.remove(waiter)
                if not fired.called:
                    fired.callback(None)

    def _count(self, key: str) -> int:
        return sum(1 for message in self.messages if key in message.splitlines())

    def wait_for(self, key: str, count: int = 1) -> Deferred[None]:
        """
        Fire once C{count} messages carry the line C{key} (such as C{READY=1}).
        """
        fired: Deferred[None] = Deferred()
        if self._count(key) >= count:
            fired.callback(None)
        else:
            self._waiters.append((key, count, fired))
        return fired.addTimeout(15, reactor)

    def keys(self) -> list[str]:
        """
        The first line of each message (READY=1, RELOADING=1, STOPPING=1, STATUS=...).
        """
        return [message.splitlines()[0] for message in self.messages]


def _route(name: str, match: str, handler: str, access: str = "") -> str:
    spec = f"{{{access}match: '{match}', handler: {handler}}}"
    return f"---\nkind: Route\nmetadata: {{name: {name}}}\nspec: {spec}\n"


class NotifierTests(SynchronousTestCase):
    """
    L{SystemdNotifier} without systemd.
    """

    def test_nothing_without_notify_socket(self) -> None:
        self.assertFalse(SystemdNotifier({}).ready("x"))
        self.assertFalse(SystemdNotifier({"NOTIFY_SOCKET": "relative"}).ready("x"))

    def test_abstract_name(self) -> None:
        self.assertEqual(SystemdNotifier({"NOTIFY_SOCKET": "@edgegw"}).address, "\0edgegw")

    def test_missing_socket_is_not_an_error(self) -> None:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": os.path.abspath(self.mktemp())})
        self.assertFalse(notifier.ready("x"))
        self.assertFalse(notifier.stopping())
        self.assertEqual(len(self.flushLoggedErrors()), 0)


class ReloadTests(TestCase):
    """
    A twistd process with C{NOTIFY_SOCKET} pointing at the test's datagram socket.
    """

    timeout = 60

    def setUp(self) -> None:
        self.held: list[Request] = []

        def slow(request: Request) -> bytes | int:
            if request.path == b"/slow":
                self.held.append(request)
                return NOT_DONE_YET
            return b"backend"

        self.backend = SiteBackend(slow).start()
        self.addCleanup(lambda: Deferred.fromCoroutine(self.backend.stop()))
        # A short path: trial's temporary directories can exceed AF_UNIX's 108 bytes.
        directory = tempfile.mkdtemp(prefix="edgegw-notify-")
        self.addCleanup(shutil.rmtree, directory, True)
        self.socket_path = os.path.join(directory, "notify")
        self.notes = _Messages()
        listening = reactor.listenUNIXDatagram(self.socket_path, self.notes)
        self.addCleanup(listening.stopListening)
        self.root = os.path.abspath(self.mktemp())
        proxy = f"{{type: reverse-proxy, upstream: 'http://127.0.0.1:{self.backend.port}'}}"
        write_tree(
            self.root,
            {
                "00-gateway.yaml": GATEWAY,
                "10-routes.yaml": _route("old", "/old", "{type: health}")
                + _route("slow", "/slow", proxy).replace(
                    "spec: {", "spec: {access: {auth: public}, ", 1
                ),
            },
        )

    async def start(self) -> int:
        env = {**DAEMON_ENV, "NOTIFY_SOCKET": self.socket_path}
        self.protocol, self.process = spawn_twistd(self.root, env=env)
        self.addCleanup(lambda: self.protocol.ended)
        self.addCleanup(kill, self.process)
        port = await self.protocol.listening
        await self.notes.wait_for("READY=1")
        return port

    async def output(self, text: str) -> str:
        """
        The daemon's output once it holds C{text} (log lines may come after the
        notification that followed them).
        """
        for _ in range(1000):
            output = self.protocol.output.decode()
            if text in output:
                return output
            await sleep(0.01)
        raise AssertionError(f"{text!r} not in {self.protocol.output!r}")

    async def test_ready_only_once_listening(self) -> None:
        env = {**DAEMON_ENV, "NOTIFY_SOCKET": self.socket_path}
        protocol, process = spawn_twistd(self.root, env=env)
        self.addCleanup(lambda: protocol.ended)
        self.addCleanup(kill, process)
        await self.notes.wait_for("READY=1")
        # READY=1 is sent after the listener is up: the port is already accepting.
        port = await protocol.listening
        answer = await http_get(f"http://127.0.0.1:{port}/old")
        self.assertEqual(answer.code, 200)
        await answer.content()
        ready = self.notes.messages[0].splitlines()
        self.assertEqual(ready[0], "READY=1")
        self.assertTrue(ready[1].startswith("STATUS=serving 2 routes on "), ready)

    async def test_valid_reload_with_a_request_in_flight(self) -> None:
        port = await self.start()
        base = f"http://127.0.0.1:{port}"
        # The connection stays open across the reload (tests/test_reload_connections.py):
        # this one asks to be closed after its response.
        in_flight = raw_exchange(
            port, b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        for _ in range(200):
            if self.held:
                break
            await sleep(0.01)
        self.assertEqual(len(self.held), 1)
        with open(os.path.join(self.root, "20-new.yaml"), "w") as stream:
            stream.write(_route("new", "/new", "{type: health}"))
        os.kill(self.process.pid, signal.SIGHUP)
        await self.notes.wait_for("READY=1", 2)
        self.assertEqual(self.notes.keys()[:3], ["READY=1", "RELOADING=1", "READY=1"])
        self.assertIn("MONOTONIC_USEC=", self.notes.messages[1])
        # The new configuration serves new connections...
        new = await http_get(base + "/new")
        self.assertEqual(new.code, 200)
        await new.content()
        # ...while the request in flight finishes on the old one, whole.
        held = self.held[0]
        held.write(b"finished late")
        held.finish()
        answer = await in_flight
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer)
        # Whole: the last chunk is there.
        self.assertTrue(answer.endswith(b"d\r\nfinished late\r\n0\r\n\r\n"), answer)
        await self.output("configuration reloaded from")

    async def test_old_connections_end_at_the_drain_timeout(self) -> None:
        """
        A request the old configuration still serves when its drainTimeout passes is cut,
        as at a stop: nothing goes on running on its stopped services.
        """
        with open(os.path.join(self.root, "00-gateway.yaml"), "w") as stream:
            stream.write(GATEWAY + "  drainTimeout: 1s\n")
        port = await self.start()
        in_flight = raw_exchange(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(200):
            if self.held:
                break
            await sleep(0.01)
        os.kill(self.process.pid, signal.SIGHUP)
        await self.notes.wait_for("READY=1", 2)
        answer = await in_flight.addTimeout(10, reactor)
        # Cut, not answered: the backend never finished.
        self.assertEqual(answer, b"")

    async def test_invalid_reload_keeps_serving(self) -> None:
        port = await self.start()
        with open(os.path.join(self.root, "20-bad.yaml"), "w") as stream:
            stream.write(_route("bad", "/bad", "{type: reverse-proxy}"))
        os.kill(self.process.pid, signal.SIGHUP)
        output = await self.output("reload refused, the running configuration keeps serving")
        self.assertIn('20-bad.yaml, document 1, Route "bad": spec.handler.upstream', output)
        answer = await http_get(f"http://127.0.0.1:{port}/old")
        self.assertEqual(answer.code, 200)
        await answer.content()
        missing = await http_get(f"http://127.0.0.1:{port}/bad")
        self.assertEqual(missing.code, 404)
        await missing.content()

    async def test_listen_change_is_refused(self) -> None:
        port = await self.start()
        with open(os.path.join(self.root, "00-gateway.yaml"), "w") as stream:
            stream.write(GATEWAY.replace('"127.0.0.1:0"', '"127.0.0.1:1"'))
        os.kill(self.process.pid, signal.SIGHUP)
        await self.output(
            "spec.listen: changed from 127.0.0.1:0 to 127.0.0.1:1: a new listen address "
            "needs a restart"
        )
        answer = await http_get(f"http://127.0.0.1:{port}/old")
        self.assertEqual(answer.code, 200)
        await answer.content()

    async def test_stopping_is_announced(self) -> None:
        await self.start()
        self.process.signalProcess("TERM")
        await self.notes.wait_for("STOPPING=1")
        await self.protocol.ended
        self.assertEqual(self.notes.keys()[-1], "STOPPING=1")
