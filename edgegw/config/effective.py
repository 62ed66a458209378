"""
What each route really gets once RouteGroups and defaults are applied, computed at load.
"""

from __future__ import annotations

import attrs

from edgegw.config.model import (
    AccessSpec,
    AuthMode,
    Config,
    PluginSpec,
    ProjectionSpec,
    RouteGroupSpec,
    RouteSpec,
    RouteType,
)

SERVICE_HANDLERS = frozenset({"reverse-proxy", "api"})


@attrs.frozen
class EffectiveRoute:
    """
    A route with its groups merged in.

    @ivar type: C{app} or C{service}, inferred when unset.
    @ivar auth: The effective auth mode.
    @ivar access: The merged access block (route over later groups over earlier ones;
        C{authorize} lists unioned, duplicates removed, order kept).
    @ivar groups: Names of the RouteGroups that select this route, in document order.
    """

    spec: RouteSpec
    type: RouteType
    auth: AuthMode
    access: AccessSpec
    groups: tuple[str, ...]
    request_plugins: tuple[PluginSpec, ...]
    response_plugins: tuple[PluginSpec, ...]


def merge_access(layers: list[AccessSpec]) -> AccessSpec:
    """
    Merge access blocks field by field; later layers win, C{authorize} is unioned.
    """
    auth = None
    redirect = None
    claims = None
    groups_header = None
    authorize: dict[str, None] = {}
    for layer in layers:
        auth = layer.auth if layer.auth is not None else auth
        redirect = layer.on_deny_redirect if layer.on_deny_redirect is not None else redirect
        if layer.projection.claims is not None:
            claims = layer.projection.claims
        if layer.projection.groups_header is not None:
            groups_header = layer.projection.groups_header
        authorize.update(dict.fromkeys(layer.authorize))
    return AccessSpec(
        auth=auth,
        authorize=tuple(authorize),
        projection=ProjectionSpec(claims=claims, groups_header=groups_header),
        on_deny_redirect=redirect,
    )


def effective_route(config: Config, route: RouteSpec) -> EffectiveRoute:
    """
    Apply the matching RouteGroups and defaults to one route.
    """
    labels = route.labels
    groups: list[RouteGroupSpec] = [
        group for group in config.route_groups if group.selector.matches(labels)
    ]
    route_type = route.type
    if route_type is None:
        for group in groups:
            if group.type is not None:
                route_type = group.type
    if route_type is None:
        route_type = "service" if route.handler.type in SERVICE_HANDLERS else "app"
    merged = merge_access([group.access for group in groups] + [route.access])
    # The route's own authorize list comes first; groups' follow in document order.
    authorize = tuple(dict.fromkeys(route.access.authorize + merged.authorize))
    merged = attrs.evolve(merged, authorize=authorize)
    auth: AuthMode = merged.auth or ("required" if route_type == "service" else "public")
    return EffectiveRoute(
        spec=route,
        type=route_type,
        auth=auth,
        access=merged,
        groups=tuple(group.name for group in groups),
        request_plugins=tuple(p for p in config.request_plugins if p.selector.matches(labels)),
        response_plugins=tuple(p for p in config.response_plugins if p.selector.matches(labels)),
    )


def effective_routes(config: Config) -> list[EffectiveRoute]:
    """
    Every route of C{config}, in document order, with groups applied.
    """
    return [effective_route(config, route) for route in config.routes]
