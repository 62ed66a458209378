"""
SpentStates: when full of unexpired states, spend() must not evict the oldest unexpired
one, or a state spent earlier would be accepted again (a replayed callback buys a second
token-endpoint call). Filling it is cheap: GET /auth/login, then
GET /auth/callback?state=S&error=x with that login cookie spends S with no IdP call at
all (2 requests per state, 50,000 states inside the 600 s login lifetime).
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

import edgegw.auth.callback as callback
from edgegw.auth.callback import SpentStates


class SpentEviction(SynchronousTestCase):
    def test_unexpired_state_is_not_forgotten(self) -> None:
        self.patch(callback, "MAX_SPENT", 3)
        clock = Clock()
        clock.advance(1000)
        spent = SpentStates(clock)
        self.assertTrue(spent.spend("victim", 1000))
        for filler in ("a", "b"):
            self.assertTrue(spent.spend(filler, 1000))
        # Full of unexpired states: a new one is refused (the callback answers 503)
        # rather than one being forgotten.
        self.assertIsNone(spent.spend("c", 1000))
        self.assertFalse(spent.spend("victim", 1000), "a spent, unexpired state was accepted again")
        # Once the first ones expire, there is room again.
        clock.advance(601)
        self.assertTrue(spent.spend("c", 1000 + 601))
