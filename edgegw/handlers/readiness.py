"""
The readiness endpoint (C{Gateway.spec.readiness}): 200 only while this instance can
serve what it is configured for — it listens and is not draining, its IdP's discovery
document and key set are loaded (with an IdP), and its state store answers (with a
state provider) — else 503 with the reasons, so that a load balancer stops sending it
logins it cannot serve. The health handler keeps meaning "the process is alive".

The state store is asked (one read, bounded by its own timeout and one second more) at
most once a second, whoever asks and however often: the endpoint is public, and must
not become a way to load Redis. The read is not counted in the state-store metrics
(load-balancer probes would swamp the sessions' own operations).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from twisted.internet.defer import Deferred, TimeoutError
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.identity.provider import IdentityProvider
from edgegw.state.store import IStateStore, StoreError
from edgegw.stream.boundary import client_gone
from edgegw.terminal.answers import write_text

_log = Logger(namespace="edgegw.readiness")

__all__ = ["PROBE_KEY", "STORE_CHECK_INTERVAL", "Readiness", "ReadinessResource"]

STORE_CHECK_INTERVAL = 1.0
"""Seconds a state-store check's answer is reused."""

PROBE_KEY = b"readiness-probe"
"""The key read to check the state store (under its key prefix; never written)."""


@attrs.define
class Readiness:
    """
    What the service tree tells the endpoint: whether the gateway listens, and whether
    it drains (stopping, or replaced by a reload).
    """

    listening: bool = False
    draining: bool = False


class ReadinessResource(Resource):
    """
    C{GET} (or C{HEAD}): C{200 {"status":"ready"}}, or C{503 {"status":"not ready",
    "reasons":[...]}}.
    """

    isLeaf = True
    method = b"GET"

    def __init__(
        self,
        state: Readiness,
        reactor: Any,
        idp: IdentityProvider | None = None,
        store: IStateStore | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.reactor = reactor
        self.idp = idp
        self.store = store
        self._store_ok: bool | None = None
        self._store_checked = float("-inf")
        self._checking: list[Deferred[bool]] | None = None

    def render(self, request: Request) -> bytes | int:
        """
        Answer C{GET} and C{HEAD}; any other method gets 405.
        """
        if request.method not in (b"GET", b"HEAD"):
            write_text(
                request,
                405,
                b"method not allowed\n",
                ((b"Allow", b"GET, HEAD"), (b"Cache-Control", b"no-store")),
            )
            return b""
        reasons = self._reasons()
        if self.store is None:
            self._answer(request, reasons)
            return NOT_DONE_YET
        checked = self._store_reachable()
        checked.addCallback(
            lambda ok: self._answer(
                request, reasons if ok else [*reasons, "the state store cannot be reached"]
            )
        )
        return NOT_DONE_YET

    def _reasons(self) -> list[str]:
        reasons = []
        if not self.state.listening:
            reasons.append("not listening yet")
        if self.state.draining:
            reasons.append("draining")
        idp = self.idp
        if idp is not None:
            if not idp.ready:
                reasons.append("the IdP's discovery document is not loaded")
            elif not len(idp.id_token_keys.keys) or not len(idp.access_token_keys.keys):
                reasons.append("the IdP's key set is not loaded")
        return reasons

    def _store_reachable(self) -> Deferred[bool]:
        waiter: Deferred[bool] = Deferred()
        now = self.reactor.seconds()
        if self._store_ok is not None and now - self._store_checked < STORE_CHECK_INTERVAL:
            waiter.callback(self._store_ok)
            return waiter
        if self._checking is not None:
            self._checking.append(waiter)
            return waiter
        self._checking = [waiter]
        assert self.store is not None
        asked: Deferred[Any] = self.store.get(PROBE_KEY)
        # Stores bound every operation by their timeout; one that does not must still
        # not hold every probe (and a growing list of them) for ever.
        asked.addTimeout(self.store.timeout + 1, self.reactor)
        asked.addCallbacks(lambda _: True, self._unreachable).addCallback(self._checked)
        return waiter

    def _unreachable(self, failure: Any) -> bool:
        if failure.check(TimeoutError):
            _log.warn("readiness: the state store did not answer within its timeout")
        elif not failure.check(StoreError):
            _log.failure("readiness: the state-store check failed unexpectedly", failure)
        return False

    def _checked(self, ok: bool) -> None:
        self._store_ok = ok
        self._store_checked = self.reactor.seconds()
        waiters, self._checking = self._checking or [], None
        for waiter in waiters:
            waiter.callback(ok)

    def _answer(self, request: Request, reasons: list[str]) -> None:
        if client_gone(request) or request.finished:
            return
        body: dict[str, Any] = {"status": "ready"}
        if reasons:
            body = {"status": "not ready", "reasons": reasons}
        request.setResponseCode(503 if reasons else 200)
        data = json.dumps(body, separators=(",", ":")).encode()
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Cache-Control", b"no-store")
        request.setHeader(b"Content-Length", b"%d" % len(data))
        if request.method != b"HEAD":
            request.write(data)
        request.finish()
