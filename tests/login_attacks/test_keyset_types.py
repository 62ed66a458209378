"""
Finding (low, robustness): KeySet.from_jwks promises that unusable entries are skipped,
not fatal, but an entry whose "alg" (or a discovery document whose
id_token_signing_alg_values_supported item) is a JSON array or object raises TypeError
(unhashable in a frozenset membership test). One odd entry then throws away the whole key
set (refresh and unknown-kid refetch fail and are retried as "IdP errors"), and a raw
TypeError escapes parse_discovery instead of DiscoveryError.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from edgegw.identity.discovery import DiscoveryError, parse_discovery
from edgegw.identity.keyset import KeySet
from tests.support.fake_idp import SigningKey


class OddTypes(SynchronousTestCase):
    def test_one_odd_jwk_is_skipped_not_fatal(self) -> None:
        good = SigningKey.generate("rsa-1", "RS256").public_jwk()
        odd = dict(good, kid="odd", alg=["RS256"])
        keys = KeySet.from_jwks({"keys": [odd, good]})
        self.assertEqual(keys.kids, frozenset({"rsa-1"}))

    def test_odd_algorithm_list_item_is_a_discovery_error(self) -> None:
        document = {
            "issuer": "https://i.example",
            "authorization_endpoint": "https://i.example/a",
            "token_endpoint": "https://i.example/t",
            "jwks_uri": "https://i.example/j",
            "id_token_signing_alg_values_supported": [{"x": 1}, "RS256"],
        }
        try:
            parse_discovery(document, "https://i.example")
        except DiscoveryError:
            pass
        except TypeError as e:
            self.fail(f"TypeError escaped: {e}")
