"""
One key set the IdP publishes, kept fresh: fetched with discovery and periodically by the
IdP client, and refetched (rate limited, one fetch shared by every waiter) when a token
names a key id it does not hold, so that a key rotation needs no restart.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from edgegw.identity.keyset import KeySet

__all__ = ["KeySource"]

_log = Logger(namespace="edgegw.idp")


class KeySource:
    """
    A key set at one URL.

    @ivar url: Where the key set is published (L{None} until discovery says).
    @ivar keys: The key set last fetched (empty until then).
    @ivar refetch_interval: The least time between two fetches caused by unknown key ids.
    """

    def __init__(
        self,
        what: str,
        fetch: Callable[[str], Coroutine[Any, Any, KeySet]],
        clock: IReactorTime,
        refetch_interval: float = 10.0,
    ) -> None:
        """
        @param what: What the keys verify, for the log (C{id_token}, C{access token}).
        @param fetch: Fetches and parses the key set at a URL (raising on failure).
        """
        self.what = what
        self.url: str | None = None
        self.keys = KeySet.from_jwks({"keys": []})
        self.refetch_interval = refetch_interval
        self._fetch = fetch
        self._clock = clock
        self._refetching: Deferred[KeySet] | None = None
        self._last_refetch = float("-inf")

    def seed(self, other: KeySource) -> None:
        """
        Start from what C{other} holds (a reload's new gateway taking over from the old):
        its URL, its keys and when it last refetched (the rate limit carries on).
        """
        self.url = other.url
        self.keys = seeded = other.keys
        self._last_refetch = other._last_refetch
        refetching = other._refetching
        if refetching is not None:
            # A refetch of the old one's is under way (a rotated key): its keys are
            # this one's too, unless this one has fetched its own meanwhile.
            def carry(keys: KeySet) -> KeySet:
                if self.keys is seeded:
                    self.keys = keys
                return keys

            refetching.addCallback(carry)

    async def load(self, url: str) -> KeySet:
        """
        Fetch the key set at C{url} (discovery, the periodic refresh) and keep it.
        """
        keys = await self._fetch(url)
        self.url = url
        self.keys = keys
        return keys

    async def keys_for(self, kid: str | None) -> KeySet:
        """
        The key set, refetched first when it lacks C{kid}: at most once per refetch
        interval, one fetch shared by every caller waiting for it. A failed refetch
        leaves the keys as they were.
        """
        keys = self.keys
        url = self.url
        if kid is None or url is None or keys.has_kid(kid):
            return keys
        refetching = self._refetching
        if refetching is None:
            now = self._clock.seconds()
            if now - self._last_refetch < self.refetch_interval:
                return keys
            self._last_refetch = now
            # A local: a fetch that fails at once has already run _refetched (which
            # clears self._refetching) by the time fromCoroutine returns.
            refetching = self._refetching = Deferred.fromCoroutine(self._fetch(url))
            refetching.addBoth(self._refetched)
        waiting: Deferred[KeySet] = Deferred()
        refetching.addBoth(_relay, waiting)
        return await waiting

    def cancel(self) -> None:
        """
        Cancel a refetch in flight (the service stops).
        """
        if self._refetching is not None:
            self._refetching.cancel()

    def _refetched(self, result: KeySet | Failure) -> KeySet:
        self._refetching = None
        if isinstance(result, KeySet):
            self.keys = result
            _log.info(
                "IdP {what} key set refetched: {count} signing keys",
                what=self.what,
                count=len(result),
            )
            return result
        if not result.check(CancelledError):
            _log.warn(
                "IdP {what} key set refetch failed: {reason}",
                what=self.what,
                reason=str(result.value)[:300],
            )
        return self.keys


def _relay(result: KeySet, waiting: Deferred[KeySet]) -> KeySet:
    waiting.callback(result)
    return result
