"""
One record per upstream call, for the access log (and, with telemetry, a client span).

Every handler that calls an upstream (the reverse proxy, each api backend) goes through
L{start_call} and L{UpstreamCall.end}, so that what is recorded about upstream calls is
the same everywhere and there is one place to hook tracing into.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

import attrs

from edgegw.chain.exchange import Exchange


@attrs.define
class UpstreamCall:
    """
    An upstream call in progress.

    @ivar name: What was called: the api backend's group, or C{"upstream"} for the proxy.
    @ivar upstream: The upstream's authority (host:port).
    """

    exchange: Exchange
    name: str
    upstream: str
    started: float
    ended: bool = False

    def end(self, status: int | None = None, error: str | None = None) -> None:
        """
        Record the outcome: the status received (if any) and the failure reason (if any).
        Later calls do nothing.
        """
        if self.ended:
            return
        self.ended = True
        record: dict[str, Any] = {
            "name": self.name,
            "upstream": self.upstream,
            "status": status,
            "ms": round((monotonic() - self.started) * 1000, 3),
        }
        if error is not None:
            record["error"] = error
        exchange = self.exchange
        notes = exchange.notes
        calls = notes.get("upstream_calls") if notes is not None else None
        if calls is None:
            exchange.note("upstream_calls", [record])
        else:
            calls.append(record)


def start_call(exchange: Exchange, name: str, upstream: bytes) -> UpstreamCall:
    """
    Begin recording an upstream call.
    """
    return UpstreamCall(exchange, name, upstream.decode("ascii", "replace"), monotonic())


def describe_error(error: BaseException) -> str:
    """
    A short reason for logs: the exception type and message, never sent to the client.
    """
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
