"""
State providers, found through package entry points (L{edgegw.entry_points}).

A provider is an object providing L{IStateProviderFactory}, named by an entry point in
the group C{edgegw.state_providers} of any installed distribution; the entry point's
name is the C{type} a configuration gives. edgegw's own C{kvstore} is registered in its
C{setup.py} exactly as a third-party package would register one::

    entry_points={"edgegw.state_providers": ["kvstore = edgegw.state.kvstore:provider"]}

Entry points are read when L{find_provider} or L{provider_types} is called (at config
load, not at import), so installing a provider needs no change to edgegw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.application.service import IService
from zope.interface import Attribute, Interface

from edgegw.config.errors import Location, Problem
from edgegw.entry_points import NotRegisteredError, find_registered, registered_names
from edgegw.state.store import IStateStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "IStateProviderFactory",
    "UnknownProviderError",
    "find_provider",
    "provider_types",
    "take_over_store",
]

ENTRY_POINT_GROUP = "edgegw.state_providers"
"""The entry point group state providers register in."""


class UnknownProviderError(LookupError):
    """
    No installed provider has the type asked for, or the one found is unusable; the
    message says which, and which types there are.
    """


class IStateProviderFactory(Interface):
    """
    Makes state stores of one provider type from their opaque C{config} mappings.
    """

    name = Attribute("The provider type (str), as configurations name it.")

    def validate(config: Mapping[str, Any], where: Location, path: str) -> list[Problem]:
        """
        Every problem with C{config}, each located at C{where} with a field path under
        C{path} (such as C{spec.stateProvider.config}); empty when it is usable.
        """

    def build(
        config: Mapping[str, Any], key_prefix: str, reactor: Any, **options: Any
    ) -> IStateStore:
        """
        The store for a C{config} that L{validate} accepted, not started: it also
        provides L{IService} (named C{state}), connects when started and closes when
        stopped. It may offer C{take_over(old) -> bool}, called by a reload before it
        starts, to use the connections of the store it replaces (L{take_over_store}).

        @param key_prefix: Prepended to every key, index and channel the store uses.
        @param reactor: The gateway's reactor.
        @param options: Provider-specific options that are not configuration (tests pass
            reconnection timings); a provider ignores those it does not know.
        """


def provider_types() -> list[str]:
    """
    The provider types installed, sorted.
    """
    return registered_names(ENTRY_POINT_GROUP)


def find_provider(type_: str) -> IStateProviderFactory:
    """
    The provider factory registered under C{type_}.

    @raise UnknownProviderError: When none is, or the entry point does not load or does
        not name an L{IStateProviderFactory}.
    """
    try:
        factory = find_registered(
            ENTRY_POINT_GROUP, type_, (IStateProviderFactory,), "state provider of type"
        )
    except NotRegisteredError as e:
        raise UnknownProviderError(str(e)) from e
    return factory  # type: ignore[return-value]


def provides_service(store: IStateStore) -> bool:
    """
    Whether a built store is also a service (as L{IStateProviderFactory.build} requires).
    """
    return IService.providedBy(store)


def take_over_store(new: IStateStore | None, old: IStateStore | None) -> bool:
    """
    Have C{new} (a reload's store, not started) use the connections of C{old} (the
    running configuration's) when it can: both of the same provider, and C{new}
    offers a C{take_over(old) -> bool} method (the shipped C{kvstore} does: its
    settings unchanged) that says it did. A provider without one reconnects, as at
    start.

    @return: Whether C{new} took over C{old}'s connections.
    """
    if new is None or old is None or type(new) is not type(old):
        return False
    take_over = getattr(new, "take_over", None)
    return take_over is not None and bool(take_over(old))
