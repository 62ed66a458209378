"""
Finding extension code through package entry points: the one mechanism behind state
providers and request and response plugins.

An extension is an object named by an entry point in a group edgegw reads (such as
C{edgegw.plugins} or C{edgegw.state_providers}) of any installed distribution; the
entry point's name is what configurations call it. Entry points are read when asked
(at config load, never at import), so installing an extension needs no change to
edgegw.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from zope.interface.interface import InterfaceClass

__all__ = ["NotRegisteredError", "find_registered", "registered", "registered_names"]


class NotRegisteredError(LookupError):
    """
    No installed distribution registers the name asked for, or what it registers does
    not load or does not provide the interface; the message says which, and which names
    there are.
    """


def registered(group: str) -> dict[str, EntryPoint]:
    """
    The entry points of C{group}, by name (a later distribution's wins a clash).
    """
    return {ep.name: ep for ep in entry_points(group=group)}


def registered_names(group: str) -> list[str]:
    """
    The names registered in C{group}, sorted.
    """
    return sorted(registered(group))


def find_registered(
    group: str, name: str, interfaces: tuple[InterfaceClass, ...], what: str
) -> object:
    """
    Load the object registered as C{name} in C{group}.

    @param interfaces: It must provide at least one of these.
    @param what: What such an object is called in messages (C{"state provider"}).
    @raise NotRegisteredError: Nothing is registered under C{name}, or it cannot be
        loaded, or it provides none of C{interfaces}.
    """
    claimants = {ep.value: ep for ep in entry_points(group=group) if ep.name == name}
    if len(claimants) > 1:
        # Which one wins would depend on the order of sys.path and of directory listings:
        # an installed package could silently replace another's (or edgegw's own) plugin.
        named = ", ".join(
            f"{value} ({ep.dist.name if ep.dist is not None else '?'})"
            for value, ep in sorted(claimants.items())
        )
        raise NotRegisteredError(
            f'{what} "{name}" is registered by more than one installed distribution '
            f"({named}): uninstall all but one"
        )
    found = next(iter(claimants.values()), None)
    if found is None:
        known = ", ".join(registered_names(group)) or "none"
        raise NotRegisteredError(f'no {what} "{name}" is installed (installed: {known})')
    try:
        loaded: object = found.load()
    except Exception as e:
        raise NotRegisteredError(f'{what} "{name}" ({found.value}) cannot be loaded: {e}') from e
    if not any(interface.providedBy(loaded) for interface in interfaces):
        names = " or ".join(interface.__name__ for interface in interfaces)
        raise NotRegisteredError(f'{what} "{name}" ({found.value}) does not provide {names}')
    return loaded
