"""
Running h2load (Debian's C{nghttp2-client}) and parsing its report.

h2load gives no latency percentiles, only the minimum, maximum, mean and standard
deviation of each request's time; the mean is what the reports show. It negotiates the
protocol with ALPN (C{h2} first, then C{http/1.1}) and says which it got: a server that
does not offer C{h2} is answered over HTTP/1.1, which L{H2loadResult.protocol} shows.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable

import attrs

from bench.processes import cpu_seconds

_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_FINISHED = re.compile(r"^finished in (\d+(?:\.\d+)?)(us|ms|s|m|h), (\d+(?:\.\d+)?) req/s", re.M)
_REQUESTS = re.compile(
    r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout",
    re.M,
)
_STATUS = re.compile(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", re.M)
_REQUEST_TIME = re.compile(
    r"^time for request:\s+(\d+(?:\.\d+)?)(us|ms|s)\s+(\d+(?:\.\d+)?)(us|ms|s)\s+"
    r"(\d+(?:\.\d+)?)(us|ms|s)",
    re.M,
)
_PROTOCOL = re.compile(r"^Application protocol: (\S+)", re.M)
_TLS = re.compile(r"^TLS Protocol: (\S+)", re.M)


class H2loadError(Exception):
    """
    h2load failed or printed something this parser does not understand.
    """


@attrs.frozen
class H2loadResult:
    """
    One h2load run.

    @ivar requests: Requests that completed with a 2xx or 3xx status.
    @ivar seconds: The measured duration.
    @ivar rps: Requests per second, as h2load reports it.
    @ivar mean: The mean time per request, in seconds.
    @ivar errors: Failed (4xx, 5xx and errored) and timed-out requests.
    @ivar protocol: The application protocol negotiated (C{h2}, C{http/1.1}).
    @ivar tls: The TLS version (C{TLSv1.3}), or C{""} over plain TCP.
    """

    requests: int
    seconds: float
    rps: float
    mean: float
    errors: int
    protocol: str
    tls: str


def parse(output: str) -> H2loadResult:
    """
    Parse h2load's report.

    @raise H2loadError: If the totals are missing.
    """
    finished, requests = _FINISHED.search(output), _REQUESTS.search(output)
    status, timing = _STATUS.search(output), _REQUEST_TIME.search(output)
    if finished is None or requests is None or status is None or timing is None:
        raise H2loadError(f"cannot parse h2load output:\n{output[-2000:]}")
    # "failed" counts HTTP-level failures (4xx, 5xx) and "errored" ones alike.
    _, _, _, succeeded, failed, _, timeout = map(int, requests.groups())
    protocol = _PROTOCOL.search(output)
    tls = _TLS.search(output)
    return H2loadResult(
        requests=succeeded,
        seconds=float(finished.group(1)) * _TIME_UNITS[finished.group(2)],
        rps=float(finished.group(3)),
        mean=float(timing.group(5)) * _TIME_UNITS[timing.group(6)],
        errors=failed + timeout,
        protocol=protocol.group(1) if protocol else "",
        tls=tls.group(1) if tls else "",
    )


def run(h2load: str, url: str, clients: int, streams: int, duration: int) -> H2loadResult:
    """
    Run C{h2load -c<clients> -m<streams> -D <duration> URL} (one thread) and parse it.

    @param clients: Connections.
    @param streams: Concurrent streams per connection (over HTTP/1.1, pipelined
        requests: the harness never lets that happen, see L{H2loadResult.protocol}).
    @raise H2loadError: If h2load fails or its output cannot be parsed.
    """
    argv = [h2load, "-t1", f"-c{clients}", f"-m{streams}", "-D", str(duration), url]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration + 60, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise H2loadError(f"h2load did not finish: {' '.join(argv)}") from e
    if done.returncode != 0:
        raise H2loadError(
            f"h2load exited with {done.returncode} ({' '.join(argv)}): "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        )
    return parse(done.stdout)


def measure(
    h2load: str, url: str, clients: int, streams: int, duration: int, pids: Iterable[int]
) -> tuple[H2loadResult, float]:
    """
    L{run} h2load, reading the CPU time of the processes C{pids} before and after it.

    @return: h2load's result and the CPU seconds C{pids} used meanwhile.
    @raise H2loadError: If h2load fails or its output cannot be parsed.
    """
    pids = list(pids)
    before = cpu_seconds(pids)
    result = run(h2load, url, clients, streams, duration)
    return result, cpu_seconds(pids) - before
