"""
edgegw as a process under test: its configuration, its check, and starting it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from bench.processes import Process
from tests.support.processes import REPO_ROOT, edgegw_twistd_args, venv_bin

GATEWAY_NAME = "bench"
"""C{metadata.name} of the Gateway resource of every benchmark configuration."""


@attrs.frozen
class RouteConfig:
    """
    One C{Route} resource of a benchmark configuration.

    @ivar name: C{metadata.name}.
    @ivar match: The mux pattern (C{spec.match}).
    @ivar handler: C{spec.handler}, as it would be written in YAML.
    @ivar authorize: C{spec.access.authorize}: the names of the Policies it needs.
    @ivar labels: C{metadata.labels} (what RouteGroups and Rego policies see).
    @ivar auth: C{spec.access.auth}: C{public}, or C{required} (which needs a session
        or an IdP in the configuration).
    @ivar route_type: C{spec.type} (C{app} or C{service}), or L{None} to leave it out
        (edgegw infers it from the handler).
    """

    name: str
    match: str
    handler: Mapping[str, Any]
    authorize: Sequence[str] = ()
    labels: Mapping[str, str] = attrs.field(factory=dict)
    auth: str = "public"
    route_type: str | None = None


def reverse_proxy(name: str, match: str, upstream: str) -> RouteConfig:
    """
    A public C{reverse-proxy} route to C{upstream}.
    """
    return RouteConfig(name, match, {"type": "reverse-proxy", "upstream": upstream})


def static(name: str, match: str, directory: Path) -> RouteConfig:
    """
    A C{static} route serving C{directory} (no SPA fallback: a miss is a 404).
    """
    return RouteConfig(name, match, {"type": "static", "dir": str(directory), "spaFallback": False})


def health(
    name: str,
    match: str,
    authorize: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    *,
    auth: str = "public",
    route_type: str | None = None,
) -> RouteConfig:
    """
    A C{health} route (always C{200 {"status":"ok"}}), needing the Policies
    C{authorize}, with C{labels}; public unless C{auth} says otherwise, of C{route_type}
    when given.
    """
    handler = {"type": "health"}
    return RouteConfig(name, match, handler, tuple(authorize), dict(labels or {}), auth, route_type)


def api(name: str, match: str, backends: Sequence[Mapping[str, str]]) -> RouteConfig:
    """
    A public C{api} route fanning each request out to C{backends} (each with its
    C{group}, C{upstream} and C{path}) and merging their JSON answers.
    """
    return RouteConfig(name, match, {"type": "api", "backends": [dict(b) for b in backends]})


def resource(
    kind: str, name: str, spec: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """
    One configuration document: C{spec} in the envelope of a C{kind} resource.
    """
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "edgegw.io/v1", "kind": kind, "metadata": metadata, "spec": dict(spec)}


def rego_policy(name: str, path: Path) -> dict[str, Any]:
    """A C{Policy} resource evaluating the Rego file C{path}."""
    return resource("Policy", name, {"rego": {"path": str(path)}})


def require_policy(name: str, groups: Sequence[str]) -> dict[str, Any]:
    """A C{Policy} resource requiring a principal in any of C{groups}."""
    return resource("Policy", name, {"require": {"groups": list(groups)}})


def gateway_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """
    More fields for the C{Gateway} resource that L{write_config} writes (a C{session}
    block, C{identity}): given among its C{resources}, this document is merged into that
    Gateway's spec rather than written as a second Gateway.
    """
    return resource("Gateway", GATEWAY_NAME, spec)


def idp(issuer: str, client_id: str, client_secret: str) -> dict[str, Any]:
    """
    An C{IdP} resource for browser login (OIDC at C{issuer}); it needs a C{session}
    block in the Gateway (L{gateway_fields}).
    """
    spec = {"type": "oidc", "issuer": issuer, "clientID": client_id, "clientSecret": client_secret}
    return resource("IdP", "idp", spec)


def telemetry(service: str, endpoint: str, protocol: str) -> dict[str, Any]:
    """
    A C{Telemetry} resource exporting spans over OTLP with C{protocol} (C{http/protobuf}:
    C{endpoint} is the receiver's base URL; C{grpc}: C{http://host:port}).
    """
    otlp = {"endpoint": endpoint, "protocol": protocol}
    return resource("Telemetry", "telemetry", {"service": {"name": service}, "otlp": otlp})


def write_config(
    directory: Path,
    port: int,
    routes: Sequence[RouteConfig],
    resources: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """
    Write a configuration directory: a Gateway on 127.0.0.1:C{port}, C{routes}, and
    other C{resources} (documents made with L{resource}: Policies, a Telemetry, an IdP;
    a Gateway document among them, from L{gateway_fields}, adds its fields to the
    Gateway's spec).

    The access log goes to C{access.log} in C{directory}. Each route's C{access.auth} is
    written explicitly (C{public} unless the route says otherwise): a reverse-proxy route
    is a C{service} route, which requires authentication by default, and most benchmarks
    have no IdP.
    """
    directory.mkdir(parents=True, exist_ok=True)
    # The access log as a production gateway would write it: JSON lines to a file
    # (buffered), not through the daemon's log.
    gateway_spec: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "accessLog": {"output": str(directory / "access.log")},
    }
    others = []
    for document in resources:
        if document.get("kind") == "Gateway":
            gateway_spec.update(document["spec"])
        else:
            others.append(dict(document))
    documents = [resource("Gateway", GATEWAY_NAME, gateway_spec)]
    for route in routes:
        access: dict[str, Any] = {"auth": route.auth}
        if route.authorize:
            access["authorize"] = list(route.authorize)
        spec: dict[str, Any] = {"match": route.match}
        if route.route_type is not None:
            spec["type"] = route.route_type
        spec |= {"access": access, "handler": dict(route.handler)}
        documents.append(resource("Route", route.name, spec, route.labels))
    documents.extend(others)
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return directory


def check(
    directory: Path, env: Mapping[str, str] | None = None, cwd: Path = REPO_ROOT
) -> str | None:
    """
    Run C{edgegw check DIRECTORY} (with C{env} and in C{cwd}: see L{start}).

    @return: L{None} when the configuration is usable, otherwise the reason edgegw gives
        (for example that a handler type is not available in this version).
    """
    done = subprocess.run(
        [venv_bin("edgegw"), "check", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else dict(env),
        cwd=cwd,
    )
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        # Not a verdict on the configuration: edgegw itself failed (say, mid-change).
        return f"edgegw check crashed: {lines[-1]}"
    # The first line is a summary ("configuration has N errors:"); the problems follow,
    # each prefixed with the temporary file's path, which says nothing to the reader.
    problems = [_without_location(line) for line in lines[1:]] or lines
    # The same refusal for several routes reads once.
    unique = list(dict.fromkeys(problems))
    return "; ".join(unique) or f"edgegw check exited with {done.returncode}"


def _without_location(problem: str) -> str:
    """
    C{'/tmp/x/gateway.yaml, document 2, Route "r": spec.handler.type: ...'} without the
    file, the document and the resource.
    """
    prefix, sep, rest = problem.partition(", document ")
    if not sep or "/" not in prefix:
        return problem
    _, _, rest = rest.partition(", ")
    if rest.startswith(("Route ", "Gateway ", "Policy ", "Telemetry ", "IdP ")):
        _, _, rest = rest.partition(": ")
    return rest or problem


def start(
    directory: Path,
    log: Path,
    name: str = "edgegw",
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
) -> Process:
    """
    Start C{twistd -n --pidfile= edgegw --config DIRECTORY} (one process), its log
    (the JSON access log included) going to C{log}; with the environment C{env} (the
    harness's by default) in C{cwd}: another revision's edgegw runs with C{PYTHONPATH}
    set to its worktree (L{bench.before}).
    """
    argv = [venv_bin("twistd"), *edgegw_twistd_args(directory)]
    return Process(name, argv, log, env, cwd)
