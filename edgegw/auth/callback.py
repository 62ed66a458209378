"""
C{GET} the callback path: finish the OIDC authorization-code flow and set the session.
"""

from __future__ import annotations

import hmac

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint, answer_redirect, answer_text
from edgegw.identity.claims import merge_userinfo, needs_userinfo, principal_of
from edgegw.identity.cookies import MAX_CHUNK, AmbiguousCookieError
from edgegw.identity.provider import IdPError
from edgegw.identity.sealing import NONCE_SIZE, TAG_SIZE
from edgegw.identity.session_cookie import SessionRecord, SessionTooLargeError, encode_record
from edgegw.identity.token_response import (
    MAX_REFRESH_TOKEN,
    access_token_expiry,
    usable_id_token,
    usable_token,
)
from edgegw.identity.tokens import TokenError
from edgegw.sessions.server import SessionStoreError

__all__ = ["CallbackResource", "LoginFailedError"]

_log = Logger(namespace="edgegw.auth")

MAX_EXCHANGES = 64
"""Callbacks completing at once (token endpoint and userinfo calls in flight)."""
MAX_CODE = 2048
"""The longest authorization code accepted."""

_BAD_REQUEST = (400, b"login failed\n")
_BAD_GATEWAY = (502, b"bad gateway\n")


# A failed callback's outcome for metrics, by the status it answers.
_FAILURE_CLASSES = {400: "bad_request", 502: "idp_error", 503: "unavailable"}


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
    a login cookie carried more than once (one may be tossed from a sibling domain), an
    C{error=} from the IdP or an C{iss} naming another issuer (RFC 9207); 502 when the
    token endpoint fails or its id_token does not verify, or userinfo fails; the reason
    goes to the log only.
    """

    def __init__(self, login: BrowserLogin) -> None:
        super().__init__()
        self.login = login
        self.spent = login.spent
        self.running = 0

    def render_allowed(self, request: Request) -> bytes | int:
        """
        Run the exchange; the answer is written when it completes. Beyond
        L{MAX_EXCHANGES} callbacks at once: 503 (the IdP rate-limits per client, and
        a flood of callbacks must not spend that budget for everyone).
        """
        if self.running >= MAX_EXCHANGES:
            self.login.metrics.login("callback", "busy")
            answer_text(request, 503, b"service unavailable\n", ((b"Retry-After", b"1"),))
            return b""
        self.running += 1
        running = Deferred.fromCoroutine(self._complete(request))
        running.addErrback(self._failed, request)
        running.addBoth(self._done)
        request.notifyFinish().addErrback(lambda _: running.cancel())
        return NOT_DONE_YET

    def _done(self, result: object) -> None:
        self.running -= 1

    async def _complete(self, request: Request) -> None:
        login = self.login
        provider = login.provider
        args = request.args
        state = _first(args.get(b"state"))
        # The login cookie is cleared whatever happens next, and the state is spent in
        # this instance: the same login cookie replayed (by this browser or a copy of it)
        # cannot buy another call to the token endpoint.
        try:
            pending = login.logins.take(request, state) if state else None
        except AmbiguousCookieError:
            raise LoginFailedError(400, "this login's state cookie came more than once") from None
        if pending is not None:
            spent = self.spent.spend(pending.state, pending.created_at)
            if spent is None:
                raise LoginFailedError(503, "too many logins in progress to remember")
            if not spent:
                raise LoginFailedError(400, "this login's state was already used")
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
        if not code or len(code) > MAX_CODE or not code.isascii() or not code.isprintable():
            raise LoginFailedError(400, "no usable code in the callback")
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
            # Fail closed: without the claims userinfo was needed for, the subject, the
            # groups or a claim a policy denies on could differ from the user's own.
            try:
                userinfo = await provider.userinfo(metadata, access_token)
            except IdPError as e:
                raise LoginFailedError(502, str(e)) from None
            claims = merge_userinfo(claims, userinfo)
        elif identity.user_info == "always":
            raise LoginFailedError(502, "identity.userInfo is always, but no access token came")
        principal = principal_of(identity, login.groups, claims)
        if principal is None:
            raise LoginFailedError(502, "the id_token names no subject")
        now = int(login.reactor.seconds())
        server = login.server
        kept_token = None
        token_expiry = None
        if (login.keep_access_token or server is not None) and access_token is not None:
            if usable_token(access_token):
                kept_token = access_token
                token_expiry = access_token_expiry(now, tokens.get("expires_in"))
            else:
                # It could never be sent as a header: forward nothing rather than fail
                # every request of the session.
                _log.warn("the access token is not an RFC 6750 token; it is not kept")
        if server is None:
            record = _with_id_token(
                login.sessions.new_record(
                    request,
                    principal.subject,
                    principal.passport,
                    principal.groups,
                    kept_token,
                    token_expiry,
                ),
                tokens["id_token"],
            )
            try:
                login.sessions.write(request, record)
            except SessionTooLargeError as e:
                raise LoginFailedError(502, f"session too large: {e}") from None
        else:
            refresh_token = tokens.get("refresh_token")
            idp_session = claims.get("sid")
            record = login.sessions.new_record(
                request,
                principal.subject,
                principal.passport,
                principal.groups,
                kept_token,
                token_expiry,
                refresh_token=(
                    refresh_token
                    if kept_token is not None and usable_token(refresh_token, MAX_REFRESH_TOKEN)
                    else None
                ),
                id_token=tokens["id_token"],
                idp_session=idp_session if isinstance(idp_session, str) and idp_session else None,
            )
            try:
                await server.create(request, record, str(claims["sub"]))
            except SessionTooLargeError as e:
                raise LoginFailedError(502, f"session too large: {e}") from None
            except SessionStoreError as e:
                raise LoginFailedError(503, f"the session store cannot be written: {e}") from None
        _log.info("login of {subject}", subject=principal.subject)
        self.login.metrics.login("callback", "ok")
        answer_redirect(request, pending.return_to.encode("ascii"))

    def _failed(self, failure: Failure, request: Request) -> None:
        if failure.check(CancelledError):
            return
        if failure.check(LoginFailedError):
            error = failure.value
            assert isinstance(error, LoginFailedError)
            _log.warn("login failed: {reason}", reason=error.reason)
            self.login.metrics.login("callback", _FAILURE_CLASSES.get(error.status, "failed"))
            if error.status == 503:
                provider = self.login.provider
                # The IdP not yet discovered, or the state store unreachable.
                retry = b"%d" % provider.retry_after() if provider.metadata is None else b"5"
                answer_text(request, 503, b"service unavailable\n", ((b"Retry-After", retry),))
            else:
                status, body = _BAD_REQUEST if error.status == 400 else _BAD_GATEWAY
                answer_text(request, status, body)
            return
        _log.failure("login callback failed", failure=failure)
        self.login.metrics.login("callback", "error")
        answer_text(request, 500, b"internal server error\n")


def _with_id_token(record: SessionRecord, id_token: str) -> SessionRecord:
    """
    The cookie session C{record} with the login's id_token (the hint of a logout at the
    IdP) when the sealed record still fits in one cookie; else C{record} as it is. The
    id_token never makes a session take more cookies, nor pushes a browser towards the
    request-header budget; without it the logout at the IdP goes without a hint.
    """
    if not usable_id_token(id_token):
        return record
    kept = attrs.evolve(record, id_token=id_token)
    # Sealed: base64url (unpadded) of nonce, ciphertext (as long as the plaintext), tag.
    sealed = -(-(NONCE_SIZE + len(encode_record(kept)) + TAG_SIZE) * 4 // 3)
    return kept if sealed <= MAX_CHUNK else record


def _first(values: list[bytes] | None) -> str | None:
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        return None
