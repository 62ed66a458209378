"""
What the gateway offers a plugin beyond its C{config}: its clock, its state store and
its metrics.

A plugin that needs them provides L{IContextRequestPlugin} as well as
L{IRequestPlugin<edgegw.plugins.interfaces.IRequestPlugin>}: the gateway then calls
C{request_hook_in(config, context)} instead of C{request_hook(config)}, with one
L{PluginContext} per resource.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from zope.interface import Interface, implementer

from edgegw.metrics.instruments import Counter
from edgegw.state.store import IScriptingStore, IStateStore, StoreError

if TYPE_CHECKING:
    from edgegw.metrics.instruments import Registry
    from edgegw.plugins.interfaces import IRequestHook

__all__ = [
    "IContextRequestPlugin",
    "IPluginStore",
    "PluginContext",
    "PluginStore",
    "plugin_key_prefix",
]


def plugin_key_prefix(resource: str) -> bytes:
    """
    The prefix, inside the store's own key prefix, of every key a plugin resource uses.
    """
    return b"plugin:" + resource.encode("utf-8") + b":"


class IPluginStore(Interface):
    """
    The gateway's state store as plugins use it. Keys are the plugin's own (a prefix
    per resource is added: C{plugin:<resource name>:}, after the store's C{keyPrefix});
    every operation fires within the store's timeout, or fails with
    L{StoreUnavailableError<edgegw.state.store.StoreUnavailableError>}.
    """

    def get(key: bytes) -> Deferred[bytes | None]:
        """
        The value of C{key}, or L{None}.
        """

    def set(key: bytes, value: bytes, ttl: float) -> Deferred[None]:
        """
        Store C{value} under C{key}, expiring in C{ttl} seconds (positive).
        """

    def run_script(script: bytes, keys: list[bytes], args: list[bytes | int]) -> Deferred[object]:
        """
        Run a Lua C{script} atomically in the store (EVALSHA once loaded; loaded again
        after NOSCRIPT); fails with L{StoreError<edgegw.state.store.StoreError>} on a
        store that cannot run scripts.
        """

    def can_run_scripts() -> bool:
        """
        Whether L{run_script} is available (the C{kvstore} provider: yes).
        """


@implementer(IPluginStore)
class PluginStore:
    """
    L{IPluginStore} over the gateway's L{IStateStore}, keys under one resource's prefix.
    """

    def __init__(self, store: IStateStore, prefix: bytes) -> None:
        self._store = store
        self._prefix = prefix

    def get(self, key: bytes) -> Deferred[bytes | None]:
        return self._store.get(self._prefix + key)

    def set(self, key: bytes, value: bytes, ttl: float) -> Deferred[None]:
        return self._store.set(self._prefix + key, value, ttl)

    def run_script(
        self, script: bytes, keys: list[bytes], args: list[bytes | int]
    ) -> Deferred[object]:
        if not IScriptingStore.providedBy(self._store):
            return fail(StoreError("this state store cannot run scripts"))
        scripting: Any = self._store
        result: Deferred[object] = scripting.run_script(
            script, [self._prefix + key for key in keys], args
        )
        return result

    def can_run_scripts(self) -> bool:
        return bool(IScriptingStore.providedBy(self._store))


@attrs.frozen
class PluginContext:
    """
    What one plugin resource is given at load.

    @ivar resource: The resource's C{metadata.name}.
    @ivar reactor: The gateway's clock (C{seconds()}, C{callLater}).
    @ivar store: The state store (the Gateway's C{stateProvider}), or L{None}.
    @ivar registry: The gateway's metrics (with C{Telemetry.metrics}), or L{None}.
    """

    resource: str
    reactor: IReactorTime
    store: IPluginStore | None = None
    registry: Registry | None = None

    def counter(
        self, name: str, description: str, attribute_names: Sequence[str] = ()
    ) -> Callable[[Sequence[str]], None]:
        """
        A monotonic counter C{name} (carried over reloads), and what adds one to it with
        the given attribute values. Attribute values must come from a bounded set (a
        route pattern, a resource name: never a client's address or key); without
        metrics, counting does nothing.
        """
        registry = self.registry
        if registry is None:
            return lambda attributes: None
        # Several resources of one plugin count into one instrument.
        for instrument in registry.instruments:
            if instrument.name == name:
                if not isinstance(instrument, Counter) or instrument.attribute_names != tuple(
                    attribute_names
                ):
                    raise ValueError(f"metric {name} exists with other attributes")
                existing = instrument
                return lambda attributes: existing.add(1, tuple(attributes))
        counter = registry.counter(name, "{request}", description, attribute_names)
        return lambda attributes: counter.add(1, tuple(attributes))


class IContextRequestPlugin(Interface):
    """
    A request plugin that is handed the gateway's L{PluginContext} with its config.
    """

    def request_hook_in(config: Mapping[str, Any], context: PluginContext) -> IRequestHook:
        """
        The hook for one resource's C{config}, checked completely, using C{context}.

        @raise PluginConfigError: What is wrong with C{config}.
        """
