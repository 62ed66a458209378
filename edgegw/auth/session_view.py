"""
C{GET session.infoPath}: the session as a single-page app may see it.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_failures, answer_json, answer_text
from edgegw.identity.session_cookie import SessionRecord

__all__ = ["SessionViewResource"]


class SessionViewResource(AuthEndpoint):
    """
    200 JSON C{{subject, passport, groups, issuedAt, expiresAt, expiresIn}} for a valid
    session; 401 without one. Never a token or the fingerprint; never cached.
    """

    def __init__(self, login: BrowserLogin) -> None:
        super().__init__()
        self.login = login

    def render_allowed(self, request: Request) -> bytes | int:
        """
        Answer the view, or 401.
        """
        server = self.login.server
        if server is None:
            self._answer(request, self.login.sessions.read(request))
            return b""
        reading = Deferred.fromCoroutine(server.read(request))
        reading.addCallback(
            lambda found: self._answer(request, found[1] if isinstance(found, tuple) else None)
        )
        answer_failures(request, reading)
        return NOT_DONE_YET

    def _answer(self, request: Request, record: SessionRecord | None) -> None:
        if record is None:
            answer_text(request, 401, b"unauthorized\n")
            return
        now = int(self.login.reactor.seconds())
        answer_json(
            request,
            200,
            {
                "subject": record.subject,
                "passport": dict(record.passport),
                "groups": list(record.groups),
                "issuedAt": record.issued_at,
                "expiresAt": record.expires_at,
                "expiresIn": max(0, record.expires_at - now),
            },
        )
