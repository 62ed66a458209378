"""
C{POST auth.logoutPath}: end the browser's session, and its session at the IdP when the
IdP offers an end-session endpoint (OpenID Connect RP-Initiated Logout 1.0);
C{GET auth.logoutPath?state=...}: the IdP's return from that logout.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote, urlencode, urlsplit

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import (
    AuthEndpoint,
    answer_failures,
    answer_json,
    answer_redirect,
    answer_text,
)
from edgegw.auth.logout_state import LogoutStates
from edgegw.config.model import AuthSpec
from edgegw.identity.session_cookie import SessionRecord
from edgegw.identity.token_response import usable_id_token
from edgegw.sessions.server import ServerSessions
from edgegw.state.store import StoreError

__all__ = ["LogoutResource"]

_log = Logger(namespace="edgegw.auth")


class LogoutResource(AuthEndpoint):
    """
    C{POST}: clears every session chunk and login-state cookie the browser holds (with
    a state provider the session record is deleted first, and the session's open
    streams are closed in every gateway sharing the store). Then, when the IdP's
    discovery document has an C{end_session_endpoint}, the browser is sent there with
    C{id_token_hint} (the session's latest id_token, when it has one), C{client_id},
    C{post_logout_redirect_uri} and, when that is this gateway's logout path, a C{state}
    kept in a logout-state cookie; otherwise 302 to C{session.postLogoutRedirect}, as
    before. A request the browser marks as not a navigation (C{Sec-Fetch-Mode} present
    and not C{navigate}: an app's C{fetch()}, which could not follow a redirect to the
    IdP) gets 200 C{{"location": <the end-session URL>}} instead, to navigate to.

    A cross-origin POST never gets here (the security layer's CSRF check stops it).

    C{GET} with a C{state} parameter is the IdP's return: with the state this browser's
    logout-state cookie holds, 302 to C{session.postLogoutRedirect}; with any other,
    none or no cookie, 400 and nothing changes. Any other C{GET}: 405.
    """

    method = b"POST"

    def __init__(
        self, login: BrowserLogin, post_logout_redirect: str, auth: AuthSpec | None = None
    ) -> None:
        """
        @param post_logout_redirect: C{session.postLogoutRedirect}, a local path.
        @param auth: The Gateway's C{auth} block: C{logoutPath} (where the IdP returns
            by default) and C{postLogoutRedirectURL}.
        """
        super().__init__()
        auth = auth if auth is not None else AuthSpec()
        self.login = login
        self.location = post_logout_redirect.encode("ascii")
        self.logout_path = auth.logout_path
        self.post_logout_url = auth.post_logout_redirect_url
        sessions = login.sessions
        self.states = LogoutStates(
            sessions.sealer, sessions.cookie_name, login.reactor, sessions.host_prefix
        )

    def render(self, request: Request) -> bytes | int:
        """
        The IdP's return (C{GET} with C{state}), else the POST-only logout.
        """
        if request.method == b"GET" and b"state" in request.args:
            return self._returned(request)
        return super().render(request)

    def render_allowed(self, request: Request) -> bytes | int:
        """
        End the session (cookies, and the stored record), then redirect.
        """
        login = self.login
        metadata = login.provider.metadata
        end_session = metadata.end_session_endpoint if metadata is not None else None
        login.logins.clear_all(request)
        login.metrics.login("logout", "ok")
        server = login.server
        if server is None:
            record = login.sessions.read(request) if end_session is not None else None
            login.sessions.clear(request)
            self._answer(request, end_session, record)
            return b""
        ending = Deferred.fromCoroutine(self._end_stored(request, server, end_session))
        answer_failures(request, ending)
        return NOT_DONE_YET

    async def _end_stored(
        self, request: Request, server: ServerSessions, end_session: str | None
    ) -> None:
        record = None
        session_id = server.session_id(request) if end_session is not None else None
        if session_id is not None:
            try:
                record = await server.load(session_id)
            except StoreError:
                record = None  # the logout goes on without a hint
            # Only this browser's session gives its id_token away (in the redirect's
            # URL): a copied cookie presented from elsewhere still ends the session,
            # but learns nothing from it.
            if record is not None and not hmac.compare_digest(
                record.fingerprint, self.login.sessions.fingerprint(request)
            ):
                record = None
        # The store is bounded by its timeout, and end() never fails: the cookie is
        # cleared whatever the store says, and the record is deleted before the answer.
        await server.end(request)
        self._answer(request, end_session, record)

    def _answer(
        self, request: Request, end_session: str | None, record: SessionRecord | None
    ) -> None:
        if end_session is None:
            answer_redirect(request, self.location)
            return
        login = self.login
        parameters: dict[str, str] = {}
        if record is not None and usable_id_token(record.id_token):
            assert record.id_token is not None
            parameters["id_token_hint"] = record.id_token
        parameters["client_id"] = login.provider.spec.client_id
        own = login.origin(request) + self.logout_path
        target = self.post_logout_url or own
        parameters["post_logout_redirect_uri"] = target
        if _same_place(target, own):
            # The IdP returns here: the state ties that return to this browser.
            parameters["state"] = self.states.begin(request)
        url = (
            end_session
            + ("&" if "?" in end_session else "?")
            + urlencode(parameters, quote_via=quote)
        )
        mode = request.getHeader(b"sec-fetch-mode")
        if mode is not None and mode.lower() != b"navigate":
            answer_json(request, 200, {"location": url})
        else:
            answer_redirect(request, url.encode("ascii"))

    def _returned(self, request: Request) -> bytes:
        values = request.args.get(b"state") or [b""]
        try:
            state: str | None = values[0].decode("ascii")
        except UnicodeDecodeError:
            state = None
        if self.states.complete(request, state):
            self.login.metrics.login("logout_return", "ok")
            answer_redirect(request, self.location)
            return b""
        _log.warn("a return from the IdP's logout with a state this browser did not begin")
        self.login.metrics.login("logout_return", "bad_state")
        answer_text(request, 400, b"logout not recognised\n")
        return b""


def _same_place(configured: str, own: str) -> bool:
    """
    Whether the URL C{configured} names the gateway's own logout URL C{own}: the same
    scheme, host (any case) and port (a default one written or not), and path.
    """
    if configured == own:
        return True
    try:
        a, b = urlsplit(configured), urlsplit(own)
        ports = (a.port, b.port)
    except ValueError:
        return False
    defaults = {"http": 80, "https": 443}
    scheme = a.scheme.lower()
    return (
        scheme == b.scheme.lower()
        and (a.hostname or "") == (b.hostname or "")
        and (ports[0] or defaults.get(scheme)) == (ports[1] or defaults.get(scheme))
        and a.path == b.path
        and not a.query
    )
