"""
Tests for L{edgegw.server.listen}.
"""

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.ssl import Certificate
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, readBody
from twisted.web.http_headers import Headers

from edgegw.assembly.assemble import build_gateway
from edgegw.config.addresses import endpoint_description
from edgegw.config.parse import load_config
from edgegw.service import GatewayService
from tests.support.certificates import make_certificate
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import spawn_socket_activated
from tests.support.processes import (
    connections_closed,
    http_client,
    http_get,
    kill,
    listening_socket,
    port_of,
)


class EndpointDescriptionTests(SynchronousTestCase):
    def test_forms(self) -> None:
        self.assertEqual(endpoint_description(":8080"), "tcp6:8080:interface=\\:\\:")
        self.assertEqual(endpoint_description("127.0.0.1:8080"), "tcp:8080:interface=127.0.0.1")
        self.assertEqual(endpoint_description("[::1]:8080"), "tcp6:8080:interface=\\:\\:1")
        for endpoint in ("tcp:8080", "ssl:8443:privateKey=k.pem", "systemd:domain=INET:index=0"):
            self.assertEqual(endpoint_description(endpoint), endpoint)

    def test_invalid(self) -> None:
        for bad in ("8080", "localhost", ":0x50", "127.0.0.1:99999", "::1:8080", "[]:80", ":"):
            self.assertRaises(ValueError, endpoint_description, bad)


class ListenOverSocketsTests(TestCase):
    """
    The gateway listening on each supported form, reached by a real client.
    """

    def start(self, listen: str) -> GatewayService:
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY.replace('"127.0.0.1:0"', f'"{listen}"')
                + "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /, handler: "
                "{type: health}}\n"
            },
        )
        gateway = build_gateway(load_config(root, {}), reactor)
        service = GatewayService(gateway, reactor)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        return service

    @inlineCallbacks
    def test_ipv4(self) -> Any:
        service = self.start("127.0.0.1:0")
        assert service.port is not None
        response = yield http_get(f"http://127.0.0.1:{port_of(service)}/")
        self.assertEqual(response.code, 200)
        yield response.content()

    @inlineCallbacks
    def test_ipv6(self) -> Any:
        service = self.start("[::1]:0")
        assert service.port is not None
        agent = Agent(reactor)
        url = f"http://[::1]:{port_of(service)}/".encode()
        response = yield agent.request(b"GET", url, Headers({b"connection": [b"close"]}))
        self.assertEqual(response.code, 200)
        yield readBody(response)

    @inlineCallbacks
    def test_tls_termination(self) -> Any:
        directory = self.mktemp()
        os.makedirs(directory)
        key_path, cert_path, cert_pem = make_certificate(directory, "localhost")
        service = self.start(f"ssl:0:interface=127.0.0.1:privateKey={key_path}:certKey={cert_path}")
        assert service.port is not None
        trust = Certificate.loadPEM(cert_pem)
        client = http_client(
            lambda pool: Agent(
                reactor, contextFactory=BrowserLikePolicyForHTTPS(trustRoot=trust), pool=pool
            )
        )
        response = yield client.get(f"https://localhost:{port_of(service)}/")
        self.assertEqual(response.code, 200)
        self.assertEqual((yield response.json()), {"status": "ok"})
        yield connections_closed()

    def test_bind_failure_is_a_clean_exit(self) -> None:
        service = self.start("127.0.0.1:0")
        assert service.port is not None
        taken = port_of(service)
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY.replace('"127.0.0.1:0"', f'"127.0.0.1:{taken}"')
                + "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /, handler: "
                "{type: health}}\n"
            },
        )
        gateway = build_gateway(load_config(root, {}), reactor)
        second = GatewayService(gateway, reactor)
        e = self.assertRaises(SystemExit, second.privilegedStartService)
        self.assertEqual(e.code, 1)


class SocketActivationTests(TestCase):
    @inlineCallbacks
    def test_systemd_endpoint(self) -> Any:
        listener = listening_socket()
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY.replace('"127.0.0.1:0"', '"systemd:domain=INET:index=0"')
                + "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /, handler: "
                "{type: health}}\n"
            },
        )
        protocol, process = spawn_socket_activated(listener, root, "edgegw.socket")
        self.addCleanup(kill, process)
        yield protocol.listening
        response = yield http_get(f"http://127.0.0.1:{port}/")
        self.assertEqual(response.code, 200)
        yield response.content()
        process.signalProcess("TERM")
        yield protocol.ended
