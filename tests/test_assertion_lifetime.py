"""
The lifetime bound of inbound identity assertions (issue 36, point 9: no test failed with
it removed): an assertion valid for longer than ten minutes (C{exp - iat} over
C{MAX_LIFETIME}, 600 s) is refused however fresh it is, one valid for exactly ten
minutes is accepted. A long-lived assertion is one a peer (or whoever stole its key for
a moment) could have minted to be replayed at will; C{issue.ttl} cannot exceed the bound.

End to end on real sockets as tests/test_assertion.py: each assertion, signed with a key
B accepts, is sent to B1 (requireBearer false: the assertion alone authenticates) and to
B2 (requireBearer true, with alice's valid Bearer token).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor

from edgegw.identity.assertion import MAX_LIFETIME
from tests.test_assertion import AssertionTestCase, world

reactor: Any = _reactor

TOO_LONG = "valid for longer than an assertion may be"


class Lifetime(AssertionTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        self.w = await world(self)
        self.b1 = await self.w.gateway_b(require_bearer=False)
        self.b2 = await self.w.gateway_b(require_bearer=True)

    async def refused(self, lifetime: int, iat_offset: int = 0) -> None:
        w = self.w
        now = int(reactor.seconds())
        iat = now + iat_offset
        message = f"exp = iat + {lifetime} s, iat now {iat_offset:+d} s"
        token = w.assertion(w.claims(iat=iat, exp=iat + lifetime))
        await self.assert_alone_ignored(self.b1, w.rec_b, token, TOO_LONG, message)
        token = w.assertion(w.claims(iat=iat, exp=iat + lifetime))
        await self.assert_bearer_only(self.b2, w.rec_b, token, w.bearer(), TOO_LONG, message)

    async def accepted(self, lifetime: int, iat_offset: int = 0) -> None:
        w = self.w
        now = int(reactor.seconds())
        iat = now + iat_offset
        message = f"exp = iat + {lifetime} s, iat now {iat_offset:+d} s"
        token = w.assertion(w.claims(iat=iat, exp=iat + lifetime))
        await self.assert_alone_accepted(self.b1, w.rec_b, token, message)
        token = w.assertion(w.claims(iat=iat, exp=iat + lifetime))
        await self.assert_enriched(self.b2, w.rec_b, token, w.bearer(), message)

    def test_the_bound_is_ten_minutes(self) -> None:
        self.assertEqual(MAX_LIFETIME, 600)

    async def test_one_second_over_is_refused(self) -> None:
        await self.refused(601)

    async def test_an_hour_is_refused(self) -> None:
        await self.refused(3600)

    async def test_a_day_is_refused(self) -> None:
        await self.refused(86400)

    async def test_exactly_ten_minutes_is_accepted(self) -> None:
        await self.accepted(600)
        await self.accepted(599)

    async def test_half_spent_long_lived_is_refused(self) -> None:
        """
        Attack: a long-lived assertion presented late in its life, when what is left of
        it (C{exp - now}) is within ten minutes, is still refused: the bound is on what
        it was minted for, not on what remains.
        """
        await self.refused(3600, iat_offset=-3300)
        # Within the bound, as late in its life: accepted.
        await self.accepted(600, iat_offset=-590)
