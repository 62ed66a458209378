"""
Silent refresh of a server-side session's access token.

A request arriving within C{refreshSkew} of the access token's expiry waits while the
token is refreshed with the refresh token, then goes on with the new one. The refresh
happens once per session however many requests ask for it:

  - in one process, the requests of one session share one refresh (single flight);
  - across processes sharing the store, a per-session lock (C{SET NX PX}, released only
    by its owner) lets one of them call the IdP; the others poll the record until the
    new token is there, the lock is gone, or L{WAIT} passes.

The new access token, its expiry and a rotated refresh token are written in one C{SET}.
A refused refresh (C{invalid_grant}) ends the session once the access token has expired;
before that, or when the IdP cannot be reached, the session goes on with what it has (an
expired token is never forwarded) and this process waits L{RETRY_AFTER_FAILURE} before
trying again.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from edgegw.identity.provider import (
    CALL_TIMEOUT,
    IdentityProvider,
    IdPError,
    RefreshRejectedError,
)
from edgegw.identity.session_cookie import SessionRecord
from edgegw.identity.token_response import (
    MAX_REFRESH_TOKEN,
    access_token_expiry,
    latest_id_token,
    usable_token,
)
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.state.store import IStateStore, StoreError

__all__ = ["RETRY_AFTER_FAILURE", "WAIT", "Refresher", "SessionRecords"]

_log = Logger(namespace="edgegw.sessions")

RETRY_AFTER_FAILURE = 10.0
"""Seconds a process leaves a session alone after its refresh failed."""

MAX_BACKOFF = 10_000
"""Sessions whose failed refresh is remembered at once (then the oldest are forgotten)."""

_FIRST_POLL = 0.05
_LAST_POLL = 0.5


def lease_for(store_timeout: float) -> float:
    """
    The refresh lock's lease: longer than the slowest refresh done under it (reading the
    record, the whole IdP call, writing the record), so it never lapses mid-refresh.
    """
    return CALL_TIMEOUT + 3 * store_timeout + 5.0


WAIT = CALL_TIMEOUT + 2.0
"""The longest a request waits for another process's refresh before going on."""


class SessionRecords(Protocol):
    """
    What a refresh reads and writes of the sessions it refreshes: the store (for the
    lock) and the session records in it. L{edgegw.sessions.server.ServerSessions}
    provides it (it hands itself to its L{Refresher}, a call mypy checks).
    """

    @property
    def store(self) -> IStateStore:
        """
        The state store the records and the refresh locks are kept in.
        """

    async def load(self, session_id: str) -> SessionRecord | None:
        """
        The record stored for C{session_id}, or L{None}.

        @raise StoreError: The store cannot be read.
        """

    async def load_sealed(self, session_id: str) -> tuple[bytes, SessionRecord] | None:
        """
        Like L{load}, with the sealed value as stored (for L{replace}).

        @raise StoreError: The store cannot be read.
        """

    async def replace(self, session_id: str, expected: bytes, record: SessionRecord) -> bool:
        """
        Store C{record} in place of the sealed value C{expected}, unless it was deleted
        or changed meanwhile.

        @return: Whether it was stored.
        @raise StoreError: The store cannot be written.
        """

    async def end_sessions(self, session_ids: Iterable[str]) -> int:
        """
        End these sessions everywhere.

        @return: How many records existed.
        @raise StoreError: The store cannot be reached.
        """


@attrs.define
class _Flight:
    """
    One refresh in progress in this process, and the requests waiting for it.
    """

    running: Deferred[SessionRecord | None] | None = None
    waiters: list[Deferred[SessionRecord | None]] = attrs.Factory(list)


class Refresher:
    """
    Refreshes access tokens of server-side sessions, once per session at a time.
    """

    def __init__(
        self,
        sessions: SessionRecords,
        provider: IdentityProvider | None,
        skew: float,
        reactor: IReactorTime,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        self._sessions = sessions
        self._metrics = metrics
        self._provider = provider
        self._skew = skew
        self._clock = reactor
        self._flights: dict[str, _Flight] = {}
        self._failed: dict[str, tuple[float, bool]] = {}
        self.refreshes = 0
        """Refresh grants sent to the IdP by this process (for tests and metrics)."""

    def due(self, record: SessionRecord) -> bool:
        """
        Whether the record's access token should be refreshed now: there is a refresh
        token and the access token expires within the skew.
        """
        expires = record.access_token_expires_at
        return (
            record.refresh_token is not None
            and expires is not None
            and expires - self._clock.seconds() <= self._skew
        )

    def refreshed(self, session_id: str, record: SessionRecord) -> Deferred[SessionRecord | None]:
        """
        The session's record once its access token is refreshed (shared by every caller
        of this session in this process).

        @return: A L{Deferred} of its own for each caller (cancelling it leaves the
            refresh running for the others), firing with the refreshed record, the record
            as it was (refresh failed or left to later) or L{None} (the session ended).
        """
        now = self._clock.seconds()
        failed = self._failed.get(session_id)
        if failed is not None:
            until, refused = failed
            # A refused refresh token keeps the session only until its access token
            # expires: then it is tried once more (and the session ends).
            if until > now and not (refused and not self._still_valid(record)):
                return succeed(record)
            del self._failed[session_id]
        flight = self._flights.get(session_id)
        if flight is None:
            flight = self._flights[session_id] = _Flight()
            running = Deferred.fromCoroutine(self._refresh(session_id, record))
            flight.running = running
            running.addBoth(self._landed, session_id, flight)
        waiter: Deferred[SessionRecord | None] = Deferred()
        flight.waiters.append(waiter)
        return waiter

    def _landed(
        self, result: SessionRecord | Failure | None, session_id: str, flight: _Flight
    ) -> None:
        if self._flights.get(session_id) is flight:
            del self._flights[session_id]
        if isinstance(result, Failure):
            _log.failure("refresh of a session failed", failure=result)
            result = None
        for waiter in flight.waiters:
            if not waiter.called:
                waiter.callback(result)

    def _remember_failure(self, session_id: str, refused: bool = False) -> None:
        failed = self._failed
        if len(failed) >= MAX_BACKOFF:
            failed.clear()
        failed[session_id] = (self._clock.seconds() + RETRY_AFTER_FAILURE, refused)

    def _still_valid(self, record: SessionRecord) -> bool:
        expires = record.access_token_expires_at
        return expires is not None and expires > self._clock.seconds()

    async def _refresh(self, session_id: str, record: SessionRecord) -> SessionRecord | None:
        store = self._sessions.store
        lock = b"lock:" + session_id.encode("ascii")
        owner = secrets.token_bytes(16)
        try:
            taken = await store.acquire(lock, owner, lease_for(store.timeout))
        except StoreError:
            # The read just worked; the lock did not. Go on with what the session has.
            self._remember_failure(session_id)
            return record
        if not taken:
            return await self._wait_for_other(session_id, record, lock)
        try:
            return await self._refresh_locked(session_id, record)
        finally:
            with contextlib.suppress(StoreError):  # the lease lets it lapse
                await store.release(lock, owner)

    async def _refresh_locked(self, session_id: str, record: SessionRecord) -> SessionRecord | None:
        sessions = self._sessions
        try:
            # Under the lock: another process may have refreshed since this one read.
            loaded = await sessions.load_sealed(session_id)
        except StoreError:
            self._remember_failure(session_id)
            return record
        if loaded is None:
            return None
        sealed, current = loaded
        if not self.due(current):
            return current
        provider = self._provider
        metadata = provider.metadata if provider is not None else None
        refresh_token = current.refresh_token
        if provider is None or metadata is None or refresh_token is None:
            self._remember_failure(session_id)
            return current
        self.refreshes += 1
        try:
            tokens = await provider.refresh(metadata, refresh_token)
        except RefreshRejectedError as e:
            self._metrics.refresh("refused")
            if self._still_valid(current):
                self._remember_failure(session_id, refused=True)
                _log.info(
                    "refresh refused for a session of {subject}; it lasts until its "
                    "access token expires ({reason})",
                    subject=current.subject,
                    reason=e,
                )
                return current
            _log.info(
                "session of {subject} ended: its refresh token was refused ({reason})",
                subject=current.subject,
                reason=e,
            )
            try:
                await sessions.end_sessions([session_id])
            except StoreError as store_error:
                _log.warn("the ended session could not be deleted ({reason})", reason=store_error)
            return None
        except IdPError as e:
            self._metrics.refresh("idp_error")
            _log.warn(
                "refresh failed for a session of {subject}; retrying in {retry:g}s ({reason})",
                subject=current.subject,
                retry=RETRY_AFTER_FAILURE,
                reason=e,
            )
            self._remember_failure(session_id)
            return current
        now = int(self._clock.seconds())
        access_token = tokens.get("access_token")
        if not usable_token(access_token):
            self._metrics.refresh("unusable_token")
            _log.warn("refresh answered an access token that cannot be sent as a header")
            self._remember_failure(session_id)
            return current
        assert isinstance(access_token, str)
        rotated = tokens.get("refresh_token")
        fresh = attrs.evolve(
            current,
            access_token=access_token,
            access_token_expires_at=access_token_expiry(now, tokens.get("expires_in")),
            refresh_token=(
                rotated if usable_token(rotated, MAX_REFRESH_TOKEN) else current.refresh_token
            ),
            id_token=latest_id_token(tokens, current.id_token),
        )
        try:
            stored = await sessions.replace(session_id, sealed, fresh)
        except StoreError as e:
            # This request has a valid token; the next read gets the old record and,
            # with a rotating IdP, a refresh token already spent.
            self._metrics.refresh("not_stored")
            _log.warn("a refreshed session could not be stored ({reason})", reason=e)
            return fresh
        self._metrics.refresh("ok")
        if not stored:
            # Ended (a logout, a back-channel logout) while the IdP answered: it stays
            # ended, and this request goes on without it. (Or written by another
            # process, had the lease lapsed: that record is the one to use.)
            try:
                return await sessions.load(session_id)
            except StoreError:
                return None
        return fresh

    async def _wait_for_other(
        self, session_id: str, record: SessionRecord, lock: bytes
    ) -> SessionRecord | None:
        """
        Another process holds the lock: poll until its new token is stored, the lock is
        released without one (it failed), or L{WAIT} passes.
        """
        sessions = self._sessions
        deadline = self._clock.seconds() + WAIT
        delay = _FIRST_POLL
        while True:
            await deferLater(self._clock, delay)
            delay = min(delay * 2, _LAST_POLL)
            try:
                current = await sessions.load(session_id)
                if current is None:
                    return None
                if current.access_token != record.access_token or not self.due(current):
                    return current
                held = await sessions.store.get(lock)
                if held is None:
                    # Released: by a refresh stored just now, or by one that failed.
                    current = await sessions.load(session_id)
                    if current is None:
                        return None
                    if current.access_token != record.access_token:
                        return current
            except StoreError:
                self._remember_failure(session_id)
                return record
            if held is None or self._clock.seconds() >= deadline:
                self._remember_failure(session_id)
                return current
