"""
The replay record of L{edgegw.identity.assertion.AssertionVerifier}: it forgets every
expired token id, not only those in front of the first unexpired one (a longer-lived
assertion must not pin later, expired ones), and one subject cannot fill it and shut
everyone else out.
"""

from __future__ import annotations

from nacl.signing import SigningKey
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.model import AssertionAcceptSpec, AssertionIssueSpec, AssertionKeySpec
from edgegw.identity import assertion as module
from edgegw.identity.assertion import AssertionIssuer, AssertionRefusedError, AssertionVerifier
from edgegw.identity.principal import Principal


class ReplayRecord(SynchronousTestCase):
    def setUp(self) -> None:
        self.key = SigningKey.generate()
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        spec = AssertionAcceptSpec(
            issuer="gw-a",
            keys=(AssertionKeySpec("a-1", bytes(self.key.verify_key)),),
            require_bearer=False,
        )
        self.verifier = AssertionVerifier(spec, self.clock)

    def issuer(self, ttl: float) -> AssertionIssuer:
        return AssertionIssuer(AssertionIssueSpec("gw-a", "a-1", bytes(self.key), ttl), self.clock)

    def test_expired_entries_behind_a_long_lived_one_are_forgotten(self) -> None:
        self.patch(module, "MAX_SEEN", 10)
        alice = Principal("alice")
        # Two instances of gw-a share the key; one was configured with ttl 1h.
        long_lived, short = self.issuer(600), self.issuer(60)
        self.verifier.verify(long_lived.mint(alice))
        for index in range(9):
            self.verifier.verify(short.mint(Principal(f"user{index}")))
        # Long after those nine expired (60 s + 30 s leeway), only one id is live.
        self.clock.advance(300)
        try:
            self.verifier.verify(short.mint(Principal("bob")))
        except AssertionRefusedError as e:
            self.fail(f"a fresh assertion refused with 1 live id remembered: {e.reason}")

    def test_one_caller_cannot_lock_everyone_out(self) -> None:
        # Every assertion A mints for mallory (any logged-in user at A; each request
        # on a forwardIdentity route mints one) occupies B's record for ttl + 30 s.
        self.patch(module, "MAX_SEEN", 50)
        a = self.issuer(60)
        refused = 0
        for _ in range(50):
            try:
                self.verifier.verify(a.mint(Principal("mallory")))
            except AssertionRefusedError as e:
                self.assertEqual(e.reason, "too many assertions in flight for this subject")
                refused += 1
        # Mallory holds a tenth of the record at most.
        self.assertEqual(refused, 45)
        try:
            self.verifier.verify(a.mint(Principal("alice")))
        except AssertionRefusedError as e:
            self.fail(f"alice's fresh assertion refused: {e.reason}")
