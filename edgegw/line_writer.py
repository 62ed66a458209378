"""
A buffered, non-blocking writer of lines to standard output or a file: the access log's
(C{accessLog.output}) and the daemon's own journal log (L{edgegw.journal}).

Writing one log event per request through twisted.logger costs tens of microseconds (event
dictionaries, observers, per-line formatting and flushing); a gateway writes its access
log the way nginx does instead: lines are appended to a buffer and written together, at
most every L{FLUSH_INTERVAL} seconds or once L{FLUSH_BYTES} are waiting.

Every write is non-blocking, because it runs on the reactor thread: a full standard-output
pipe (journald behind) or a stalled terminal must never stop the gateway from serving.
What cannot be written yet stays in a buffer of at most L{MAX_BUFFERED} bytes and is
retried at the next flush; lines that do not fit are dropped and counted, and the count
is logged once per L{DROP_REPORT_INTERVAL}.

The output file is opened when the service starts (L{LineWriter.open}, or the first
flush), never when the writer is built: C{edgegw check} builds the same objects and must
create nothing.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

FLUSH_INTERVAL = 0.1
FLUSH_BYTES = 64 * 1024
MAX_BUFFERED = 4 * 1024 * 1024
"""The most bytes of lines waiting to be written; lines beyond it are dropped."""
DROP_REPORT_INTERVAL = 10.0
"""Seconds between two log messages about dropped lines."""

_FILE_FLAGS = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | os.O_CLOEXEC
    | os.O_NONBLOCK
    | getattr(os, "O_NOCTTY", 0)
)

_STDOUT_FLAGS = os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)

# The namespace its events had in edgegw/chain/access_writer.py: moving the module does
# not change the log lines.
_log = Logger(namespace="edgegw.chain.access_writer")


class NotRegularFileError(OSError):
    """
    The output path names something other than a regular file (a FIFO, a device, a
    socket): writing to it could block, or go nowhere a log should.
    """

    def __init__(self, path: str) -> None:
        super().__init__(errno.EINVAL, "not a regular file", path)


def open_log_file(path: str) -> int:
    """
    Open C{path} for appending (created C{0640} if missing) without blocking: a FIFO
    without a reader fails at once instead of waiting for one.

    @raise NotRegularFileError: C{path} is not a regular file.
    @raise OSError: It cannot be opened.
    """
    fd = os.open(path, _FILE_FLAGS, 0o640)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Stdout:
    """
    Non-blocking writes to standard output, without making descriptor 1 itself
    non-blocking (twistd's own log may share it, and its writes expect blocking).
    """

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self.fd = -1
        mode = os.fstat(1).st_mode
        self.write: Callable[[memoryview], int]
        if stat.S_ISREG(mode):
            # A file: writes do not wait on a reader (and the offset must stay shared).
            self.fd = os.dup(1)
            fd = self.fd
            self.write = lambda data: os.write(fd, data)
        elif stat.S_ISSOCK(mode):
            # journald's stream socket: each send is non-blocking on its own.
            self._socket = socket.socket(fileno=os.dup(1))
            self.fd = self._socket.fileno()
            send = self._socket.send
            self.write = lambda data: send(data, socket.MSG_DONTWAIT)
        else:
            try:
                # A pipe or a terminal: opened again, it is a description of its own
                # whose O_NONBLOCK leaves descriptor 1 as it is.
                self.fd = os.open("/proc/self/fd/1", _STDOUT_FLAGS)
            except OSError:
                self.fd = os.dup(1)
                os.set_blocking(self.fd, False)
            fd = self.fd
            self.write = lambda data: os.write(fd, data)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        elif self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class _SharedStdout:
    """
    The one non-blocking standard output that every writer of C{"-"} uses (the journal
    log and an access log may both write there): a line that one writer's write left
    half written is finished before anyone's next bytes go out, so that their lines
    never tear each other. Opened by the first writer, closed with the last.
    """

    def __init__(self) -> None:
        self._out: _Stdout | None = None
        self._users = 0
        self._tail = b""
        self._retry: IDelayedCall | None = None

    def acquire(self) -> None:
        if self._users == 0:
            self._out = _Stdout()
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self._users:
            return
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        # Last chance for a half-written line; the next start begins a fresh one.
        self._finish_tail()
        self._tail = b""
        assert self._out is not None
        self._out.close()
        self._out = None

    def write(self, data: memoryview, reactor: Any) -> int:
        """
        Write what the output takes of C{data} (whole lines, each ending in a newline),
        as L{os.write}; a line cut short is kept and finished first, by the next write
        or a flush interval later, and counts as written.

        @raise BlockingIOError: Nothing could be written (a line is still unfinished).
        """
        if not self._finish_tail():
            raise BlockingIOError
        assert self._out is not None
        written = self._out.write(data)
        if 0 < written < len(data) and data[written - 1] != _NEWLINE:
            rest = bytes(data[written:])
            end = rest.find(b"\n") + 1
            self._tail = rest[:end]
            written += end
            if self._retry is None:
                self._retry = reactor.callLater(FLUSH_INTERVAL, self._retry_tail, reactor)
        return written

    def _finish_tail(self) -> bool:
        """
        Write the unfinished line, as far as the output takes it; whether it is done.
        """
        while self._tail:
            assert self._out is not None
            try:
                self._tail = self._tail[self._out.write(memoryview(self._tail)) :]
            except BlockingIOError:
                return False
            except OSError:
                self._tail = b""  # the writers see the same error on their next write
        return True

    def _retry_tail(self, reactor: Any) -> None:
        self._retry = None
        if not self._finish_tail():
            self._retry = reactor.callLater(FLUSH_INTERVAL, self._retry_tail, reactor)


_NEWLINE = ord("\n")
_shared_stdout = _SharedStdout()


class LineWriter:
    """
    Appends lines to C{output}: C{"-"} for standard output, else the path of a regular
    file (opened for appending, created if missing, and reopened when log rotation
    moves or removes it).

    @param reactor: For scheduling flushes.
    @ivar dropped: How many lines were dropped since the writer was made.
    @ivar on_drop: Told how many lines each drop lost (the gateway's metrics, which
        outlive the writer across reloads).
    """

    def __init__(self, reactor: Any, output: str) -> None:
        self.reactor = reactor
        self.output = output
        self.dropped = 0
        self.on_drop: Callable[[int], None] | None = None
        self._lines: list[bytes] = []
        self._queued = 0
        self._pending = b""
        self._flush_call: IDelayedCall | None = None
        self._report_call: IDelayedCall | None = None
        self._unreported = 0
        self._reason = ""
        self._reporting = False
        self._closed = False
        self._fd = -1
        self._stdout = False
        self._write: Callable[[memoryview], int] | None = None

    def open(self) -> None:
        """
        Open the output now (when the service starts); does nothing if it is open.

        @raise OSError: The file cannot be opened (L{NotRegularFileError} when the path
            is not a regular file).
        """
        if self._write is not None:
            return
        if self.output == "-":
            _shared_stdout.acquire()
            self._stdout = True
            reactor = self.reactor
            self._write = lambda data: _shared_stdout.write(data, reactor)
        else:
            self._fd = fd = open_log_file(self.output)
            self._write = lambda data: os.write(fd, data)

    def write(self, line: bytes) -> None:
        """
        Queue one line (without its newline); dropped and counted when the buffer is
        full.

        After L{close} (a request that outlived the shutdown drain), the line is written
        at once: no timer is left behind, and the line is not lost.
        """
        if self._closed:
            self._write_late(line + b"\n")
            return
        size = len(line) + 1
        if self._queued + len(self._pending) + size > MAX_BUFFERED:
            self._drop(1, "the output is not keeping up")
            return
        self._lines.append(line)
        self._queued += size
        if self._queued >= FLUSH_BYTES:
            self.flush()
        elif self._flush_call is None:
            self._flush_call = self.reactor.callLater(FLUSH_INTERVAL, self.flush)

    def flush(self) -> None:
        """
        Write what is queued, as far as the output takes it without blocking; the rest
        is tried again a flush interval later.
        """
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if self._lines:
            self._pending += b"\n".join(self._lines) + b"\n"
            self._lines = []
            self._queued = 0
        if not self._pending:
            return
        write = self._ready()
        if write is None:
            return
        view = memoryview(self._pending)
        written = 0
        try:
            while written < len(view):
                written += write(view[written:])
        except BlockingIOError:
            pass
        except OSError as e:
            self._pending = self._pending[written:]
            self._drop(self._pending.count(b"\n"), f"cannot write: {e.strerror or e}")
            self._pending = b""
            return
        finally:
            view.release()
        self._pending = self._pending[written:]
        if self._pending and not self._closed and self._flush_call is None:
            self._flush_call = self.reactor.callLater(FLUSH_INTERVAL, self.flush)

    def _ready(self) -> Callable[[memoryview], int] | None:
        """
        The open output's write (opened now if it is not, reopened after rotation), or
        L{None} when it cannot be opened: what waits is then dropped.
        """
        if self._write is not None and self.output != "-":
            self._reopen_if_rotated()
        if self._write is None:
            try:
                self.open()
            except OSError as e:
                self._drop(self._pending.count(b"\n"), f"cannot open: {e.strerror or e}")
                self._pending = b""
                return None
        return self._write

    def _reopen_if_rotated(self) -> None:
        try:
            current = os.stat(self.output)
            opened = os.fstat(self._fd)
            if (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            fd = open_log_file(self.output)
        except OSError as e:
            _log.error(
                "cannot reopen the access log {output}: {error}",
                output=self.output,
                error=e.strerror,
            )
            return
        os.close(self._fd)
        self._fd = fd
        self._write = lambda data: os.write(fd, data)

    def _drop(self, lines: int, reason: str) -> None:
        """
        Count C{lines} dropped lines; say so in the log at most once per
        L{DROP_REPORT_INTERVAL}.
        """
        if not lines:
            return
        self.dropped += lines
        if self.on_drop is not None:
            self.on_drop(lines)
        self._unreported += lines
        self._reason = reason
        if self._closed:
            self._report_drops()
        elif self._report_call is None:
            self._report_call = self.reactor.callLater(DROP_REPORT_INTERVAL, self._report_drops)

    def _report_drops(self) -> None:
        self._report_call = None
        if self._reporting:
            # The report itself came back to this writer (the daemon's journal log is
            # one) and was dropped: counted, reported with the next one.
            return
        count, self._unreported = self._unreported, 0
        if count:
            self._reporting = True
            try:
                _log.warn(
                    "access log {output}: {count} line(s) dropped ({reason})",
                    output=self.output,
                    count=count,
                    reason=self._reason,
                )
            finally:
                self._reporting = False

    def close(self) -> None:
        """
        Write what the output takes now, drop (and report) the rest, and close the
        output.
        """
        self.flush()
        self._closed = True
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if self._pending:
            self._drop(self._pending.count(b"\n"), "the output is not keeping up")
            self._pending = b""
        if self._report_call is not None:
            if self._report_call.active():
                self._report_call.cancel()
            self._report_drops()
        self._close_output()

    def _close_output(self) -> None:
        if self._stdout:
            _shared_stdout.release()
            self._stdout = False
        elif self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._write = None

    def _write_late(self, data: bytes) -> None:
        try:
            self.open()
            write = self._write
            assert write is not None
            written = write(memoryview(data))
            if written < len(data):
                self._drop(1, "the output is not keeping up")
        except BlockingIOError:
            self._drop(1, "the output is not keeping up")
        except OSError as e:
            self._drop(1, f"cannot write: {e.strerror or e}")
        finally:
            self._close_output()
