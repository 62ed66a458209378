"""
A connection's timeout kept lazily: one timer pending while its deadline moves.

Twisted's L{TimeoutMixin} keeps a timer per period: each request stops the timer while
it is answered and starts it again after, two C{callLater}s and two cancellations a
request (~2 µs). L{LazyTimeout} keeps one timer pending while the deadline moves:
stopping only forgets the deadline, a later deadline only records it, and when the
timer fires early it waits for the rest. Only a deadline sooner than the pending timer
replaces it.
"""

from __future__ import annotations

from typing import cast

from twisted.internet.base import DelayedCall
from twisted.protocols.policies import TimeoutMixin


class LazyTimeout(TimeoutMixin):
    """
    L{TimeoutMixin}'s C{setTimeout} and C{resetTimeout}, kept lazily (mixed in before
    a protocol class that has L{TimeoutMixin}; its private timer is never made).
    """

    # When the timeout is due, and the one timer that fires at or before then.
    _deadline: float | None = None
    _timerCall: DelayedCall | None = None

    def setTimeout(self, period: float | None) -> float | None:
        """
        Change the timeout period, as L{TimeoutMixin.setTimeout} does (L{None}: no
        timeout), and return the previous one.
        """
        previous = self.timeOut
        self.timeOut = period  # type: ignore[assignment]  # TimeoutMixin says int
        if period is None:
            self._deadline = None
        else:
            self._arm(period)
        return previous

    def resetTimeout(self) -> None:
        """
        Restart the timeout's period from now, if one is running.
        """
        period = self.timeOut
        if self._deadline is not None and period is not None:
            self._arm(period)

    def limitTimeout(self, period: float) -> None:
        """
        Make the timeout end within C{period} seconds from now: sooner than it would,
        never later (a timeout not running starts with that period).
        """
        deadline, call = self._deadline, self._timerCall
        if deadline is not None and call is not None and deadline - call.seconds() <= period:
            return
        self.setTimeout(period)

    def stopTimer(self) -> None:
        """
        Cancel the pending timer, rather than leave it to lapse: it would keep a
        connection that is closed, or no longer this protocol's, for a whole period.
        """
        self._deadline = None
        timer = self._timerCall
        if timer is not None:
            self._timerCall = None
            timer.cancel()

    def _arm(self, period: float) -> None:
        call = self._timerCall
        if call is not None:
            deadline = call.seconds() + period
            if deadline >= call.getTime():
                self._deadline = deadline
                return
            # Sooner than the pending timer: a new one (moving a timer sooner is a
            # linear search of the reactor's timers; cancelling is constant time).
            call.cancel()
        call = self._timerCall = cast(DelayedCall, self.callLater(period, self._timerFired))
        self._deadline = call.getTime()

    def _timerFired(self) -> None:
        fired = self._timerCall
        self._timerCall = None
        deadline = self._deadline
        if deadline is None or fired is None:
            return
        remaining = deadline - fired.seconds()
        if remaining > 0:
            self._timerCall = cast(DelayedCall, self.callLater(remaining, self._timerFired))
            return
        self._deadline = None
        self.timeoutConnection()
