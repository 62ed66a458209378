"""
The session stage: resolve the caller's session cookie into the request's principal.

A missing or invalid credential rejects nothing here; the request simply stays
unauthenticated and the auth-gate decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from twisted.web.server import Request

from edgegw.identity.assertion import (
    AssertionRefusedError,
    AssertionUnavailableError,
    AssertionVerifier,
)
from edgegw.identity.bearer import (
    BearerRejectedError,
    BearerUnavailableError,
    BearerVerifier,
    bearer_token,
)
from edgegw.identity.cookies import is_https
from edgegw.identity.principal import Principal
from edgegw.identity.session_cookie import SessionCookie, SessionRecord
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.sessions.server import STORE_UNAVAILABLE, ServerSessions
from edgegw.terminal.answers import write_text
from edgegw.terminal.exchange import Exchange, Handler, Stage

__all__ = ["session_stage"]

_RETRY_SOON = ((b"Retry-After", b"5"),)


def session_stage(
    cookie: SessionCookie | None,
    seconds: Callable[[], float],
    trusted_origins: Iterable[str] = (),
    refuse: Callable[[Exchange, bool], None] | None = None,
    bearer: BearerVerifier | None = None,
    assertions: AssertionVerifier | None = None,
    server: ServerSessions | None = None,
    metrics: IMetrics = NO_METRICS,
) -> Stage:
    """
    Make the session stage of one route.

    @param cookie: Reads and checks the sealed session cookie (L{None} without a session
        block: a verification-only instance).
    @param seconds: The reactor's C{seconds}: a stored access token past its expiry
        is not forwarded (the backend would refuse it; the session itself lives on).
    @param trusted_origins: C{security.csrf.trustedOrigins}: besides the gateway's own
        origin, the pages whose WebSocket handshakes carry the session.
    @param refuse: On a route whose auth is required, the auth-gate's answer to a
        request left without a principal (L{refusal<edgegw.chain.auth_gate.refusal>}):
        the gate then runs here rather than as a stage of its own.
    @param bearer: On a service route, the Bearer verifier: without a valid session
        cookie, C{Authorization: Bearer} is verified (the cookie wins when both are
        sent). App routes never look at Bearer tokens.
    @param assertions: On a service route, with C{identity.assertion.accept}: the
        inbound assertion header is taken off the request first (ordering rule 3: no
        later stage or backend sees a client's), then verified after the Bearer token;
        with C{requireBearer} it only enriches a Bearer principal of the same subject,
        without it a valid assertion alone authenticates. An invalid or unusable
        assertion is ignored (the reason goes to the access log), never an error; one
        whose token id the shared replay record (state store) could not record is
        not accepted either, and where a login is required answered 503.
    @param server: With a state provider: the cookie holds a session id, the record is
        read from the store (its access token refreshed first when due, on routes that
        require a login), and the request is tracked as one of the session's open
        streams until it finishes. A store that cannot be reached leaves the request
        unauthenticated (fail closed); routes that do not require a login skip the store
        for a while after it failed to answer.
    @param metrics: Counts each authentication's method and outcome (by reason class).
    """
    trusted = frozenset(origin.lower() for origin in trusted_origins)
    assertion_header = assertions.header if assertions is not None else b""
    require_bearer = assertions.spec.require_bearer if assertions is not None else True

    async def session(exchange: Exchange, next: Handler) -> None:
        request = exchange.request
        principal = None
        rejected = False
        asserted = None
        if assertions is not None:
            headers = request.requestHeaders
            asserted = headers.getRawHeaders(assertion_header)
            if asserted is not None:
                headers.removeHeader(assertion_header)
        from_bearer = False
        if cookie is not None:
            if _cross_origin_websocket(request, trusted):
                # A WebSocket handshake is a GET, which CSRF protection lets through,
                # and the browser sends SameSite=Lax cookies with it from any same-site
                # page: a socket opened by another origin's page is not the user's.
                exchange.note("auth", "cross-origin WebSocket: session not used")
            else:
                record: SessionRecord | None
                unavailable = False
                if server is None:
                    record = cookie.read(request)
                else:
                    found = await server.read(request, exchange.note, refuse is None)
                    record = None
                    if isinstance(found, tuple):
                        session_id, record = found
                        server.streams.track(session_id, request)
                    elif found is STORE_UNAVAILABLE:
                        unavailable = True
                if record is None:
                    if unavailable:
                        metrics.auth("session", "unavailable", "state_store")
                    elif cookie.carried(request):
                        # Sent, but expired, tampered with, ended or unreadable.
                        metrics.auth("session", "rejected", "invalid")
                else:
                    metrics.auth("session", "accepted")
                    expires = record.access_token_expires_at
                    if (
                        record.access_token is not None
                        and expires is not None
                        and expires <= seconds()
                    ):
                        principal = Principal(
                            subject=record.subject, passport=record.passport, groups=record.groups
                        )
                    else:
                        principal = record.principal()
        if principal is None and bearer is not None:
            token = bearer_token(request.requestHeaders)
            if isinstance(token, bytes):
                principal = bearer.cached(token)
                if principal is None:
                    try:
                        principal = await bearer.verify(token)
                    except BearerUnavailableError as e:
                        metrics.auth("bearer", "unavailable", reason_class(e.reason))
                        _rejected(exchange, e.reason)
                        if refuse is not None:
                            # Not the token's fault: retry later, keep the token.
                            write_text(request, 503, b"service unavailable\n", _RETRY_SOON)
                            return
                    except BearerRejectedError as e:
                        rejected = True
                        metrics.auth("bearer", "rejected", reason_class(e.reason))
                        _rejected(exchange, e.reason)
                from_bearer = principal is not None
                if from_bearer:
                    metrics.auth("bearer", "accepted")
            elif token is not None:
                rejected = True
                metrics.auth("bearer", "rejected", "malformed")
                _rejected(exchange, "malformed Bearer credential")
        if asserted is not None and assertions is not None:
            try:
                principal = await _with_assertion(
                    exchange, assertions, asserted, principal, from_bearer, require_bearer, metrics
                )
            except AssertionUnavailableError as e:
                # Whether it was used before cannot be told: not accepted (fail closed),
                # and, where a login is required, not the caller's fault either.
                metrics.auth("assertion", "unavailable", "state_store")
                _ignored(exchange, e.reason, principal)
                if refuse is not None:
                    write_text(request, 503, b"service unavailable\n", _RETRY_SOON)
                    return
        if principal is not None:
            exchange.principal = principal
        elif refuse is not None:
            refuse(exchange, rejected)
            return
        await next(exchange)

    return session


async def _with_assertion(
    exchange: Exchange,
    assertions: AssertionVerifier,
    values: Sequence[bytes],
    principal: Principal | None,
    from_bearer: bool,
    require_bearer: bool,
    metrics: IMetrics = NO_METRICS,
) -> Principal | None:
    """
    The principal once the inbound assertion is taken into account: enriched with its
    groups and claims, or (without C{requireBearer}) authenticated by it alone; as it was
    when the assertion is invalid or does not fit.

    @raise AssertionUnavailableError: The shared replay record cannot be reached.
    """
    if len(values) != 1:
        metrics.auth("assertion", "rejected", "multiple")
        return _ignored(exchange, "more than one assertion header", principal)
    if require_bearer and not from_bearer:
        # Checked before the signature: an unaccompanied assertion costs nothing.
        metrics.auth("assertion", "rejected", "no_bearer")
        return _ignored(exchange, "not accompanied by a verified Bearer token", principal)
    try:
        asserted = await assertions.accept(values[0])
    except AssertionRefusedError as e:
        metrics.auth("assertion", "rejected", reason_class(e.reason))
        return _ignored(exchange, e.reason, principal)
    if principal is None:
        metrics.auth("assertion", "accepted")
        exchange.note("assertion", "accepted")
        return Principal(asserted.subject, asserted.claims, asserted.groups)
    if asserted.subject != principal.subject:
        metrics.auth("assertion", "rejected", "subject_mismatch")
        return _ignored(exchange, "subject differs from the token's", principal)
    metrics.auth("assertion", "accepted")
    exchange.note("assertion", "accepted")
    return Principal(principal.subject, asserted.claims, asserted.groups, principal.access_token)


def _ignored(exchange: Exchange, reason: str, principal: Principal | None) -> Principal | None:
    exchange.note("assertion", f"ignored: {reason}")
    span = exchange.span
    if span is not None:
        span.add_event("assertion.ignored", {"reason": reason})
    return principal


def _rejected(exchange: Exchange, reason: str) -> None:
    """
    Record why a Bearer token was rejected: the access log and the span, never the body.
    """
    exchange.note("auth", f"Bearer rejected: {reason}")
    span = exchange.span
    if span is not None:
        span.add_event("auth.rejected", {"reason": reason})


def _cross_origin_websocket(request: Request, trusted: frozenset[str]) -> bool:
    """
    Whether C{request} is a WebSocket handshake from a page of another origin: its
    C{Origin} is neither the gateway's own origin (as the browser addressed it) nor a
    trusted one. Browsers always send C{Origin} on a handshake; a client without one
    (not a browser) carries no ambient cookies to abuse.
    """
    headers = request.requestHeaders
    upgrade = headers.getRawHeaders(b"upgrade")
    if not upgrade or b"websocket" not in upgrade[0].lower():
        return False
    origins = headers.getRawHeaders(b"origin")
    if not origins:
        return False
    origin = origins[0].decode("latin-1").strip().lower()
    host = headers.getRawHeaders(b"x-forwarded-host") or headers.getRawHeaders(b"host") or [b""]
    first = host[0].split(b",", 1)[0].strip()
    own = ("https://" if is_https(request) else "http://") + first.decode("latin-1").lower()
    return origin != own and origin not in trusted


_REASON_CLASSES = (
    ("expired", "expired"),
    ("not yet valid", "not_yet_valid"),
    ("issued in the future", "not_yet_valid"),
    ("bad signature", "signature"),
    ("unknown key id", "signature"),
    ("no key for algorithm", "signature"),
    ("algorithm not allowed", "signature"),
    ("critical header extension", "signature"),
    ("malformed", "malformed"),
    ("token too long", "malformed"),
    ("wrong ", "claims"),
    ("missing ", "claims"),
    ("bad sub", "claims"),
    ("the token names no subject", "claims"),
    ("not an access token", "not_access_token"),
    ("userinfo", "userinfo"),
    ("replayed", "replayed"),
    ("the IdP is not discovered", "idp_not_ready"),
)


def reason_class(reason: str) -> str:
    """
    A rejection reason (for the access log, where it can carry details) as one word of a
    fixed set, for metrics: C{expired}, C{signature}, C{malformed}, C{claims}, ...
    """
    for prefix, kind in _REASON_CLASSES:
        if reason.startswith(prefix) or prefix in reason:
            return kind
    return "other"
