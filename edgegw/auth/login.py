"""
C{GET auth.loginPath}: start the OIDC authorization-code flow (PKCE S256).
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_redirect, answer_text
from edgegw.routing.redirects import is_local_redirect

__all__ = ["LoginResource", "safe_return_to"]


MAX_RETURN_TO = 1024
"""
The longest C{return_to} kept: with L{MAX_PENDING<edgegw.identity.login_state.MAX_PENDING>}
logins pending and a session of L{MAX_SESSION_CHUNKS
<edgegw.identity.session_cookie.MAX_SESSION_CHUNKS>} chunks, the browser's cookies stay
well inside the gateway's 16 KiB request-header budget (past it every request would be
a 431, the logout included).
"""


def safe_return_to(values: list[bytes] | None) -> str:
    """
    The C{return_to} a login goes back to: the first value when it is a local path
    (starts with C{/}, not C{//} or C{/\\}, no C{://}, printable ASCII without spaces or
    backslashes, which browsers rewrite) of at most L{MAX_RETURN_TO} characters; anything
    else is C{/}.
    """
    if not values or len(values[0]) > MAX_RETURN_TO:
        return "/"
    try:
        target = values[0].decode("ascii")
    except UnicodeDecodeError:
        return "/"
    return target if is_local_redirect(target) else "/"


class LoginResource(AuthEndpoint):
    """
    Sends the browser to the IdP's authorization endpoint with a fresh state, nonce and
    PKCE challenge, remembered (with C{return_to}) in a sealed login-state cookie of its
    own, so that logins begun in several tabs each complete.

    Until the IdP's discovery has succeeded: 503 with C{Retry-After}.
    """

    def __init__(self, login: BrowserLogin) -> None:
        super().__init__()
        self.login = login

    def render_allowed(self, request: Request) -> bytes:
        """
        Answer 302 to the IdP, or 503 while it is not known.
        """
        login = self.login
        provider = login.provider
        metadata = provider.metadata
        if metadata is None:
            login.metrics.login("login", "idp_unavailable")
            retry = b"%d" % provider.retry_after()
            answer_text(request, 503, b"service unavailable\n", ((b"Retry-After", retry),))
            return b""
        return_to = safe_return_to(request.args.get(b"return_to"))
        state = login.logins.begin(request, return_to)
        url = provider.authorization_url(
            metadata,
            redirect_uri=login.redirect_uri(request),
            state=state.state,
            nonce=state.nonce,
            code_challenge=state.challenge,
        )
        login.metrics.login("login", "redirected")
        answer_redirect(request, url.encode("ascii"))
        return b""
