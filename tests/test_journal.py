"""
The daemon's log as JSON lines for journald (C{--logger=edgegw.journal.observer}), and
a standard output nobody reads: requests go on being served.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.journal import JsonLinesObserver
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import DAEMON_ENV, JOURNAL_LOGGER, sleep
from tests.support.processes import (
    REPO_ROOT,
    ProcessOutput,
    edgegw_twistd_args,
    http_get,
    kill,
    listening_socket,
    venv_bin,
)

reactor: Any = _reactor
HEALTH = "spec: {match: /, handler: {type: health}}\n"


class _Lines:
    """
    Stands in for the line writer.
    """

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, line: bytes) -> None:
        self.lines.append(line)


class ObserverTests(SynchronousTestCase):
    """
    One JSON line per event.
    """

    def test_fields(self) -> None:
        lines = _Lines()
        log = Logger(namespace="edgegw.test", observer=JsonLinesObserver(lines))  # type: ignore[arg-type]
        log.warn("upstream {name} is slow", name="api")
        record = json.loads(lines.lines[0])
        self.assertEqual(
            {key: record[key] for key in ("level", "namespace", "message")},
            {"level": "warn", "namespace": "edgegw.test", "message": "upstream api is slow"},
        )
        self.assertRegex(record["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")

    def test_failure_and_priority(self) -> None:
        lines = _Lines()
        observer = JsonLinesObserver(lines, priorities=True)  # type: ignore[arg-type]
        log = Logger(namespace="edgegw.test", observer=observer)
        try:
            raise ValueError("broken")
        except ValueError:
            log.failure("it failed", Failure())
        line = lines.lines[0]
        self.assertTrue(line.startswith(b"<2>"), line)  # failure() logs at critical
        record = json.loads(line[3:])
        self.assertIn("ValueError: broken", record["traceback"])
        log.emit(LogLevel.info, "fine")
        self.assertTrue(lines.lines[1].startswith(b"<6>{"))

    def test_access_event(self) -> None:
        lines = _Lines()
        log = Logger(namespace="edgegw.access", observer=JsonLinesObserver(lines))  # type: ignore[arg-type]
        access = {"method": "GET", "path": "/x", "status": 200}
        log.info("{line}", line=json.dumps(access), access=access)
        record = json.loads(lines.lines[0])
        self.assertEqual((record["message"], record["access"]), ("GET /x 200", access))


class BlockedStdoutTests(TestCase):
    """
    A twistd whose standard output is a pipe the test stops reading (journald falling
    behind): its log fills the pipe, and requests are still answered.
    """

    timeout = 60

    async def test_requests_go_on_with_a_full_pipe(self) -> None:
        root = write_tree(
            self.mktemp(),
            {"a.yaml": GATEWAY + "---\nkind: Route\nmetadata: {name: h}\n" + HEALTH},
        )
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        self.addCleanup(os.close, read_end)
        # Its output goes to the pipe, not to the protocol: only its end is awaited.
        protocol = ProcessOutput()
        process = reactor.spawnProcess(
            protocol,
            venv_bin("twistd"),
            ["twistd", *edgegw_twistd_args(root, JOURNAL_LOGGER)],
            env=DAEMON_ENV,
            path=str(REPO_ROOT),
            childFDs={0: "w", 1: write_end, 2: write_end},
        )
        os.close(write_end)
        self.addCleanup(lambda: protocol.ended)
        self.addCleanup(kill, process)
        received = b""
        port = 0
        for _ in range(1000):
            with contextlib.suppress(BlockingIOError):
                received += os.read(read_end, 65536)
            for line in received.splitlines():
                if b"edgegw listening on" in line:
                    record = json.loads(line)
                    port = int(record["message"].rsplit("port=", 1)[1].split(")")[0])
            if port:
                break
            await sleep(0.01)
        self.assertTrue(port, received)
        # From now on nobody reads: each request's access-log line (~250 bytes) goes to
        # the pipe, whose 64 KiB are full after a few hundred.
        for _ in range(1200):
            answer = await http_get(f"http://127.0.0.1:{port}/")
            self.assertEqual(answer.code, 200)
            await answer.content()
        # The pipe is full, the rest waits in the gateway's buffer.
        waiting = b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            waiting += chunk
        # The pipe's 64 KiB, less what the last write that did not fit whole left free
        # (a write of a few KiB is all or nothing; 59,889 bytes were seen).
        self.assertGreaterEqual(len(waiting), 48 * 1024)
        # Whole lines only: the pipe was full in the middle of one.
        complete = waiting.rpartition(b"\n")[0].split(b"\n")
        records = [json.loads(line) for line in complete if line.startswith(b"{")]
        self.assertTrue(any(record.get("access", {}).get("status") == 200 for record in records))


class StartupFailureTests(TestCase):
    """
    A daemon that cannot listen exits before its reactor runs: what it says about it
    still reaches the journal.
    """

    timeout = 30

    async def test_bind_failure_is_logged(self) -> None:
        taken = listening_socket()
        self.addCleanup(taken.close)
        port = taken.getsockname()[1]
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY.replace('"127.0.0.1:0"', f'"127.0.0.1:{port}"')
                + "---\nkind: Route\nmetadata: {name: h}\n"
                + HEALTH
            },
        )
        out, err, code = await getProcessOutputAndValue(
            venv_bin("twistd"),
            edgegw_twistd_args(root, JOURNAL_LOGGER),
            env=DAEMON_ENV,
            path=str(REPO_ROOT),
        )
        self.assertEqual(code, 1)
        messages = [
            json.loads(line)["message"] for line in out.splitlines() if line.startswith(b"{")
        ]
        self.assertTrue(
            any(f"cannot listen on 127.0.0.1:{port}" in message for message in messages),
            out + err,
        )


class ReportRecursionTests(SynchronousTestCase):
    """
    A writer whose drop report is logged back to itself (the journal observer's) does
    not recurse when the report is dropped too.
    """

    def test_late_drop_report(self) -> None:
        from twisted.internet.task import Clock
        from twisted.logger import globalLogPublisher

        from edgegw.line_writer import LineWriter

        writer = LineWriter(Clock(), "/dev/null")
        # An output that takes nothing: every late line is dropped and reported.
        writer._write = lambda data: 0
        writer.open = lambda: None  # type: ignore[method-assign]
        writer._close_output = lambda: None  # type: ignore[method-assign]
        writer._closed = True
        observer = JsonLinesObserver(writer)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        Logger(namespace="edgegw.test").info("one line")
        self.assertGreaterEqual(writer.dropped, 2)
        self.assertLess(writer.dropped, 10)
