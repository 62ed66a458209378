"""
The Gateway kind: listen address, trusted proxies, plugins, drain timeout, and its auth,
accessLog and reload blocks; its larger blocks have modules of their own (tls and redirectHTTP:
L{edgegw.config.tls_block}; compression: L{edgegw.config.compression_block}).
"""

from __future__ import annotations

import ipaddress
import os
import stat

from edgegw.config.addresses import endpoint_description, listen_port
from edgegw.config.compression_block import read_compression
from edgegw.config.fields import Node
from edgegw.config.identity import read_identity
from edgegw.config.limits import read_limits
from edgegw.config.model import (
    DEFAULT_WARMUP_TIMEOUT,
    AccessLogSpec,
    AuthSpec,
    GatewaySpec,
    ReloadSpec,
)
from edgegw.config.plugin_refs import parse_manifest_entry
from edgegw.config.security_block import read_security
from edgegw.config.session_block import read_session
from edgegw.config.state import read_state_ref
from edgegw.config.tls_block import read_redirect_http, read_tls
from edgegw.config.urls import check_local_path, check_url

__all__ = ["read_gateway"]


def read_gateway(spec: Node, base_dir: str) -> GatewaySpec:
    """
    The Gateway resource's spec.

    @param base_dir: The directory of its file, for a relative access-log output,
        certificate files and ACME webroot.
    """
    listen = spec.string("listen", ":8080") or ":8080"
    try:
        endpoint_description(listen)
    except ValueError as e:
        spec.error("listen", str(e))
    trusted = spec.strings("trustedProxies")
    for index, entry in enumerate(trusted):
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            spec.error(
                f"trustedProxies[{index}]",
                f'"{entry}" is not an IP address, a CIDR such as "10.0.0.0/8", or "*"',
            )
    security = read_security(spec.mapping("security"))
    plugins = spec.strings("plugins")
    for index, entry in enumerate(plugins):
        try:
            parse_manifest_entry(entry)
        except ValueError as e:
            spec.error(f"plugins[{index}]", str(e))
    session = read_session(spec.mapping("session"))
    identity = read_identity(spec.mapping("identity"))
    auth = _auth(spec.mapping("auth"))
    # Without a session block the store holds no session (the session key seals them):
    # accepted assertions' records and plugins' state (shared rate limits) still use it.
    state = read_state_ref(spec.mapping("stateProvider"))
    tls = read_tls(spec.mapping("tls"), base_dir)
    if tls is not None and listen.startswith("ssl:"):
        spec.error(
            "tls",
            'listen is an "ssl:" endpoint, which configures TLS itself: use tls with a '
            'plain listen address (such as ":443"), or the "ssl:" endpoint alone',
        )
    redirect = read_redirect_http(spec.mapping("redirectHTTP"), base_dir)
    if redirect is not None:
        if tls is None:
            spec.error("redirectHTTP", "requires tls (the HTTPS listener it redirects to)")
        elif redirect.listen == listen and listen_port(listen) is not None:
            spec.error("redirectHTTP.listen", f"is listen's address too ({listen})")
    return GatewaySpec(
        listen=listen,
        trusted_proxies=trusted,
        security=security,
        plugins=plugins,
        session=session,
        identity=identity,
        auth=auth,
        state_provider=state,
        drain_timeout=spec.duration("drainTimeout", 30.0) or 0.0,
        access_log=_access_log(spec.mapping("accessLog"), base_dir),
        limits=read_limits(spec.mapping("limits")),
        readiness_path=_readiness(spec.mapping("readiness")),
        tls=tls,
        redirect_http=redirect,
        compression=read_compression(spec.mapping("compression")),
        reload=_reload(spec.mapping("reload")),
    )


def _reload(node: Node | None) -> ReloadSpec:
    """
    C{reload}: C{warmupTimeout} (C{0s}: a reload serves at once, whatever is cold).
    """
    if node is None:
        return ReloadSpec()
    warmup = node.duration("warmupTimeout", DEFAULT_WARMUP_TIMEOUT)
    node.finish()
    return ReloadSpec(warmup_timeout=DEFAULT_WARMUP_TIMEOUT if warmup is None else warmup)


def _readiness(node: Node | None) -> str | None:
    """
    C{readiness.path}: where the readiness endpoint answers (the block turns it on).
    """
    if node is None:
        return None
    path = node.string("path", "/readyz") or "/readyz"
    if not path.startswith("/") or any(c in path for c in "?#*{} "):
        node.error("path", f'"{path}" is not a plain absolute path (such as /readyz)')
    node.finish()
    return path


def _access_log(node: Node | None, base_dir: str) -> AccessLogSpec:
    if node is None:
        return AccessLogSpec()
    output = node.string("output", "log", nonempty=True) or "log"
    if output not in ("log", "-"):
        output = os.path.normpath(os.path.join(base_dir, output))
        problem = _output_problem(output)
        if problem is not None:
            node.error("output", problem)
    node.finish()
    return AccessLogSpec(output=output)


def _output_problem(path: str) -> str | None:
    """
    Why the access log cannot be appended to the file at C{path}, or L{None}.
    """
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        return f"{path} is a directory"
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            return f"the directory of {path} is not a directory"
        return f"the directory of {path} does not exist"
    if os.path.exists(path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A FIFO would block the check and the daemon until a reader comes; a device
            # or socket is no log file either.
            return f'{path} is not a regular file (use "-" for standard output)'
        if not os.access(path, os.W_OK):
            return f"{path} cannot be written: permission denied"
    elif not os.access(directory, os.W_OK | os.X_OK):
        return f"{path} cannot be written: cannot create files in {directory}"
    return None


def _auth(node: Node | None) -> AuthSpec:
    if node is None:
        return AuthSpec()
    login = node.string("loginPath", "/auth/login") or ""
    logout = node.string("logoutPath", "/auth/logout") or ""
    check_local_path(node, "loginPath", login)
    check_local_path(node, "logoutPath", logout)
    backchannel = node.string("backchannelLogoutPath", "/auth/backchannel-logout") or ""
    check_local_path(node, "backchannelLogoutPath", backchannel)
    # Absolute: it is sent to the IdP. https, or http only on the gateway's own origin
    # (checked against the IdP's redirectURL with the other resources: cross_checks).
    post_logout = node.string("postLogoutRedirectURL", nonempty=True)
    check_url(node, "postLogoutRedirectURL", post_logout, ("https", "http"))
    node.finish()
    return AuthSpec(
        login_path=login,
        logout_path=logout,
        backchannel_logout_path=backchannel,
        post_logout_redirect_url=post_logout,
    )
