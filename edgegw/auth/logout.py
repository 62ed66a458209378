"""
C{POST auth.logoutPath}: end the browser's session.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_failures, answer_redirect

__all__ = ["LogoutResource"]


class LogoutResource(AuthEndpoint):
    """
    Clears every session chunk and login-state cookie the browser holds, then 302 to
    C{session.postLogoutRedirect}. POST only; a cross-origin POST never gets here (the
    security layer's CSRF check stops it first). With a state provider the session
    record is deleted too, and the session's open streams are closed in every gateway
    sharing the store.
    """

    method = b"POST"

    def __init__(self, login: BrowserLogin, post_logout_redirect: str) -> None:
        super().__init__()
        self.login = login
        self.location = post_logout_redirect.encode("ascii")

    def render_allowed(self, request: Request) -> bytes | int:
        """
        Clear the cookies (and the stored record) and redirect.
        """
        self.login.logins.clear_all(request)
        self.login.metrics.login("logout", "ok")
        server = self.login.server
        if server is None:
            self.login.sessions.clear(request)
            answer_redirect(request, self.location)
            return b""
        # The store is bounded by its timeout, and end() never fails: the cookie is
        # cleared whatever the store says.
        ending = Deferred.fromCoroutine(server.end(request))
        ending.addCallback(lambda _: answer_redirect(request, self.location))
        answer_failures(request, ending)
        return NOT_DONE_YET
