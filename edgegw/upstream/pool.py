"""
The pool of upstream connections: idle keep-alive ones kept for reuse, a bound per
upstream and the queue of requests waiting behind it, one retry on a stale connection.
Where an upstream is and how a connection to it is made is L{edgegw.upstream.upstreams}.

Pool policy: idle connections are kept per L{Upstream}, most recently used first
(LIFO keeps a few connections warm and lets the rest reach the idle timeout), at most
C{max_idle_per_upstream} of them; one timer sweeps those idle for longer than
C{idle_timeout}. A request that finds no idle connection opens a new one, unless its
upstream already has C{max_connections_per_upstream} connections (connecting, busy or
idle): then it waits in that upstream's queue, first come first served, until one is
idle or closes, for at most its queue timeout (the route's timeout, or the client's
C{queue_timeout}); past it the request fails with L{UpstreamUnavailableError}, which
the handlers answer 503.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Final, cast

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults
from twisted.internet.error import ConnectingCancelledError, ConnectionAborted, ConnectionClosed
from twisted.internet.interfaces import IDelayedCall, IProtocol, IStreamClientEndpoint
from twisted.internet.protocol import Factory, connectionDone
from twisted.internet.ssl import Certificate
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer

from edgegw.seam import IOpenSSLTrustRoot
from edgegw.upstream.http11 import UpstreamConnection
from edgegw.upstream.request_encoding import encode_request
from edgegw.upstream.response import UpstreamResponse
from edgegw.upstream.upstreams import Upstream, upstream_endpoint

__all__ = ["UpstreamClient", "UpstreamUnavailableError"]

# Methods a client may repeat without changing the outcome (RFC 9110 section 9.2.2);
# PUT and DELETE only qualify here because retries are limited to bodiless requests.
_RETRYABLE: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
# Slack when comparing idle deadlines, so that a sweep scheduled for exactly the
# deadline is not defeated by float rounding.
_SWEEP_SLACK: Final = 0.001
# Seconds between two log lines about requests answered 503 for want of a connection.
_BUSY_LOG_INTERVAL: Final = 10.0


class UpstreamUnavailableError(Exception):
    """
    No connection to the upstream could be had: the request waited its whole queue
    timeout behind C{maxConnectionsPerUpstream}, or the pool stopped while it waited.
    Nothing was sent; the handlers answer it 503 (the api: a failed call).
    """


class _PooledConnection(UpstreamConnection):
    """
    A connection the pool counts against its upstream's bound until it closes, whatever
    it was doing (an idle connection's close is all L{UpstreamConnection} reports).
    """

    _closed_hook: Callable[[], None] | None = None

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        UpstreamConnection.connectionLost(self, reason)
        hook = self._closed_hook
        if hook is not None:
            self._closed_hook = None
            hook()


class _Waiter:
    """
    A request waiting in an upstream's queue for a connection.
    """

    __slots__ = (
        "body",
        "deferred",
        "head",
        "head_request",
        "inner",
        "length",
        "queued_in",
        "rehead",
        "retryable",
        "timer",
        "upgrade",
        "upstream",
    )

    def __init__(
        self,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
        body: IBodyProducer | None,
        length: int | None,
        upgrade: bool,
        retryable: bool,
        rehead: Callable[[], bytes] | None = None,
    ) -> None:
        self.upstream = upstream
        self.rehead = rehead
        self.head = head
        self.head_request = head_request
        self.body = body
        self.length = length
        self.upgrade = upgrade
        self.retryable = retryable
        self.deferred: Deferred[UpstreamResponse] = Deferred(self._cancelled)
        self.timer: IDelayedCall | None = None
        # Once dispatched: what the request now waits on.
        self.inner: Deferred[UpstreamResponse] | None = None
        self.queued_in: UpstreamClient | None = None

    def _cancelled(self, d: Deferred[UpstreamResponse]) -> None:
        inner = self.inner
        if inner is not None:
            inner.cancel()
        elif self.queued_in is not None:
            self.queued_in._dequeue(self)


class _ConnectionFactory(Factory):
    """
    Builds the connections of one upstream, wired to its pool.
    """

    noisy = False

    def __init__(
        self,
        on_idle: Callable[[UpstreamConnection], None],
        on_lost: Callable[[UpstreamConnection], None],
    ) -> None:
        self._on_idle = on_idle
        self._on_lost = on_lost

    def buildProtocol(self, addr: Any) -> UpstreamConnection:
        return _PooledConnection(self._on_idle, self._on_lost)


@attrs.frozen
class _Connector:
    endpoint: IStreamClientEndpoint
    factory: _ConnectionFactory


def _send(
    protocol: IProtocol,
    head: bytes,
    head_request: bool,
    body: IBodyProducer | None,
    length: int | None,
    upgrade: bool,
) -> Deferred[UpstreamResponse]:
    connection = cast(UpstreamConnection, protocol)
    return connection.send(head, head_request, body, length, upgrade)


def _forward(result: UpstreamResponse | Failure, waiter: _Waiter) -> None:
    waiter.inner = None
    d = waiter.deferred
    if d.called:
        # Cancelled, and the cancellation did not reach what it waited on in time.
        if isinstance(result, UpstreamResponse):
            result.abort()
        return
    if isinstance(result, Failure):
        d.errback(result)
    else:
        d.callback(result)


def _connect_cancelled(reason: Failure) -> Failure:
    # An endpoint cancelled while connecting fails with ConnectingCancelledError: to the
    # caller that cancelled (a deadline, a client gone) it is a cancellation like any
    # other, which addTimeout turns into a timeout.
    if reason.check(ConnectingCancelledError):
        return Failure(CancelledError())
    return reason


def _unavailable(waiter: _Waiter) -> UpstreamUnavailableError:
    authority = waiter.upstream.authority.decode("ascii", "replace")
    return UpstreamUnavailableError(f"no connection to {authority} could be had")


class UpstreamClient:
    """
    The gateway's HTTP/1.1 client for upstreams, with a persistent connection pool.

    @param reactor: Provides L{IReactorTCP}, L{IReactorTime} and (for host names)
        L{IReactorPluggableNameResolver}.
    @param max_idle_per_upstream: The most idle connections kept per upstream.
    @param idle_timeout: Seconds an idle connection is kept.
    @param connect_timeout: Seconds a TCP connection attempt may take.
    @param tls_trust_root: What verified https upstreams' certificates must chain to
        (a L{Certificate}, or e.g. L{twisted.internet.ssl.trustRootFromCertificates});
        the platform's trust store by default. Tests inject their own CA here.
    @param max_connections_per_upstream: The most connections to one upstream,
        connecting, busy or idle (0: no bound). A request beyond it waits in its
        upstream's queue until a connection is idle or closes.
    @param queue_timeout: The longest wait there, for callers that give none (see
        L{with_queue_timeout}); past it the request fails with L{UpstreamUnavailableError}.

    @ivar unavailable: How many requests failed for want of a connection.
    """

    log = Logger(namespace="edgegw.upstream")

    def __init__(
        self,
        reactor: Any,
        *,
        max_idle_per_upstream: int = 128,
        idle_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        tls_trust_root: IOpenSSLTrustRoot | Certificate | None = None,
        max_connections_per_upstream: int = 0,
        queue_timeout: float = 60.0,
    ) -> None:
        self._reactor = reactor
        self._max_idle = max_idle_per_upstream
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self._trust_root = tls_trust_root
        self._idle: dict[Upstream, list[UpstreamConnection]] = {}
        self._connectors: dict[Upstream, _Connector] = {}
        self._sweep: IDelayedCall | None = None
        self._closed = False
        self._max_open = max_connections_per_upstream
        self._queue_timeout = queue_timeout
        self._open: dict[Upstream, int] = {}
        self._queues: dict[Upstream, deque[_Waiter]] = {}
        self._queued = 0
        self._dispatching: IDelayedCall | None = None
        self.unavailable = 0
        self._unlogged_unavailable = 0
        self._next_log = 0.0

    def with_queue_timeout(self, seconds: float | None) -> UpstreamClient:
        """
        This pool, for a caller whose requests wait at most C{seconds} for a connection
        (a route's timeout); this very client when C{seconds} is L{None}.
        """
        if seconds is None:
            return self
        return _QueueTimeoutClient(self, seconds)

    def queued(self, upstream: Upstream) -> int:
        """
        How many requests wait for a connection to C{upstream}.
        """
        return len(self._queues.get(upstream, ()))

    def open_connections(self, upstream: Upstream) -> int:
        """
        How many connections to C{upstream} are connecting, busy or idle.
        """
        return self._open.get(upstream, 0)

    def request(
        self,
        upstream: Upstream,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: IBodyProducer | None = None,
        *,
        upgrade: bool = False,
        queue_timeout: float | None = None,
        refresh: Callable[[], list[tuple[bytes, bytes]]] | None = None,
    ) -> Deferred[UpstreamResponse]:
        """
        Send a request upstream, on an idle pooled connection when there is one.

        @param method: The request method.
        @param target: The request-target (origin form: path and query).
        @param headers: Exactly the header fields to send, in order: C{Host} included,
            hop-by-hop fields, C{Content-Length} and C{Transfer-Encoding} left out. The
            client adds the body framing: C{Content-Length} when C{body.length} is an
            integer, C{Transfer-Encoding: chunked} when it is C{UNKNOWN_LENGTH},
            nothing when C{body} is L{None}.
        @param body: Streamed with C{body.startProducing}; paused while the socket's
            send buffer is full.
        @param upgrade: The headers ask for a protocol upgrade: use a fresh connection,
            never pooled afterwards; a 101 response can then be
            L{detached<UpstreamResponse.detach>}.
        @param queue_timeout: The longest wait for a connection when the upstream has
            as many as it may (the client's own by default).
        @param refresh: Gives the header fields afresh for a retry (a header that must
            differ on every attempt, such as an identity assertion's token id); the
            retry resends C{headers} as they were without it.

        @return: Fires with the response once its head has arrived. Fails with the
            original failure (refused, DNS, TLS verification, L{UpstreamProtocolError},
            the connection closing before a complete head). Cancelling it aborts the
            connection. A bodiless request with an idempotent method that finds its
            pooled connection closed by the server before any response byte is retried
            once on a fresh connection. A request that waited its whole queue timeout
            fails with L{UpstreamUnavailableError} (nothing was sent).
        """
        try:
            head, length = encode_request(method, target, headers, body)
        except ValueError:
            return fail()
        head_request = method == b"HEAD"
        retryable = body is None and method in _RETRYABLE
        rehead = None
        if retryable and refresh is not None:

            def rehead() -> bytes:
                return encode_request(method, target, refresh(), None)[0]

        if self._queued and self._queues.get(upstream):
            # Others wait already: no overtaking them for a connection just freed.
            return self._enqueue(
                _Waiter(upstream, head, head_request, body, length, upgrade, retryable, rehead),
                queue_timeout,
            )
        if not upgrade:
            idle = self._idle.get(upstream)
            if idle:
                return self._send_pooled(
                    idle.pop(), upstream, head, head_request, body, length, retryable, rehead
                )
        limit = self._max_open
        if limit and self._open.get(upstream, 0) >= limit:
            return self._enqueue(
                _Waiter(upstream, head, head_request, body, length, upgrade, retryable, rehead),
                queue_timeout,
            )
        return self._connect(upstream, head, head_request, body, length, upgrade)

    def close(self) -> Deferred[None]:
        """
        Close every idle pooled connection; exchanges in flight finish, and their
        connections are then closed instead of kept (the pool is shutting down: nothing
        may be left holding a socket or a timer).

        @return: Fires once the idle connections are closed.
        """
        self._closed = True
        if self._sweep is not None:
            if self._sweep.active():
                self._sweep.cancel()
            self._sweep = None
        if self._dispatching is not None:
            self._dispatching.cancel()
            self._dispatching = None
        # Requests still waiting for a connection will not get one.
        for queue in list(self._queues.values()):
            while queue:
                waiter = queue[0]
                self._dequeue(waiter)
                waiter.deferred.errback(_unavailable(waiter))
        closing: list[Deferred[None]] = []
        for idle in self._idle.values():
            connections = idle[:]
            idle.clear()
            closing.extend(connection.close() for connection in connections)
        return gatherResults(closing).addCallback(lambda ignored: None)

    def idle_connections(self, upstream: Upstream) -> int:
        """
        How many idle connections the pool holds for C{upstream}.
        """
        return len(self._idle.get(upstream, ()))

    def pool_state(self) -> list[tuple[str, int, int, int]]:
        """
        For each upstream the pool has met: its origin (scheme://host:port), its idle
        and active (connecting or busy) connections, and the requests waiting for one.
        """
        state = []
        for upstream in {*self._open, *self._idle, *self._queues}:
            idle = len(self._idle.get(upstream, ()))
            active = max(0, self._open.get(upstream, 0) - idle)
            origin = f"{upstream.scheme}://{upstream.authority.decode('ascii', 'replace')}"
            state.append((origin, idle, active, len(self._queues.get(upstream, ()))))
        return state

    # -- connecting --------------------------------------------------------------------

    def _send_pooled(
        self,
        connection: UpstreamConnection,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
        body: IBodyProducer | None,
        length: int | None,
        retryable: bool,
        rehead: Callable[[], bytes] | None = None,
    ) -> Deferred[UpstreamResponse]:
        d = connection.send(head, head_request, body, length, False)
        if retryable:
            d.addErrback(self._retry_stale, connection, upstream, head, head_request, rehead)
        if body is None:
            # The whole request is written: to the upstream now, while the rest of this
            # event's work runs (a connection found closed fails d at the end of the
            # iteration, retried above).
            connection.send_now()
        return d

    def _connect(
        self,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
        body: IBodyProducer | None,
        length: int | None,
        upgrade: bool,
    ) -> Deferred[UpstreamResponse]:
        connector = self._connectors.get(upstream)
        if connector is None:
            connector = self._connectors[upstream] = self._connector(upstream)
        # Counted from now: a connection being opened is one of the upstream's.
        self._open[upstream] = self._open.get(upstream, 0) + 1
        connecting: Deferred[IProtocol] = connector.endpoint.connect(connector.factory)
        connecting.addCallbacks(
            self._connected,
            self._not_connected,
            callbackArgs=(upstream,),
            errbackArgs=(upstream,),
        )
        return connecting.addCallback(_send, head, head_request, body, length, upgrade)

    def _connected(self, protocol: IProtocol, upstream: Upstream) -> IProtocol:
        cast(_PooledConnection, protocol)._closed_hook = partial(self._closed_one, upstream)
        return protocol

    def _not_connected(self, reason: Failure, upstream: Upstream) -> Failure:
        self._closed_one(upstream)
        return _connect_cancelled(reason)

    def _connector(self, upstream: Upstream) -> _Connector:
        endpoint = upstream_endpoint(
            self._reactor, upstream, self._connect_timeout, self._trust_root
        )
        factory = _ConnectionFactory(
            partial(self._release, upstream), partial(self._forget, upstream)
        )
        return _Connector(endpoint, factory)

    def _retry_stale(
        self,
        reason: Failure,
        connection: UpstreamConnection,
        upstream: Upstream,
        head: bytes,
        head_request: bool,
        rehead: Callable[[], bytes] | None = None,
    ) -> Deferred[UpstreamResponse] | Failure:
        # The server closed a kept-alive connection as we reused it (the request and
        # its FIN crossed): nothing was processed, so one retry on a fresh connection
        # is safe for a repeatable request.
        if (
            connection.response_started
            or not reason.check(ConnectionClosed)
            or reason.check(ConnectionAborted, CancelledError)
        ):
            return reason
        if rehead is not None:
            try:
                head = rehead()
            except ValueError:
                return reason
        limit = self._max_open
        # The stale connection is still counted until its close is processed: wait for
        # it at the head of the queue rather than go over the bound.
        if limit and self._open.get(upstream, 0) >= limit:
            return self._enqueue(
                _Waiter(upstream, head, head_request, None, None, False, False), None, first=True
            )
        return self._connect(upstream, head, head_request, None, None, False)

    # -- the pool ----------------------------------------------------------------------

    def _release(self, upstream: Upstream, connection: UpstreamConnection) -> None:
        if self._closed:
            connection.close()
            return
        idle = self._idle.get(upstream)
        if idle is None:
            idle = self._idle[upstream] = []
        waiting = self._queued and self._queues.get(upstream)
        if waiting:
            # Kept for the first request waiting (not here and now: the connection is
            # still inside the exchange that just ended).
            self._schedule_dispatch()
        elif len(idle) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = self._reactor.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._reactor.callLater(self._idle_timeout, self._expire)

    def _forget(self, upstream: Upstream, connection: UpstreamConnection) -> None:
        idle = self._idle.get(upstream)
        if idle:
            with contextlib.suppress(ValueError):
                idle.remove(connection)

    # -- the bound and its queues ------------------------------------------------------

    def _closed_one(self, upstream: Upstream) -> None:
        """
        One of C{upstream}'s connections closed, or failed to open: room for another.
        """
        left = self._open.get(upstream, 0) - 1
        if left > 0:
            self._open[upstream] = left
        else:
            self._open.pop(upstream, None)
        if self._queued and self._queues.get(upstream):
            self._schedule_dispatch()

    def _enqueue(
        self, waiter: _Waiter, queue_timeout: float | None, first: bool = False
    ) -> Deferred[UpstreamResponse]:
        if self._closed:
            return fail(_unavailable(waiter))
        queue = self._queues.get(waiter.upstream)
        if queue is None:
            queue = self._queues[waiter.upstream] = deque()
        if first:
            queue.appendleft(waiter)
        else:
            queue.append(waiter)
        self._queued += 1
        waiter.queued_in = self
        timeout = self._queue_timeout if queue_timeout is None else queue_timeout
        waiter.timer = self._reactor.callLater(timeout, self._waited_too_long, waiter)
        if waiter.upgrade and self._idle.get(waiter.upstream):
            # Nothing else may free a connection: an idle one is closed to make room.
            self._schedule_dispatch()
        return waiter.deferred

    def _dequeue(self, waiter: _Waiter) -> None:
        """
        Take C{waiter} out of its queue (it is served, cancelled or answered 503).
        """
        queue = self._queues.get(waiter.upstream)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
                self._queued -= 1
            if not queue:
                del self._queues[waiter.upstream]
        waiter.queued_in = None
        timer = waiter.timer
        waiter.timer = None
        if timer is not None and timer.active():
            timer.cancel()

    def _waited_too_long(self, waiter: _Waiter) -> None:
        waiter.timer = None
        self._dequeue(waiter)
        self.unavailable += 1
        self._unlogged_unavailable += 1
        now = self._reactor.seconds()
        if now >= self._next_log:
            self._next_log = now + _BUSY_LOG_INTERVAL
            self.log.warn(
                "{count} request(s) answered 503 after waiting their queue timeout for a"
                " connection (limits.maxConnectionsPerUpstream: {limit}) since the last"
                " report; the last for {upstream}",
                count=self._unlogged_unavailable,
                limit=self._max_open,
                upstream=waiter.upstream.authority.decode("ascii", "replace"),
            )
            self._unlogged_unavailable = 0
        waiter.deferred.errback(_unavailable(waiter))

    def _schedule_dispatch(self) -> None:
        if self._dispatching is None:
            self._dispatching = self._reactor.callLater(0, self._dispatch)

    def _dispatch(self) -> None:
        """
        Give the requests waiting what has freed up: idle connections first, then room
        for new ones.
        """
        self._dispatching = None
        limit = self._max_open
        for upstream, queue in list(self._queues.items()):
            idle = self._idle.get(upstream)
            while queue:
                waiter = queue[0]
                if not waiter.upgrade and idle:
                    self._dequeue(waiter)
                    self._serve(
                        waiter,
                        self._send_pooled(
                            idle.pop(),
                            upstream,
                            waiter.head,
                            waiter.head_request,
                            waiter.body,
                            waiter.length,
                            waiter.retryable,
                            waiter.rehead,
                        ),
                    )
                elif not limit or self._open.get(upstream, 0) < limit:
                    self._dequeue(waiter)
                    self._serve(
                        waiter,
                        self._connect(
                            upstream,
                            waiter.head,
                            waiter.head_request,
                            waiter.body,
                            waiter.length,
                            waiter.upgrade,
                        ),
                    )
                else:
                    if waiter.upgrade and idle:
                        # An upgrade needs a fresh connection: make room for it (its close
                        # brings us back here).
                        idle.pop(0).close()
                    break

    def _serve(self, waiter: _Waiter, inner: Deferred[UpstreamResponse]) -> None:
        waiter.inner = inner
        inner.addBoth(_forward, waiter)

    def _expire(self) -> None:
        self._sweep = None
        now = self._reactor.seconds()
        cutoff = now - self._idle_timeout + _SWEEP_SLACK
        earliest: float | None = None
        for idle in self._idle.values():
            # Each list is in release order, so the expired ones are a prefix.
            count = 0
            for connection in idle:
                if connection.idle_since > cutoff:
                    break
                count += 1
            if count:
                expired = idle[:count]
                del idle[:count]
                for connection in expired:
                    connection.close()
            if idle and (earliest is None or idle[0].idle_since < earliest):
                earliest = idle[0].idle_since
        if earliest is not None:
            delay = max(0.0, earliest + self._idle_timeout - now)
            self._sweep = self._reactor.callLater(delay, self._expire)


class _QueueTimeoutClient(UpstreamClient):
    """
    A client's pool seen by a caller with a queue timeout of its own (a route's): its
    requests go to the same pool and wait at most that long for a connection.
    """

    def __init__(self, pool: UpstreamClient, seconds: float) -> None:
        # The pool's state stays the pool's: nothing of UpstreamClient.__init__ here.
        self._pool = pool
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def request(
        self,
        upstream: Upstream,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: IBodyProducer | None = None,
        *,
        upgrade: bool = False,
        queue_timeout: float | None = None,
        refresh: Callable[[], list[tuple[bytes, bytes]]] | None = None,
    ) -> Deferred[UpstreamResponse]:
        return self._pool.request(
            upstream,
            method,
            target,
            headers,
            body,
            upgrade=upgrade,
            queue_timeout=self._seconds if queue_timeout is None else queue_timeout,
            refresh=refresh,
        )

    def close(self) -> Deferred[None]:
        return self._pool.close()

    def with_queue_timeout(self, seconds: float | None) -> UpstreamClient:
        return self._pool.with_queue_timeout(seconds)

    def queued(self, upstream: Upstream) -> int:
        return self._pool.queued(upstream)

    def open_connections(self, upstream: Upstream) -> int:
        return self._pool.open_connections(upstream)

    def idle_connections(self, upstream: Upstream) -> int:
        return self._pool.idle_connections(upstream)

    def pool_state(self) -> list[tuple[str, int, int, int]]:
        return self._pool.pool_state()
