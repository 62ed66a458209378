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
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from edgegw.config.model import KvStoreConfig
from edgegw.state.kvstore import KvStoreService
from edgegw.state.sentinels import SentinelEndpoint
from tests.support.redis import redis_server
from tests.support.sentinel import MASTER_NAME, FakeSentinel, sleep

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
