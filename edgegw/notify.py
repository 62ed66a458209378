"""
Telling systemd how the daemon is doing: the C{sd_notify} protocol over
C{NOTIFY_SOCKET}, without libsystemd.

A unit with C{Type=notify} sets C{NOTIFY_SOCKET} to a datagram socket (a path, or an
abstract name written with a leading C{@}); the daemon sends it newline-separated
C{KEY=value} lines: C{READY=1} once it serves, C{RELOADING=1} (with C{MONOTONIC_USEC})
and C{READY=1} around a reload that switches, C{STOPPING=1} when it begins to stop, and
C{STATUS=} lines for C{systemctl status} (one line each: a line break in the text would
start another C{KEY=value}). Without C{NOTIFY_SOCKET} nothing is sent. Sending never
blocks: a message the socket cannot take at once is dropped, and the failure logged once.

C{RELOADING=1} puts a C{Type=notify} unit in the C{reloading} state until C{READY=1}
comes: whoever sends the first must send the second (L{edgegw.service.GatewayService.reload}
says when).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from twisted.logger import Logger

__all__ = ["STATUS_MAX", "SystemdNotifier", "monotonic_usec", "one_line"]

_log = Logger(namespace="edgegw.notify")

STATUS_MAX = 1000
"""The most characters of a C{STATUS=} line (a longer one is cut, ending with C{...})."""


def monotonic_usec() -> int:
    """
    C{CLOCK_MONOTONIC} in microseconds, as C{MONOTONIC_USEC=} wants it.
    """
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def one_line(text: str, limit: int = STATUS_MAX) -> str:
    """
    C{text} as one line of at most C{limit} characters: its lines joined with single
    spaces (each stripped), cut with C{...} when too long.
    """
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class SystemdNotifier:
    """
    Sends state changes to systemd's notification socket, when there is one.

    @ivar address: The socket address (L{None}: not run by systemd with C{Type=notify}).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        value = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
        if value.startswith("@"):
            value = "\0" + value[1:]  # an abstract socket name
        self.address = value if value.startswith(("/", "\0")) else None
        self._socket: socket.socket | None = None
        self._failed = False

    def send(self, message: str) -> bool:
        """
        Send C{message} (C{KEY=value} lines).

        @return: Whether it was sent.
        """
        if self.address is None:
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)
            self._socket.sendto(message.encode("utf-8", "replace"), self.address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                _log.warn(
                    "cannot notify systemd at NOTIFY_SOCKET ({error}); further failures "
                    "are not logged",
                    error=e.strerror or e,
                )
            return False
        return True

    def ready(self, status: str) -> bool:
        """
        The daemon serves (at start, and after a reload that switched).
        """
        return self.send(f"READY=1\nSTATUS={one_line(status)}")

    def reloading(self, began: int | None = None) -> bool:
        """
        A reload is under way; L{ready} must follow.

        @param began: When it began (L{monotonic_usec}); now when not given.
        """
        usec = monotonic_usec() if began is None else began
        return self.send(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the configuration")

    def stopping(self) -> bool:
        """
        The daemon begins to stop (it drains first).
        """
        return self.send("STOPPING=1\nSTATUS=draining requests in flight, then stopping")

    def status(self, status: str) -> bool:
        """
        A new C{STATUS=} line.
        """
        return self.send(f"STATUS={one_line(status)}")

    def close(self) -> None:
        """
        Close the socket.
        """
        if self._socket is not None:
            self._socket.close()
            self._socket = None
