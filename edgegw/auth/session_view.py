"""
C{GET session.infoPath}: the session as a single-page app may see it.
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_json, answer_text

__all__ = ["SessionViewResource"]


class SessionViewResource(AuthEndpoint):
    """
    200 JSON C{{subject, passport, groups, issuedAt, expiresAt, expiresIn}} for a valid
    session; 401 without one. Never a token or the fingerprint; never cached.
    """

    def __init__(self, login: BrowserLogin) -> None:
        super().__init__()
        self.login = login

    def respond(self, request: Request) -> bytes:
        """
        Answer the view, or 401.
        """
        record = self.login.sessions.read(request)
        if record is None:
            answer_text(request, 401, b"unauthorized\n")
            return b""
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
        return b""
