"""
The interface the gateway holds its server-side state through, whatever keeps it.

Every operation answers a L{Deferred} that fires within the store's configured timeout:
with the result, or with L{StoreUnavailableError} when the store cannot be reached, did
not answer in time, or is reconnecting. Callers treat that as "no state" (fail closed),
never wait for the store to come back.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

__all__ = [
    "IScriptingStore",
    "IStateStore",
    "MessageCallback",
    "StoreError",
    "StoreUnavailableError",
]

MessageCallback = Callable[[bytes], object]
"""Called with each message published on a subscribed channel."""


class StoreError(Exception):
    """
    The store refused an operation (an error reply); the message says why, for the log.
    """


class StoreUnavailableError(StoreError):
    """
    The store cannot be reached right now: not connected, connection lost, or no answer
    within the timeout. The operation may or may not have taken effect.
    """


class IStateStore(Interface):
    """
    A key-value store with expiry, owner-checked locks, expiring sets and pub/sub.

    Keys, index names and channels are given without the configured key prefix: the store
    adds it, so that gateways sharing one store under different prefixes never meet.
    Times are seconds (floats); the store keeps them to the millisecond.
    """

    timeout = Attribute("Seconds every operation is bounded by (float).")

    def get(key: bytes) -> Deferred[bytes | None]:
        """
        The value of C{key}, or L{None} when there is none (or it has expired).
        """

    def set(key: bytes, value: bytes, ttl: float) -> Deferred[None]:
        """
        Store C{value} under C{key}, replacing any value, expiring in C{ttl} seconds.

        @param ttl: Positive seconds.
        """

    def replace(key: bytes, expected: bytes, value: bytes, ttl: float) -> Deferred[bool]:
        """
        Store C{value} under C{key}, expiring in C{ttl} seconds, if and only if C{key}
        still holds C{expected} (atomically); fires with whether it did. A key deleted
        (or changed) meanwhile stays as it is.
        """

    def delete(*keys: bytes) -> Deferred[int]:
        """
        Remove the keys; fires with how many existed.
        """

    def ttl(key: bytes) -> Deferred[float | None]:
        """
        Seconds C{key} has left, or L{None} when it does not exist or never expires.
        """

    def acquire(lock_key: bytes, owner: bytes, lease: float) -> Deferred[bool]:
        """
        Take the lock C{lock_key} for C{owner} unless someone holds it (SET NX PX):
        fires with whether it was taken. The lock lapses by itself after C{lease}
        seconds, so choose a lease that outlives the slowest work done under it.
        """

    def release(lock_key: bytes, owner: bytes) -> Deferred[bool]:
        """
        Release C{lock_key} if, and only if, C{owner} still holds it (atomically: a lock
        that lapsed and was taken by another owner is left alone); fires with whether
        it was released.
        """

    def add_to_index(index_key: bytes, member: bytes, ttl: float) -> Deferred[None]:
        """
        Add C{member} to the set C{index_key} and make the whole set expire in C{ttl}
        seconds unless it already lives longer (atomically).
        """

    def index_members(index_key: bytes) -> Deferred[frozenset[bytes]]:
        """
        The members of the set C{index_key} (empty when there is none).
        """

    def remove_from_index(index_key: bytes, *members: bytes) -> Deferred[int]:
        """
        Remove members from the set C{index_key}; fires with how many were in it.
        """

    def publish(channel: bytes, message: bytes) -> Deferred[int]:
        """
        Publish C{message} on C{channel}; fires with how many subscribers (connections,
        in every process) received it.
        """

    def subscribe(channel: bytes, callback: MessageCallback) -> Deferred[None]:
        """
        Call C{callback} with every message later published on C{channel}, on a
        connection of its own. The subscription is kept, and made again after every
        reconnection (messages published while disconnected are lost); the L{Deferred}
        fires once it is active, or fails with L{StoreUnavailableError} while the store
        cannot be reached.
        """

    def unsubscribe(channel: bytes, callback: MessageCallback) -> Deferred[None]:
        """
        Stop calling C{callback} for C{channel}.
        """


class IScriptingStore(Interface):
    """
    A store that runs scripts atomically next to the data (Redis Lua), as an
    L{IStateStore} may also provide.
    """

    def run_script(script: bytes, keys: list[bytes], args: list[bytes | int]) -> Deferred[object]:
        """
        Run C{script} (Lua, for Redis) atomically with C{keys} (without the key prefix:
        the store adds it) and C{args}: sent once, then by its digest (EVALSHA), sent
        again whenever the store has forgotten it (NOSCRIPT). Fires with the script's
        reply; fails with L{StoreError} for an error reply, L{StoreUnavailableError}
        when the store cannot be reached.
        """
