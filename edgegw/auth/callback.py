"""
C{GET} the callback path: finish the OIDC authorization-code flow and set the session.
"""

from __future__ import annotations

import hmac

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_redirect, answer_text
from edgegw.identity.claims import merge_userinfo, needs_userinfo, principal_of
from edgegw.identity.provider import IdPError
from edgegw.identity.tokens import TokenError

__all__ = ["CallbackResource", "LoginFailedError"]

_log = Logger(namespace="edgegw.auth")

_BAD_REQUEST = (400, b"login failed\n")
_BAD_GATEWAY = (502, b"bad gateway\n")


class LoginFailedError(Exception):
    """
    The callback cannot complete: no session is set.

    @ivar status: 400 (the browser's request: state, login cookie, an IdP error) or 502
        (the IdP: token endpoint, id_token, userinfo); 503 while the IdP is unknown.
    @ivar reason: For the log only.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class CallbackResource(AuthEndpoint):
    """
    Checks the state against this browser's login-state cookie, exchanges the code with
    the PKCE verifier, verifies the id_token, reads userinfo when the identity rules ask
    for it, sets the session cookie and sends the browser back to its C{return_to}.

    Every failure sets no session: 400 for a missing or mismatched state or login cookie,
    an C{error=} from the IdP or an C{iss} naming another issuer (RFC 9207); 502 when the
    token endpoint fails or its id_token does not verify, or userinfo fails; the reason
    goes to the log only.
    """

    def __init__(self, login: BrowserLogin) -> None:
        super().__init__()
        self.login = login

    def respond(self, request: Request) -> int:
        """
        Run the exchange; the answer is written when it completes.
        """
        running = Deferred.fromCoroutine(self._complete(request))
        running.addErrback(self._failed, request)
        request.notifyFinish().addErrback(lambda _: running.cancel())
        return NOT_DONE_YET

    async def _complete(self, request: Request) -> None:
        login = self.login
        provider = login.provider
        args = request.args
        state = _first(args.get(b"state"))
        # The login cookie is cleared whatever happens next: a state is used once.
        pending = login.logins.take(request, state) if state else None
        error = _first(args.get(b"error"))
        if error is not None:
            raise LoginFailedError(400, f"the IdP answered error={error[:100]!r}")
        if state is None:
            raise LoginFailedError(400, "no state in the callback")
        if pending is None:
            raise LoginFailedError(400, "no login in progress for this state in this browser")
        metadata = provider.metadata
        if metadata is None:
            raise LoginFailedError(503, "the IdP is not discovered")
        issuer = _first(args.get(b"iss"))
        if issuer is None and metadata.iss_parameter_supported:
            raise LoginFailedError(400, "the callback has no iss, which the IdP always sends")
        if issuer is not None and not hmac.compare_digest(
            issuer.encode("utf-8"), provider.spec.issuer.encode("utf-8")
        ):
            raise LoginFailedError(400, f"the callback names another issuer: {issuer[:200]!r}")
        code = _first(args.get(b"code"))
        if not code:
            raise LoginFailedError(400, "no code in the callback")
        try:
            tokens = await provider.exchange_code(
                metadata,
                code=code,
                verifier=pending.verifier,
                redirect_uri=login.redirect_uri(request),
            )
            claims = await provider.verify_id_token(metadata, tokens["id_token"], pending.nonce)
        except TokenError as e:
            raise LoginFailedError(502, f"id_token refused: {e.reason}") from None
        except IdPError as e:
            raise LoginFailedError(502, str(e)) from None
        access_token = tokens.get("access_token")
        if not isinstance(access_token, str) or not access_token:
            access_token = None
        identity = login.identity
        if access_token is not None and needs_userinfo(identity, claims):
            try:
                userinfo = await provider.userinfo(metadata, access_token)
            except IdPError as e:
                if identity.user_info == "always":
                    raise LoginFailedError(502, str(e)) from None
                # auto: the id_token's claims stand alone (an access token for an API,
                # RFC 8707, is often refused at userinfo); a missing claim or group only
                # ever takes rights away.
                _log.warn("userinfo unavailable, using the id_token alone: {reason}", reason=e)
            else:
                claims = merge_userinfo(claims, userinfo)
        elif identity.user_info == "always":
            raise LoginFailedError(502, "identity.userInfo is always, but no access token came")
        principal = principal_of(identity, login.groups, claims)
        if principal is None:
            raise LoginFailedError(502, "the id_token names no subject")
        now = int(login.reactor.seconds())
        token_expiry = None
        if login.keep_access_token and access_token is not None:
            expires_in = tokens.get("expires_in")
            if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
                token_expiry = now + int(expires_in)
        record = login.sessions.new_record(
            request,
            principal.subject,
            principal.passport,
            principal.groups,
            access_token if login.keep_access_token else None,
            token_expiry,
        )
        login.sessions.write(request, record)
        _log.info("login of {subject}", subject=principal.subject)
        answer_redirect(request, pending.return_to.encode("ascii"))

    def _failed(self, failure: Failure, request: Request) -> None:
        if failure.check(CancelledError):
            return
        if failure.check(LoginFailedError):
            error = failure.value
            assert isinstance(error, LoginFailedError)
            _log.warn("login failed: {reason}", reason=error.reason)
            if error.status == 503:
                retry = b"%d" % self.login.provider.retry_after()
                answer_text(request, 503, b"service unavailable\n", ((b"Retry-After", retry),))
            else:
                status, body = _BAD_REQUEST if error.status == 400 else _BAD_GATEWAY
                answer_text(request, status, body)
            return
        _log.failure("login callback failed", failure=failure)
        answer_text(request, 500, b"internal server error\n")


def _first(values: list[bytes] | None) -> str | None:
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        return None
