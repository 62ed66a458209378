"""
Finding the Redis master through Redis Sentinel, for the C{kvstore} store's connections.

L{SentinelEndpoint} is the endpoint the store's txredisapi factories connect through
when C{kvstore} is given C{sentinels}: at each connection attempt (the first one, and
every reconnection after a lost connection) it asks the Sentinels in turn for the
address of the master (C{SENTINEL get-master-addr-by-name}), asks that server its
C{ROLE} (a Sentinel that is behind, or that lies, may name a replica, or nothing that
answers: the next Sentinel is asked), and connects there. Discovery is only ever done
on connecting: the commands of a connected store cost what they cost with one
C{address}.

Each exchange is a connection of its own (with C{AUTH} when a password is set, and TLS
with the same trust as the master's when C{tls} is set), closed once answered, and
bounded by the store's timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IProtocolFactory, IStreamClientEndpoint
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.python.failure import Failure
from zope.interface import implementer

from edgegw.config.model import KvStoreConfig
from edgegw.seam import IOpenSSLTrustRoot
from edgegw.state.resp import INCOMPLETE, RedisReplyError, encode_command, parse_reply

__all__ = ["MasterNotFoundError", "SentinelEndpoint", "redis_endpoint", "split_address"]


class MasterNotFoundError(ConnectError):
    """
    No Sentinel named a master that says it is one.
    """


def split_address(address: str) -> tuple[str, int]:
    """
    The host and port of C{host:port} (an IPv6 host in brackets or not).
    """
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def redis_endpoint(
    reactor: Any,
    host: str,
    port: int,
    timeout: float,
    tls: bool,
    trust_root: IOpenSSLTrustRoot | Certificate | None,
) -> IStreamClientEndpoint:
    """
    An endpoint to the Redis server (or Sentinel) at C{host}:C{port}, in TLS verified
    against C{trust_root} (the platform's when L{None}) and C{host} when C{tls}.
    """
    endpoint: IStreamClientEndpoint = HostnameEndpoint(
        reactor, host, port, timeout=max(1, int(timeout))
    )
    if tls:
        endpoint = wrapClientTLS(optionsForClientTLS(host, trustRoot=trust_root), endpoint)
    return endpoint


class _Exchange(Protocol):
    """
    Sends commands in one pipeline, collects their replies, and closes.
    """

    def __init__(self, commands: Sequence[Sequence[bytes | str]]) -> None:
        self.commands = commands
        self.received = b""
        self.replies: list[Any] = []
        self.answered: Deferred[list[Any]] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(encode_command(c) for c in self.commands))

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        at = 0
        try:
            while len(self.replies) < len(self.commands):
                value, at = parse_reply(self.received, at)
                if value is INCOMPLETE:
                    break
                self.replies.append(value)
        except ValueError as e:
            self.close()
            if not self.answered.called:
                self.answered.errback(e)
            return
        self.received = self.received[at:]
        if len(self.replies) == len(self.commands) and not self.answered.called:
            self.answered.callback(self.replies)
            self.close()

    def close(self) -> None:
        """
        Close the connection (once answered, or on a reply that is not RESP).
        """
        if self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.answered.called:
            self.answered.errback(ConnectError(string="connection lost before the answer"))


class _Attempt:
    """
    One discovery: whether it was cancelled (told apart from a Sentinel's failure by
    this flag, not by the exception the cancelled question failed with).
    """

    cancelled = False


@implementer(IStreamClientEndpoint)
class SentinelEndpoint:
    """
    Connects to the master the Sentinels name, found again at each connection attempt.

    @ivar current: The address (host, port) of the master last connected to, or L{None}.
    """

    def __init__(
        self,
        config: KvStoreConfig,
        reactor: Any,
        trust_root: IOpenSSLTrustRoot | Certificate | None,
    ) -> None:
        self.config = config
        self.reactor = reactor
        self.trust_root = trust_root
        self.sentinels = [split_address(s) for s in config.sentinels]
        self.current: tuple[str, int] | None = None
        # The Sentinel that answered last is asked first next time: a Sentinel that is
        # down costs its timeout once, not at every reconnection.
        self._first = 0

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[Any]:
        """
        Find the master (L{discover}), then connect C{protocolFactory} to it.
        """

        def found(address: tuple[str, int]) -> Deferred[Any]:
            self.current = address
            host, port = address
            endpoint = self._endpoint(host, port)
            return endpoint.connect(protocolFactory)

        return self.discover().addCallback(found)

    def discover(self) -> Deferred[tuple[str, int]]:
        """
        The master's address, as the first Sentinel that names a server that says it is
        the master gives it.

        @raise MasterNotFoundError: (Asynchronously.) None does; says what each answered.
        """
        attempt = _Attempt()
        running = ensureDeferred(self._discover(attempt))

        def cancel(_: Deferred[tuple[str, int]]) -> None:
            attempt.cancelled = True
            running.cancel()

        discovered: Deferred[tuple[str, int]] = Deferred(cancel)
        running.chainDeferred(discovered)
        return discovered

    async def _discover(self, attempt: _Attempt) -> tuple[str, int]:
        name = self.config.master_name
        why: list[str] = []
        refused: set[tuple[str, int]] = set()
        count = len(self.sentinels)
        for step in range(count):
            index = (self._first + step) % count
            host, port = self.sentinels[index]
            where = f"Sentinel {host}:{port}"
            try:
                reply = await self._ask(
                    host,
                    port,
                    self.config.sentinel_user,
                    self.config.sentinel_password,
                    ["SENTINEL", "get-master-addr-by-name", name],
                )
            except Exception as e:
                if attempt.cancelled:
                    # The store stopped: asking the next Sentinel would connect a master
                    # nobody waits for. Whatever the question failed with (a cancelled
                    # connection attempt fails as DNSLookupError or
                    # ConnectingCancelledError, not CancelledError).
                    raise CancelledError() from e
                why.append(f"{where}: {_describe(e)}")
                continue
            if not (isinstance(reply, list) and len(reply) == 2):
                why.append(f"{where}: knows no master {name!r}")
                continue
            try:
                master = (reply[0].decode("ascii"), int(reply[1]))
            except (AttributeError, UnicodeDecodeError, ValueError):
                why.append(f"{where}: answered {reply!r}")
                continue
            at = f"{master[0]}:{master[1]}"
            if master in refused:
                # Already asked in this round: a frozen master named by every Sentinel
                # costs one timeout, not one per Sentinel.
                why.append(f"{where}: named {at} too")
                continue
            refused.add(master)
            try:
                role = await self._ask(
                    master[0],
                    master[1],
                    self.config.user if self.config.password is not None else None,
                    self.config.password,
                    ["ROLE"],
                )
            except Exception as e:
                if attempt.cancelled:
                    raise CancelledError() from e
                why.append(f"{where}: named {at}, which did not answer ROLE: {_describe(e)}")
                continue
            if not (isinstance(role, list) and role and role[0] == b"master"):
                said = role[0] if isinstance(role, list) and role else role
                why.append(f"{where}: named {at}, which says it is {said!r}, not the master")
                continue
            self._first = index
            return master
        raise MasterNotFoundError(
            string=f"no Sentinel named the master {name!r}: " + "; ".join(why)
        )

    async def _ask(
        self,
        host: str,
        port: int,
        user: str | None,
        password: str | None,
        command: list[str],
    ) -> Any:
        commands: list[list[str]] = []
        if password is not None:
            commands.append(["AUTH", user or "default", password])
        commands.append(command)
        exchange = _Exchange(commands)
        connecting = connectProtocol(self._endpoint(host, port), exchange)
        connecting.addTimeout(self.config.timeout, self.reactor)
        await connecting
        try:
            replies = await exchange.answered.addTimeout(self.config.timeout, self.reactor)
        finally:
            exchange.close()
        for reply in replies:
            if isinstance(reply, RedisReplyError):
                raise reply
        return replies[-1]

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        return redis_endpoint(
            self.reactor, host, port, self.config.timeout, self.config.tls, self.trust_root
        )


def _describe(error: BaseException) -> str:
    if isinstance(error, RedisReplyError):
        return f"answered {error}"
    return str(error) or type(error).__name__
