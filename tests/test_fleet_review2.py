"""
Review of 3bb627a (a cancelled Sentinel discovery) and 90cc269 (rate-limit fields on
passing responses): each test is a finding, failing on the reviewed code.

  - Sentinel discovery goes on after its connection attempt is cancelled while a
    Sentinel's connection is still being made: Twisted's L{HostnameEndpoint} fails a
    cancelled attempt with C{DNSLookupError} (cancelled while resolving) or
    C{ConnectingCancelledError} (while connecting), neither a C{CancelledError}, so
    the next Sentinel is asked and a master connected for a stopped store.

Real sockets on 127.0.0.1, a real redis-server as the master.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from wsproto import ConnectionType, WSConnection
from wsproto.events import Request as WSRequest
from zope.interface import implementer

from edgegw.config.errors import ConfigError
from edgegw.config.model import KvStoreConfig
from edgegw.plugins.interfaces import IRequestHook, IRequestPlugin
from edgegw.plugins.messages import PluginRequest
from edgegw.plugins.stages import PluginError
from edgegw.state.kvstore import KvStoreService
from edgegw.state.sentinels import SentinelEndpoint
from tests.support.backends import SiteBackend
from tests.support.gateways import start_gateway
from tests.support.h2client import connect_h2, listen_tls
from tests.support.plugin_dists import install_plugins
from tests.support.processes import listen_local, port_of
from tests.support.rawclient import connect
from tests.support.redis import redis_server
from tests.support.sentinel import MASTER_NAME, FakeSentinel, sleep
from tests.test_plugins import fetch, request_plugin, route
from tests.test_proxy import EchoWebSocket

reactor: Any = _reactor

WITHIN = 30.0
"""The most seconds a wait for an outcome may take (a bound, never asserted)."""


async def until(test: TestCase, what: str, check: Any) -> None:
    deadline = reactor.seconds() + WITHIN
    while reactor.seconds() < deadline:
        if check():
            return
        await sleep(0.02)
    test.fail(f"{what}: not within {WITHIN:g}s")


class _Recording(Factory):
    """Builds plain protocols and keeps them (to close what a test leaked)."""

    def __init__(self) -> None:
        self.built: list[Protocol] = []

    def buildProtocol(self, addr: Any) -> Protocol:
        protocol = Protocol()
        self.built.append(protocol)
        return protocol

    def close_all(self) -> None:
        for protocol in self.built:
            if protocol.transport is not None:
                protocol.transport.loseConnection()


def unanswered_address(test: TestCase) -> str:
    """
    A loopback address whose TCP handshake never completes (a Sentinel host that drops
    SYNs, as a blackholed one does): a listener with a backlog of 0, its one slot taken
    by a connection never accepted, so Linux drops further SYNs.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    test.addCleanup(listener.close)
    test.addCleanup(filler.close)
    return f"127.0.0.1:{listener.getsockname()[1]}"


class CancelledDiscoveryTests(TestCase):
    """
    A discovery cancelled before a Sentinel's connection is made.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.master = await redis_server(self)
        self.honest = FakeSentinel(self, ("127.0.0.1", self.master.port))

    async def test_cancelled_while_the_first_sentinel_connects(self) -> None:
        """
        Cancelled at once (the store stopped just after starting: a reload, a stop
        during startup), while the first Sentinel's connection is being resolved and
        made: the attempt must fail with C{CancelledError} and ask no Sentinel.
        Reviewed code: C{HostnameEndpoint} turns the cancellation into
        C{DNSLookupError}/C{ConnectingCancelledError}, the discovery takes that for the
        first Sentinel's failure, asks the second, and connects the master.
        """
        first = FakeSentinel(self, ("127.0.0.1", self.master.port))
        config = KvStoreConfig(
            sentinels=(first.address, self.honest.address),
            master_name=MASTER_NAME,
            timeout=WITHIN,
        )
        endpoint = SentinelEndpoint(config, reactor, None)
        factory = _Recording()
        self.addCleanup(factory.close_all)
        outcomes: list[object] = []
        attempt = endpoint.connect(factory)
        attempt.addBoth(outcomes.append)
        attempt.cancel()
        await until(self, "the attempt's outcome", lambda: outcomes)
        self.assertEqual(self.honest.asked, [], "a Sentinel was asked after the cancellation")
        self.assertIsNone(endpoint.current, "a master was connected after the cancellation")
        self.assertEqual(factory.built, [])
        self.assertIsInstance(outcomes[0], Failure)
        assert isinstance(outcomes[0], Failure)
        outcomes[0].trap(CancelledError)

    async def test_store_stopped_while_a_sentinel_host_does_not_answer_syn(self) -> None:
        """
        The store stopped while its first Sentinel's host does not complete the TCP
        handshake (down behind a firewall that drops): stopping must not ask the next
        Sentinel nor connect the master. Reviewed code: ClientService cancels the
        attempt, C{ConnectingCancelledError} is taken for that Sentinel's failure, the
        next is asked, the master connected for a service already stopping (Twisted's
        state machine then raises C{NoTransition} when that connection closes).
        """
        config = KvStoreConfig(
            sentinels=(unanswered_address(self), self.honest.address),
            master_name=MASTER_NAME,
            timeout=WITHIN,
        )
        store = KvStoreService(config, "t:", reactor, first_retry=0.05, retry_cap=0.3)
        store.startService()
        # Setup only (not asserted): the attempt is past name resolution and waits on
        # the TCP handshake; a stop earlier still shows the same.
        await sleep(0.3)
        await store.stopService()
        # Whatever the discovery still does after the stop, give it the time to.
        await sleep(0.5)
        self.assertEqual(
            self.honest.asked, [], "the next Sentinel was asked after the store stopped"
        )


@implementer(IRequestHook)
class _ConnectionSpecific:
    """Adds fields valid on HTTP/1.1 that an HTTP/2 message cannot carry."""

    def on_request(self, request: PluginRequest) -> None:
        for name, value in _H2_MALFORMED:
            request.add_response_header(name, value)


_H2_MALFORMED = (("TE", "trailers"), ("X-Padded", " v "))
"""
RFC 9113 section 8.2.2: TE is connection-specific (allowed in requests only); 8.2.1: a
field value must not start or end with SP or HTAB. Each makes the response malformed.
"""


@implementer(IRequestPlugin)
class _ConnectionSpecificPlugin:
    def request_hook(self, config: Mapping[str, Any]) -> _ConnectionSpecific:
        return _ConnectionSpecific()


connection_specific = _ConnectionSpecificPlugin()
"""A test plugin adding C{TE} and a value with surrounding spaces."""


class AddResponseHeaderTests(TestCase):
    """
    C{PluginRequest.add_response_header} and C{headers: always} through a real gateway.
    """

    def setUp(self) -> None:
        install_plugins(
            self,
            {
                "rate-limit": "edgegw.plugins.rate_limit:plugin",
                "connection-specific": "tests.test_fleet_review2:connection_specific",
            },
            name="edgegw-fleet-review2",
        )
        self.backend = SiteBackend().start()
        self.addCleanup(self.backend.stop)
        self.clock = Clock()

    async def test_http2_response_stays_well_formed(self) -> None:
        """
        Fields a plugin adds are accepted (C{TE} is not among the refused names, the
        value check allows surrounding spaces) and C{send_head} puts them in the HTTP/2
        head as they are (h2's outbound validation is off, and C{CONNECTION_SPECIFIC}
        filters only the response's own fields): the client gets a malformed response,
        which a conforming client (nghttp2, Go, h2 with its default checks) refuses
        with a stream error. The gateway must refuse them (C{ValueError}: 500, as for
        any other refused field) or leave them out of HTTP/2 heads; either way the head
        it sends must be well formed.
        """
        gateway, _ = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            clock=self.clock,
            routes=request_plugin("cs", "connection-specific"),
        )
        client = await connect_h2(self, listen_tls(self, gateway.site))
        # Read what the gateway sends, as it is (the test's checks are below).
        client.h2.config.validate_inbound_headers = False
        response = await client.request(b"GET", b"/x")
        malformed = [
            (name, value)
            for name, value in response.headers
            if name == b"te" or value != value.strip(b" \t")
        ]
        self.assertEqual(malformed, [], f"status {response.status}")
        # A fix that refuses them answers 500 and logs the plugin's failure.
        self.flushLoggedErrors(PluginError)

    async def test_policy_name_outside_printable_ascii(self) -> None:
        """
        A RequestPlugin's name is any string (C{metadata.name} is not checked), and the
        policy is named after it in an sf-string, which carries printable ASCII only
        (RFC 8941 section 3.3.3). With C{headers: always}, a name beyond Latin-1 makes
        C{add_response_header} raise on every passing request (each answers 500 while
        C{edgegw check} passed the configuration), and a Latin-1 one sends a field no
        structured-field parser accepts. Expected: refused at load, or a policy name
        an sf-string can carry.
        """
        port = self.serve("лимит")
        if port is None:
            return
        statuses = [(await fetch(port, "GET", "/x"))[0] for _ in range(4)]
        # Burst 3: three pass, the fourth is limited (its 429 names the policy too).
        self.assertEqual(statuses, [200, 200, 200, 429])

    async def test_policy_name_latin1_is_not_an_sf_string(self) -> None:
        port = self.serve("débit")
        if port is None:
            return
        status, headers, _ = await fetch(port, "GET", "/x")
        self.assertEqual(status, 200)
        values = headers.get("ratelimit-policy", []) + headers.get("ratelimit", [])
        self.assertEqual(len(values), 2)
        for value in values:
            self.assertTrue(
                all(0x20 <= ord(c) <= 0x7E for c in value),
                f"{value!r} is not a structured field (sf-string beyond printable ASCII)",
            )

    def serve(self, name: str) -> int | None:
        """
        A gateway whose rate-limit resource (C{headers: always}) is C{name}; L{None}
        when the configuration is refused at load (a fix as good as another).
        """
        try:
            _, port = start_gateway(
                self,
                f"http://127.0.0.1:{self.backend.port}",
                clock=self.clock,
                routes=request_plugin(
                    name, "rate-limit", config={"rate": "6/m", "burst": 3, "headers": "always"}
                ),
            )
        except ConfigError:
            return None
        return port

    async def test_websocket_handshake_carries_them(self) -> None:
        """
        docs/plugins.md: with C{headers: always}, passing responses carry both fields
        "whatever answers the request: the backend, ...". A WebSocket handshake the
        backend accepts is answered 101 with a head the tunnel writes itself
        (C{Tunnel._head}, from the upstream's fields only): the fields a request plugin
        added are dropped. Either the tunnel writes C{ResponseHeaders.appended} too, or
        the docs say that a 101 carries none.
        """
        echo = listen_local(Factory.forProtocol(EchoWebSocket))
        self.addCleanup(echo.stopListening)
        _, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            clock=self.clock,
            routes=request_plugin(
                "limit", "rate-limit", config={"rate": "6/m", "burst": 3, "headers": "always"}
            )
            + route("ws", "/ws", f"http://127.0.0.1:{port_of(echo)}"),
        )
        client = await connect(port)
        self.addCleanup(client.close)
        ws = WSConnection(ConnectionType.CLIENT)
        client.send(ws.send(WSRequest(host="gateway.test", target="/ws")))
        await client.until(b"\r\n\r\n")
        head = client.received.partition(b"\r\n\r\n")[0].lower()
        self.assertTrue(head.startswith(b"http/1.1 101 "), head)
        self.assertIn(b"\r\nratelimit-policy: ", head)
        self.assertIn(b"\r\nratelimit: ", head)
