"""
C{POST auth.logoutPath}: end the browser's session.
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_redirect

__all__ = ["LogoutResource"]


class LogoutResource(AuthEndpoint):
    """
    Clears every session chunk and login-state cookie the browser holds, then 302 to
    C{session.postLogoutRedirect}. POST only; a cross-origin POST never gets here (the
    security layer's CSRF check stops it first).
    """

    method = b"POST"

    def __init__(self, login: BrowserLogin, post_logout_redirect: str) -> None:
        super().__init__()
        self.login = login
        self.location = post_logout_redirect.encode("ascii")

    def respond(self, request: Request) -> bytes:
        """
        Clear the cookies and redirect.
        """
        self.login.sessions.clear(request)
        self.login.logins.clear_all(request)
        answer_redirect(request, self.location)
        return b""
