"""
Finding plugins (entry point group C{edgegw.plugins}) and configuring them for the
resources that name them.

A distribution registers a plugin exactly as edgegw registers its own::

    entry_points={"edgegw.plugins": ["headers = edgegw.plugins.headers:plugin"]}

The entry point's name is what a resource's C{spec.plugin} gives (default: its
C{metadata.name}); the object it names provides L{IRequestPlugin}, L{IResponsePlugin}
or both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import attrs
from twisted.internet.interfaces import IReactorTime
from zope.interface.exceptions import Invalid
from zope.interface.verify import verifyObject

from edgegw.config.errors import Problems
from edgegw.config.model import Config, PluginSpec
from edgegw.entry_points import NotRegisteredError, find_registered, registered, registered_names
from edgegw.metrics.gateway_metrics import GatewayMetrics
from edgegw.plugins.interfaces import (
    IHeaderNames,
    IRequestHook,
    IRequestPlugin,
    IResponseHook,
    IResponsePlugin,
    PluginConfigError,
)
from edgegw.plugins.messages import Protected
from edgegw.plugins.plugin_context import (
    IContextRequestPlugin,
    PluginContext,
    PluginStore,
    plugin_key_prefix,
)
from edgegw.state.store import IStateStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "ConfiguredPlugins",
    "configure_plugins",
    "describe_plugins",
    "plugin_context_of",
    "plugin_names",
]

ENTRY_POINT_GROUP = "edgegw.plugins"
"""The entry point group plugins register in."""


def plugin_names() -> list[str]:
    """
    The names of the installed plugins, sorted.
    """
    return registered_names(ENTRY_POINT_GROUP)


@attrs.frozen
class ConfiguredPlugins:
    """
    The hook of every plugin resource, by the resource's document position.
    """

    request: dict[int, IRequestHook] = attrs.field(factory=dict)
    response: dict[int, IResponseHook] = attrs.field(factory=dict)


def configure_plugins(
    config: Config,
    problems: Problems,
    protected: Protected | None = None,
    context: Callable[[str], PluginContext] | None = None,
) -> ConfiguredPlugins:
    """
    Find the plugin each RequestPlugin and ResponsePlugin resource names and hand it the
    resource's C{config}; what fails is added to C{problems}, located at the resource.

    One hook is made per resource, shared by every route the resource selects.

    @param protected: The header names plugins cannot change: a hook that declares its
        header names (L{IHeaderNames}) may not name one.
    @param context: Makes the L{PluginContext} of a resource (by its name), for plugins
        that provide L{IContextRequestPlugin}; by default one with the global reactor
        and neither store nor metrics.
    """
    protected = protected or Protected()
    make_context = context or _default_context
    configured = ConfiguredPlugins()
    for spec in config.request_plugins:
        hook = _configure(
            spec, IRequestPlugin, IRequestHook, "request_hook", problems, make_context
        )
        if hook is not None and _check_names(
            spec, hook, protected.request, protected.request_prefixes, problems
        ):
            configured.request[spec.order] = hook
    for spec in config.response_plugins:
        hook = _configure(spec, IResponsePlugin, IResponseHook, "response_hook", problems)
        if (
            hook is not None
            and _check_response_hook(spec, hook, problems)
            and _check_names(spec, hook, protected.response, (), problems)
        ):
            configured.response[spec.order] = hook
    return configured


def _check_names(
    spec: PluginSpec,
    hook: Any,
    owned: frozenset[bytes],
    prefixes: tuple[bytes, ...],
    problems: Problems,
) -> bool:
    if not IHeaderNames.providedBy(hook):
        return True
    good = True
    for field, name in hook.header_names():
        lower = name.lower().encode("latin-1", "replace")
        if lower in owned or lower.startswith(prefixes):
            problems.add(
                spec.location,
                f"spec.config.{field}",
                f"{name} is set by the gateway; a plugin cannot change it",
            )
            good = False
    return good


def plugin_context_of(
    resource: str,
    reactor: IReactorTime,
    store: IStateStore | None,
    metrics: GatewayMetrics | None,
) -> PluginContext:
    """
    The L{PluginContext} of the plugin resource named C{resource}: the gateway's
    C{reactor}, its C{store} (keys under the resource's own prefix), its metrics.
    """
    return PluginContext(
        resource,
        reactor,
        PluginStore(store, plugin_key_prefix(resource)) if store is not None else None,
        metrics.registry if metrics is not None else None,
    )


def _default_context(resource: str) -> PluginContext:
    from twisted.internet import reactor

    return PluginContext(resource, cast(IReactorTime, reactor))


def _configure(
    spec: PluginSpec,
    plugin_interface: Any,
    hook_interface: Any,
    method: str,
    problems: Problems,
    context: Callable[[str], PluginContext] | None = None,
) -> Any:
    try:
        plugin = find_registered(
            ENTRY_POINT_GROUP, spec.plugin, (IRequestPlugin, IResponsePlugin), "plugin"
        )
    except NotRegisteredError as e:
        problems.add(spec.location, "spec.plugin", str(e))
        return None
    if not plugin_interface.providedBy(plugin):
        problems.add(
            spec.location,
            "spec.plugin",
            f'plugin "{spec.plugin}" cannot be used as a {spec.kind}: '
            f"it does not provide {plugin_interface.__name__}",
        )
        return None
    try:
        if context is not None and IContextRequestPlugin.providedBy(plugin):
            hook = plugin.request_hook_in(spec.config, context(spec.name))
        else:
            hook = getattr(plugin, method)(spec.config)
    except PluginConfigError as e:
        for field, message in e.problems:
            problems.add(spec.location, f"spec.config.{field}" if field else "spec.config", message)
        return None
    except Exception as e:
        problems.add(
            spec.location,
            "spec.config",
            f'plugin "{spec.plugin}" failed while reading its config: {type(e).__name__}: {e}',
        )
        return None
    try:
        verifyObject(hook_interface, hook)
    except Invalid as e:
        problems.add(
            spec.location,
            "spec.plugin",
            f'plugin "{spec.plugin}" returned {type(hook).__name__}, '
            f"which does not provide {hook_interface.__name__}: {e}",
        )
        return None
    return hook


def _check_response_hook(spec: PluginSpec, hook: IResponseHook, problems: Problems) -> bool:
    wants = getattr(hook, "wants_body", None)
    bound = getattr(hook, "max_body_bytes", None)
    if not isinstance(wants, bool) or (
        wants and (not isinstance(bound, int) or isinstance(bound, bool) or bound <= 0)
    ):
        problems.add(
            spec.location,
            "spec.plugin",
            f'plugin "{spec.plugin}" returned a response hook without a boolean wants_body '
            "and, when it wants the body, a positive integer max_body_bytes",
        )
        return False
    return True


def describe_plugins() -> str:
    """
    One line per installed plugin: its name, the kinds it can be used as, and where it
    comes from (or why it does not load).
    """
    lines = []
    for name, entry in sorted(registered(ENTRY_POINT_GROUP).items()):
        try:
            plugin = entry.load()
        except Exception as e:
            lines.append(f"{name:<20} cannot be loaded: {type(e).__name__}: {e}")
            continue
        kinds = [
            kind
            for kind, interface in (
                ("RequestPlugin", IRequestPlugin),
                ("ResponsePlugin", IResponsePlugin),
            )
            if interface.providedBy(plugin)
        ]
        dist = entry.dist
        origin = f"{dist.name} {dist.version}" if dist is not None else "?"
        lines.append(f"{name:<20} {','.join(kinds) or 'not a plugin':<29} {entry.value} ({origin})")
    return "\n".join(lines) + "\n" if lines else "no plugins are installed\n"
