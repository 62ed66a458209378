"""
Server-side sessions: the record in the state store, the browser holding only its id.

With a C{Gateway.spec.stateProvider}, login stores the session record (subject, passport,
groups, the IdP's tokens and their expiry) sealed with C{session.key} under
C{keyPrefix + <session id>}, expiring when the session does; the session cookie carries
only the sealed session id. Every request that carries the cookie reads the record with
one C{GET}: a logout anywhere, or a back-channel logout from the IdP, ends the session
for every gateway sharing the store at once.

Store keys, all under the configured prefix (the store adds it)::

    <session id>            the sealed record (random, 32 base64url characters)
    lock:<session id>       the refresh lock (owner token, short lease)
    sub:<sha256(subject)>   the session ids of a subject (back-channel logout by sub)
    idp:<sha256(sid)>       the session ids of an IdP session (back-channel logout by sid)
    jti:<sha256(jti)>       a logout token already used
    logout                  the channel ended session ids are published on

The record is sealed with the key it is stored under as associated data, so a record
copied to another key or another prefix does not open.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Final

from twisted.application.service import Service
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.identity.provider import IdentityProvider
from edgegw.identity.sealing import SESSION_ID_AAD, SESSION_RECORD_AAD
from edgegw.identity.session_cookie import (
    SessionCookie,
    SessionRecord,
    SessionTooLargeError,
    decode_record,
    encode_record,
)
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.sessions.refresh import Refresher
from edgegw.sessions.streams import OpenRequests
from edgegw.state.store import IStateStore, StoreError, StoreUnavailableError

__all__ = ["LOGOUT_CHANNEL", "STORE_UNAVAILABLE", "ServerSessions", "SessionStoreError"]

_log = Logger(namespace="edgegw.sessions")

LOGOUT_CHANNEL = b"logout"
"""The channel (under the key prefix) ended session ids are published on."""


class _StoreUnavailable:
    def __repr__(self) -> str:
        return "STORE_UNAVAILABLE"


STORE_UNAVAILABLE: Final = _StoreUnavailable()
"""
What L{ServerSessions.read} answers when the store could not be asked: no session, as
for an unknown one, but told apart (an outage is not a forged cookie).
"""

MAX_OPENED = 2048
"""Opened records kept per gateway ((session id, sealed value) -> its record)."""

MAX_OPENED_SIZE = 8192
"""The largest sealed record kept opened (so the cache is bounded in bytes too)."""

MAX_RECORD = 64 * 1024
"""The largest sealed record a login stores."""

OPTIONAL_READ_BUDGET = 0.25
"""
The longest a route that does not require a login waits for the store (at most the
store's own timeout): past it the request is served as anonymous.
"""

SKIP_AFTER_FAILURE = 5.0
"""
Seconds after the store failed to answer a read during which routes that do not require
a login skip it (they are served as anonymous rather than wait on the store).
"""

_SESSION_ID = re.compile(rb"[A-Za-z0-9_-]{32}")


class SessionStoreError(Exception):
    """
    The state store could not be used for this session operation (see the log).
    """


def index_key(kind: bytes, value: str) -> bytes:
    """
    The store key of the index of sessions for one subject (C{b"sub"}) or one IdP
    session (C{b"idp"}): hashed, so that any value makes a short key of fixed shape.
    """
    return kind + b":" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest().encode()


class ServerSessions(Service):
    """
    Reads, creates and ends server-side sessions; refreshes their access tokens
    (L{Refresher}); closes the live streams of sessions ended anywhere.

    A child service of the gateway (C{sessions}, started after the store): it
    subscribes to the logout channel when it starts.
    """

    name = "sessions"

    def __init__(
        self,
        store: IStateStore,
        cookie: SessionCookie,
        key_prefix: str,
        refresh_skew: float,
        provider: IdentityProvider | None,
        reactor: IReactorTime,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        """
        @param store: The state store (it adds C{key_prefix} to every key itself).
        @param cookie: The session cookie settings (name, sealer, fingerprint, ttl).
        @param key_prefix: The store's key prefix, sealed into each record's binding.
        @param refresh_skew: Seconds before the access token's expiry it is refreshed.
        @param provider: The IdP client that refreshes tokens.
        @param metrics: Counts the refreshes and their failures.
        """
        self.store = store
        self.cookie = cookie
        self.sealer = cookie.sealer
        self.streams = OpenRequests()
        self._prefix = key_prefix.encode("utf-8")
        self._clock = reactor
        self._opened: dict[tuple[str, bytes], SessionRecord] = {}
        self._ids: dict[bytes, str] = {}
        self._skip_until = 0.0
        self.refresher = Refresher(self, provider, refresh_skew, reactor, metrics)

    # -- service -------------------------------------------------------------------------

    def startService(self) -> None:
        """
        Listen for ended sessions on the logout channel (again after every reconnection).
        """
        super().startService()
        subscribed = self.store.subscribe(LOGOUT_CHANNEL, self._ended_elsewhere)
        subscribed.addErrback(self._not_subscribed)

    def stopService(self) -> Deferred[None] | None:
        """
        Stop listening on the logout channel.
        """
        super().stopService()
        done = self.store.unsubscribe(LOGOUT_CHANNEL, self._ended_elsewhere)
        return done.addErrback(lambda _: None)

    def _not_subscribed(self, failure: Failure) -> None:
        failure.trap(StoreError)
        if not self.running:
            return  # stopped before the store could be reached: nothing to listen for
        _log.warn(
            "state store: not yet listening for ended sessions ({reason}); "
            "listening once it is reachable",
            reason=failure.getErrorMessage(),
        )

    def _ended_elsewhere(self, message: bytes) -> None:
        ids = [part.decode("ascii") for part in message.split() if _SESSION_ID.fullmatch(part)]
        self.streams.close(ids)

    # -- the cookie ----------------------------------------------------------------------

    def session_id(self, request: Request) -> str | None:
        """
        The session id the request's cookie carries, or L{None} (an ambiguous cookie is
        none: L{SessionCookie.sealed_value}).
        """
        sealed = self.cookie.sealed_value(request)
        if sealed is None:
            return None
        return self._open_id(sealed)

    def _open_id(self, sealed: bytes) -> str | None:
        ids = self._ids
        session_id = ids.get(sealed)
        if session_id is None:
            opened = self.sealer.unseal(sealed, SESSION_ID_AAD)
            if opened is None or not _SESSION_ID.fullmatch(opened):
                return None
            session_id = opened.decode("ascii")
            # A browser sends the same sealed id with every request: open it once.
            if len(ids) >= MAX_OPENED:
                ids.clear()
            ids[sealed] = session_id
        return session_id

    def _record_aad(self, session_id: str) -> bytes:
        return SESSION_RECORD_AAD + self._prefix + session_id.encode("ascii")

    # -- records -------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """
        The record stored for C{session_id}: L{None} when there is none, it has expired,
        or it does not open (tampered, sealed with another key, copied from another key
        or prefix).

        @raise StoreError: The store cannot be read.
        """
        loaded = await self.load_sealed(session_id)
        return loaded[1] if loaded is not None else None

    async def load_sealed(self, session_id: str) -> tuple[bytes, SessionRecord] | None:
        """
        Like L{load}, with the sealed value as stored (for L{replace}).

        @raise StoreError: The store cannot be read.
        """
        sealed = await self.store.get(session_id.encode("ascii"))
        if sealed is None:
            return None
        opened = self._opened
        # Keyed by the id too: a sealed record only ever opens under its own key, and a
        # cached one must not open under another (a value copied to another session).
        cache_key = (session_id, sealed)
        record = opened.get(cache_key)
        if record is None:
            plaintext = self.sealer.unseal(sealed, self._record_aad(session_id))
            if plaintext is None:
                _log.warn("state store: a session record that does not open was ignored")
                return None
            record = decode_record(plaintext)
            if record is None:
                return None
            # The same sealed value comes back on every request until the record is
            # written again: open it once. Only authentic values get here; records of
            # accounts with many groups or claims are opened each time instead.
            if len(sealed) <= MAX_OPENED_SIZE:
                if len(opened) >= MAX_OPENED:
                    opened.clear()
                opened[cache_key] = record
        if record.expires_at <= self._clock.seconds():
            return None
        return sealed, record

    def _sealed(self, session_id: str, record: SessionRecord) -> bytes:
        return self.sealer.seal(encode_record(record), self._record_aad(session_id)).encode()

    async def replace(self, session_id: str, expected: bytes, record: SessionRecord) -> bool:
        """
        Store C{record} in place of the sealed value C{expected}, in one step (a rotated
        refresh token is written together with its access token), unless the record was
        deleted or changed meanwhile: a session ended while its refresh was under way
        stays ended.

        @return: Whether it was stored.
        @raise StoreError: The store cannot be written.
        """
        ttl = record.expires_at - self._clock.seconds()
        if ttl <= 0:
            return False
        sealed = self._sealed(session_id, record)
        return await self.store.replace(session_id.encode("ascii"), expected, sealed, ttl)

    async def read(
        self,
        request: Request,
        note: Callable[[str, str], object] | None = None,
        optional: bool = False,
    ) -> tuple[str, SessionRecord] | _StoreUnavailable | None:
        """
        The session of C{request}, its access token refreshed first when it is due.

        @param note: Told why a session cookie did not count (for the access log).
        @param optional: The route does not require a login (C{auth: public}): the
            access token is not refreshed (an expired one is not forwarded), and for
            L{SKIP_AFTER_FAILURE} seconds after a read the store did not answer the store
            is not asked at all; it is waited for at most L{OPTIONAL_READ_BUDGET}. The
            request is then served as anonymous rather than wait.
        @return: The session id and record; L{None} without a cookie, for a session that
            does not exist (any more) or for another browser's (fingerprint);
            L{STORE_UNAVAILABLE} when the store cannot be reached (fail closed: the store
            logs why).
        """
        session_id = self.session_id(request)
        if session_id is None:
            return None
        if optional and self._skip_until > self._clock.seconds():
            if note is not None:
                note("auth", "session store unavailable: session not used")
            return STORE_UNAVAILABLE
        try:
            if optional:
                loading = Deferred.fromCoroutine(self.load(session_id))
                budget = min(self.store.timeout, OPTIONAL_READ_BUDGET)
                loading.addTimeout(budget, self._clock)
                try:
                    record = await loading
                except TimeoutError:
                    raise StoreUnavailableError(f"no answer within {budget:g}s") from None
            else:
                record = await self.load(session_id)
        except StoreError:
            self._skip_until = self._clock.seconds() + SKIP_AFTER_FAILURE
            if note is not None:
                note("auth", "session store unavailable: session not used")
            return STORE_UNAVAILABLE
        if record is None:
            return None
        if not hmac.compare_digest(record.fingerprint, self.cookie.fingerprint(request)):
            return None
        if not optional and self.refresher.due(record):
            record = await self.refresher.refreshed(session_id, record)
            if record is None:
                return None
        return session_id, record

    async def create(self, request: Request, record: SessionRecord, idp_subject: str) -> str:
        """
        Store a new session for C{record} and set its cookie on the response.

        @param idp_subject: The id_token's C{sub}: what a back-channel logout names (the
            principal's subject may come from another claim, C{identity.subjectClaim}).
        @return: The new session id.
        @raise SessionTooLargeError: The sealed record is over L{MAX_RECORD}.
        @raise SessionStoreError: The store cannot be written: no session was begun.
        """
        session_id = secrets.token_urlsafe(24)
        ttl = record.expires_at - self._clock.seconds()
        member = session_id.encode("ascii")
        sealed = self._sealed(session_id, record)
        if len(sealed) > MAX_RECORD:
            raise SessionTooLargeError(
                f"the sealed session record is {len(sealed)} bytes, over {MAX_RECORD}"
            )
        try:
            await self.store.set(member, sealed, ttl)
            await self.store.add_to_index(index_key(b"sub", idp_subject), member, ttl)
            if record.idp_session is not None:
                await self.store.add_to_index(index_key(b"idp", record.idp_session), member, ttl)
        except StoreError as e:
            raise SessionStoreError(str(e)) from None
        self.cookie.write_value(request, self.sealer.seal(member, SESSION_ID_AAD), max(0, int(ttl)))
        return session_id

    async def end(self, request: Request) -> None:
        """
        End the request's session: clear the cookie, delete the record, close its
        streams in every process. A store failure is logged; the cookie is cleared
        all the same (the record then lapses with its TTL).
        """
        # Every session id the cookie carries: a tossed one beside the user's own makes
        # the cookie ambiguous (no session to serve), but the logout must still end hers.
        ids = [self._open_id(sealed) for sealed in self.cookie.carried_values(request)]
        self.cookie.clear(request)
        session_ids = [session_id for session_id in ids if session_id is not None]
        if not session_ids:
            return
        try:
            await self.end_sessions(session_ids)
        except StoreError as e:
            _log.warn("logout: the session record could not be deleted ({reason})", reason=e)

    async def end_sessions(self, session_ids: Iterable[str]) -> int:
        """
        Delete these sessions' records, close their streams here and publish their ids
        so that every other process closes theirs.

        @return: How many records existed.
        @raise StoreError: The store cannot be reached.
        """
        ids = sorted(set(session_ids))
        if not ids:
            return 0
        self.streams.close(ids)
        deleted = await self.store.delete(*(i.encode("ascii") for i in ids))
        await self.store.publish(LOGOUT_CHANNEL, " ".join(ids).encode("ascii"))
        return deleted

    async def end_matching(self, idp_session: str | None, subject: str | None) -> int:
        """
        End every session of the IdP session C{idp_session} when given, else every
        session of C{subject} (OIDC Back-Channel Logout 1.0, section 2.7).

        @return: How many session records existed.
        @raise StoreError: The store cannot be reached.
        """
        if idp_session is not None:
            index = index_key(b"idp", idp_session)
        elif subject is not None:
            index = index_key(b"sub", subject)
        else:
            return 0
        members = await self.store.index_members(index)
        ids = [m.decode("ascii") for m in members if _SESSION_ID.fullmatch(m)]
        ended = await self.end_sessions(ids)
        # Only those read: a login that joined the index meanwhile stays in it.
        await self.store.remove_from_index(index, *members)
        return ended

    async def first_use(self, jti: str, lifetime: float) -> bool:
        """
        Whether a logout token's C{jti} is seen for the first time by any gateway sharing
        the store (remembered for C{lifetime} seconds).

        @raise StoreError: The store cannot be reached.
        """
        return await self.store.acquire(_jti_key(jti), b"1", lifetime)

    async def forget_use(self, jti: str) -> None:
        """
        Forget a logout token's C{jti} (its logout could not be carried out: the IdP's
        retry of the same token must not be refused as a replay). Best effort.
        """
        with contextlib.suppress(StoreError):
            await self.store.delete(_jti_key(jti))


def _jti_key(jti: str) -> bytes:
    return b"jti:" + hashlib.sha256(jti.encode("utf-8", "surrogatepass")).hexdigest().encode()
