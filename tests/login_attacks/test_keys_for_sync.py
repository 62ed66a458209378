"""
The shared key-set refetch (HEAD: IdentityProvider.keys_for; working tree:
KeySource.keys_for) does

    self._refetching = Deferred.fromCoroutine(fetch(url))
    self._refetching.addBoth(self._refetched)      # sets self._refetching = None
    ...
    self._refetching.addBoth(_relay, waiting)

When the fetch completes synchronously (the agent/pool fails the request at once: a
request encode_request refuses, a synchronous connection failure, the pool's queue
closed during shutdown), _refetched has already set self._refetching to None:
AttributeError, and the callback (or a Bearer request) answers 500 instead of treating it
as a failed refetch.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from edgegw.config.model import IdpSpec
from edgegw.identity.discovery import parse_discovery
from edgegw.identity.provider import IdentityProvider


class FailingAgent:
    def request(
        self, method: bytes, uri: bytes, headers: Any = None, bodyProducer: Any = None
    ) -> Any:
        return fail(ConnectionRefusedError("refused at once"))


class SyncRefetch(TestCase):
    async def test_refetch_failing_synchronously(self) -> None:
        issuer = "http://idp.test"
        spec = IdpSpec(name="i", issuer=issuer, client_id="gw")
        clock = Clock()
        clock.advance(1000)
        provider = IdentityProvider(spec, FailingAgent(), clock)  # type: ignore[arg-type]
        provider.metadata = parse_discovery(
            {
                "issuer": issuer,
                "authorization_endpoint": issuer + "/authorize",
                "token_endpoint": issuer + "/token",
                "jwks_uri": issuer + "/jwks",
            },
            issuer,
        )
        source = getattr(provider, "id_token_keys", None)
        if source is not None:  # working tree: KeySource
            source.url = issuer + "/jwks"
            keys = await source.keys_for("unknown-kid")
            self.assertIs(keys, source.keys)
        else:  # HEAD
            keys = await provider.keys_for("unknown-kid")
            self.assertIs(keys, provider.keys)
