"""
What the browser-login endpoints share: the IdP client, the cookies, the identity rules.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.web.server import Request

from edgegw.config.model import IdentitySpec
from edgegw.identity.cookies import is_https
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.login_state import LoginStates, SpentStates
from edgegw.identity.provider import IdentityProvider
from edgegw.identity.session_cookie import SessionCookie
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.sessions.server import ServerSessions

__all__ = ["BrowserLogin"]


@attrs.frozen
class BrowserLogin:
    """
    Everything the login, callback, logout and session-view endpoints need, built once.

    @ivar redirect_url: The IdP's configured C{redirectURL}, or L{None}: the callback URL
        is then this gateway's origin as the browser sees it plus C{callback_path}.
    @ivar keep_access_token: Some route forwards the access token (C{forwardAccessToken}),
        so the session stores it; otherwise it never leaves the callback.
    @ivar spent: The login states this instance has taken a callback for (carried
        across reloads).
    @ivar server: With a state provider, the server-side sessions (the record, with the
        IdP's tokens, goes to the store; the cookie holds only the session id).
    """

    provider: IdentityProvider
    sessions: SessionCookie
    logins: LoginStates
    identity: IdentitySpec
    groups: GroupRenderer
    callback_path: str
    redirect_url: str | None
    keep_access_token: bool
    reactor: IReactorTime
    server: ServerSessions | None = None
    metrics: IMetrics = NO_METRICS
    spent: SpentStates = attrs.field(
        default=attrs.Factory(lambda self: SpentStates(self.reactor), takes_self=True)
    )

    def redirect_uri(self, request: Request) -> str:
        """
        The callback URL for an authorization request started by C{request}.
        """
        if self.redirect_url is not None:
            return self.redirect_url
        return self.origin(request) + self.callback_path

    def origin(self, request: Request) -> str:
        """
        This gateway's origin (C{scheme://host[:port]}): that of the configured
        C{redirectURL}, else the one the browser reached with C{request}.
        """
        if self.redirect_url is not None:
            parts = urlsplit(self.redirect_url)
            return f"{parts.scheme}://{parts.netloc}"
        # The edge has validated and normalised Host (and X-Forwarded-* only ever come
        # from trusted proxies), and the IdP checks the value against its registration.
        host = request.getHeader(b"x-forwarded-host") or request.getHeader(b"host") or b""
        host = host.split(b",", 1)[0].strip()  # the client's own, first in a proxy chain
        scheme = "https" if is_https(request) else "http"
        return f"{scheme}://{host.decode('ascii', 'replace')}"
