"""
The extension points a plugin implements.

A plugin is an object registered under a name in the C{edgegw.plugins} entry point
group (L{edgegw.plugins.registry}). It provides L{IRequestPlugin}, L{IResponsePlugin}
or both; a C{RequestPlugin} resource uses the first, a C{ResponsePlugin} resource the
second. At load the gateway hands each resource's C{config} to the plugin, which checks
it and returns a hook (raising L{PluginConfigError} for what is wrong); the hook then
runs on every request of the routes the resource selects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from edgegw.plugins.messages import PluginRequest, PluginResponse, Reply

__all__ = [
    "IHeaderNames",
    "IRequestHook",
    "IRequestPlugin",
    "IResponseHook",
    "IResponsePlugin",
    "PluginConfigError",
]


class PluginConfigError(ValueError):
    """
    Raised by a plugin for a C{config} it cannot use: each problem names a field path
    inside C{config} (C{""} for the config as a whole) and says what is wrong.

    Raise C{PluginConfigError("maxBytes", "must be a size")} for one problem, or
    C{PluginConfigError.of([(field, message), ...])} for several.

    @ivar problems: The (field, message) pairs.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.problems: tuple[tuple[str, str], ...] = ((field, message),)

    @classmethod
    def of(cls, problems: Sequence[tuple[str, str]]) -> PluginConfigError:
        """
        One error carrying every problem in C{problems} (at least one).
        """
        if not problems:
            raise ValueError("PluginConfigError.of needs at least one problem")
        error = cls(*problems[0])
        error.problems = tuple(problems)
        return error


class IRequestHook(Interface):
    """
    A request plugin configured for one C{RequestPlugin} resource.
    """

    def on_request(request: PluginRequest) -> Reply | Awaitable[Reply | None] | None:
        """
        Look at and change C{request} (headers, path, query, body producer) on its way to
        the terminal; return a L{Reply} to answer it instead (the terminal and any later
        plugin are then skipped), or L{None} to go on. May return an awaitable (a
        coroutine or a Deferred) of either. Raising answers 500.
        """


class IResponseHook(Interface):
    """
    A response plugin configured for one C{ResponsePlugin} resource.
    """

    wants_body = Attribute(
        "bool: whether on_response needs the whole body (it is then buffered, up to "
        "max_body_bytes; the response streams when no plugin of the route wants it)"
    )
    max_body_bytes = Attribute(
        "int: the longest body this hook accepts buffered; past it the answer is a 502"
    )

    def on_response(response: PluginResponse) -> None:
        """
        Look at and change C{response} (status, headers, and the body when it was
        buffered) before it goes out. Runs as the response starts: it must not block.
        Raising answers 500.
        """


class IHeaderNames(Interface):
    """
    Optionally provided by a hook whose header edits are fixed by its config: edgegw
    then refuses, at load, names the gateway owns (which would fail every request).
    """

    def header_names() -> Sequence[tuple[str, str]]:
        """
        (field path inside C{config}, header name) of every header the hook sets, adds
        or removes.
        """


class IRequestPlugin(Interface):
    """
    A plugin usable as a C{RequestPlugin}.
    """

    def request_hook(config: Mapping[str, Any]) -> IRequestHook:
        """
        The hook for one resource's C{config}, checked completely.

        @raise PluginConfigError: What is wrong with C{config}.
        """


class IResponsePlugin(Interface):
    """
    A plugin usable as a C{ResponsePlugin}.
    """

    def response_hook(config: Mapping[str, Any]) -> IResponseHook:
        """
        The hook for one resource's C{config}, checked completely.

        @raise PluginConfigError: What is wrong with C{config}.
        """
