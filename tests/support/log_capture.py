"""
Log events captured while a test runs.
"""

from __future__ import annotations

from typing import Any, cast

from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase


def capture_log(test: SynchronousTestCase) -> list[dict[str, Any]]:
    """
    Every log event from now until C{test} ends.
    """
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    test.addCleanup(globalLogPublisher.removeObserver, observer)
    return events
