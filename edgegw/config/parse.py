"""
From YAML documents to the frozen L{Config}: each document's envelope read, its spec handed
to the module for its kind, then the rules over the whole configuration.

Parsing never stops at the first problem: each resource is read completely, problems are
collected with their location, and L{load_config} raises one L{ConfigError} at the end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

import attrs

from edgegw.config.envelope import read_envelope
from edgegw.config.errors import Location, Problems
from edgegw.config.gateway_kind import read_gateway
from edgegw.config.idp import read_idp
from edgegw.config.load import Document, read_sources
from edgegw.config.model import (
    Config,
    GatewaySpec,
    IdpSpec,
    PluginSpec,
    PolicySpec,
    RouteGroupSpec,
    RouteSpec,
    StateProviderSpec,
    TelemetrySpec,
)
from edgegw.config.plugins import read_plugin, read_state_provider
from edgegw.config.policies import read_policy
from edgegw.config.route_groups import read_route_group
from edgegw.config.routes import read_route
from edgegw.config.rules import at_most_one, check_logged_headers, cross_checks, one_gateway
from edgegw.config.telemetry_kind import read_telemetry

__all__ = ["load_config"]


def load_config(source: str, environ: Mapping[str, str] | None = None) -> Config:
    """
    Load, interpolate and validate the configuration at C{source} (file or directory).

    @param environ: Variables for C{${VAR}} interpolation; defaults to C{os.environ}.
    @raise ConfigError: With every problem found.
    """
    problems = Problems()
    sources = read_sources(source, os.environ if environ is None else environ, problems)
    config = _parse(source, list(sources.documents), problems, complete=sources.complete)
    problems.raise_if_any()
    assert config is not None
    return config


def _parse(
    source: str, documents: list[Document], problems: Problems, *, complete: bool
) -> Config | None:
    """
    Read every document into its kind's spec and apply the whole-configuration rules.

    @param complete: Whether every source file was read and parsed; when not, rules that
        look for a resource (the Gateway, a Policy, a StateProvider) are skipped, since
        it may be in a file that could not be read.
    @return: The configuration, or L{None} when there is no Gateway.
    """
    gateways: list[tuple[Location, GatewaySpec]] = []
    idps: list[tuple[Location, IdpSpec]] = []
    telemetries: list[tuple[Location, TelemetrySpec]] = []
    routes: list[RouteSpec] = []
    groups: list[RouteGroupSpec] = []
    policies: dict[str, PolicySpec] = {}
    request_plugins: list[PluginSpec] = []
    response_plugins: list[PluginSpec] = []
    providers: dict[str, StateProviderSpec] = {}
    names: dict[tuple[str, str], Location] = {}

    for order, document in enumerate(documents):
        envelope = read_envelope(document, problems)
        if envelope is None:
            continue
        kind, name, labels, spec = envelope
        location = document.location
        previous = names.get((kind, name))
        if previous is not None:
            problems.add(
                location,
                "metadata.name",
                f'duplicate {kind} name "{name}" (first defined in {previous.describe()})',
            )
        else:
            names[(kind, name)] = location
        base = document.base_dir
        if kind == "Gateway":
            gateways.append((location, attrs.evolve(read_gateway(spec, base), location=location)))
        elif kind == "IdP":
            idps.append((location, attrs.evolve(read_idp(spec, name), location=location)))
        elif kind == "Telemetry":
            telemetries.append((location, attrs.evolve(read_telemetry(spec), location=location)))
        elif kind == "Route":
            route = read_route(spec, name, labels, location, order, base)
            if route is not None:
                routes.append(route)
        elif kind == "RouteGroup":
            groups.append(read_route_group(spec, name, location, order))
        elif kind == "Policy":
            policies.setdefault(name, read_policy(spec, name, location, base))
        elif kind in ("RequestPlugin", "ResponsePlugin"):
            plugin = read_plugin(spec, name, cast(Any, kind), location, order)
            (request_plugins if kind == "RequestPlugin" else response_plugins).append(plugin)
        elif kind == "StateProvider":
            providers.setdefault(name, read_state_provider(spec, name, location))
        spec.finish()

    gateway = one_gateway(gateways, problems, complete=complete)
    idp = at_most_one("IdP", idps, problems)
    telemetry = at_most_one("Telemetry", telemetries, problems)
    cross_checks(gateway, idp, routes, groups, policies, problems, complete=complete)
    if gateway is not None and telemetry is not None:
        check_logged_headers(gateway[1], telemetry, problems)
    if gateway is None:
        return None
    return Config(
        source=source,
        files=tuple(dict.fromkeys(d.location.file for d in documents)),
        gateway=gateway[1],
        routes=tuple(routes),
        route_groups=tuple(groups),
        policies=policies,
        request_plugins=tuple(request_plugins),
        response_plugins=tuple(response_plugins),
        state_providers=providers,
        idp=idp,
        telemetry=telemetry,
    )
