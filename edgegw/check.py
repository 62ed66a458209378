"""
Validating a configuration without serving it, like C{nginx -t}.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from twisted.internet.task import Clock

from edgegw.config.addresses import endpoint_description
from edgegw.config.errors import ConfigError, Problem
from edgegw.config.model import Config
from edgegw.config.parse import load_config
from edgegw.service import build_service
from edgegw.terminal.route import CompiledRoute


def route_table(routes: Sequence[CompiledRoute]) -> str:
    """
    The effective route table: pattern, name, type, auth, the RouteGroups that select
    the route, its merged policies and deny redirect, its request and response plugins
    (resource names, in the order they run), and the handler.
    """
    header = (
        "PATTERN",
        "NAME",
        "TYPE",
        "AUTH",
        "GROUPS",
        "POLICIES",
        "ON-DENY",
        "REQUEST-PLUGINS",
        "RESPONSE-PLUGINS",
        "HANDLER",
    )
    rows = [header]
    for route in routes:
        effective = route.effective
        access = effective.access
        on_deny = access.on_deny_redirect if route.type == "app" else None
        rows.append(
            (
                route.pattern,
                route.name,
                route.type,
                route.auth,
                ",".join(effective.groups) or "-",
                ",".join(access.authorize) or "-",
                on_deny or "-",
                ",".join(spec.name for spec in effective.request_plugins) or "-",
                ",".join(spec.name for spec in effective.response_plugins) or "-",
                route.handler_description,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def check(source: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """
    Load the configuration at C{source} and build the gateway's whole service tree, as
    startup would, without starting it (no socket is bound, no file is created: the
    access-log file's directory and permissions are checked at load); print the route
    table or the errors.

    @return: The process exit status: 0 when the configuration is usable, 1 otherwise.
    """
    try:
        config = load_config(source)
        service = build_service(config, Clock())
    except ConfigError as e:
        _write(err, f"edgegw: {e.render()}\n")
        return 1
    listen = config.gateway.listen
    listeners = [(service.listener, "spec.listen")]
    if service.redirect_listener is not None:
        listeners.append((service.redirect_listener, "spec.redirectHTTP.listen"))
    for listener, field in listeners:
        if endpoint_description(listener.listen).startswith("systemd:"):
            # Socket activation has no socket at check time; everything else (TLS key
            # and certificate files included) is built as startup would.
            continue
        try:
            listener.build_endpoint()
        except ValueError as e:
            problem = Problem(config.gateway.location, field, str(e))
            _write(err, f"edgegw: {ConfigError([problem]).render()}\n")
            return 1
    gateway = service.gateway
    _write(
        out,
        f"edgegw: configuration {source} is valid: {len(config.files)} file(s), "
        f"{len(gateway.routes)} route(s), listening on {listen} "
        f"({endpoint_description(listen)}){_tls_summary(config)}\n\n"
        + route_table(gateway.routes)
        + "\n",
    )
    if gateway.auth_endpoints:
        idp = config.idp
        lines = [f"  {method:<5} {path}" for method, path in gateway.auth_endpoints]
        _write(
            out,
            f"\nauth endpoints (IdP {idp.issuer if idp else '-'}, discovered at start):\n"
            + "\n".join(lines)
            + "\n",
        )
    for warning in warnings(config, gateway.routes):
        _write(err, f"edgegw: warning: {warning}\n")
    return 0


def warnings(config: Config, routes: Sequence[CompiledRoute]) -> list[Problem]:
    """
    What a valid configuration had better not leave as it is: an IdP used for browser
    login whose service routes (where Bearer tokens are taken) verify them against the
    default audience, the login client (C{clientID}). Its id_tokens have that audience
    too: the verifier refuses those without access-token evidence, but an API audience
    of their own (C{bearer.audience}) keeps the two kinds of token apart at the IdP.
    """
    found = []
    idp = config.idp
    if idp is not None and not idp.verification_only and idp.bearer.audience is None:
        bearer_routes = [route.name for route in routes if route.type == "service"]
        if bearer_routes:
            shown = ", ".join(bearer_routes[:3]) + (", ..." if len(bearer_routes) > 3 else "")
            found.append(
                Problem(
                    idp.location,
                    "spec.bearer.audience",
                    f"unset: Bearer tokens on the service routes ({shown}) are verified "
                    f'against the login client "{idp.client_id}" as audience, which its '
                    "id_tokens have too (those without at+jwt, scope, scp or client_id are "
                    "refused); set it to the audience of the API's access tokens",
                )
            )
    return found


def _tls_summary(config: Config) -> str:
    """
    What C{edgegw check} says of C{tls} and C{redirectHTTP}: the names served, the
    protocols, the redirect listener.
    """
    tls = config.gateway.tls
    if tls is None:
        return ""
    names = ", ".join(name for spec in tls.certificates for name in spec.names)
    protocols = "h2, http/1.1" if tls.http2 else "http/1.1"
    summary = f" with TLS {tls.min_version}+ for {names} ({protocols})"
    redirect = config.gateway.redirect_http
    if redirect is not None:
        summary += f"; redirecting plain HTTP on {redirect.listen} to https"
    return summary


def _write(stream: TextIO, text: str) -> None:
    """
    Write C{text} whatever C{stream}'s encoding (a C locale's ASCII stdout included):
    what it cannot encode is written as backslash escapes rather than a traceback after
    half the report.
    """
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
