"""
A small Redis Sentinel deployment for a test, of real processes on free loopback ports:
a master and two replicas (redis-server, L{tests.support.redis.RedisServer}) and three
Sentinels (redis-sentinel, or C{redis-server --sentinel}) watching the master as
C{mymaster} with a quorum of 2, a short C{down-after-milliseconds} and
C{failover-timeout}, so that a failover after the master dies or freezes takes about
1 to 3 seconds.

And L{FakeSentinel}: a Sentinel of the test's own, in process, that answers
C{SENTINEL get-master-addr-by-name} with whatever address the test sets (a lying or
stale Sentinel).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import PrivateCertificate
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support.processes import ProcessOutput, free_port, kill, listen_local, port_of
from tests.support.redis import (
    INCOMPLETE,
    SETUP_HINT,
    RedisServer,
    encode_command,
    parse_reply,
    redis_call,
    redis_command,
)

reactor: Any = _reactor

MASTER_NAME = "mymaster"
DOWN_AFTER_MS = 800
FAILOVER_TIMEOUT_MS = 3000
SETTLE_TIMEOUT = 60.0
"""The most seconds a wait for the deployment to be in a given state may take."""


def find_sentinel() -> list[str] | None:
    """
    The command that starts a Sentinel (before its config file): redis-sentinel, or
    redis-server with C{--sentinel} after the file; L{None} when neither is installed.
    """
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin"])
    binary = shutil.which("redis-sentinel", path=path)
    if binary is not None:
        return [binary]
    binary = shutil.which("redis-server", path=path)
    return None if binary is None else [binary, "--sentinel"]


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


class SentinelProcess:
    """
    One redis-sentinel on 127.0.0.1, watching C{master} as L{MASTER_NAME}.
    """

    def __init__(self, test: TestCase, directory: str, master_port: int) -> None:
        command = find_sentinel()
        if command is None:
            test.fail(f"redis-sentinel is not installed: {SETUP_HINT}")
        self.command: list[str] = command
        self.test = test
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.directory = os.path.join(directory, f"sentinel-{self.port}")
        os.mkdir(self.directory)
        self.conf = os.path.join(self.directory, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write(
                f"port {self.port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.directory}\n"
                'logfile ""\n'
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 2\n"
            )
        self._process: Any = None
        self._protocol: ProcessOutput | None = None
        test.addCleanup(self.stop)

    def start(self) -> None:
        binary, *rest = self.command
        args = [binary, self.conf] if not rest else [binary, self.conf, *rest]
        self._protocol = ProcessOutput()
        self._process = reactor.spawnProcess(
            self._protocol, binary, args, env=None, path=self.directory
        )

    async def stop(self) -> None:
        protocol, process = self._protocol, self._process
        self._protocol = self._process = None
        if protocol is None:
            return
        if not protocol.exited:
            kill(process)
        await protocol.ended

    async def master(self) -> dict[str, str]:
        """
        What this Sentinel says of the master (C{SENTINEL master}), as text fields.
        """
        reply = await redis_command(self.port, "SENTINEL", "master", MASTER_NAME)
        pairs = [item.decode() for item in reply]
        return dict(zip(pairs[::2], pairs[1::2], strict=True))


class SentinelCluster:
    """
    A master, two replicas and three Sentinels (L{start}); everything is killed when the
    test ends.

    @ivar servers: The redis-servers, the first started as the master.
    @ivar sentinels: The Sentinels.
    """

    def __init__(self, test: TestCase) -> None:
        self.test = test
        self.directory = tempfile.mkdtemp(prefix="edgegw-sentinel-")
        test.addCleanup(shutil.rmtree, self.directory, True)
        self.servers = [RedisServer(test) for _ in range(3)]
        master = self.servers[0]
        for replica in self.servers[1:]:
            replica.args += ["--replicaof", "127.0.0.1", str(master.port)]
        self.sentinels = [SentinelProcess(test, self.directory, master.port) for _ in range(3)]

    @property
    def sentinel_addresses(self) -> list[str]:
        return [s.address for s in self.sentinels]

    async def start(self) -> SentinelCluster:
        """
        Start the servers and the Sentinels, and wait until every Sentinel knows the
        master, both replicas and the two other Sentinels.
        """
        for server in self.servers:
            await server.start()
        for sentinel in self.sentinels:
            sentinel.start()
        await self.settled(self.servers[0])
        return self

    def server_at(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise AssertionError(f"no server of the test on port {port}")

    async def master_port(self) -> int | None:
        """
        The port of the master the first Sentinel that answers names, or L{None}.
        """
        for sentinel in self.sentinels:
            try:
                reply = await redis_command(
                    sentinel.port, "SENTINEL", "get-master-addr-by-name", MASTER_NAME
                )
            except Exception:
                continue
            if reply:
                return int(reply[1])
        return None

    async def settled(self, master: RedisServer, replicas: int = 2) -> None:
        """
        Wait until every running Sentinel names C{master}, which says it is the master,
        with C{replicas} replicas it knows and the other Sentinels.
        """
        deadline = reactor.seconds() + SETTLE_TIMEOUT
        last: Any = None
        while reactor.seconds() < deadline:
            try:
                ok = True
                for sentinel in self.sentinels:
                    if sentinel._protocol is None:
                        continue
                    state = await sentinel.master()
                    last = state
                    if (
                        int(state["port"]) != master.port
                        or "s_down" in state["flags"]
                        or int(state["num-slaves"]) < replicas
                        or int(state["num-other-sentinels"]) < 2
                    ):
                        ok = False
                        break
                if ok:
                    [role] = await redis_call(master.port, [["ROLE"]])
                    if role[0] == b"master" and len(role[2]) >= replicas:
                        return
            except Exception as e:
                last = e
            await sleep(0.1)
        raise AssertionError(f"the Sentinel deployment did not settle: {last}")

    async def failed_over(self, old: int) -> RedisServer:
        """
        Wait until the Sentinels name a master other than the one on port C{old} and it
        says it is the master; that server.
        """
        deadline = reactor.seconds() + SETTLE_TIMEOUT
        while reactor.seconds() < deadline:
            port = await self.master_port()
            if port is not None and port != old:
                try:
                    [role] = await redis_call(port, [["ROLE"]], timeout=1)
                    if role[0] == b"master":
                        return self.server_at(port)
                except Exception:
                    pass
            await sleep(0.1)
        raise AssertionError("the Sentinels did not promote a replica")


# -- a Sentinel of the test's own ----------------------------------------------------------


class _FakeSentinelProtocol(Protocol):
    def __init__(self, fake: FakeSentinel) -> None:
        self.fake = fake
        self.received = b""

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        while True:
            command, at = parse_reply(self.received)
            if command is INCOMPLETE:
                return
            self.received = self.received[at:]
            self.fake.asked.append(command)
            assert self.transport is not None
            name = [part.lower() for part in command[:2]]
            if name[0] == b"auth":
                right = [b"AUTH", *(x.encode() for x in self.fake.credentials or ())]
                good = self.fake.credentials is not None and command == right
                self.transport.write(b"+OK\r\n" if good else b"-WRONGPASS invalid\r\n")
            elif name == [b"sentinel", b"get-master-addr-by-name"]:
                answer = self.fake.answer
                if answer is None:
                    self.transport.write(b"*-1\r\n")
                else:
                    host, port = answer
                    self.transport.write(encode_command([host, str(port)]))
            else:
                self.transport.write(b"-ERR unknown command\r\n")


class FakeSentinel(Factory):
    """
    Answers C{SENTINEL get-master-addr-by-name} with L{answer} (host, port), or a null
    reply when it is L{None}; records every command it is sent in L{asked}.
    """

    def buildProtocol(self, addr: IAddress | None) -> Protocol:
        return _FakeSentinelProtocol(self)

    def __init__(
        self,
        test: TestCase,
        answer: tuple[str, int] | None,
        credentials: tuple[str, str] | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        """
        @param credentials: The user and password C{AUTH} must give (any AUTH is refused
            without).
        @param tls: Its certificate and key files: then it speaks TLS only.
        """
        self.answer = answer
        self.credentials = credentials
        self.asked: list[list[bytes]] = []
        listening: Any
        if tls is None:
            listening = listen_local(self)
        else:
            cert, key = tls
            with open(cert, "rb") as c, open(key, "rb") as k:
                pem = c.read() + k.read()
            options = PrivateCertificate.loadPEM(pem).options()
            listening = reactor.listenSSL(0, self, options, interface="127.0.0.1")
        test.addCleanup(listening.stopListening)
        self.port = port_of(listening)
        self.address = f"127.0.0.1:{self.port}"
