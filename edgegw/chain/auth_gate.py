"""
The auth-gate stage: a route whose effective auth is C{required} lets no anonymous
request through.

App routes send a browser to the login path, carrying the original path and query in
C{return_to}; a request that the browser marks as not a navigation (C{Sec-Fetch-Mode}
present and not C{navigate}: the single-page app's own C{fetch()}) gets 401 instead,
since a script cannot follow a redirect to another origin's login form. Service routes
answer 401 with C{WWW-Authenticate: Bearer}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal
from urllib.parse import quote

from edgegw.terminal.answers import write_text
from edgegw.terminal.exchange import Exchange, Handler, Stage

__all__ = ["auth_gate", "refusal", "return_to_of"]

_CHALLENGE = ((b"WWW-Authenticate", b"Bearer"),)
# RFC 6750 3.1: a token was sent and is not accepted (the reason goes to the log only).
_INVALID_TOKEN = ((b"WWW-Authenticate", b'Bearer error="invalid_token"'),)
_NO_STORE = (b"Cache-Control", b"no-store")


def return_to_of(uri: bytes) -> str:
    """
    The original path and query of a request target, as a C{return_to} value: an
    origin-form target as it is; an absolute-form one without its scheme and authority.
    """
    target = uri.decode("ascii", "replace")
    if not target.startswith("/"):
        scheme_end = target.find("://")
        if scheme_end != -1:
            path_start = target.find("/", scheme_end + 3)
            target = target[path_start:] if path_start != -1 else "/"
        else:
            target = "/"
    return target


def auth_gate(route_type: Literal["app", "service"], login_path: str | None) -> Stage:
    """
    Make the auth-gate stage of a route whose auth is required.

    @param login_path: Where app routes send anonymous navigations; L{None} when no
        login is mounted (no session or IdP): app routes then answer 401 too.
    """
    refuse = refusal(route_type, login_path)

    async def gate(exchange: Exchange, next: Handler) -> None:
        if exchange.principal is not None:
            await next(exchange)
        else:
            refuse(exchange, False)

    return gate


def refusal(
    route_type: Literal["app", "service"], login_path: str | None
) -> Callable[[Exchange, bool], None]:
    """
    What the auth-gate answers an anonymous request on a required route: the login
    redirect or 401 (see the module docstring). The session stage applies it itself on
    such routes, which saves the chain a stage per request. Its second argument says
    that a Bearer token was sent and rejected (the 401 then says C{invalid_token}).
    """
    login = login_path.encode("ascii") if login_path is not None else None
    redirects = route_type == "app" and login is not None

    def refuse(exchange: Exchange, invalid_token: bool) -> None:
        request = exchange.request
        if not invalid_token:
            exchange.note("auth", "no credential")
        if redirects:
            mode = request.requestHeaders.getRawHeaders(b"sec-fetch-mode")
            if mode is None or mode[0].lower() == b"navigate":
                target = quote(return_to_of(request.uri), safe="")
                assert login is not None
                location = login + b"?return_to=" + target.encode("ascii")
                write_text(request, 302, b"redirecting\n", ((b"Location", location), _NO_STORE))
                return
        write_text(request, 401, b"unauthorized\n", _INVALID_TOKEN if invalid_token else _CHALLENGE)

    return refuse
