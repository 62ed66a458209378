"""
Starting, stopping and measuring the processes under test.

Every process is started in its own session (process group) so that stopping it also
stops whatever it spawned (nginx's workers); CPU time and RSS are read from C{/proc}.
What the tests share (the repository root, the virtualenv's scripts, a free port) is in
L{tests.support.processes}.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from tests.support.processes import REPO_ROOT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024
"""Bytes in a mebibyte."""


class StartupError(Exception):
    """
    A process under test did not come up; the message says why (with its log's tail).
    """


def tail(path: Path, lines: int = 15) -> str:
    """
    The last C{lines} lines of a log file, or C{""} when it does not exist.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """
    A child process in its own process group, with its output in a log file.

    @ivar name: A short label for messages.
    @ivar log: The file receiving the process's stdout and stderr.
    @param env: Its whole environment; the harness's own by default.
    @param cwd: Its working directory; the repository root by default.
    @param pass_fds: Descriptors it inherits (a listening socket).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self._popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self._popen.pid

    def running(self) -> bool:
        """Whether the process has not exited yet."""
        return self._popen.poll() is None

    def wait_for_port(self, port: int, timeout: float = 20.0) -> None:
        """
        Wait until something accepts TCP connections on 127.0.0.1:C{port}.

        @raise StartupError: If the process exits first or C{timeout} passes.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise StartupError(
                    f"{self.name} exited with status {self._popen.returncode} before "
                    f"listening on 127.0.0.1:{port}:\n{tail(self.log)}"
                )
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            time.sleep(0.05)
        raise StartupError(
            f"{self.name} did not listen on 127.0.0.1:{port} within {timeout:.0f}s:\n"
            f"{tail(self.log)}"
        )

    def stop(self, grace: float = 5.0) -> None:
        """
        Stop the whole process group: SIGTERM, then SIGKILL after C{grace} seconds.
        """
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(grace)
        # Children (nginx workers) may outlive a leader that exited on its own.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(grace)


@contextlib.contextmanager
def started(process: Process) -> Iterator[Process]:
    """
    Use C{process} in a C{with} block and stop it (and its group) on the way out.
    """
    try:
        yield process
    finally:
        process.stop()


def children(pid: int) -> list[int]:
    """
    The ids of the live processes whose parent is C{pid}.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def _stat_fields(pid: int) -> list[str] | None:
    """
    The fields of C{/proc/PID/stat} from the state onwards (index 0 is field 3, the
    state), or L{None} if the process is gone. The command name may hold spaces and
    parentheses, so the line is split after its last C{)}.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    """
    The user plus system CPU time, in seconds, used so far by the processes C{pids}
    (all their threads); processes that are gone count as zero.
    """
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            # Fields 14 (utime) and 15 (stime) of proc(5), in clock ticks.
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLOCK_TICKS


def _status_kib(pid: int, key: str) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_bytes(pid: int) -> int:
    """
    The resident set size of process C{pid} in bytes (C{VmRSS}), 0 if it is gone.
    """
    try:
        text = Path(f"/proc/{pid}/statm").read_text()
    except OSError:
        return 0
    return int(text.split()[1]) * PAGE_SIZE


def peak_rss_bytes(pid: int) -> int:
    """
    The process's peak resident set size in bytes (C{VmHWM}) since it started or since
    the last L{reset_peak_rss}.
    """
    return _status_kib(pid, "VmHWM") * 1024


def reset_peak_rss(pid: int) -> bool:
    """
    Reset C{VmHWM} to the current RSS (C{echo 5 > /proc/PID/clear_refs}).

    @return: Whether the kernel allowed it (it needs the same user and Linux 4.0+).
    """
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _cpu_times() -> tuple[int, int]:
    """Total and idle (idle + iowait) jiffies of all CPUs, from C{/proc/stat}."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields[:8]), fields[3] + fields[4]


def busy_fraction(seconds: float = 1.0) -> float:
    """
    How busy the machine's CPUs are (0 to 1), over C{seconds} of sampling: a check that
    nothing else is running before a benchmark starts.
    """
    total_before, idle_before = _cpu_times()
    time.sleep(seconds)
    total_after, idle_after = _cpu_times()
    total = total_after - total_before
    return 1 - (idle_after - idle_before) / total if total else 0.0


BUSY_WARNING = 0.15
"""Warn when the CPUs are busier than this before a run starts."""


def warn_if_busy(threshold: float = BUSY_WARNING) -> float:
    """
    Sample how busy the CPUs are (L{busy_fraction}) and warn on stderr when they are
    busier than C{threshold}: other processes would skew a benchmark.

    @return: The busy fraction, for the results.
    """
    busy = busy_fraction()
    if busy > threshold:
        print(
            f"bench: warning: the CPUs were {busy:.0%} busy before starting; other "
            "processes will skew the results",
            file=sys.stderr,
        )
    return busy


@contextlib.contextmanager
def scratch(prefix: str, keep: bool = False) -> Iterator[Path]:
    """
    A temporary directory for a run's configurations and logs, removed on the way out
    unless C{keep} (then its path is printed).
    """
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield directory
    finally:
        if keep:
            print(f"bench: kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)


def raise_fd_limit(wanted: int) -> int:
    """
    Raise this process's open-file limit (inherited by the processes it starts) to at
    least C{wanted} where allowed: the soft limit up to the hard one, and the hard one
    too when running as root.

    @return: The soft limit now in force.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
