"""
Review findings (fleet review 4): failing tests for bugs in the rate-limit plugin.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from edgegw.plugins.plugin_context import PluginContext
from edgegw.plugins.rate_limit import RateLimit, plugin


def _limiter(config: dict[str, object], clock: Clock) -> RateLimit:
    return plugin.request_hook_in(config, PluginContext("rl", clock))


class HugeRateTests(TestCase):
    """
    A rate above 2,000,000/s (or 120,000,000/m) is accepted by the config check, but
    its interval rounds to 0 microseconds: the GCRA never moves the TAT and no request
    is ever limited (locally, and in GCRA_SCRIPT with ARGV[1] = 0 likewise).
    """

    def test_huge_rate_still_limits_or_is_refused(self) -> None:
        clock = Clock()
        try:
            limiter = _limiter({"rate": "3000000/s", "burst": 1}, clock)
        except Exception:
            return  # refused at load: fine
        key = b"k" * 16
        first, _ = limiter.table.take(key)
        self.assertTrue(first)
        # Same instant, burst 1: the second request must be over the limit.
        second, _ = limiter.table.take(key)
        self.assertFalse(second, f"interval is {limiter.interval} us: never limited")

    def test_interval_never_zero(self) -> None:
        try:
            limiter = _limiter({"rate": "99999999999999999999/s"}, Clock())
        except Exception:
            return
        self.assertGreater(limiter.interval, 0)
