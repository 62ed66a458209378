"""
Running wrk and parsing its C{--latency} report.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Sequence

import attrs

from bench.processes import cpu_seconds

_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}

_PERCENTILE = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s+(\d+(?:\.\d+)?)(us|ms|s|m|h)\s*$", re.M)
_TOTALS = re.compile(
    r"^\s*(\d+) requests in (\d+(?:\.\d+)?)(us|ms|s|m|h), (\d+(?:\.\d+)?)(B|KB|MB|GB|TB) read",
    re.M,
)
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_RPS = re.compile(r"^Requests/sec:\s+(\d+(?:\.\d+)?)", re.M)


class Url(str):
    """
    A URL for wrk to load, with request headers (C{Name: value}) that wrk sends with
    every request (one C{-H} each): it passes, as the string it is, through code that
    only knows URLs (L{bench.rounds.InterleavedRunner}) down to L{run}.

    @ivar headers: The request headers.
    """

    headers: tuple[str, ...]

    def __new__(cls, url: str, headers: Sequence[str] = ()) -> Url:
        self = super().__new__(cls, url)
        self.headers = tuple(headers)
        return self


class WrkError(Exception):
    """
    wrk failed or printed something this parser does not understand.
    """


@attrs.frozen
class WrkResult:
    """
    One wrk run.

    @ivar requests: Completed requests.
    @ivar seconds: The run's measured duration.
    @ivar rps: Requests per second, as wrk reports it.
    @ivar bytes_read: Bytes received (wrk's rounded figure).
    @ivar latency: Latency percentile (50, 75, 90, 99) to seconds.
    @ivar socket_errors: connect, read, write and timeout errors.
    @ivar non_2xx_3xx: Responses with another status.
    """

    requests: int
    seconds: float
    rps: float
    bytes_read: int
    latency: dict[float, float]
    socket_errors: dict[str, int]
    non_2xx_3xx: int

    @property
    def errors(self) -> int:
        """Socket errors plus non-2xx/3xx responses."""
        return sum(self.socket_errors.values()) + self.non_2xx_3xx


def parse(output: str) -> WrkResult:
    """
    Parse the text wrk prints with C{--latency}.

    @raise WrkError: If the totals or the latency distribution are missing.
    """
    totals = _TOTALS.search(output)
    rps = _RPS.search(output)
    percentiles = {
        float(p): round(float(value) * _TIME_UNITS[unit], 9)
        for p, value, unit in _PERCENTILE.findall(output)
    }
    if totals is None or rps is None or 50.0 not in percentiles or 99.0 not in percentiles:
        raise WrkError(f"cannot parse wrk output:\n{output}")
    errors = _SOCKET_ERRORS.search(output)
    socket_errors = dict.fromkeys(("connect", "read", "write", "timeout"), 0)
    if errors is not None:
        socket_errors = dict(zip(socket_errors, map(int, errors.groups()), strict=True))
    non_2xx = _NON_2XX.search(output)
    return WrkResult(
        requests=int(totals.group(1)),
        seconds=float(totals.group(2)) * _TIME_UNITS[totals.group(3)],
        rps=float(rps.group(1)),
        bytes_read=int(float(totals.group(4)) * _SIZE_UNITS[totals.group(5)]),
        latency=percentiles,
        socket_errors=socket_errors,
        non_2xx_3xx=int(non_2xx.group(1)) if non_2xx else 0,
    )


def run(wrk: str, url: str, connections: int, duration: int, threads: int = 1) -> WrkResult:
    """
    Run C{wrk -t<threads> -c<connections> -d<duration>s --latency URL} and parse it
    (with C{-H HEADER} for each of the headers of a L{Url}).

    @raise WrkError: If wrk fails or its output cannot be parsed.
    """
    headers = url.headers if isinstance(url, Url) else ()
    argv = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration}s",
        "--latency",
        *(option for header in headers for option in ("-H", header)),
        url,
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration + 60, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise WrkError(f"wrk did not finish: {' '.join(argv)}") from e
    if done.returncode != 0:
        raise WrkError(
            f"wrk exited with {done.returncode} ({' '.join(argv)}): "
            f"{done.stderr.strip() or done.stdout}"
        )
    return parse(done.stdout)


def measure(
    wrk: str,
    url: str,
    connections: int,
    duration: int,
    pids: Iterable[int],
    settle: Callable[[WrkResult], object] | None = None,
) -> tuple[WrkResult, float]:
    """
    L{run} wrk, reading the CPU time (C{utime + stime}) of the processes C{pids} before
    and after it.

    @param settle: Called with wrk's result before the CPU time is read again: a wait
        for work the run left behind (spans still queued for export), charged to it.
    @return: wrk's result and the CPU seconds C{pids} used meanwhile.
    @raise WrkError: If wrk fails or its output cannot be parsed.
    """
    pids = list(pids)
    before = cpu_seconds(pids)
    result = run(wrk, url, connections, duration)
    if settle is not None:
        settle(result)
    return result, cpu_seconds(pids) - before
