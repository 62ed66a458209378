"""
A real redis-server for a test, on a free loopback port: plain, with TLS (a test CA and
server certificate generated here) and/or with an ACL user and password.

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
import socket
import tempfile
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol, Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

SETUP_HINT = "run make test (it installs redis-server)"
READY_TIMEOUT = 10.0


def free_port() -> int:
    """
    A loopback TCP port that was free a moment ago.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
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


class _ServerProcess(ProcessProtocol):
    def __init__(self) -> None:
        self.output = b""
        self.ended: Deferred[None] = Deferred()
        self.exited = False

    def outReceived(self, data: bytes) -> None:
        self.output += data

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self.exited = True
        self.ended.callback(None)


class _Ping(Protocol):
    def __init__(self) -> None:
        self.answered: Deferred[bytes] = Deferred()
        self._received = b""

    def connectionMade(self) -> None:
        self.transport.write(b"PING\r\n")  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self._received += data
        if b"\r\n" in self._received and not self.answered.called:
            self.answered.callback(self._received)
            self.transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        if not self.answered.called:
            self.answered.errback(reason)


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
        binary = shutil.which("redis-server")
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
        self.args = [self.binary, "--save", "", "--appendonly", "no", "--dir", self.directory]
        self.args += ["--bind", "127.0.0.1", "--logfile", ""]
        if tls:
            self.ca = TestCA(self.directory)
            cert, key = self.ca.issue("redis", ["127.0.0.1", "localhost"])
            self.args += ["--port", "0", "--tls-port", str(self.port)]
            self.args += ["--tls-cert-file", cert, "--tls-key-file", key]
            self.args += ["--tls-ca-cert-file", self.ca.path, "--tls-auth-clients", "no"]
        else:
            self.args += ["--port", str(self.port)]
        if password is not None:
            # The default user off: connecting without AUTH as this user gets NOAUTH.
            self.args += ["--user", "default", "off"]
            self.args += ["--user", user or "default", "on", f">{password}", "~*", "&*", "+@all"]
        self._process: Any = None
        self._protocol: _ServerProcess | None = None
        test.addCleanup(self.stop)

    async def start(self) -> None:
        """
        Start redis-server (again, on the same port) and wait until it answers PING.
        """
        protocol = _ServerProcess()
        self._protocol = protocol
        self._process = reactor.spawnProcess(
            protocol, self.binary, self.args, env=None, path=self.directory
        )
        waited = 0.0
        while True:
            if protocol.exited:
                self.test.fail(f"redis-server exited at start:\n{protocol.output.decode()}")
            with contextlib.suppress(Exception):
                answer = await self._ping()
                if answer.startswith((b"+PONG", b"-NOAUTH")):
                    return
            if waited > READY_TIMEOUT:
                self.test.fail(f"redis-server did not answer PING:\n{protocol.output.decode()}")
            await deferLater(reactor, 0.05, lambda: None)
            waited += 0.05

    async def _ping(self) -> bytes:
        endpoint: Any = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port, timeout=1)
        if self.ca is not None:
            endpoint = wrapClientTLS(
                optionsForClientTLS("127.0.0.1", trustRoot=self.ca.trust_root()), endpoint
            )
        ping = _Ping()
        await connectProtocol(endpoint, ping)
        return await ping.answered.addTimeout(1, reactor)

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
            with contextlib.suppress(ProcessExitedAlready):
                process.signalProcess("KILL")
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
