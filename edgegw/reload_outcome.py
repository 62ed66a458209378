"""
Each reload's outcome, as the daemon saw it, for C{edgegw reload} (systemd's
C{ExecReload}) to report: whether the new configuration was taken, and if not, why
(the located problems).

A signal carries no answer, and C{sd_notify} has no message for "reload refused": the
daemon writes a small record, C{reload-<pid>.json} in its runtime directory (systemd's
C{RuntimeDirectory=}, C{$RUNTIME_DIRECTORY}), replaced atomically at each reload's
start and end (L{OutcomeRecord}). C{edgegw reload --pid PID} (L{request_reload}) reads
how many reloads had begun, sends SIGHUP, and waits until a reload that began after
that has ended: its outcome is the answer. A reload already under way when the signal
arrives read the configuration too early; the SIGHUP then runs another after it, and
the command waits for that one. The wait is bounded (twice the warm-up timeout and a
margin, or C{--timeout}), and it ends at once when the daemon is gone.

One record per process (the pid in its name): the worker units share one runtime
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TextIO

from twisted.logger import Logger

__all__ = [
    "MARGIN",
    "OutcomeRecord",
    "ReloadOutcome",
    "read_outcome",
    "record_path",
    "request_reload",
    "runtime_directory",
]

_log = Logger(namespace="edgegw.reload_outcome")

MARGIN = 10.0
"""
Seconds C{edgegw reload} waits beyond twice the warm-up timeout: reading and building
the configuration (a reload already warming up may come first, hence twice).
"""

POLL = 0.05
"""Seconds between two looks at the record."""


@dataclass(frozen=True)
class ReloadOutcome:
    """
    The record a daemon keeps of its reloads.

    @ivar pid: The daemon's process id.
    @ivar started: How many reloads have begun (each SIGHUP that was not folded into
        one under way begins one, refused at once or not).
    @ivar finished: The number of the last reload that ended (0: none yet).
    @ivar taken: Whether that one switched to the new configuration.
    @ivar problems: Why not, when it did not: the located errors, as logged.
    @ivar warm_up_timeout: The daemon's warm-up timeout, in seconds (what bounds a
        reload).
    @ivar status: The daemon's status line once that reload ended (what it serves).
    """

    pid: int
    started: int = 0
    finished: int = 0
    taken: bool = False
    problems: str = ""
    warm_up_timeout: float = 0.0
    status: str = ""


def runtime_directory(environ: Mapping[str, str] | None = None) -> str | None:
    """
    The runtime directory systemd made for the unit (the first of
    C{$RUNTIME_DIRECTORY}), or L{None}.
    """
    value = (os.environ if environ is None else environ).get("RUNTIME_DIRECTORY", "")
    first = value.split(":")[0]
    return first or None


def record_path(directory: str, pid: int) -> str:
    """
    Where the daemon C{pid} keeps its record in C{directory}.
    """
    return os.path.join(directory, f"reload-{pid}.json")


def read_outcome(path: str) -> ReloadOutcome | None:
    """
    The record at C{path}, or L{None} when there is none (or it cannot be read).
    """
    try:
        with open(path, encoding="utf-8") as stream:
            fields = json.load(stream)
        return ReloadOutcome(
            pid=int(fields["pid"]),
            started=int(fields["started"]),
            finished=int(fields["finished"]),
            taken=bool(fields["taken"]),
            problems=str(fields["problems"]),
            warm_up_timeout=float(fields["warm_up_timeout"]),
            status=str(fields["status"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class OutcomeRecord:
    """
    The daemon's side: numbers its reloads and writes their outcomes (see the module
    docstring). A record that cannot be written is logged once; the reload goes on.
    """

    def __init__(self, directory: str, warm_up_timeout: float = 0.0) -> None:
        """
        @param directory: The runtime directory the record is written in.
        @param warm_up_timeout: Written with each reload (L{ReloadOutcome}).
        """
        self.directory = directory
        self.warm_up_timeout = warm_up_timeout
        self.path: str | None = None
        self._outcome: ReloadOutcome | None = None
        self._failed = False

    def start(self) -> None:
        """
        Write the first record (no reload yet), named after this process: call it once
        the process is the one that serves (after twistd has daemonized, if it does).
        """
        pid = os.getpid()
        self.path = record_path(self.directory, pid)
        self._write(ReloadOutcome(pid=pid, warm_up_timeout=self.warm_up_timeout))

    def begin(self, warm_up_timeout: float | None = None) -> int:
        """
        A reload begins (before it reads the configuration).

        @return: Its number, for L{end}.
        """
        if warm_up_timeout is not None:
            self.warm_up_timeout = warm_up_timeout
        outcome = self._current()
        started = outcome.started + 1
        self._write(
            ReloadOutcome(
                outcome.pid,
                started,
                outcome.finished,
                outcome.taken,
                outcome.problems,
                self.warm_up_timeout,
                outcome.status,
            )
        )
        return started

    def end(self, number: int, taken: bool, problems: str = "", status: str = "") -> None:
        """
        Reload C{number} ended: taken, or not because of C{problems}; the daemon's
        C{status} line then.
        """
        outcome = self._current()
        self._write(
            ReloadOutcome(
                outcome.pid,
                max(outcome.started, number),
                number,
                taken,
                "" if taken else problems,
                self.warm_up_timeout,
                status,
            )
        )

    def refuse(self, problems: str) -> None:
        """
        A reload refused before it began (the daemon is stopping): it begins and ends.
        """
        self.end(self.begin(), False, problems)

    def remove(self) -> None:
        """
        Remove the record (the daemon exits).
        """
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _current(self) -> ReloadOutcome:
        if self._outcome is None:
            self.start()
        assert self._outcome is not None
        return self._outcome

    def _write(self, outcome: ReloadOutcome) -> None:
        self._outcome = outcome
        assert self.path is not None
        partial = None
        try:
            # A new file of a name no one can plant a link at beforehand (mkstemp opens
            # with O_EXCL), in the same directory so that the rename is atomic.
            fd, partial = tempfile.mkstemp(
                prefix=f".{os.path.basename(self.path)}.", suffix=".partial", dir=self.directory
            )
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                json.dump(asdict(outcome), stream)
            # Atomic: the reader sees the old record or the new one, never a part.
            os.replace(partial, self.path)
            partial = None
        except OSError as e:
            if partial is not None:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
            if not self._failed:
                self._failed = True
                _log.warn(
                    "cannot write the reload record {path} ({error}): `edgegw reload` "
                    "will not see this daemon's reloads; further failures are not logged",
                    path=self.path,
                    error=e.strerror or e,
                )


def request_reload(
    pid: int,
    directory: str,
    timeout: float | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """
    Ask the daemon C{pid} to reload (SIGHUP), and report the outcome of a reload that
    began after the request: a taken one on C{out}, a refused one with its problems on
    C{err}.

    @param directory: The daemon's runtime directory (where its record is).
    @param timeout: The most seconds to wait; by default twice the daemon's warm-up
        timeout and L{MARGIN}.
    @return: The exit status: 0 when the new configuration serves, 1 when it was
        refused or no outcome came (no such daemon, no record, the daemon exited, the
        wait timed out).
    """
    path = record_path(directory, pid)
    if not _alive(pid):
        err.write(f"edgegw reload: no process {pid}: the gateway is not running\n")
        return 1
    before = read_outcome(path)
    if before is None or before.pid != pid:
        err.write(
            f"edgegw reload: no reload record {path}: is process {pid} an edgegw daemon "
            "run with this runtime directory (RUNTIME_DIRECTORY, twistd edgegw "
            "--runtime-directory)? Nothing was sent\n"
        )
        return 1
    if timeout is None:
        timeout = 2 * before.warm_up_timeout + MARGIN
    deadline = clock() + timeout
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as e:
        err.write(f"edgegw reload: cannot signal process {pid}: {e.strerror or e}\n")
        return 1
    while True:
        outcome = read_outcome(path)
        if outcome is not None and outcome.pid == pid and outcome.finished > before.started:
            break
        if not _alive(pid):
            err.write(
                f"edgegw reload: process {pid} exited before its reload ended: the "
                "gateway is not running\n"
            )
            return 1
        if clock() >= deadline:
            err.write(
                f"edgegw reload: no outcome from process {pid} within {timeout:g} s; the "
                "reload may still be under way (see the daemon's log)\n"
            )
            return 1
        sleep(POLL)
    if outcome.taken:
        out.write(
            f"edgegw reload: the new configuration serves (process {pid}): {outcome.status}\n"
        )
        return 0
    problems = outcome.problems.rstrip("\n") or "(no reason given)"
    err.write(
        f"edgegw reload: refused, the running configuration keeps serving (process {pid}):\n"
        f"{problems}\n"
    )
    return 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Another user's process: alive (and the signal will say it may not be sent).
        return True
    return True
