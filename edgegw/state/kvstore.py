"""
The shipped C{kvstore} state provider: Redis through txredisapi.

L{KvStoreService} is both the store (L{IStateStore}) and the gateway's child service
C{state}: it starts connecting when the service starts (the gateway does not wait for
it), keeps one connection for commands and, from the first subscription on, a second for
pub/sub, and closes both when the service stops -- unless a reload's new store took them
over (L{KvStoreService.take_over}: nothing in the store's settings changed), which then
uses the same connections and subscriptions, and closes them when it stops.

Connections are txredisapi factories connected through an endpoint built here: a
L{HostnameEndpoint} on the gateway's reactor, wrapped in TLS from Twisted's
C{optionsForClientTLS} when C{tls} is set, so the server's certificate is verified
against the platform's trust store (or a given trust root) and its host name or IP
address; txredisapi's own C{ssl_context_factory=True} checks no certificate and is never
used. When Redis goes away, txredisapi's pool slots (Twisted C{ClientService}) reconnect
with capped exponential backoff; meanwhile every operation fails at once with
L{StoreUnavailableError} instead of waiting in txredisapi's queue for a connection, and
one that is under way fails when the configured timeout passes.

With C{sentinels} instead of C{address}, both connections connect through a
L{SentinelEndpoint}: the master is asked of the Sentinels at each (re)connection, so a
failover is followed by reconnecting; a C{READONLY} answer (a master demoted to a
replica under a live connection) drops the connection for that.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import txredisapi  # type: ignore[import-untyped]
from twisted.application.service import Service
from twisted.internet import error as internet_error
from twisted.internet.defer import (
    Deferred,
    TimeoutError,
    fail,
    gatherResults,
    succeed,
)
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.internet.ssl import Certificate, trustRootFromCertificates
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import classImplements, implementer

from edgegw.config.errors import ConfigError, Location, Problem, Problems
from edgegw.config.fields import Node
from edgegw.config.model import KvStoreConfig
from edgegw.config.state import read_kvstore
from edgegw.seam import IOpenSSLTrustRoot, LeanRedisCommands, WholeRedisReplies
from edgegw.state.providers import IStateProviderFactory
from edgegw.state.sentinels import SentinelEndpoint, redis_endpoint, split_address
from edgegw.state.store import (
    IScriptingStore,
    IStateStore,
    MessageCallback,
    StoreError,
    StoreUnavailableError,
)

__all__ = [
    "KvStoreProvider",
    "KvStoreService",
    "load_trust_root",
    "provider",
    "read_kvstore_config",
]

_log = Logger(namespace="edgegw.state")
_T = TypeVar("_T")

# Deletes the lock only while it still holds this owner's token: a lock whose lease
# lapsed and that another owner took since is left alone.
_RELEASE = b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# Sets the key only while it still holds the value read before (compare and set).
_REPLACE = b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
end
return 0
"""

# Adds the member and extends the set's life to at least the given milliseconds, never
# shortens it: the index lives as long as the longest-lived session it lists.
_INDEX_ADD = b"""
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

SENTINEL_RETRY_CAP = 1.0
"""With sentinels, the most seconds between two attempts to find and connect to the
master."""

# What a lost, refused or timed-out connection looks like once it reaches an operation.
# (A CancelledError is the caller's own, say a client that left: passed through as it
# is, never logged as Redis failing. The store's own timeout arrives as TimeoutError.)
_UNAVAILABLE = (
    txredisapi.ConnectionError,
    TimeoutError,
    internet_error.ConnectError,
    internet_error.ConnectionLost,
    internet_error.ConnectionDone,
)


def read_kvstore_config(node: Node) -> KvStoreConfig:
    """
    Read C{kvstore}'s C{config} mapping, reporting problems on C{node}'s collector: the
    one parser the Gateway's C{stateProvider.config} uses too.
    """
    return read_kvstore(node)


class _Throttle:
    """
    Logs a failure at most once per interval, saying how many were left unlogged.
    """

    def __init__(self, reactor: IReactorTime, interval: float) -> None:
        self._reactor = reactor
        self.interval = interval
        self._last: float | None = None
        self._suppressed = 0

    def failure(self, message: str) -> None:
        now = self._reactor.seconds()
        if self._last is not None and now - self._last < self.interval:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more failures since)" if self._suppressed else ""
        _log.warn("state store: {reason}{more}", reason=message, more=more)
        self._last = now
        self._suppressed = 0

    def recovered(self, message: str) -> None:
        """
        Log C{message} (at info), and log the next failure whenever it comes.
        """
        more = f" ({self._suppressed} failures since the last reported)" if self._suppressed else ""
        _log.info("state store: {reason}{more}", reason=message, more=more)
        self._last = None
        self._suppressed = 0


class _Factory(txredisapi.RedisFactory):  # type: ignore[misc]
    """
    A txredisapi factory of one connection that tells its link when it is usable and
    when it is lost, and that never gives up reconnecting.
    """

    protocol: Any = None  # _Protocol, once defined (below)

    def __init__(self, link: _Link, label: str, **kwargs: Any) -> None:
        super().__init__(None, kwargs.pop("dbid", None), 1, isLazy=True, **kwargs)
        self.link = link
        self.label = label
        self.initialDelay = link.first_retry
        self.maxDelay = link.retry_cap
        # With isLazy nobody waits on it; connectionError (below) logs what fails it.
        self.deferred.addErrback(lambda f: None)

    def stopTrying(self) -> Deferred[Any]:
        # txredisapi calls this when AUTH or SELECT fails, which also happens when the
        # connection drops (or its TLS handshake fails) during them: keep retrying with
        # backoff, so that Redis coming back, or an ACL being fixed, needs no restart.
        # Stopping at service stop goes through disconnect(), not here.
        return succeed(None)

    def retryDelay(self, attempt: int) -> float:
        """
        Seconds before the C{attempt}th consecutive connection attempt: the backoff, and
        with sentinels none before the first (a lost master is most likely a failover,
        and the new one is asked of the Sentinels anyway) and at most
        L{SENTINEL_RETRY_CAP} (a failed attempt costs only questions to the Sentinels,
        and the master comes back when a replica is promoted, not when it recovers).
        """
        delay: float = super().retryDelay(attempt)
        if self.link.sentinel_endpoint is None:
            return delay
        if attempt <= 1:
            return 0.0
        return min(delay, SENTINEL_RETRY_CAP)

    def connectionError(self, why: str) -> None:
        # AUTH or SELECT failed.
        super().connectionError(why)
        self.link.throttle.failure(why)

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        lost = protocol.connectionLost

        def connectionLost(reason: Failure) -> None:
            # Says why, such as a TLS handshake refused for an untrusted certificate.
            if not self.disconnectCalled:
                self.link.throttle.failure(
                    f"{self.label} connection to Redis at {self.link.where()} "
                    f"lost: {reason.getErrorMessage()}"
                )
            lost(reason)

        protocol.connectionLost = connectionLost
        return protocol

    def addConnection(self, conn: Any) -> None:
        super().addConnection(conn)
        if conn in self.pool:
            self.link.connection_ready(self, conn)


class _Protocol(LeanRedisCommands, WholeRedisReplies, txredisapi.RedisProtocol):  # type: ignore[misc]
    """The command connection's protocol."""


class _Subscriber(LeanRedisCommands, WholeRedisReplies, txredisapi.SubscriberProtocol):  # type: ignore[misc]
    """
    The pub/sub connection: hands every message to the link.
    """

    factory: _Factory

    def messageReceived(self, pattern: bytes | None, channel: bytes, message: bytes) -> None:
        self.factory.link.deliver(channel, message)


_Factory.protocol = _Protocol


class _SubscriberFactory(_Factory):
    protocol = _Subscriber


class _Link:
    """
    A store's connections to Redis -- one for commands and, from the first
    subscription on, one for pub/sub -- with the subscriptions made on them.

    Held by the store that made it; after a reload that changed none of the store's
    settings, by the stores of both configurations (L{KvStoreService.take_over}):
    it closes when the last of them lets go (L{release}), so the replaced
    configuration's stop closes nothing the new one uses, nor does a new one's that
    never served.

    @ivar subscriptions: Each subscribed channel (with the key prefix) and its callbacks,
        whichever store they were subscribed through.
    """

    def __init__(
        self,
        store: KvStoreService,
        reactor: Any,
        trust_root: IOpenSSLTrustRoot | Certificate | None,
        log_interval: float,
    ) -> None:
        self.config = store.config
        self.timeout = store.timeout
        self.first_retry = store.first_retry
        self.retry_cap = store.retry_cap
        self.reactor = reactor
        self.trust_root = trust_root
        self.throttle = _Throttle(reactor, log_interval)
        self.commands: _Factory | None = None
        self.subscriber: _Factory | None = None
        self.subscriptions: dict[bytes, list[MessageCallback]] = {}
        self.subscribing: list[Deferred[None]] = []
        self.holders: list[KvStoreService] = []
        # With sentinels, one endpoint for both connections: the Sentinel that answered
        # last is asked first by either.
        self.sentinel_endpoint: SentinelEndpoint | None = None
        self.subscribed_master: tuple[str, int] | None = None
        if self.config.sentinels:
            self.sentinel_endpoint = SentinelEndpoint(self.config, reactor, trust_root)

    def where(self) -> str:
        """
        The Redis connected to, for messages: the address, or with sentinels the master's
        name and the address it was last found at.
        """
        found = self.sentinel_endpoint
        if found is None:
            return self.config.address
        at = f" at {found.current[0]}:{found.current[1]}" if found.current else ""
        return f"master {self.config.master_name!r}{at} (through Sentinel)"

    def hold(self, store: KvStoreService) -> None:
        """
        C{store} (starting) uses these connections: connect for commands unless that is
        done already.
        """
        if store not in self.holders:
            self.holders.append(store)
        if self.commands is None:
            self.commands = self.connect(_Factory, "command")

    def release(self, store: KvStoreService) -> Deferred[None]:
        """
        C{store} (stopping) no longer uses these connections: when nobody else does, stop
        reconnecting and close them.

        @return: Fires once they are closed (at once when others still hold them).
        """
        if store in self.holders:
            self.holders.remove(store)
        if self.holders:
            return succeed(None)
        factories = [f for f in (self.commands, self.subscriber) if f is not None]
        self.commands = self.subscriber = None
        # Subscriptions still waiting for the pub/sub connection will never be made.
        waiting, self.subscribing = self.subscribing, []
        for d in waiting:
            if not d.called:
                d.errback(StoreUnavailableError("the state store stopped"))
        closing = [f.disconnect() for f in factories]
        done: Deferred[None] = Deferred()
        remaining = [len(closing)]

        def one(_: object) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.callback(None)

        for d in closing:
            d.addBoth(one)
        if not closing:
            done.callback(None)
        return done

    def endpoint(self) -> IStreamClientEndpoint:
        """
        Where the connections connect: the address, or with sentinels the master the
        Sentinels name at each (re)connection; wrapped in TLS with C{tls}.
        """
        if self.sentinel_endpoint is not None:
            return self.sentinel_endpoint
        host, port = split_address(self.config.address)
        # No trust root: optionsForClientTLS verifies against the platform's.
        return redis_endpoint(
            self.reactor, host, port, self.timeout, self.config.tls, self.trust_root
        )

    def connect(self, kind: type[_Factory], label: str) -> _Factory:
        """
        Start connecting a connection of C{kind} (it reconnects by itself until closed).
        """
        password = self.config.password
        factory = kind(
            self,
            label,
            # Pub/sub is not scoped to a database; SELECT 0 would be a wasted round trip.
            dbid=self.config.db if kind is _Factory and self.config.db else None,
            charset=None,
            password=password,
            username=self.config.user if password is not None else None,
            # No reply timeout of txredisapi's: every operation has one timer, the
            # store's own (bounded), which also aborts a connection that timed out.
            replyTimeout=None,
            convertNumbers=False,
        )
        factory.startConnecting(self.endpoint())
        return factory

    def connection_ready(self, factory: _Factory, conn: Any) -> None:
        """
        A connection of C{factory} (commands or pub/sub) is ready: say so in the log,
        and on the pub/sub connection subscribe to every channel again, then settle
        whoever waits for that.
        """
        self.throttle.recovered(f"{factory.label} connection to Redis at {self.where()} ready")
        if factory is self.commands and self.subscriber is not None:
            self._follow_master(self.subscriber)
        if factory is self.subscriber:
            if self.sentinel_endpoint is not None:
                # The master as the Sentinels named it when this connection was made.
                self.subscribed_master = self.sentinel_endpoint.current
            waiting, self.subscribing = self.subscribing, []
            made = [
                self.bounded(conn.execute_command("SUBSCRIBE", channel))
                for channel in self.subscriptions
            ]
            subscribed = gatherResults(made, consumeErrors=True)

            def settle(result: object) -> None:
                for d in waiting:
                    if d.called:
                        continue
                    if isinstance(result, Failure):
                        d.errback(StoreUnavailableError("could not subscribe again"))
                    else:
                        d.callback(None)

            subscribed.addBoth(settle)

    def _follow_master(self, subscriber: _Factory) -> None:
        """
        With sentinels, drop the pub/sub connection when it is not to the master the
        command connection just found: a frozen old master keeps it open without a
        word, and it would never hear what is published on the new one.
        """
        found = self.sentinel_endpoint
        if found is None or found.current is None or found.current == self.subscribed_master:
            # The same master as the Sentinels named it (a host name, when they announce
            # names, never equals the socket's peer address: compared as named).
            return
        for connection in list(subscriber.pool):
            transport = connection.transport
            if transport is None:
                continue
            self.throttle.failure(
                f"pub/sub connection not to the master {self.where()}: connecting again"
            )
            transport.abortConnection()

    def deliver(self, channel: bytes, message: bytes) -> None:
        """
        Hand a message published on C{channel} to each of its callbacks.
        """
        for callback in list(self.subscriptions.get(channel, ())):
            try:
                callback(message)
            except Exception:
                _log.failure("state store: a subscriber of {channel!r} failed", channel=channel)

    def bounded(self, d: Deferred[_T], factory: _Factory | None = None) -> Deferred[_T]:
        """
        C{d}, an operation, bounded by the timeout (which drops C{factory}'s connection)
        and failing with L{StoreError}s.
        """
        d.addTimeout(self.timeout, self.reactor)
        if factory is not None:
            d.addErrback(self._timed_out, factory)
        return d.addErrback(self._translate)

    def _timed_out(self, failure: Failure, factory: _Factory) -> Failure:
        if failure.check(TimeoutError):
            # No answer in time: the connection may be dead without knowing it (a Redis
            # host gone, a frozen server). Drop it; the factory reconnects with backoff
            # (through the Sentinels with sentinels), and until then operations fail at
            # once rather than queue up behind it.
            _drop(factory)
        elif failure.check(txredisapi.ResponseError) and failure.getErrorMessage().startswith(
            "READONLY"
        ):
            # The server is a replica now: a failover demoted it. Drop the connection;
            # the reconnection asks the Sentinels for the new master.
            _drop(factory)
            message = f"Redis at {self.where()} is a replica now (READONLY)"
            self.throttle.failure(message)
            return Failure(StoreUnavailableError(message))
        return failure

    def _translate(self, failure: Failure) -> Failure:
        if failure.check(*_UNAVAILABLE):
            message = failure.getErrorMessage() or failure.type.__name__  # type: ignore[union-attr]
            if failure.check(TimeoutError):
                message = f"no answer from Redis within {self.timeout:g}s"
            self.throttle.failure(message)
            return Failure(StoreUnavailableError(message))
        if failure.check(txredisapi.ResponseError):
            return Failure(StoreError(failure.getErrorMessage()))
        return failure

    def run(self, factory: _Factory | None, command: str, *args: Any) -> Deferred[Any]:
        """
        Send C{command} on C{factory}'s connection, bounded; fail at once when it is not
        connected.
        """
        return self.bounded(self.send(factory, command, *args), factory)

    def send(self, factory: _Factory | None, command: str, *args: Any) -> Deferred[Any]:
        """
        Send C{command} on C{factory}'s connection, unbounded; fail at once when it is not
        connected.

        Straight to the connection's protocol (each factory has one): txredisapi's
        handler would look the connection up through a generator and a queue on every
        command (~10 µs of a shared rate limit's request).
        """
        if factory is not None:
            for connection in factory.pool:
                if connection.connected:
                    try:
                        return cast(Deferred[Any], connection.execute_command(command, *args))
                    except Exception:
                        # An argument that cannot be encoded, ...: a failed operation,
                        # as through txredisapi's handler, never a raise.
                        return fail()
        message = f"not connected to Redis at {self.where()}"
        self.throttle.failure(message)
        return fail(StoreUnavailableError(message))


@implementer(IStateStore)
class KvStoreService(Service):
    """
    The C{kvstore} store: Redis, through txredisapi.

    @ivar config: The provider's configuration.
    @ivar key_prefix: Prepended to every key, index name and channel.
    @ivar first_retry: Seconds before the first reconnection attempt; grows
        exponentially (with jitter) up to C{retry_cap}.
    @ivar carried_over: Whether it took over the connections of the store of the
        configuration a reload replaced (L{take_over}).
    """

    name = "state"

    def __init__(
        self,
        config: KvStoreConfig,
        key_prefix: str | bytes,
        reactor: Any,
        *,
        trust_root: IOpenSSLTrustRoot | Certificate | None = None,
        first_retry: float = 0.5,
        retry_cap: float = 10.0,
        log_interval: float = 60.0,
    ) -> None:
        """
        @param reactor: Provides C{IReactorTime} and C{IReactorTCP}.
        @param trust_root: The certificate authorities a TLS server certificate is
            verified against; the platform's by default.
        @param log_interval: Seconds between two logged failures (more are counted).
        """
        self.config = config
        self.key_prefix = key_prefix if isinstance(key_prefix, bytes) else key_prefix.encode()
        self.timeout = config.timeout
        self.first_retry = first_retry
        self.retry_cap = retry_cap
        self._reactor = reactor
        self._given_trust_root = trust_root
        # The caFile's bytes: a renewed file at the same path is a changed setting.
        self._ca_pem: bytes | None = None
        if trust_root is None and config.ca_file is not None:
            self._ca_pem = _read_pem(config.ca_file)
            trust_root = _trust_root_of(self._ca_pem, config.ca_file)
        self._trust_root = trust_root
        self.carried_over = False
        self._link = _Link(self, reactor, self._trust_root, log_interval)

    @property
    def connected(self) -> bool:
        """
        Whether the command connection is up (operations are sent, not refused at once).
        """
        factory = self._link.commands
        return factory is not None and bool(factory.size)

    def take_over(self, old: KvStoreService) -> bool:
        """
        Use the connections of C{old} (the store of the configuration a reload replaces,
        running) from now on, with its subscriptions, instead of connecting again, when
        none of the settings that make them changed: the C{config} (address, user,
        password, db, tls, caFile and the bytes in it, timeout), the key prefix, the
        retry timings and any trust root given. C{old}'s stop then closes nothing this
        one holds. Otherwise this one connects on its own when it starts, as at start.
        Called before L{startService}.

        @return: Whether it took over.
        """
        if (
            self.running
            or not old.running
            or self.config != old.config
            or self.key_prefix != old.key_prefix
            or self._ca_pem != old._ca_pem
            or self._given_trust_root is not old._given_trust_root
            or (self.first_retry, self.retry_cap) != (old.first_retry, old.retry_cap)
        ):
            return False
        self._link = old._link
        self.carried_over = True
        return True

    # -- service -------------------------------------------------------------------------

    def startService(self) -> None:
        """
        Start connecting (for commands; pub/sub connects at the first subscription),
        unless the connections were taken over (L{take_over}).
        """
        super().startService()
        self._link.hold(self)

    def stopService(self) -> Deferred[None]:
        """
        Let go of the connections: stop reconnecting and close them, unless the store
        of a reloaded configuration took them over and still uses them.
        """
        super().stopService()
        return self._link.release(self)

    # -- operations ----------------------------------------------------------------------

    def _key(self, key: bytes) -> bytes:
        return self.key_prefix + key

    def _command(self, command: str, *args: Any) -> Deferred[Any]:
        return self._link.run(self._link.commands, command, *args)

    def get(self, key: bytes) -> Deferred[bytes | None]:
        return self._command("GET", self._key(key))

    def set(self, key: bytes, value: bytes, ttl: float) -> Deferred[None]:
        return self._command("SET", self._key(key), value, "PX", _millis(ttl)).addCallback(_none)

    def replace(self, key: bytes, expected: bytes, value: bytes, ttl: float) -> Deferred[bool]:
        return self._script(
            _REPLACE, [self._key(key)], [expected, value, _millis(ttl)]
        ).addCallback(bool)

    def delete(self, *keys: bytes) -> Deferred[int]:
        if not keys:
            return succeed(0)
        return self._command("DEL", *(self._key(k) for k in keys))

    def ttl(self, key: bytes) -> Deferred[float | None]:
        return self._command("PTTL", self._key(key)).addCallback(
            lambda ms: ms / 1000.0 if ms >= 0 else None
        )

    def acquire(self, lock_key: bytes, owner: bytes, lease: float) -> Deferred[bool]:
        return self._command(
            "SET", self._key(lock_key), owner, "PX", _millis(lease), "NX"
        ).addCallback(lambda reply: reply is not None)

    def release(self, lock_key: bytes, owner: bytes) -> Deferred[bool]:
        return self._script(_RELEASE, [self._key(lock_key)], [owner]).addCallback(bool)

    def add_to_index(self, index_key: bytes, member: bytes, ttl: float) -> Deferred[None]:
        return self._script(_INDEX_ADD, [self._key(index_key)], [member, _millis(ttl)]).addCallback(
            _none
        )

    def index_members(self, index_key: bytes) -> Deferred[frozenset[bytes]]:
        return self._command("SMEMBERS", self._key(index_key)).addCallback(frozenset)

    def remove_from_index(self, index_key: bytes, *members: bytes) -> Deferred[int]:
        if not members:
            return succeed(0)
        return self._command("SREM", self._key(index_key), *members)

    def publish(self, channel: bytes, message: bytes) -> Deferred[int]:
        return self._command("PUBLISH", self._key(channel), message)

    def subscribe(self, channel: bytes, callback: MessageCallback) -> Deferred[None]:
        link = self._link
        full = self._key(channel)
        callbacks = link.subscriptions.setdefault(full, [])
        callbacks.append(callback)
        if link.subscriber is None:
            if not self.running:
                return fail(StoreUnavailableError("the state store is not running"))
            # The subscription is made once the connection is ready (connection_ready).
            link.subscriber = link.connect(_SubscriberFactory, "pub/sub")
        if len(callbacks) > 1:
            return succeed(None)
        if link.subscriber.size:
            return link.run(link.subscriber, "SUBSCRIBE", full).addCallback(_none)
        # Not connected (yet): the connection subscribes to every channel when ready.
        waiter: Deferred[None] = Deferred()
        link.subscribing = [d for d in link.subscribing if not d.called]
        link.subscribing.append(waiter)
        return link.bounded(waiter)

    def unsubscribe(self, channel: bytes, callback: MessageCallback) -> Deferred[None]:
        link = self._link
        full = self._key(channel)
        callbacks = link.subscriptions.get(full, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if callbacks or full not in link.subscriptions:
            return succeed(None)
        del link.subscriptions[full]
        return link.run(link.subscriber, "UNSUBSCRIBE", full).addCallback(_none)

    def _script(self, script: bytes, keys: list[bytes], args: list[Any]) -> Deferred[Any]:
        """
        Run C{script} by its digest (EVALSHA); sent whole (EVAL) when Redis does not
        know it (NOSCRIPT: the first time on a server, after SCRIPT FLUSH, a restart or a
        failover), one timeout bounding both.
        """
        link = self._link
        factory = link.commands
        given: object = script
        if isinstance(given, str):
            # Typed bytes; an untyped plugin's str script worked through txredisapi.
            script = given.encode()
        digest = _SCRIPT_DIGESTS.get(script)
        if digest is None:
            if len(_SCRIPT_DIGESTS) >= _MAX_SCRIPT_DIGESTS:
                # Scripts made per call would otherwise grow it without bound.
                _SCRIPT_DIGESTS.clear()
            digest = _SCRIPT_DIGESTS[script] = hashlib.sha1(script).hexdigest().encode()
        sent = link.send(factory, "EVALSHA", digest, len(keys), *keys, *args)

        def unknown(failure: Failure) -> Any:
            if failure.check(txredisapi.ResponseError) and failure.getErrorMessage().startswith(
                "NOSCRIPT"
            ):
                return link.send(factory, "EVAL", script, len(keys), *keys, *args)
            return failure

        return link.bounded(sent.addErrback(unknown), factory)

    def run_script(
        self, script: bytes, keys: list[bytes], args: list[bytes | int]
    ) -> Deferred[object]:
        """
        Run a Lua C{script} atomically (L{IScriptingStore.run_script}): keys get the
        key prefix; EVALSHA once the script is known, reloaded on NOSCRIPT.
        """
        return self._script(script, [self._key(key) for key in keys], list(args))


_SCRIPT_DIGESTS: dict[bytes, bytes] = {}
"""Each script's SHA-1 (hex, as EVALSHA takes it), computed once."""

_MAX_SCRIPT_DIGESTS = 256
"""Scripts whose digests are kept (the gateway's own and its plugins' are a handful)."""


def _drop(factory: _Factory) -> None:
    """
    Abort C{factory}'s connection (it reconnects by itself).
    """
    for connection in list(factory.pool):
        transport = connection.transport
        if transport is not None:
            transport.abortConnection()


def load_trust_root(path: str) -> IOpenSSLTrustRoot:
    """
    The certificate authorities in the PEM file C{path} (C{caFile}), as a TLS trust root.

    @raise ValueError: The file cannot be read or holds no usable certificate.
    """
    return _trust_root_of(_read_pem(path), path)


def _read_pem(path: str) -> bytes:
    """
    The bytes of the PEM file C{path}.

    @raise ValueError: It cannot be read.
    """
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror}") from None


def _trust_root_of(pem: bytes, path: str) -> IOpenSSLTrustRoot:
    """
    The certificate authorities in C{pem} (read from C{path}), as a TLS trust root.

    @raise ValueError: It holds no usable certificate.
    """
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem, re.S)
    try:
        certificates = [Certificate.loadPEM(block) for block in blocks]
    except Exception as e:  # pyOpenSSL raises its own Error for a bad certificate
        raise ValueError(f"{path} holds a certificate that cannot be loaded: {e}") from None
    if not certificates:
        raise ValueError(f"{path} holds no PEM certificate")
    root: IOpenSSLTrustRoot = trustRootFromCertificates(certificates)
    return root


def _millis(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _none(_: object) -> None:
    return None


@implementer(IStateProviderFactory)
class KvStoreProvider:
    """
    The C{kvstore} provider factory (entry point C{edgegw.state_providers: kvstore}).
    """

    name = "kvstore"

    def validate(self, config: Mapping[str, Any], where: Location, path: str) -> list[Problem]:
        """
        Problems with C{config}, located at C{where} under the field path C{path}.
        """
        problems = Problems()
        parsed = read_kvstore_config(Node(config, where, path, problems))
        if not problems and parsed.ca_file is not None:
            try:
                load_trust_root(parsed.ca_file)
            except ValueError as e:
                problems.add(where, f"{path}.caFile", str(e))
        try:
            problems.raise_if_any()
        except ConfigError as e:
            return list(e.problems)
        return []

    def build(
        self, config: Mapping[str, Any], key_prefix: str, reactor: Any, **options: Any
    ) -> KvStoreService:
        """
        The store for a valid C{config}, not started.

        @param options: Those L{KvStoreService} takes (C{trust_root}, retry timings,
            C{log_interval}) are passed on; others are ignored.
        @raise ConfigError: When C{config} is not valid (L{validate} says so first).
        """
        problems = Problems()
        parsed = read_kvstore_config(
            Node(config, Location("<stateProvider>", 1), "config", problems)
        )
        problems.raise_if_any()
        known = {k: v for k, v in options.items() if k in _SERVICE_OPTIONS}
        return KvStoreService(parsed, key_prefix, reactor, **known)


_SERVICE_OPTIONS = frozenset({"trust_root", "first_retry", "retry_cap", "log_interval"})


provider = KvStoreProvider()
"""The object the C{kvstore} entry point names."""


# Declared here rather than on the class, next to the other operations.
classImplements(KvStoreService, IScriptingStore)
