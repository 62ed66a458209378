"""
systemd sees the truth about each reload: what a real twistd process sends on
C{NOTIFY_SOCKET} (a datagram socket of the test's) around a reload taken and a reload
refused, and what C{edgegw reload --pid PID} (systemd's C{ExecReload}) answers: 0 for a
taken reload, 1 with the daemon's located errors on stderr for a refused one (also when
another reload was under way as it asked), 1 at once when there is no daemon to answer.
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
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from edgegw import reload as reload_module
from edgegw.config.parse import load_config
from edgegw.notify import SystemdNotifier, monotonic_usec
from edgegw.reload_outcome import OutcomeRecord, read_outcome, record_path
from edgegw.service import GatewayService, build_service
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import DAEMON_ENV, sleep, spawn_twistd
from tests.support.processes import ProcessOutput, http_get, kill, venv_bin

reactor: Any = _reactor

BAD_ROUTE_PROBLEM = '20-bad.yaml, document 1, Route "bad": spec.handler.upstream'
"""Where the refused configuration's error is located (file, document, resource, field)."""

UNREACHABLE_IDP = (
    "  reload: {warmupTimeout: 3s}\n"
    '  session: {key: "0123456789abcdef0123456789abcdef"}\n'
    "---\nkind: IdP\nmetadata: {name: idp}\nspec:\n  type: oidc\n"
    '  issuer: "http://127.0.0.1:9"\n  clientID: gw\n  clientSecret: gw-secret\n'
)
"""
A Gateway's session and an IdP nothing answers for: a reload of it warms up (waits for
a discovery that never comes) until its warm-up timeout (3 s), RELOADING=1 sent
meanwhile.
"""


def _route(name: str, match: str, handler: str = "{type: health}") -> str:
    spec = f"{{match: '{match}', handler: {handler}}}"
    return f"---\nkind: Route\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def _finished(path: str) -> int:
    """
    How many reloads the record at C{path} says have ended.
    """
    record = read_outcome(path)
    return 0 if record is None else record.finished


def _hangup_pending(pid: int) -> bool:
    """
    Whether a SIGHUP waits for the (stopped) process C{pid}.
    """
    with open(f"/proc/{pid}/status", encoding="ascii") as stream:
        for line in stream:
            if line.startswith("ShdPnd:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


class _Notes(DatagramProtocol):
    """
    What arrives on the notification socket, one message (its lines) per datagram.
    """

    def __init__(self) -> None:
        self.messages: list[list[str]] = []
        self._waiters: list[tuple[str, int, Deferred[None]]] = []

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        self.messages.append(datagram.decode().split("\n"))
        for waiter in list(self._waiters):
            prefix, count, fired = waiter
            if self._count(prefix) >= count:
                self._waiters.remove(waiter)
                fired.callback(None)

    def _count(self, prefix: str) -> int:
        return sum(1 for lines in self.messages if any(line.startswith(prefix) for line in lines))

    def wait_for(self, prefix: str, count: int = 1) -> Deferred[None]:
        """
        Fire once C{count} messages hold a line that begins with C{prefix} (C{READY=1},
        C{STATUS=reload refused}).
        """
        fired: Deferred[None] = Deferred()
        if self._count(prefix) >= count:
            fired.callback(None)
        else:
            self._waiters.append((prefix, count, fired))
        return fired.addTimeout(30, reactor)

    def firsts(self) -> list[str]:
        """
        The first line of each message so far.
        """
        return [lines[0] for lines in self.messages]

    def field(self, index: int, key: str) -> str:
        """
        The value of C{key} in message C{index}.
        """
        for line in self.messages[index]:
            if line.startswith(key + "="):
                return line[len(key) + 1 :]
        raise AssertionError(f"no {key}= in {self.messages[index]}")


class ReloadNotifyTests(TestCase):
    """
    A twistd process with C{NOTIFY_SOCKET} at the test's datagram socket and
    C{RUNTIME_DIRECTORY} at a directory of the test's, as systemd runs it.
    """

    timeout = 90

    def setUp(self) -> None:
        # A short path: trial's temporary directories can exceed AF_UNIX's 108 bytes.
        directory = tempfile.mkdtemp(prefix="edgegw-rn-")
        self.addCleanup(shutil.rmtree, directory, True)
        self.notes = _Notes()
        listening = reactor.listenUNIXDatagram(os.path.join(directory, "notify"), self.notes)
        self.addCleanup(listening.stopListening)
        self.runtime = os.path.join(directory, "run")
        os.mkdir(self.runtime)
        self.env = {
            **DAEMON_ENV,
            "NOTIFY_SOCKET": os.path.join(directory, "notify"),
            "RUNTIME_DIRECTORY": self.runtime,
        }
        self.root = os.path.abspath(self.mktemp())

    async def start(self, gateway: str = GATEWAY) -> int:
        """
        Write the configuration (C{gateway} and two routes) and start the daemon; once
        it is ready, its port.
        """
        write_tree(self.root, {"00-gateway.yaml": gateway, "10-routes.yaml": _route("a", "/a")})
        self.protocol, self.process = spawn_twistd(self.root, env=self.env)
        self.addCleanup(lambda: self.protocol.ended)
        self.addCleanup(kill, self.process)
        port = await self.protocol.listening
        await self.notes.wait_for("READY=1")
        return port

    def write(self, name: str, text: str) -> None:
        with open(os.path.join(self.root, name), "w", encoding="utf-8") as stream:
            stream.write(text)

    async def edgegw_reload(self, *options: str, pid: int | None = None) -> tuple[int, str, str]:
        """
        Run C{edgegw reload --pid PID [OPTIONS]} as systemd's ExecReload does (in the
        unit's environment: C{RUNTIME_DIRECTORY} set).

        @return: Its exit status, stdout and stderr.
        """
        pid = self.process.pid if pid is None else pid
        out, err, code = await getProcessOutputAndValue(
            venv_bin("edgegw"), ["reload", "--pid", str(pid), *options], env=self.env
        )
        return code, out.decode(), err.decode()

    async def test_a_taken_reload_is_reloading_then_ready(self) -> None:
        port = await self.start()
        self.write("20-b.yaml", _route("b", "/b"))
        code, out, err = await self.edgegw_reload()
        self.assertEqual((code, err), (0, ""))
        self.assertIn("the new configuration serves", out)
        await self.notes.wait_for("READY=1", 2)
        self.assertEqual(self.notes.firsts(), ["READY=1", "RELOADING=1", "READY=1"])
        began = int(self.notes.field(1, "MONOTONIC_USEC"))
        self.assertTrue(0 < began <= monotonic_usec(), began)
        # READY=1 once the new configuration serves: its STATUS counts its routes.
        self.assertTrue(self.notes.field(2, "STATUS").startswith("serving 2 routes on "))
        answer = await http_get(f"http://127.0.0.1:{port}/b")
        self.assertEqual(answer.code, 200)
        await answer.content()

    async def test_a_refused_reload_says_why_and_is_not_a_switch(self) -> None:
        port = await self.start()
        self.write("20-bad.yaml", _route("bad", "/bad", "{type: reverse-proxy}"))
        code, out, err = await self.edgegw_reload()
        self.assertEqual((code, out), (1, ""))
        self.assertIn("refused, the running configuration keeps serving", err)
        self.assertIn(BAD_ROUTE_PROBLEM, err)
        # No RELOADING=1 and no READY=1: the unit stays active, its status says why.
        await self.notes.wait_for("STATUS=reload refused")
        self.assertEqual(len(self.notes.firsts()), 2, self.notes.messages)
        status = self.notes.firsts()[1]
        self.assertTrue(status.startswith("STATUS=reload refused: configuration has 1 error: "))
        self.assertIn(BAD_ROUTE_PROBLEM, status)
        self.assertIn("; still serving 1 routes on ", status)
        answer = await http_get(f"http://127.0.0.1:{port}/a")
        self.assertEqual(answer.code, 200)
        await answer.content()
        # The next reload that is taken is the next message (nothing came between), and
        # its status no longer says refused.
        os.unlink(os.path.join(self.root, "20-bad.yaml"))
        code, _, err = await self.edgegw_reload()
        self.assertEqual((code, err), (0, ""))
        await self.notes.wait_for("READY=1", 2)
        self.assertEqual(self.notes.firsts()[2:], ["RELOADING=1", "READY=1"])
        self.assertTrue(self.notes.field(3, "STATUS").startswith("serving 1 routes on "))

    async def test_a_restart_only_change_fails_the_reload(self) -> None:
        await self.start()
        # What `edgegw check` cannot see: only the running daemon knows its listen.
        self.write("00-gateway.yaml", GATEWAY.replace('"127.0.0.1:0"', '"127.0.0.1:1"'))
        code, _, err = await self.edgegw_reload()
        self.assertEqual(code, 1)
        self.assertIn(
            '00-gateway.yaml, document 1, Gateway "gw": spec.listen: changed from '
            "127.0.0.1:0 to 127.0.0.1:1: a new listen address needs a restart",
            err,
        )
        await self.notes.wait_for("STATUS=reload refused")
        self.assertNotIn("RELOADING=1", self.notes.firsts())

    async def test_the_answer_is_for_a_reload_that_began_after_the_request(self) -> None:
        """
        A SIGHUP while a reload warms up runs another once it is done: C{edgegw
        reload} reports that one's outcome, not the one under way (which read the
        configuration before the request).
        """
        await self.start(GATEWAY + UNREACHABLE_IDP)
        # A reload adding a route, warming up (the IdP never answers) until the warm-up
        # timeout.
        self.write("20-b.yaml", _route("b", "/b"))
        os.kill(self.process.pid, signal.SIGHUP)
        await self.notes.wait_for("RELOADING=1")
        # Announced while it warms up: the switch has not happened yet.
        self.assertEqual(self.notes.firsts(), ["READY=1", "RELOADING=1"])
        # Asked for meanwhile: another route; its reload warms up as long.
        self.write("30-c.yaml", _route("c", "/c"))
        code, out, err = await self.edgegw_reload()
        self.assertEqual((code, err), (0, ""))
        self.assertIn("the new configuration serves (process ", out)
        self.assertIn("): serving 3 routes on ", out)
        await self.notes.wait_for("READY=1", 3)
        firsts = self.notes.firsts()
        self.assertEqual(firsts, ["READY=1", "RELOADING=1", "READY=1", "RELOADING=1", "READY=1"])
        self.assertTrue(self.notes.field(2, "STATUS").startswith("serving 2 routes on "))
        self.assertTrue(self.notes.field(4, "STATUS").startswith("serving 3 routes on "))
        record = read_outcome(record_path(self.runtime, self.process.pid))
        assert record is not None
        self.assertEqual((record.started, record.finished, record.taken), (2, 2, True))

    async def test_no_daemon_no_wait(self) -> None:
        await self.start()
        pid = self.process.pid
        path = record_path(self.runtime, pid)
        self.assertIsNotNone(read_outcome(path))
        # A daemon that cannot answer (stopped): no outcome within the timeout given.
        os.kill(pid, signal.SIGSTOP)
        try:
            code, _, err = await self.edgegw_reload("--timeout", "0.5")
        finally:
            os.kill(pid, signal.SIGCONT)
        self.assertEqual(code, 1)
        self.assertIn(f"no outcome from process {pid} within 0.5 s", err)
        # Continued, it runs that reload.
        while _finished(path) < 1:
            await sleep(0.02)
        # One that exits while the command waits (once its SIGHUP is pending).
        os.kill(pid, signal.SIGSTOP)
        waiting = Deferred.fromCoroutine(self.edgegw_reload())
        while not _hangup_pending(pid):
            await sleep(0.02)
        kill(self.process)
        code, _, err = await waiting
        self.assertEqual(code, 1)
        self.assertIn(f"process {pid} exited before its reload ended", err)
        # One that is gone.
        await self.protocol.ended
        code, _, err = await self.edgegw_reload(pid=pid)
        self.assertEqual(code, 1)
        self.assertIn(f"no process {pid}", err)

    async def test_no_record_no_signal(self) -> None:
        """
        A process that keeps no record (not an edgegw daemon, or one run without this
        runtime directory) is not sent SIGHUP (which would end most processes).
        """
        bystander = ProcessOutput()
        process = reactor.spawnProcess(bystander, "/bin/sleep", ["sleep", "60"])
        self.addCleanup(lambda: bystander.ended)
        self.addCleanup(kill, process)
        pid = process.pid
        _, err, code = await getProcessOutputAndValue(
            venv_bin("edgegw"), ["reload", "--pid", str(pid)], env=self.env
        )
        self.assertEqual(code, 1)
        self.assertIn(f"no reload record {record_path(self.runtime, pid)}", err.decode())
        self.assertFalse(bystander.exited)


class _Recorder(SystemdNotifier):
    """
    A notifier that keeps what it would send (one list of lines per message).
    """

    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[list[str]] = []

    def send(self, message: str) -> bool:
        self.sent.append(message.split("\n"))
        return True

    def firsts(self) -> list[str]:
        return [lines[0] for lines in self.sent]


class InProcessTests(TestCase):
    """
    What the tree tells systemd, and records, when a reload ends neither taken nor
    refused by its configuration: a bug while it warms up, a stop meanwhile.
    """

    def serve(self) -> tuple[GatewayService, _Recorder, str]:
        """
        A running tree with a recording notifier and a reload record; its warm-up waits
        for C{self.release} (then raises C{self.bug}, unless L{None}).
        """
        root = write_tree(self.mktemp(), {"a.yaml": GATEWAY + _route("a", "/a")})
        notifier = _Recorder()
        service = build_service(load_config(root, {}), reactor, source=root, notifier=notifier)
        directory = os.path.abspath(self.mktemp())
        os.mkdir(directory)
        service.outcomes = OutcomeRecord(directory, service.warm_up_bound)
        service.outcomes.start()
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        self.release: Deferred[None] = Deferred()
        self.bug: Exception | None = None
        # Before the stop (cleanups run last first): a failed test must not hold it.
        self.addCleanup(lambda: None if self.release.called else self.release.callback(None))

        async def warm_up(tree: Any, new: Any) -> None:
            await self.release
            if self.bug is not None:
                raise self.bug

        self.patch(reload_module, "warm_up", warm_up)
        notifier.sent.clear()
        return service, notifier, record_path(directory, os.getpid())

    async def test_a_bug_while_warming_up_still_ends_the_reloading_state(self) -> None:
        service, notifier, path = self.serve()
        reloading = service.reload()
        self.assertEqual(notifier.firsts(), ["RELOADING=1"])
        self.bug = RuntimeError("boom")
        self.release.callback(None)
        self.assertFalse(await reloading)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        # READY=1 though nothing switched: the unit must leave "reloading"; the
        # status says what happened.
        self.assertEqual(notifier.firsts(), ["RELOADING=1", "READY=1"])
        status = notifier.sent[1][1]
        self.assertTrue(
            status.startswith("STATUS=reload failed (a bug): RuntimeError: boom; still serving 1 "),
            status,
        )
        record = read_outcome(path)
        assert record is not None
        self.assertEqual(
            (record.finished, record.taken, record.problems),
            (1, False, "reload failed (a bug): RuntimeError: boom"),
        )

    async def test_a_stop_while_warming_up_is_no_reload(self) -> None:
        service, notifier, path = self.serve()
        reloading = service.reload()
        # Asked again meanwhile: folded into a second reload, to run after it.
        self.assertIs(service.reload(), reloading)
        stopping = service.stopService()
        self.release.callback(None)
        self.assertFalse(await reloading)
        await stopping
        # STOPPING=1 follows RELOADING=1, and no READY=1 comes after it.
        self.assertEqual(notifier.firsts(), ["RELOADING=1", "STOPPING=1"])
        # Both reloads are answered (`edgegw reload` waits for neither in vain), and
        # so is a SIGHUP once stopped.
        record = read_outcome(path)
        assert record is not None
        self.assertEqual(
            (record.started, record.finished, record.taken, record.problems),
            (2, 2, False, "the gateway began to stop"),
        )
        self.assertFalse(await service.reload())
        record = read_outcome(path)
        assert record is not None
        self.assertEqual(
            (record.started, record.finished, record.problems), (3, 3, "the gateway is stopping")
        )
