"""
A buffered writer of access-log lines to standard output or a file.

Writing one log event per request through twisted.logger costs tens of microseconds (event
dictionaries, observers, per-line formatting and flushing); a gateway writes its access
log the way nginx does instead: lines are appended to a buffer and written together, at
most every L{FLUSH_INTERVAL} seconds or once L{FLUSH_BYTES} are waiting.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

FLUSH_INTERVAL = 0.1
FLUSH_BYTES = 64 * 1024

_log = Logger()


class LineWriter:
    """
    Appends lines to C{output}: C{"-"} for standard output, else a file path (opened for
    appending, created if missing, and reopened when log rotation moves or removes it).

    @param reactor: For scheduling flushes.
    """

    def __init__(self, reactor: Any, output: str) -> None:
        self.reactor = reactor
        self.output = output
        self._lines: list[bytes] = []
        self._size = 0
        self._flush_call: IDelayedCall | None = None
        self._closed = False
        self._fd = 1 if output == "-" else self._open()

    def _open(self) -> int:
        return os.open(self.output, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)

    def write(self, line: bytes) -> None:
        """
        Queue one line (without its newline).

        After L{close} (a request that outlived the shutdown drain), the line is written
        at once: no timer is left behind, and the line is not lost.
        """
        if self._closed:
            self._write_late(line + b"\n")
            return
        self._lines.append(line)
        self._size += len(line) + 1
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif self._flush_call is None:
            self._flush_call = self.reactor.callLater(FLUSH_INTERVAL, self.flush)

    def flush(self) -> None:
        """
        Write everything queued now.
        """
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if not self._lines:
            return
        data = b"\n".join(self._lines) + b"\n"
        self._lines = []
        self._size = 0
        if self.output != "-":
            self._reopen_if_rotated()
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as e:
            _log.error(
                "cannot write the access log to {output}: {error}",
                output=self.output,
                error=e.strerror,
            )

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
            fd = self._open()
        except OSError as e:
            _log.error(
                "cannot reopen the access log {output}: {error}",
                output=self.output,
                error=e.strerror,
            )
            return
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        """
        Flush, and close the file (standard output stays open).
        """
        self.flush()
        self._closed = True
        if self.output != "-" and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write_late(self, data: bytes) -> None:
        try:
            fd = 1 if self.output == "-" else self._open()
            try:
                os.write(fd, data)
            finally:
                if fd != 1:
                    os.close(fd)
        except OSError as e:
            _log.error(
                "cannot write the access log to {output}: {error}",
                output=self.output,
                error=e.strerror,
            )
