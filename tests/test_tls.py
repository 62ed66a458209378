"""
C{Gateway.spec.tls}: the certificates read and checked at load, and the TLS listener as
clients see it over real sockets (SNI, versions, suites, ALPN, resumption, reloads,
socket activation), with certificates a test CA issues.
"""

from __future__ import annotations

import datetime
import io
import os
import shutil
import socket
import ssl
import struct
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.server.tls_contexts import ServerTLS
from edgegw.service import GatewayService, build_service
from tests.support.backends import SiteBackend, answer
from tests.support.certificates import CertificateAuthority
from tests.support.configs import write_tree
from tests.support.daemons import spawn_socket_activated
from tests.support.processes import kill, listening_socket, port_of, raw_exchange
from tests.support.tls_client import client_context, get_request, handshake

HEALTH = "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /healthz, handler: {type: health}}\n"


def tls_gateway(
    certificates: list[tuple[str, str]], tls_extra: str = "", listen: str = "127.0.0.1:0"
) -> str:
    """
    A Gateway document listening on C{listen} with a C{tls} block of C{certificates}
    (certFile, keyFile pairs) and C{tls_extra} lines (indented four spaces).
    """
    entries = "".join(f'      - {{certFile: "{c}", keyFile: "{k}"}}\n' for c, k in certificates)
    return (
        "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
        f'  listen: "{listen}"\n  tls:\n    certificates:\n{entries}{tls_extra}'
    )


def serial(pem: bytes) -> int:
    """
    The serial number of one PEM certificate.
    """
    return int(x509.load_pem_x509_certificate(pem).serial_number)


def der(pem: bytes) -> bytes:
    """
    The DER form of one PEM certificate.
    """
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


class ConfigTests(SynchronousTestCase):
    """
    Each problem with a certificate is a located error at load, and in C{edgegw check}.
    """

    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.ca = CertificateAuthority()

    def issue(self, stem: str, names: list[str], **kwargs: Any) -> tuple[str, str]:
        key, cert, _ = self.ca.issue(self.directory, names, stem=stem, **kwargs)
        return cert, key

    def problems(self, text: str) -> list[str]:
        path = os.path.join(self.directory, "gateway.yaml")
        with open(path, "w") as stream:
            stream.write(text + HEALTH)
        with self.assertRaises(ConfigError) as raised:
            load_config(path, {})
        prefix = f'{path}, document 1, Gateway "gw": '
        return [str(p).removeprefix(prefix) for p in raised.exception.problems]

    def load(self, text: str) -> Any:
        path = os.path.join(self.directory, "gateway.yaml")
        with open(path, "w") as stream:
            stream.write(text + HEALTH)
        return load_config(path, {})

    def test_valid(self) -> None:
        first = self.issue("a", ["a.example", "*.a.example"])
        second = self.issue("b", ["B.Example"])
        config = self.load(tls_gateway([first, second]))
        tls = config.gateway.tls
        self.assertEqual(
            [c.names for c in tls.certificates], [("a.example", "*.a.example"), ("b.example",)]
        )
        self.assertEqual((tls.min_version, tls.http2), ("1.2", True))
        self.assertEqual(tls.certificates[0].cert_file, first[0])
        with open(first[0], "rb") as stream:
            self.assertEqual(tls.certificates[0].chain_pem, stream.read())

    def test_relative_paths(self) -> None:
        self.issue("a", ["a.example"])
        config = self.load(tls_gateway([("a.pem", "./a.key")]))
        certificate = config.gateway.tls.certificates[0]
        self.assertEqual(certificate.cert_file, os.path.join(self.directory, "a.pem"))
        self.assertEqual(certificate.key_file, os.path.join(self.directory, "a.key"))

    def test_unreadable(self) -> None:
        cert, key = self.issue("a", ["a.example"])
        missing = os.path.join(self.directory, "missing.pem")
        self.assertEqual(
            self.problems(tls_gateway([(cert, key), (missing, key)])),
            [
                f"spec.tls.certificates[1].certFile: cannot read {missing}: No such file or "
                "directory"
            ],
        )
        self.assertEqual(
            self.problems(tls_gateway([(cert, self.directory)])),
            [f"spec.tls.certificates[0].keyFile: cannot read {self.directory}: Is a directory"],
        )

    def test_not_pem(self) -> None:
        cert, key = self.issue("a", ["a.example"])
        # The certificate where the key belongs, the key where the certificate does.
        self.assertEqual(
            self.problems(tls_gateway([(key, key)])),
            [
                f"spec.tls.certificates[0].certFile: {key} holds no PEM certificate "
                "(-----BEGIN CERTIFICATE-----)"
            ],
        )
        self.assertEqual(
            self.problems(tls_gateway([(cert, cert)])),
            [
                f"spec.tls.certificates[0].keyFile: {cert} holds no PEM private key "
                "(-----BEGIN PRIVATE KEY-----)"
            ],
        )

    def test_encrypted_key(self) -> None:
        cert, key = self.issue("a", ["a.example"])
        with open(key, "rb") as stream:
            loaded = serialization.load_pem_private_key(stream.read(), None)
        encrypted = os.path.join(self.directory, "encrypted.key")
        with open(encrypted, "wb") as stream:
            stream.write(
                loaded.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(b"secret"),
                )
            )
        self.assertEqual(
            self.problems(tls_gateway([(cert, encrypted)])),
            [
                f"spec.tls.certificates[0].keyFile: {encrypted} is encrypted: the key must "
                "have no passphrase"
            ],
        )

    def test_key_mismatch(self) -> None:
        first = self.issue("a", ["a.example"])
        cert, _ = self.issue("b", ["b.example"])
        self.assertEqual(
            self.problems(tls_gateway([first, (cert, first[1])])),
            [
                f"spec.tls.certificates[1].keyFile: the key in {first[1]} does not match the "
                f"certificate in {cert} (the first certificate of the file must be the one "
                "the key is for)"
            ],
        )

    def test_dates(self) -> None:
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        expired = self.issue(
            "old",
            ["old.example"],
            not_before=now - datetime.timedelta(days=90),
            not_after=now - datetime.timedelta(days=1),
        )
        future = self.issue("new", ["new.example"], not_before=now + datetime.timedelta(days=1))
        on = (now - datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        after = (now + datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.assertEqual(
            self.problems(tls_gateway([expired, future])),
            [
                f"spec.tls.certificates[0].certFile: the certificate in {expired[0]} "
                f"(old.example) expired on {on}",
                f"spec.tls.certificates[1].certFile: the certificate in {future[0]} "
                f"(new.example) is not valid before {after}",
            ],
        )

    def test_names(self) -> None:
        # Without a subjectAltName, a common name that is a host name serves.
        legacy = self.issue("legacy", [], common_name="Legacy.Example")
        config = self.load(tls_gateway([legacy]))
        self.assertEqual(config.gateway.tls.certificates[0].names, ("legacy.example",))
        nameless = self.issue("nameless", [], common_name="edgegw test service")
        self.assertEqual(
            self.problems(tls_gateway([nameless])),
            [
                f"spec.tls.certificates[0].certFile: the certificate in {nameless[0]} names "
                "no host: no DNS name in its subjectAltName and no host name as its common "
                "name"
            ],
        )

    def test_fields(self) -> None:
        cert = self.issue("a", ["a.example"])
        self.assertEqual(
            self.problems(tls_gateway([cert], '    minVersion: "1.1"\n    http2: maybe\n')),
            [
                'spec.tls.minVersion: "1.1" is not one of "1.2", "1.3"',
                "spec.tls.http2: expected a boolean (true or false), got a string",
            ],
        )
        unquoted = self.load(tls_gateway([cert], "    minVersion: 1.3\n    http2: false\n"))
        tls = unquoted.gateway.tls
        self.assertEqual((tls.min_version, tls.http2), ("1.3", False))
        self.assertEqual(
            self.problems(tls_gateway([]).replace("    certificates:\n", "    certificates: []\n")),
            ["spec.tls.certificates: must list at least one entry"],
        )
        self.assertEqual(
            self.problems(tls_gateway([]).replace("    certificates:\n", "    certs: []\n")),
            [
                "spec.tls.certificates: required field is missing",
                "spec.tls.certs: unknown field",
            ],
        )
        self.assertEqual(
            self.problems(tls_gateway([cert]).replace("keyFile", "key")),
            [
                "spec.tls.certificates[0].keyFile: required field is missing",
                'spec.tls.certificates[0].key: unknown field; did you mean "keyFile"?',
            ],
        )

    def test_one_way_to_configure_tls(self) -> None:
        cert, key = self.issue("a", ["a.example"])
        listen = f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"
        self.assertEqual(
            self.problems(tls_gateway([(cert, key)], listen=listen)),
            [
                'spec.tls: listen is an "ssl:" endpoint, which configures TLS itself: use '
                'tls with a plain listen address (such as ":443"), or the "ssl:" endpoint '
                "alone"
            ],
        )

    def test_check(self) -> None:
        """
        C{edgegw check} reports the certificate's problem, located.
        """
        cert, _ = self.issue("a", ["a.example"])
        _, other = self.issue("b", ["b.example"])
        path = os.path.join(self.directory, "gateway.yaml")
        with open(path, "w") as stream:
            stream.write(tls_gateway([(cert, other)]) + HEALTH)
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(check(path, out, err), 1)
        self.assertIn(
            f'{path}, document 1, Gateway "gw": spec.tls.certificates[0].keyFile: the key in '
            f"{other} does not match",
            err.getvalue(),
        )
        with open(path, "w") as stream:
            stream.write(tls_gateway([(cert, cert.replace(".pem", ".key"))]) + HEALTH)
        self.assertEqual(check(path, out, err), 0)

    def test_openssl_refusal_is_located(self) -> None:
        """
        What OpenSSL refuses when the contexts are built (here a key that is not the
        certificate's, which the load would have refused first) is a located error
        too, when the gateway is built.
        """
        cert, key = self.issue("a", ["a.example"])
        _, other_key = self.issue("b", ["b.example"])
        config = self.load(tls_gateway([(cert, key)]))
        certificate = config.gateway.tls.certificates[0]
        with open(other_key, "rb") as stream:
            broken = attrs.evolve(certificate, key_pem=stream.read())
        tls = attrs.evolve(config.gateway.tls, certificates=(certificate, broken))
        config = attrs.evolve(config, gateway=attrs.evolve(config.gateway, tls=tls))
        raised = self.assertRaises(ConfigError, build_gateway, config, reactor)
        [problem] = raised.problems
        self.assertEqual(problem.field, "spec.tls.certificates[1]")
        self.assertIn(f"OpenSSL refuses the certificate in {cert}", problem.message)


class ContextTests(SynchronousTestCase):
    """
    What the contexts are built with that a client cannot see on the wire.
    """

    def test_options(self) -> None:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key, cert, _ = CertificateAuthority().issue(directory, ["a.example"])
        config_path = write_tree(directory, {"g.yaml": tls_gateway([(cert, key)]) + HEALTH})
        service = build_service(load_config(config_path, {}), reactor)
        tls = service.gateway.tls
        assert isinstance(tls, ServerTLS)
        options = tls.getContext().set_options(0)  # adds nothing, answers all
        # OpenSSL without zlib never compresses, so no client can show this one.
        self.assertTrue(options & SSL.OP_NO_COMPRESSION)
        self.assertTrue(options & SSL.OP_NO_RENEGOTIATION)
        self.assertFalse(options & SSL.OP_NO_TICKET)
        # Built once: every connection gets the same context.
        self.assertIs(tls.getContext(), tls.getContext())
        self.assertTrue(service.gateway.site.http2)


class ListenerTests(TestCase):
    """
    The TLS listener over real sockets.
    """

    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.ca = CertificateAuthority()

    def issue(self, stem: str, names: list[str], **kwargs: Any) -> tuple[str, str, bytes]:
        key, cert, leaf = self.ca.issue(self.directory, names, stem=stem, **kwargs)
        return cert, key, leaf

    def serve(self, text: str) -> tuple[GatewayService, int]:
        root = write_tree(os.path.join(self.directory, "config"), {"a.yaml": text})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        return service, port_of(service)

    async def test_sni(self) -> None:
        """
        The certificate naming the SNI name exactly, else its wildcard (one label), else
        the first; the first without SNI.
        """
        first = self.issue("first", ["first.example"])
        wild = self.issue("wild", ["*.wild.example"])
        exact = self.issue("exact", ["exact.wild.example", "other.example"])
        _, port = self.serve(tls_gateway([first[:2], wild[:2], exact[:2]]) + HEALTH)
        expected = {
            "first.example": first,
            "a.wild.example": wild,
            "EXACT.wild.example": exact,
            "other.example": exact,
            "a.b.wild.example": first,
            "wild.example": first,
            "unknown.example": first,
            None: first,
        }
        for name, certificate in expected.items():
            handshaken = await handshake(port, name)
            self.assertEqual(handshaken.certificate, der(certificate[2]), name)

    async def test_chain_verifies(self) -> None:
        """
        The chain in the certificate file is sent: a client trusting only the root
        verifies the leaf and its name, for the SNI-chosen certificate too.
        """
        first = self.issue("first", ["first.example"])
        second = self.issue("second", ["second.example"])
        _, port = self.serve(tls_gateway([first[:2], second[:2]]) + HEALTH)
        for name in ("first.example", "second.example"):
            context = client_context(self.ca.root_pem)
            handshaken = await handshake(port, name, context)
            self.assertIn(b"HTTP/1.1 404", handshaken.response)

    async def test_versions_and_suites(self) -> None:
        ec = self.issue("ec", ["localhost"])
        rsa = self.issue("rsa", ["rsa.example"], key_type="rsa")
        _, port = self.serve(tls_gateway([ec[:2], rsa[:2]]) + HEALTH)
        tls12 = ssl.TLSVersion.TLSv1_2
        handshaken = await handshake(port)
        self.assertEqual(handshaken.version, "TLSv1.3")
        handshaken = await handshake(port, context=client_context(max_version=tls12))
        self.assertEqual(handshaken.version, "TLSv1.2")
        self.assertTrue(handshaken.cipher.startswith("ECDHE-ECDSA-"), handshaken.cipher)
        for cipher in ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-CHACHA20-POLY1305"):
            context = client_context(max_version=tls12, ciphers=cipher)
            handshaken = await handshake(port, "rsa.example", context)
            self.assertEqual(handshaken.cipher, cipher)
        # CBC, and suites without ECDHE (RSA key exchange, DHE): refused on TLS 1.2.
        refused = [
            ("localhost", "ECDHE-ECDSA-AES128-SHA"),
            ("localhost", "ECDHE-ECDSA-AES256-SHA384"),
            ("rsa.example", "ECDHE-RSA-AES128-SHA"),
            ("rsa.example", "AES128-GCM-SHA256"),
            ("rsa.example", "DHE-RSA-AES128-GCM-SHA256"),
        ]
        for name, cipher in refused:
            context = client_context(max_version=tls12, ciphers=cipher)
            with self.assertRaises(ssl.SSLError, msg=cipher):
                await handshake(port, name, context)

    async def test_min_version_13(self) -> None:
        certificate = self.issue("a", ["localhost"])
        _, port = self.serve(tls_gateway([certificate[:2]], '    minVersion: "1.3"\n') + HEALTH)
        self.assertEqual((await handshake(port)).version, "TLSv1.3")
        context = client_context(max_version=ssl.TLSVersion.TLSv1_2)
        with self.assertRaises(ssl.SSLError):
            await handshake(port, context=context)

    async def test_alpn(self) -> None:
        certificate = self.issue("a", ["localhost"])
        _, port = self.serve(tls_gateway([certificate[:2]]) + HEALTH)
        offers: list[tuple[list[str] | None, str | None]] = [
            (["h2", "http/1.1"], "h2"),
            (["http/1.1", "h2"], "h2"),
            (["http/1.1"], "http/1.1"),
            (["spdy/3"], None),
            (None, None),
        ]
        for offer, chosen in offers:
            handshaken = await handshake(port, context=client_context(alpn=offer))
            self.assertEqual(handshaken.alpn, chosen, offer)

    async def test_alpn_without_http2(self) -> None:
        certificate = self.issue("a", ["localhost"])
        service, port = self.serve(tls_gateway([certificate[:2]], "    http2: false\n") + HEALTH)
        self.assertFalse(service.gateway.site.http2)
        for offer, chosen in ((["h2", "http/1.1"], "http/1.1"), (["h2"], None), (None, None)):
            handshaken = await handshake(port, context=client_context(alpn=offer))
            self.assertEqual(handshaken.alpn, chosen, offer)

    async def test_resumption(self) -> None:
        """
        A second connection resumes the first one's session: TLS 1.3 (a ticket) and
        TLS 1.2 (a ticket, or the session cache).
        """
        certificate = self.issue("a", ["localhost"])
        _, port = self.serve(tls_gateway([certificate[:2]]) + HEALTH)
        for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
            context = client_context(max_version=version)
            first = await handshake(port, context=context)
            self.assertFalse(first.reused)
            second = await handshake(port, context=context, session=first.session)
            self.assertTrue(second.reused, version)
        # Without tickets, TLS 1.2 resumes from the server's session cache.
        context = client_context(max_version=ssl.TLSVersion.TLSv1_2)
        context.options |= ssl.OP_NO_TICKET
        first = await handshake(port, context=context)
        second = await handshake(port, context=context, session=first.session)
        self.assertTrue(second.reused)
        self.assertIsNone(second.compression)

    async def test_no_renegotiation(self) -> None:
        """
        A TLS 1.2 client asking to renegotiate is refused (OpenSSL 3 refuses a client's
        renegotiation by default too; the option, checked in L{ContextTests}, keeps it
        refused whatever the library's default).
        """
        certificate = self.issue("a", ["localhost"])
        _, port = self.serve(tls_gateway([certificate[:2]]) + HEALTH)

        def renegotiate() -> str:
            context = SSL.Context(SSL.TLS_CLIENT_METHOD)
            context.set_max_proto_version(SSL.TLS1_2_VERSION)
            raw = socket.create_connection(("127.0.0.1", port))
            # Blocking (pyOpenSSL's calls), yet never waiting for ever.
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 10, 0))
            connection = SSL.Connection(context, raw)
            connection.set_connect_state()
            connection.set_tlsext_host_name(b"localhost")
            connection.do_handshake()
            try:
                connection.renegotiate()
                connection.do_handshake()
                connection.sendall(get_request("/healthz"))
                return connection.recv(65536).decode("latin-1")
            except SSL.Error as e:
                return f"refused: {e}"
            finally:
                raw.close()

        outcome = await deferToThread(renegotiate)
        self.assertTrue(outcome.startswith("refused: "), outcome)

    async def test_http11_end_to_end(self) -> None:
        """
        Plain HTTP/1.1 over the TLS listener, through the whole gateway: a health route
        and a reverse-proxy route.
        """
        backend = SiteBackend(answer(body=b"from the backend")).start()
        self.addCleanup(backend.stop)
        certificate = self.issue("a", ["localhost"])
        proxy = (
            "---\nkind: Route\nmetadata: {name: p}\nspec:\n  match: /api/\n"
            "  access: {auth: public}\n"
            f'  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}\n'
        )
        _, port = self.serve(tls_gateway([certificate[:2]]) + HEALTH + proxy)
        context = client_context(self.ca.root_pem, alpn=["http/1.1"])
        health = await handshake(port, context=context, request=get_request("/healthz"))
        self.assertTrue(health.response.startswith(b"HTTP/1.1 200 "), health.response)
        self.assertIn(b'{"status":"ok"}', health.response.replace(b" ", b""))
        proxied = await handshake(port, context=context, request=get_request("/api/x"))
        self.assertTrue(proxied.response.startswith(b"HTTP/1.1 200 "), proxied.response)
        self.assertTrue(proxied.response.endswith(b"from the backend"), proxied.response)
        self.assertEqual(backend.requests[0].header(b"x-forwarded-proto"), b"https")

    async def test_h2_end_to_end(self) -> None:
        """
        A client offering h2 gets HTTP/2 on the spec.tls listener, through the whole
        gateway; with http2 false the same client gets HTTP/1.1.
        """
        from tests.support.h2client import connect_h2

        backend = SiteBackend(answer(body=b"from the backend")).start()
        self.addCleanup(backend.stop)
        certificate = self.issue("a", ["localhost"])
        proxy = (
            "---\nkind: Route\nmetadata: {name: p}\nspec:\n  match: /api/\n"
            "  access: {auth: public}\n"
            f'  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}\n'
        )
        _, port = self.serve(tls_gateway([certificate[:2]]) + HEALTH + proxy)
        self.tls_certificate = self.ca.root_pem
        client = await connect_h2(self, port, [b"h2", b"http/1.1"])
        proxied = await client.request(b"GET", b"/api/x")
        self.assertEqual(client.negotiated, b"h2")
        self.assertEqual((proxied.status, proxied.body), (200, b"from the backend"))
        self.assertEqual(backend.requests[0].header(b"x-forwarded-proto"), b"https")
        _, port = self.serve(tls_gateway([certificate[:2]], "    http2: false\n") + HEALTH)
        context = client_context(self.ca.root_pem, alpn=["h2", "http/1.1"])
        health = await handshake(port, context=context, request=get_request("/healthz"))
        self.assertEqual(health.alpn, "http/1.1")
        self.assertTrue(health.response.startswith(b"HTTP/1.1 200 "), health.response)

    async def test_reload_switches_certificates(self) -> None:
        """
        A reload reads the certificate files again: new connections get the new
        certificate on the same socket; a bad one refuses the reload.
        """
        first = self.issue("a", ["localhost"])
        text = tls_gateway([first[:2]]) + HEALTH
        service, port = self.serve(text)
        self.assertEqual((await handshake(port)).certificate, der(first[2]))
        renewed = self.issue("a", ["localhost"])  # renewed at the same paths
        open_before = await handshake(port)
        self.assertTrue(await service.reload())
        self.assertEqual((await handshake(port)).certificate, der(renewed[2]))
        # The renewal's serial, as a client reads it (certbot's deploy hook reloads).
        seen = x509.load_der_x509_certificate((await handshake(port)).certificate)
        self.assertEqual(seen.serial_number, serial(renewed[2]))
        self.assertNotEqual(seen.serial_number, serial(first[2]))
        self.assertEqual(open_before.certificate, der(first[2]))
        # An expired certificate at the same paths refuses the reload.
        shutil.copy(renewed[0], renewed[0] + ".good")
        shutil.copy(renewed[1], renewed[1] + ".good")
        now = datetime.datetime.now(datetime.UTC)
        self.issue(
            "a",
            ["localhost"],
            not_before=now - datetime.timedelta(days=9),
            not_after=now - datetime.timedelta(days=1),
        )
        self.assertFalse(await service.reload())
        self.assertEqual((await handshake(port)).certificate, der(renewed[2]))
        # Another certificate, added: SNI finds it after the reload.
        other = self.issue("b", ["other.example"])
        shutil.copy(renewed[0] + ".good", renewed[0])
        shutil.copy(renewed[1] + ".good", renewed[1])
        root = os.path.join(self.directory, "config")
        write_tree(root, {"a.yaml": tls_gateway([first[:2], other[:2]]) + HEALTH})
        self.assertTrue(await service.reload())
        self.assertEqual((await handshake(port, "other.example")).certificate, der(other[2]))
        self.assertEqual((await handshake(port)).certificate, der(renewed[2]))
        # http2 turned off: ALPN offers http/1.1 alone from the switch on.
        h2 = client_context(alpn=["h2", "http/1.1"])
        self.assertEqual((await handshake(port, context=h2)).alpn, "h2")
        write_tree(root, {"a.yaml": tls_gateway([first[:2]], "    http2: false\n") + HEALTH})
        self.assertTrue(await service.reload())
        self.assertFalse(service.gateway.site.http2)
        self.assertEqual((await handshake(port, context=h2)).alpn, "http/1.1")

    async def test_reload_cannot_turn_tls_off(self) -> None:
        first = self.issue("a", ["localhost"])
        service, port = self.serve(tls_gateway([first[:2]]) + HEALTH)
        root = os.path.join(self.directory, "config")
        write_tree(
            root,
            {
                "a.yaml": "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
                '  listen: "127.0.0.1:0"\n' + HEALTH
            },
        )
        self.assertFalse(await service.reload())
        self.assertEqual((await handshake(port)).certificate, der(first[2]))


class SocketActivationTests(TestCase):
    async def test_systemd_socket_wrapped_in_tls(self) -> None:
        """
        The socket systemd passes in (the worker template's shared one) is served with
        TLS; a second one serves redirectHTTP, naming the first one's port.
        """
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = CertificateAuthority()
        key, cert, leaf = ca.issue(directory, ["localhost"])
        listeners = [listening_socket(), listening_socket()]
        for listener in listeners:
            self.addCleanup(listener.close)
        port, redirect_port = (listener.getsockname()[1] for listener in listeners)
        root = write_tree(
            os.path.join(directory, "config"),
            {
                "a.yaml": tls_gateway([(cert, key)], listen="systemd:domain=INET:index=0")
                + '  redirectHTTP: {listen: "systemd:domain=INET:index=1"}\n'
                + HEALTH
            },
        )
        protocol, process = spawn_socket_activated(listeners, root, "https:http")
        self.addCleanup(kill, process)
        await protocol.listening
        context = client_context(ca.root_pem)
        handshaken = await handshake(port, context=context, request=get_request("/healthz"))
        self.assertEqual(handshaken.certificate, der(leaf))
        self.assertTrue(handshaken.response.startswith(b"HTTP/1.1 200 "), handshaken.response)
        from tests.support.h2client import connect_h2

        self.tls_certificate = ca.root_pem
        client = await connect_h2(self, port, [b"h2", b"http/1.1"])
        over_h2 = await client.request(b"GET", b"/healthz")
        self.assertEqual((client.negotiated, over_h2.status), (b"h2", 200))
        client.close()
        await client.closed
        redirected = await raw_exchange(redirect_port, get_request("/healthz?a", "localhost"))
        self.assertTrue(redirected.startswith(b"HTTP/1.1 308 "), redirected)
        self.assertIn(b"\r\nLocation: https://localhost:%d/healthz?a\r\n" % port, redirected)
        process.signalProcess("TERM")
        await protocol.ended
