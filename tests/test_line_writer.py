"""
Tests for the buffered line writer (the access log's and the journal's) and the
C{accessLog.output} setting.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import stat
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import provider

from edgegw.assembly.assemble import build_gateway
from edgegw.line_writer import (
    DROP_REPORT_INTERVAL,
    FLUSH_BYTES,
    FLUSH_INTERVAL,
    MAX_BUFFERED,
    LineWriter,
    NotRegularFileError,
)
from tests.support.configs import load_text, problems_of
from tests.support.memory import MemoryClient


class LineWriterTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.path = os.path.join(self.directory, "access.log")
        self.clock = Clock()
        self.writer = LineWriter(self.clock, self.path)
        self.writer.open()
        self.addCleanup(self.writer.close)

    def read(self) -> bytes:
        with open(self.path, "rb") as stream:
            return stream.read()

    def test_lines_are_batched_until_the_interval(self) -> None:
        self.writer.write(b'{"a":1}')
        self.writer.write(b'{"a":2}')
        self.assertEqual(self.read(), b"")
        self.clock.advance(FLUSH_INTERVAL)
        self.assertEqual(self.read(), b'{"a":1}\n{"a":2}\n')

    def test_large_batches_flush_at_once(self) -> None:
        line = b"x" * 1000
        for _ in range(FLUSH_BYTES // 1000 + 1):
            self.writer.write(line)
        self.assertGreaterEqual(len(self.read()), FLUSH_BYTES)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_line_after_close_is_written_at_once(self) -> None:
        self.writer.write(b'{"a":1}')
        self.writer.close()
        # A request that outlived the shutdown drain: its line is neither lost nor left
        # waiting on a timer.
        self.writer.write(b'{"late":true}')
        self.assertEqual(self.read(), b'{"a":1}\n{"late":true}\n')
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_reopened_after_rotation(self) -> None:
        self.writer.write(b"before")
        self.writer.flush()
        os.rename(self.path, self.path + ".1")
        self.writer.write(b"after")
        self.writer.flush()
        self.assertEqual(self.read(), b"after\n")
        with open(self.path + ".1", "rb") as stream:
            self.assertEqual(stream.read(), b"before\n")

    def test_close_flushes(self) -> None:
        writer = LineWriter(self.clock, self.path)
        writer.write(b"last")
        writer.close()
        self.assertEqual(self.read(), b"last\n")


class AccessLogOutputTests(SynchronousTestCase):
    def test_json_lines_to_a_file(self) -> None:
        root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(root, "logs"))
        config = load_text(
            root,
            "kind: Gateway\nmetadata: {name: g}\nspec:\n  accessLog: {output: logs/access.log}\n"
            "---\nkind: Route\nmetadata: {name: h}\n"
            "spec: {match: GET /healthz, handler: {type: health}}\n",
            gateway=False,
        )
        output = os.path.join(root, "logs", "access.log")
        self.assertEqual(config.gateway.access_log.output, output)
        gateway = build_gateway(config, Clock())
        client = MemoryClient(gateway.site)
        client.request("GET", "/healthz", {"X-Request-Id": "r-1"})
        client.request("GET", "/missing")
        assert gateway.access_log.writer is not None
        gateway.access_log.writer.close()
        with open(output, "rb") as stream:
            lines = [json.loads(line) for line in stream.read().splitlines()]
        self.assertEqual(
            [(line["path"], line["status"], line["request_id"]) for line in lines],
            [("/healthz", 200, "r-1"), ("/missing", 404, "")],
        )

    def test_default_is_the_twistd_log(self) -> None:
        config = load_text(
            self.mktemp(),
            "kind: Route\nmetadata: {name: h}\nspec: {match: /, handler: {type: health}}\n",
        )
        self.assertEqual(config.gateway.access_log.output, "log")

    def test_missing_directory_is_an_error(self) -> None:
        root = os.path.abspath(self.mktemp())
        self.assertEqual(
            problems_of(
                root,
                "kind: Gateway\nmetadata: {name: g}\n"
                "spec: {accessLog: {output: nowhere/access.log}}\n",
                gateway=False,
            ),
            [
                f'document 1, Gateway "g": spec.accessLog.output: the directory of '
                f"{os.path.join(root, 'nowhere', 'access.log')} does not exist"
            ],
        )


class OutputFileTests(SynchronousTestCase):
    """
    Issue 10, points 7 and 12: the access-log file is created when the daemon starts,
    never by building the gateway (edgegw check); only a regular file is written to,
    opened without blocking.
    """

    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.path = os.path.join(self.directory, "access.log")

    def test_building_creates_nothing(self) -> None:
        writer = LineWriter(Clock(), self.path)
        self.assertFalse(os.path.exists(self.path))
        writer.open()
        self.assertTrue(stat.S_ISREG(os.stat(self.path).st_mode))
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode) & 0o007, 0)
        writer.close()

    def test_first_flush_opens_a_writer_nobody_opened(self) -> None:
        clock = Clock()
        writer = LineWriter(clock, self.path)
        writer.write(b"line")
        self.assertFalse(os.path.exists(self.path))
        clock.advance(FLUSH_INTERVAL)
        with open(self.path, "rb") as stream:
            self.assertEqual(stream.read(), b"line\n")
        writer.close()

    def test_fifo_refused_without_blocking(self) -> None:
        fifo = os.path.join(self.directory, "fifo")
        os.mkfifo(fifo)
        guard_against_blocking(self)
        # No reader: a blocking open would wait for one forever.
        with self.assertRaises(OSError) as raised:
            LineWriter(Clock(), fifo).open()
        self.assertEqual(raised.exception.errno, errno.ENXIO)
        # With a reader the open succeeds, and the FIFO is refused as not a file.
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.addCleanup(os.close, reader)
        self.assertRaises(NotRegularFileError, LineWriter(Clock(), fifo).open)

    def test_fifo_refused_at_load(self) -> None:
        root = os.path.abspath(self.mktemp())
        os.makedirs(root)
        os.mkfifo(os.path.join(root, "fifo"))
        self.assertEqual(
            problems_of(
                root,
                "kind: Gateway\nmetadata: {name: g}\nspec: {accessLog: {output: fifo}}\n",
                gateway=False,
            ),
            [
                f'document 1, Gateway "g": spec.accessLog.output: {os.path.join(root, "fifo")} '
                'is not a regular file (use "-" for standard output)'
            ],
        )


def guard_against_blocking(test: SynchronousTestCase, seconds: float = 10.0) -> None:
    """
    Fail C{test} with an exception, rather than hang, if it blocks for C{seconds}.
    """

    def expired(signum: int, frame: Any) -> None:
        raise AssertionError(f"blocked for {seconds}s")

    previous = signal.signal(signal.SIGALRM, expired)
    # Repeating: a cleanup that blocks too (closing a writer flushes) fails as well.
    signal.setitimer(signal.ITIMER_REAL, seconds, seconds)

    def restore() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    test.addCleanup(restore)


def redirect_stdout(test: SynchronousTestCase, fd: int) -> None:
    """
    Make descriptor 1 C{fd} for the rest of C{test}.
    """
    saved = os.dup(1)

    def restore() -> None:
        os.dup2(saved, 1)
        os.close(saved)

    os.dup2(fd, 1)
    test.addCleanup(restore)


def capture_warnings(test: SynchronousTestCase) -> list[LogEvent]:
    events: list[LogEvent] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        if "dropped" in event.get("log_format", ""):
            events.append(event)

    globalLogPublisher.addObserver(observe)
    test.addCleanup(globalLogPublisher.removeObserver, observe)
    return events


def read_all(fd: int) -> bytes:
    """
    Everything readable from a non-blocking descriptor now.
    """
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


class StdoutTests(SynchronousTestCase):
    """
    Issue 10, point 12: a standard output nobody reads (journald behind, a stopped
    terminal) never blocks the reactor thread: the writer buffers a bounded amount,
    drops the rest with a count, says so once per interval, and catches up when the
    reader does. Descriptor 1 itself stays blocking (twistd's own log may share it).
    """

    def fill(self, writer: LineWriter, clock: Clock, first: int, lines: int) -> list[bytes]:
        sent = [b'{"n":%d,"pad":"%s"}' % (n, b"x" * 980) for n in range(first, first + lines)]
        for line in sent:
            writer.write(line)
        clock.advance(FLUSH_INTERVAL)
        return sent

    def check_stalled_reader(self, reader: int) -> None:
        guard_against_blocking(self)
        clock = Clock()
        warnings = capture_warnings(self)
        writer = LineWriter(clock, "-")
        writer.open()
        self.addCleanup(writer.close)
        self.assertTrue(os.get_blocking(1))
        lines = MAX_BUFFERED // 1000 + 500
        sent = self.fill(writer, clock, 0, lines)
        self.assertGreater(writer.dropped, 0)
        self.assertLess(writer.dropped, lines)
        # One report per interval, however many lines were dropped in it.
        self.assertEqual(warnings, [])
        clock.advance(DROP_REPORT_INTERVAL)
        self.assertEqual([event["count"] for event in warnings], [writer.dropped])
        sent += self.fill(writer, clock, lines, 10)
        clock.advance(DROP_REPORT_INTERVAL)
        self.assertEqual(sum(event["count"] for event in warnings), writer.dropped)
        self.assertEqual(len(warnings), 2)
        # The reader catches up: what was kept arrives whole, in order.
        received = b""
        for _ in range(1000):
            received += read_all(reader)
            clock.advance(FLUSH_INTERVAL)
            if not clock.getDelayedCalls():
                break
        received += read_all(reader)
        got = received.split(b"\n")
        self.assertEqual(got.pop(), b"")
        kept = set(got)
        self.assertEqual(got, [line for line in sent if line in kept])
        self.assertEqual(len(got), len(sent) - writer.dropped)

    def test_pipe(self) -> None:
        reader, writer_end = os.pipe()
        os.set_blocking(reader, False)
        self.addCleanup(os.close, reader)
        redirect_stdout(self, writer_end)
        os.close(writer_end)
        self.check_stalled_reader(reader)

    def test_two_writers_never_tear_each_others_lines(self) -> None:
        # The journal log and an access log on "-" share standard output: a line one
        # writer's flush left half written is finished before the other's bytes.
        guard_against_blocking(self)
        reader, writer_end = os.pipe()
        os.set_blocking(reader, False)
        self.addCleanup(os.close, reader)
        fcntl.fcntl(writer_end, fcntl.F_SETPIPE_SZ, 4096)
        redirect_stdout(self, writer_end)
        os.close(writer_end)
        clock = Clock()
        writers = [LineWriter(clock, "-"), LineWriter(clock, "-")]
        for writer in writers:
            writer.open()
            self.addCleanup(writer.close)

        def line(w: int, n: int) -> bytes:
            return b'{"w":%d,"n":%d,"pad":"%s"}' % (w, n, b"%d" % w * (300 + 97 * n % 700))

        sent = {line(w, n) for n in range(60) for w in (0, 1)}
        received = b""
        for n in range(60):
            for w, writer in enumerate(writers):
                writer.write(line(w, n))
                writer.flush()
            if n % 3 == 0:
                received += read_all(reader)
        for _ in range(1000):
            clock.advance(FLUSH_INTERVAL)
            received += read_all(reader)
            if not clock.getDelayedCalls():
                break
        got = received.split(b"\n")
        self.assertEqual(got.pop(), b"")
        self.assertTrue(set(got) <= sent, [line[:40] for line in set(got) - sent])
        dropped = sum(writer.dropped for writer in writers)
        self.assertEqual(len(got) + dropped, len(sent))
        self.assertEqual(len(got), len(set(got)))

    def test_socket(self) -> None:
        ours, theirs = socket.socketpair()
        self.addCleanup(ours.close)
        ours.setblocking(False)
        redirect_stdout(self, theirs.fileno())
        theirs.close()
        self.check_stalled_reader(ours.fileno())
