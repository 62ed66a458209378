"""
Redis for the tests and the benchmarks (C{bench/}): the redis-server binary and its
command line, the RESP2 wire format, and, for a test, a real redis-server on a free
loopback port -- plain, with TLS (a test CA and server certificate generated here)
and/or with an ACL user and password -- and one-connection clients that read and write
it behind the gateway's back (L{RedisProbe}, L{redis_command}).

The server keeps nothing on disk (C{--save "" --appendonly no}, its directory a fresh
temporary one) and is killed and awaited when the test ends. L{RedisServer.stop} and
L{RedisServer.start} take it away and bring it back on the same port mid-test.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from edgegw.state.resp import INCOMPLETE as INCOMPLETE
from edgegw.state.resp import RedisReplyError as RedisReplyError
from edgegw.state.resp import encode_command as encode_command
from edgegw.state.resp import parse_reply as parse_reply
from tests.support.certificates import ca_certificate
from tests.support.processes import ProcessOutput, free_port, kill

SETUP_HINT = "run make test (it installs redis-server)"
READY_TIMEOUT = 10.0


def find_redis_server() -> str | None:
    """
    The redis-server binary on the C{PATH} or in the sbin directories (which are not on
    every user's C{PATH}), or L{None}.
    """
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin"])
    return shutil.which("redis-server", path=path)


def server_command(
    binary: str,
    directory: str | Path,
    port: int,
    *,
    tls: tuple[str, str, str] | None = None,
    user: str | None = None,
    password: str | None = None,
) -> list[str]:
    """
    The command line of a redis-server on 127.0.0.1:C{port} that keeps nothing on disk
    (its directory C{directory}) and logs to its standard output.

    @param tls: The certificate, key and CA files: then C{port} is the TLS port, and
        there is no plaintext one (clients are not asked for certificates).
    @param password: With it, the default user is off and C{user} (the default user
        when L{None}) has every right with this password: connecting without AUTH as
        that user gets C{NOAUTH}.
    """
    args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(directory), "--logfile", ""]
    if tls is None:
        args += ["--port", str(port)]
    else:
        cert, key, ca = tls
        args += ["--port", "0", "--tls-port", str(port)]
        args += ["--tls-cert-file", cert, "--tls-key-file", key]
        args += ["--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
    if password is not None:
        args += ["--user", "default", "off"]
        args += ["--user", user or "default", "on", f">{password}", "~*", "&*", "+@all"]
    return args


# -- RESP2 -------------------------------------------------------------------------------


# -- a test's redis-server ---------------------------------------------------------------


class TestCA:
    """
    A certificate authority for tests, and the certificates it issues (PEM files in
    C{directory}).
    """

    def __init__(self, directory: str, name: str = "edgegw test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = ca_certificate(
            subject, subject, self.key, self.key, now, 1, datetime.timedelta(minutes=5)
        )
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self.path = os.path.join(directory, "ca.pem")
        with open(self.path, "wb") as f:
            f.write(self.pem)

    def trust_root(self) -> Certificate:
        """
        This CA as a trust root for C{optionsForClientTLS}.
        """
        return Certificate.loadPEM(self.pem)

    def issue(self, name: str, hosts: list[str]) -> tuple[str, str]:
        """
        A server certificate for C{hosts} (names and IP addresses); its (cert, key) paths.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alt: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        cert_path = os.path.join(self.directory, f"{name}.pem")
        key_path = os.path.join(self.directory, f"{name}.key")
        with open(cert_path, "wb") as f:
            f.write(certificate.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return cert_path, key_path


class RedisServer:
    """
    A redis-server process for one test.

    @ivar port: Its port (the TLS port with C{tls}; then there is no plaintext one).
    @ivar address: C{127.0.0.1:port}, as a C{kvstore} config gives it.
    @ivar ca: The L{TestCA} that issued its certificate, with C{tls}.
    """

    def __init__(
        self,
        test: TestCase,
        *,
        tls: bool = False,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        binary = find_redis_server()
        if binary is None:
            test.fail(f"redis-server is not installed: {SETUP_HINT}")
        self.binary: str = binary
        self.test = test
        self.directory = tempfile.mkdtemp(prefix="edgegw-redis-")
        test.addCleanup(shutil.rmtree, self.directory, True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.tls = tls
        self.ca: TestCA | None = None
        files: tuple[str, str, str] | None = None
        if tls:
            self.ca = TestCA(self.directory)
            cert, key = self.ca.issue("redis", ["127.0.0.1", "localhost"])
            files = (cert, key, self.ca.path)
        self.args = server_command(
            self.binary, self.directory, self.port, tls=files, user=user, password=password
        )
        self._process: Any = None
        self._protocol: ProcessOutput | None = None
        test.addCleanup(self.stop)

    async def start(self) -> None:
        """
        Start redis-server (again, on the same port) and wait until it answers PING.
        """
        protocol = ProcessOutput()
        self._protocol = protocol
        self._process = reactor.spawnProcess(
            protocol, self.binary, self.args, env=None, path=self.directory
        )
        waited = 0.0
        while True:
            if protocol.exited:
                self.test.fail(f"redis-server exited at start:\n{protocol.output.decode()}")
            with contextlib.suppress(Exception):
                [answer] = await redis_call(self.port, [["PING"]], self.trust_root(), timeout=1)
                if answer == b"PONG" or str(answer).startswith("NOAUTH"):
                    return
            if waited > READY_TIMEOUT:
                self.test.fail(f"redis-server did not answer PING:\n{protocol.output.decode()}")
            await deferLater(reactor, 0.05, lambda: None)
            waited += 0.05

    def trust_root(self) -> Certificate | None:
        """
        What a client trusts to connect to it: its CA with C{tls}, else L{None}.
        """
        return None if self.ca is None else self.ca.trust_root()

    def pause(self) -> None:
        """
        Freeze redis-server (SIGSTOP): connections stay open, nothing answers.
        """
        self._process.signalProcess(signal.SIGSTOP)
        self.test.addCleanup(self.resume)

    def resume(self) -> None:
        """
        Let a paused redis-server go on (SIGCONT).
        """
        if self._process is not None and self._protocol is not None and not self._protocol.exited:
            with contextlib.suppress(ProcessExitedAlready):
                self._process.signalProcess(signal.SIGCONT)

    async def stop(self) -> None:
        """
        Kill redis-server (as a crash would) and wait until it has exited.
        """
        protocol, process = self._protocol, self._process
        self._protocol = self._process = None
        if protocol is None:
            return
        if not protocol.exited:
            kill(process)
        await protocol.ended


async def redis_server(
    test: TestCase,
    *,
    tls: bool = False,
    user: str | None = None,
    password: str | None = None,
) -> RedisServer:
    """
    A started L{RedisServer}, killed when C{test} ends.
    """
    server = RedisServer(test, tls=tls, user=user, password=password)
    await server.start()
    return server


# -- one-connection clients --------------------------------------------------------------


class _Resp(Protocol):
    def __init__(self, commands: Sequence[Sequence[bytes | str | int]]) -> None:
        self.commands = commands
        self.received = b""
        self.replies: list[Any] = []
        self.answered: Deferred[list[Any]] = Deferred()
        self.closed: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(encode_command(command) for command in self.commands))

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        at = 0
        while len(self.replies) < len(self.commands):
            value, at = parse_reply(self.received, at)
            if value is INCOMPLETE:
                break
            self.replies.append(value)
        self.received = self.received[at:]
        if len(self.replies) == len(self.commands) and not self.answered.called:
            self.answered.callback(self.replies)
            assert self.transport is not None
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.answered.called:
            self.answered.errback(ConnectionError(f"Redis connection lost: {reason}"))
        self.closed.callback(None)


async def redis_call(
    port: int,
    commands: Sequence[Sequence[bytes | str | int]],
    trust_root: Certificate | None = None,
    timeout: float = 5.0,
) -> list[Any]:
    """
    Send C{commands} in one pipeline to the Redis server on 127.0.0.1:C{port} (over TLS
    trusting C{trust_root} when given) on a connection of its own, closed before this
    returns (so nothing is left open when the server is stopped mid-test); their
    replies, in order, as L{parse_reply} gives them (error replies among them).
    """
    endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=timeout)
    if trust_root is not None:
        endpoint = wrapClientTLS(optionsForClientTLS("127.0.0.1", trustRoot=trust_root), endpoint)
    protocol = _Resp(commands)
    await connectProtocol(endpoint, protocol)
    try:
        return await protocol.answered.addTimeout(timeout, reactor)
    finally:
        if protocol.transport is not None and not protocol.closed.called:
            protocol.transport.loseConnection()
        await protocol.closed


async def redis_command(port: int, *args: bytes | str | int) -> Any:
    """
    One command to the Redis server on 127.0.0.1:C{port} (plaintext, no AUTH) on a
    connection of its own; its reply (bytes, int, list or None).

    @raise RedisReplyError: If Redis answers an error.
    """
    [reply] = await redis_call(port, [args])
    if isinstance(reply, RedisReplyError):
        raise reply
    return reply


class RedisProbe:
    """
    Talks to a test's redis-server directly, one connection per call (L{redis_call}).
    """

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    async def run(self, *commands: Sequence[bytes | str | int]) -> list[Any]:
        """
        Send C{commands} in one pipeline; their replies, in order (an error reply raises).
        """
        replies = await redis_call(self.server.port, commands, self.server.trust_root())
        for reply in replies:
            if isinstance(reply, RedisReplyError):
                raise reply
        return replies

    async def command(self, *args: bytes | str | int) -> Any:
        """
        One command's reply.
        """
        return (await self.run(args))[0]

    async def keys(self, pattern: bytes | str = b"*") -> set[bytes]:
        """
        The keys matching C{pattern}.
        """
        return set(await self.command("KEYS", pattern))

    async def get(self, key: bytes | str) -> bytes | None:
        value: bytes | None = await self.command("GET", key)
        return value

    async def pttl(self, key: bytes | str) -> int:
        return int(await self.command("PTTL", key))

    async def replace(self, key: bytes | str, value: bytes) -> None:
        """
        Overwrite C{key}'s value, keeping its time to live.
        """
        await self.command("SET", key, value, "KEEPTTL")

    async def subscribers(self, channel: bytes | str) -> int:
        """
        How many connections are subscribed to C{channel}.
        """
        reply = await self.command("PUBSUB", "NUMSUB", channel)
        return int(reply[1])
