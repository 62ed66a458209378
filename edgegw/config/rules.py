"""
Rules over the whole configuration: one Gateway, at most one IdP and Telemetry, Route
patterns that do not conflict, and references between resources.
"""

from __future__ import annotations

from typing import TypeVar
from urllib.parse import urlsplit

from edgegw.config.errors import Location, Problems
from edgegw.config.fields import suggest
from edgegw.config.model import (
    GatewaySpec,
    IdpSpec,
    PolicySpec,
    RouteGroupSpec,
    RouteSpec,
    TelemetrySpec,
)
from edgegw.config.shown_values import show
from edgegw.routing.mux import ConflictError, Mux
from edgegw.routing.pattern import PatternError, parse_pattern

__all__ = ["at_most_one", "cross_checks", "one_gateway"]

T = TypeVar("T")


def one_gateway(
    gateways: list[tuple[Location, GatewaySpec]], problems: Problems, *, complete: bool
) -> tuple[Location, GatewaySpec] | None:
    """
    The one Gateway, reporting a second one, and a missing one when every file was read
    (C{complete}).
    """
    if not gateways:
        if complete:
            problems.add(None, "", "no Gateway resource: exactly one is required")
        return None
    for location, _ in gateways[1:]:
        problems.add(
            location,
            "",
            "a second Gateway resource: exactly one is allowed "
            f"(the first is {gateways[0][0].describe()})",
        )
    return gateways[0]


def at_most_one(kind: str, found: list[tuple[Location, T]], problems: Problems) -> T | None:
    """
    The first resource of C{kind} found, or L{None}, reporting every further one.
    """
    for location, _ in found[1:]:
        problems.add(
            location,
            "",
            f"a second {kind} resource: at most one is allowed "
            f"(the first is {found[0][0].describe()})",
        )
    return found[0][1] if found else None


def cross_checks(
    gateway: tuple[Location, GatewaySpec] | None,
    idp: IdpSpec | None,
    routes: list[RouteSpec],
    groups: list[RouteGroupSpec],
    policies: dict[str, PolicySpec],
    problems: Problems,
    *,
    complete: bool,
) -> None:
    """
    Report what is wrong between resources: Route patterns that do not parse or conflict,
    policies that are not declared (only when every file was read, C{complete}),
    assertions forwarded without a key to mint them, a session with a verificationOnly
    IdP or without any IdP, auth paths that clash. (State provider types are looked up
    among the installed providers when the gateway is built:
    L{edgegw.assembly.assemble.build_gateway}.)
    """
    mux: Mux[RouteSpec] = Mux()
    for route in routes:
        if not route.match:
            continue
        try:
            mux.register(route.match, route)
        except PatternError as e:
            problems.add(route.location, "spec.match", str(e))
        except ConflictError as e:
            problems.add(route.location, "spec.match", str(e))
    holders: list[RouteSpec | RouteGroupSpec] = [*routes, *groups]
    for holder in holders:
        for index, policy in enumerate(holder.access.authorize):
            if policy not in policies and complete:
                problems.add(
                    holder.location,
                    f"spec.access.authorize[{index}]",
                    f'no Policy named "{policy}"' + suggest(policy, list(policies)),
                )
    if gateway is None:
        return
    location, spec = gateway
    assertion = spec.identity.assertion
    if assertion is None or assertion.issue is None:
        for route in routes:
            handler = route.handler
            backends = getattr(handler, "backends", ())
            if getattr(handler, "forward_identity", False):
                problems.add(
                    route.location,
                    "spec.handler.forwardIdentity",
                    "needs identity.assertion.issue in the Gateway to mint assertions",
                )
            for index, backend in enumerate(backends):
                if backend.forward_identity:
                    problems.add(
                        route.location,
                        f"spec.handler.backends[{index}].forwardIdentity",
                        "needs identity.assertion.issue in the Gateway to mint assertions",
                    )
    if idp is not None and idp.verification_only and spec.session is not None:
        problems.add(
            location,
            "spec.session",
            "a verificationOnly IdP cannot serve a configuration that has a session",
        )
    if spec.session is not None and idp is None and complete:
        problems.add(
            location,
            "spec.session",
            "a session needs an IdP resource to log users in (declare kind: IdP)",
        )
    if idp is not None and not idp.verification_only and spec.session is None:
        problems.add(
            idp.location,
            "spec",
            "an IdP used for browser login needs a session block in the Gateway "
            "(spec.session with a 32-byte key); an instance that only verifies Bearer "
            "tokens sets verificationOnly: true",
        )
    login = spec.session is not None and idp is not None and not idp.verification_only
    if login or spec.readiness_path is not None:
        _check_auth_paths(location, spec, idp if login else None, routes, problems)
    if login and idp is not None:
        _check_post_logout_url(location, spec, idp, problems)


def _check_post_logout_url(
    location: Location | None, spec: GatewaySpec, idp: IdpSpec, problems: Problems
) -> None:
    """
    C{auth.postLogoutRedirectURL} over plain http must be the gateway's own origin: that
    of the IdP's C{redirectURL} (the only place the configuration names it). Anywhere
    else it must be https: the IdP sends the browser there after its logout.
    """
    url = spec.auth.post_logout_redirect_url
    if url is None or not url.lower().startswith("http://"):
        return
    own = _origin(idp.redirect_url) if idp.redirect_url else None
    if own is not None and _origin(url) == own:
        return
    problems.add(
        location,
        "spec.auth.postLogoutRedirectURL",
        f'"{show(url)}": an http URL is allowed only on the gateway\'s own origin '
        + (
            f"({own}, that of the IdP's redirectURL); use https"
            if own is not None
            else "(known from the IdP's redirectURL, which is not set); use https"
        ),
    )


def _origin(url: str) -> str | None:
    """
    C{scheme://host[:port]} of an absolute URL, lowercased, the default port left out.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    scheme = parts.scheme.lower()
    default = {"http": 80, "https": 443}.get(scheme)
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def _check_auth_paths(
    location: Location,
    spec: GatewaySpec,
    idp: IdpSpec | None,
    routes: list[RouteSpec],
    problems: Problems,
) -> None:
    """
    The login, callback, logout and session-view paths (and, with a state provider, the
    back-channel logout path) of a browser login (C{idp}), and the readiness path, are
    answered before the routes
    (exact paths, any host): each must be distinct, and no Route may match exactly one
    of them alone (it could never be reached). A Route covering more (C{GET /}, a
    subtree, a wildcard) keeps every other path.
    """
    seen: dict[str, str] = {}
    reserved: list[tuple[str, str]] = []
    if idp is not None:
        assert spec.session is not None
        reserved += [
            ("spec.auth.loginPath", spec.auth.login_path),
            ("spec.auth.logoutPath", spec.auth.logout_path),
            ("spec.session.infoPath", spec.session.info_path),
            ("spec.redirectURL", idp.callback_path),
        ]
        if spec.state_provider is not None:
            reserved.append(("spec.auth.backchannelLogoutPath", spec.auth.backchannel_logout_path))
    if spec.readiness_path is not None:
        reserved.append(("spec.readiness.path", spec.readiness_path))
    for field, path in reserved:
        where: Location | None = (
            idp.location if idp is not None and field == "spec.redirectURL" else location
        )
        if path in seen:
            problems.add(where, field, f"{path} is also {seen[path]}")
            continue
        seen[path] = field
    for route in routes:
        try:
            pattern = parse_pattern(route.match)
        except PatternError:
            continue  # reported with the route
        if all(segment.kind == "literal" for segment in pattern.segments):
            path = "/" + "/".join(segment.value for segment in pattern.segments)
            if path in seen:
                kind = "readiness" if seen[path] == "spec.readiness.path" else "auth"
                problems.add(
                    route.location,
                    "spec.match",
                    f"never reached: {path} is the gateway's own {kind} endpoint "
                    f"({seen[path]}), answered before any Route",
                )


def check_logged_headers(
    gateway: GatewaySpec, telemetry: TelemetrySpec, problems: Problems
) -> None:
    """
    The access log may not name the identity-assertion headers this gateway issues or
    accepts (an assertion is a credential, like Authorization, which telemetry refuses).
    """
    assertion = gateway.identity.assertion
    if assertion is None:
        return
    names = {
        side.header.lower() for side in (assertion.issue, assertion.accept) if side is not None
    }
    for index, header in enumerate(telemetry.access_log_headers):
        if header.lower() in names:
            problems.add(
                telemetry.location,
                f"spec.accessLog.requestHeaders[{index}]",
                f"{header} carries identity assertions, which are never logged",
            )
