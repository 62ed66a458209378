"""
C{POST auth.backchannelLogoutPath}: OpenID Connect Back-Channel Logout 1.0.

The IdP posts a logout token (C{application/x-www-form-urlencoded}, C{logout_token=...})
when a user's IdP session ends; the gateway ends every server-side session of that IdP
session (C{sid}) or, without one, of that subject (C{sub}), in the store shared by all
its instances, and every instance closes those sessions' open streams. Mounted only with
a state provider (a cookie-only session cannot be ended from the server), and exempt
from the CSRF check: it is called server to server, never by a browser, and the token's
signature is what authenticates it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IConsumer
from twisted.logger import Logger
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from edgegw.auth.endpoint import AuthEndpoint, answer_failures, answer_json, answer_text
from edgegw.identity.logout_token import MAX_AGE, LogoutToken, verify_logout_token
from edgegw.identity.provider import IdentityProvider
from edgegw.identity.tokens import DEFAULT_LEEWAY, TokenError, UnknownKeyError
from edgegw.sessions.server import ServerSessions
from edgegw.state.store import StoreError

__all__ = ["MAX_BODY", "BackchannelLogoutResource"]

_log = Logger(namespace="edgegw.auth")

MAX_BODY = 32 * 1024
"""The largest logout request body read (a logout token is at most 16 KiB)."""

_FORM = b"application/x-www-form-urlencoded"


class _BadRequestError(Exception):
    pass


class _UnavailableError(Exception):
    pass


@implementer(IConsumer)
class _Collector:
    """
    Reads a request body of at most L{MAX_BODY} bytes; past it, stops reading and fails.
    """

    def __init__(self, body: Any) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.body = body
        self.done: Deferred[bytes] = Deferred()

    def read(self) -> Deferred[bytes]:
        """
        The whole body, or a L{_BadRequest} when it is too large.
        """
        if self.body is None:
            self.done.callback(b"")
        else:
            producing = self.body.startProducing(self)
            producing.addCallbacks(self._complete, self._failed)
        return self.done

    def cancel(self) -> None:
        """
        Stop reading (the client left); nothing once the whole body is read.
        """
        if not self.done.called:
            if self.body is not None:
                self.body.stopProducing()
            self.done.errback(CancelledError())

    def _complete(self, _: object) -> None:
        if not self.done.called:
            self.done.callback(b"".join(self.parts))

    def _failed(self, failure: Any) -> None:
        if not self.done.called:
            self.done.errback(failure)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        if self.done.called:
            return
        self.size += len(data)
        if self.size > MAX_BODY:
            self.parts = []
            self.body.stopProducing()
            self.done.errback(_BadRequestError("the body is too large"))
            return
        self.parts.append(data)


class BackchannelLogoutResource(AuthEndpoint):
    """
    Verifies the logout token and ends the sessions it names: 200 (C{no-store}) when
    done, even when no session matched; 400 with an OAuth-style JSON error for a request
    or token that is not valid (the reason goes to the log); 503 with C{Retry-After}
    while the IdP's keys or the store are not available.
    """

    method = b"POST"

    def __init__(self, provider: IdentityProvider, server: ServerSessions) -> None:
        super().__init__()
        self.provider = provider
        self.sessions = server

    def render_allowed(self, request: Request) -> bytes | int:
        """
        Read the form, then verify and end.
        """
        content_type = (request.getHeader(b"content-type") or b"").split(b";", 1)[0]
        if content_type.strip().lower() != _FORM:
            self._invalid(request, "not a form")
            return b""
        # The gateway's requests stream their bodies (server.request.RequestBody).
        body = getattr(request, "body", None)
        length = getattr(body, "length", 0)
        if isinstance(length, int) and length > MAX_BODY:
            self._invalid(request, "the body is too large")
            return b""
        collector = _Collector(body)
        reading = collector.read()
        # A client that leaves stops the body read; once the token is read, the logout
        # is carried out whether or not the IdP waits for the answer.
        request.notifyFinish().addErrback(lambda _: collector.cancel())
        running = reading.addCallback(lambda form: Deferred.fromCoroutine(self._end(form)))
        running.addCallback(lambda ended: self._done(request, ended))
        running.addErrback(self._refused, request)
        answer_failures(request, running)
        return NOT_DONE_YET

    async def _end(self, body: bytes) -> int:
        try:
            form = parse_qs(
                body.decode("ascii"),
                strict_parsing=True,
                max_num_fields=8,
            )
        except (ValueError, UnicodeDecodeError):
            raise _BadRequestError("the body is not a form") from None
        tokens = form.get("logout_token", [])
        if len(tokens) != 1:
            raise _BadRequestError("not exactly one logout_token")
        token = await self._verify(tokens[0])
        server = self.sessions
        try:
            if not await server.first_use(token.jti, MAX_AGE + DEFAULT_LEEWAY):
                raise _BadRequestError("logout token replayed")
        except StoreError as e:
            raise _UnavailableError(f"the session store: {e}") from None
        try:
            return await server.end_matching(token.sid, token.sub)
        except StoreError as e:
            # Not done: the IdP's retry of this very token must be carried out, not
            # refused as a replay.
            await server.forget_use(token.jti)
            raise _UnavailableError(f"the session store: {e}") from None

    async def _verify(self, token: str) -> LogoutToken:
        provider = self.provider
        metadata = provider.metadata
        if metadata is None:
            raise _UnavailableError("the IdP is not discovered")
        keys = provider.keys
        for attempt in range(2):
            try:
                return verify_logout_token(
                    token,
                    keys,
                    algorithms=metadata.id_token_algorithms,
                    issuer=provider.spec.issuer,
                    client_id=provider.spec.client_id,
                    now=provider.seconds(),
                )
            except UnknownKeyError as e:
                if attempt:
                    raise _BadRequestError("logout token refused: unknown key id") from None
                keys = await provider.keys_for(e.kid)
            except TokenError as e:
                raise _BadRequestError(f"logout token refused: {e.reason}") from None
        raise AssertionError("unreachable")

    def _done(self, request: Request, ended: int) -> None:
        _log.info("back-channel logout ended {count} session(s)", count=ended)
        answer_text(request, 200, b"")

    def _refused(self, failure: Any, request: Request) -> None:
        if failure.check(CancelledError):
            return  # the IdP went away; nothing to answer
        error = failure.trap(_BadRequestError, _UnavailableError)
        reason = failure.getErrorMessage()
        if error is _BadRequestError:
            self._invalid(request, reason)
            return
        _log.warn("back-channel logout not done: {reason}", reason=reason)
        answer_text(request, 503, b"service unavailable\n", ((b"Retry-After", b"5"),))

    def _invalid(self, request: Request, reason: str) -> None:
        _log.warn("back-channel logout refused: {reason}", reason=reason)
        answer_json(request, 400, {"error": "invalid_request"})
