"""
A state store whose operations are counted by outcome (C{ok} or C{error}) in the
gateway's metrics, whatever provider it comes from: what the server-side sessions and
the readiness endpoint use when metrics are on.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.metrics.gateway_metrics import IMetrics
from edgegw.state.store import IStateStore, MessageCallback

__all__ = ["MeasuredStore"]


@implementer(IStateStore)
class MeasuredStore:
    """
    Delegates every operation to C{store}; counts each in C{metrics}.
    """

    def __init__(self, store: IStateStore, metrics: IMetrics) -> None:
        self.store = store
        self.metrics = metrics

    @property
    def timeout(self) -> float:
        return float(self.store.timeout)

    def _counted(self, operation: str, result: Deferred[Any]) -> Deferred[Any]:
        def ok(value: object) -> object:
            self.metrics.state_operation(operation, "ok")
            return value

        def error(failure: Failure) -> Failure:
            self.metrics.state_operation(operation, "error")
            return failure

        return result.addCallbacks(ok, error)

    def get(self, key: bytes) -> Deferred[bytes | None]:
        return self._counted("get", self.store.get(key))

    def set(self, key: bytes, value: bytes, ttl: float) -> Deferred[None]:
        return self._counted("set", self.store.set(key, value, ttl))

    def replace(self, key: bytes, expected: bytes, value: bytes, ttl: float) -> Deferred[bool]:
        return self._counted("replace", self.store.replace(key, expected, value, ttl))

    def delete(self, *keys: bytes) -> Deferred[int]:
        return self._counted("delete", self.store.delete(*keys))

    def ttl(self, key: bytes) -> Deferred[float | None]:
        return self._counted("ttl", self.store.ttl(key))

    def acquire(self, lock_key: bytes, owner: bytes, lease: float) -> Deferred[bool]:
        return self._counted("acquire", self.store.acquire(lock_key, owner, lease))

    def release(self, lock_key: bytes, owner: bytes) -> Deferred[bool]:
        return self._counted("release", self.store.release(lock_key, owner))

    def add_to_index(self, index_key: bytes, member: bytes, ttl: float) -> Deferred[None]:
        return self._counted("add_to_index", self.store.add_to_index(index_key, member, ttl))

    def index_members(self, index_key: bytes) -> Deferred[frozenset[bytes]]:
        return self._counted("index_members", self.store.index_members(index_key))

    def remove_from_index(self, index_key: bytes, *members: bytes) -> Deferred[int]:
        return self._counted("remove_from_index", self.store.remove_from_index(index_key, *members))

    def publish(self, channel: bytes, message: bytes) -> Deferred[int]:
        return self._counted("publish", self.store.publish(channel, message))

    def subscribe(self, channel: bytes, callback: MessageCallback) -> Deferred[None]:
        return self._counted("subscribe", self.store.subscribe(channel, callback))

    def unsubscribe(self, channel: bytes, callback: MessageCallback) -> Deferred[None]:
        return self._counted("unsubscribe", self.store.unsubscribe(channel, callback))
