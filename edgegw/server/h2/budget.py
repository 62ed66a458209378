"""
Budgets for what an HTTP/2 client may make the gateway do for nothing.

HTTP/2 lets a client send frames that cost the server work but ask for nothing it
serves: streams opened and cancelled at once (rapid reset, CVE-2023-44487), SETTINGS,
PING, PRIORITY and WINDOW_UPDATE frames, empty DATA frames, unknown frame types. Each
connection has a token bucket per kind; a client that empties one gets GOAWAY with
ENHANCE_YOUR_CALM and its connection is closed.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

__all__ = ["EventBudget"]


class EventBudget:
    """
    A token bucket: up to C{capacity} events at once, refilled at C{per_second}.
    """

    __slots__ = ("_capacity", "_clock", "_per_second", "_stamp", "_tokens")

    def __init__(self, capacity: float, per_second: float, clock: IReactorTime) -> None:
        self._capacity = capacity
        self._per_second = per_second
        self._clock = clock
        self._tokens = capacity
        self._stamp = clock.seconds()

    def spend(self, count: float = 1) -> bool:
        """
        Take C{count} tokens; L{False} when there are not that many left (the bucket is
        left empty then).
        """
        tokens = self._tokens - count
        if tokens >= 0:
            self._tokens = tokens
            return True
        now = self._clock.seconds()
        tokens += (now - self._stamp) * self._per_second
        self._stamp = now
        if tokens >= 0:
            self._tokens = min(tokens, self._capacity - count)
            return True
        self._tokens = 0
        return False

    def refund(self, count: float = 1) -> None:
        """
        Give C{count} tokens back (up to the capacity): what a client earns by doing
        useful work.
        """
        self._tokens = min(self._tokens + count, self._capacity)
