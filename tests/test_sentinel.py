"""
The C{kvstore} store through Redis Sentinel (issue 37), on real processes: a master,
two replicas and three Sentinels (L{tests.support.sentinel.SentinelCluster}), and
Sentinels of the test's own that lie or are down (L{FakeSentinel}).

  - The store finds the master through the Sentinels and follows a failover (the
    master killed, or frozen by SIGSTOP and later back as a replica) with no restart;
    its pub/sub connection follows too, and subscriptions are made again.
  - A master demoted to a replica under a live connection (C{READONLY}) is a failover
    signal: the store finds the master again.
  - A Sentinel that is down, or names a server that is not the master, is passed over.
  - A gateway with server-side sessions through the Sentinels: sessions that had
    replicated answer 200 again after the failover with no new login; meanwhile
    session routes fail closed, public routes answer, C{/readyz} says not ready.
  - Config errors.

No pass/fail assertion is on a timing: waits are bounded generously, and outcomes are
counted.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError, Deferred, gatherResults
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from edgegw.config.errors import Location
from edgegw.config.model import KvStoreConfig
from edgegw.state.kvstore import KvStoreService, provider
from edgegw.state.sentinels import SentinelEndpoint
from edgegw.state.store import StoreError, StoreUnavailableError
from tests.support.backends import SiteBackend, answer
from tests.support.browser import USER_AGENT, Browser
from tests.support.daemons import GatewayProcess, HttpAnswer, http_exchange
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of, refused_port
from tests.support.redis import RedisProbe, RedisServer, TestCA, redis_command, redis_server
from tests.support.sentinel import MASTER_NAME, FakeSentinel, SentinelCluster, sleep
from tests.support.sessions import (
    COOKIE,
    KEY,
    SessionGateway,
    server_session_config,
    stream_backend,
)

reactor: Any = _reactor

WITHIN = 60.0
"""The most seconds a wait for an outcome may take (bounds, never asserted)."""


def sentinel_store(
    test: TestCase, sentinels: list[str], trust_root: Any = None, **fields: Any
) -> KvStoreService:
    config = KvStoreConfig(sentinels=tuple(sentinels), master_name=MASTER_NAME, timeout=1.0)
    if fields:
        config = KvStoreConfig(**{**_fields(config), **fields})
    store = KvStoreService(
        config, "t:", reactor, trust_root=trust_root, first_retry=0.05, retry_cap=0.3
    )
    store.startService()
    test.addCleanup(store.stopService)
    return store


def _fields(config: KvStoreConfig) -> dict[str, Any]:
    return attrs.asdict(config, recurse=False)


async def until(test: TestCase, what: str, check: Any) -> Any:
    """
    Call the async C{check} until it returns a true value (errors count as false);
    that value. Fails after L{WITHIN} seconds.
    """
    deadline = reactor.seconds() + WITHIN
    last: Any = None
    while reactor.seconds() < deadline:
        try:
            value = await check()
            if value:
                return value
            last = value
        except Exception as e:
            last = e
        await sleep(0.05)
    test.fail(f"{what}: not within {WITHIN:g}s (last: {last!r})")


async def replicated(server: RedisServer, key: bytes, value: bytes) -> bool:
    return bool(await redis_command(server.port, "GET", key) == value)


class SentinelStoreTests(TestCase):
    """
    The store on a real Sentinel deployment.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.cluster = await SentinelCluster(self).start()
        self.master = self.cluster.servers[0]
        self.replicas = self.cluster.servers[1:]

    async def written_everywhere(self, store: KvStoreService, key: bytes, value: bytes) -> None:
        await until(self, "store ready", lambda: store.set(key, value, 300).addCallback(bool_))
        for replica in self.replicas:
            await until(self, "replicated", lambda r=replica: replicated(r, b"t:" + key, value))

    async def test_finds_the_master_and_follows_a_kill(self) -> None:
        store = sentinel_store(self, self.cluster.sentinel_addresses)
        await self.written_everywhere(store, b"k", b"v")
        self.assertEqual(await RedisProbe(self.master).get(b"t:k"), b"v")
        await self.master.stop()
        promoted = await self.cluster.failed_over(self.master.port)
        outcomes = await self.count_until_answered(store, b"k", b"v")
        self.assertEqual(await store.get(b"k"), b"v")
        await store.set(b"k2", b"after", 300)
        self.assertEqual(await RedisProbe(promoted).get(b"t:k2"), b"after")
        self.assertEqual(set(outcomes) - {"ok", "unavailable"}, set(), outcomes)

    async def count_until_answered(
        self, store: KvStoreService, key: bytes, value: bytes
    ) -> dict[str, int]:
        outcomes: dict[str, int] = {}

        async def check() -> bool:
            try:
                got = await store.get(key)
            except StoreUnavailableError:
                outcomes["unavailable"] = outcomes.get("unavailable", 0) + 1
                return False
            except StoreError as e:
                outcomes[f"error: {e}"] = outcomes.get(f"error: {e}", 0) + 1
                return False
            outcomes["ok"] = outcomes.get("ok", 0) + 1
            self.assertEqual(got, value)
            return True

        await until(self, "the store answers after the failover", check)
        return outcomes

    async def test_follows_a_frozen_master_and_its_return_as_a_replica(self) -> None:
        store = sentinel_store(self, self.cluster.sentinel_addresses)
        await self.written_everywhere(store, b"k", b"v")
        self.master.pause()
        promoted = await self.cluster.failed_over(self.master.port)
        await self.count_until_answered(store, b"k", b"v")
        self.master.resume()

        async def a_replica() -> bool:
            role = await redis_command(self.master.port, "ROLE")
            return bool(role[0] == b"slave")

        await until(self, "the old master is a replica", a_replica)
        await until(self, "writes go on", lambda: store.set(b"k3", b"w", 300).addCallback(bool_))
        self.assertEqual(await RedisProbe(promoted).get(b"t:k3"), b"w")

    async def test_pubsub_follows_the_master(self) -> None:
        store = sentinel_store(self, self.cluster.sentinel_addresses)
        received: list[bytes] = []
        await until(self, "store ready", lambda: store.get(b"x").addCallback(lambda _: True))
        await store.subscribe(b"chan", received.append)
        await store.publish(b"chan", b"before")
        await until(self, "message before", lambda: succeed_(b"before" in received))
        await self.master.stop()
        promoted = await self.cluster.failed_over(self.master.port)

        async def published_on_the_new_master() -> bool:
            await redis_command(promoted.port, "PUBLISH", "t:chan", "after")
            return b"after" in received

        await until(self, "a message published on the new master", published_on_the_new_master)

    async def test_pubsub_leaves_a_frozen_master(self) -> None:
        """
        A frozen master (SIGSTOP, never resumed here) keeps the pub/sub connection open
        without a word: once the command connection has found the promoted master, the
        pub/sub connection is dropped and follows.
        """
        store = sentinel_store(self, self.cluster.sentinel_addresses)
        received: list[bytes] = []
        await until(self, "store ready", lambda: store.get(b"x").addCallback(lambda _: True))
        await store.subscribe(b"chan", received.append)
        await store.publish(b"chan", b"before")
        await until(self, "message before", lambda: succeed_(b"before" in received))
        self.master.pause()
        promoted = await self.cluster.failed_over(self.master.port)

        async def published_on_the_new_master() -> bool:
            # Commands go on as the gateway's requests would (a timeout, then the new
            # master).
            try:
                await store.get(b"x")
            except StoreError:
                return False
            await redis_command(promoted.port, "PUBLISH", "t:chan", "after")
            return b"after" in received

        await until(self, "a message published on the new master", published_on_the_new_master)


def bool_(_: object) -> bool:
    return True


async def succeed_(value: bool) -> bool:
    return value


class LyingSentinelTests(TestCase):
    """
    Sentinels of the test's own in front of a real master and its replica.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.master = await redis_server(self)
        self.replica = RedisServer(self)
        self.replica.args += ["--replicaof", "127.0.0.1", str(self.master.port)]
        await self.replica.start()

    async def test_a_sentinel_down_and_one_naming_a_replica_are_passed_over(self) -> None:
        down = f"127.0.0.1:{await refused_port()}"
        liar = FakeSentinel(self, ("127.0.0.1", self.replica.port))
        nobody = FakeSentinel(self, ("127.0.0.1", await refused_port()))
        unknowing = FakeSentinel(self, None)
        honest = FakeSentinel(self, ("127.0.0.1", self.master.port))
        store = sentinel_store(
            self, [down, liar.address, nobody.address, unknowing.address, honest.address]
        )
        await until(self, "store ready", lambda: store.set(b"k", b"v", 30).addCallback(bool_))
        self.assertEqual(await RedisProbe(self.master).get(b"t:k"), b"v")
        self.assertTrue(liar.asked and nobody.asked and unknowing.asked and honest.asked)

    async def test_readonly_is_a_failover_signal(self) -> None:
        """
        The master becomes a replica under the store's live connection (REPLICAOF, as a
        Sentinel's reconfiguration does): the write answered C{READONLY} makes the store
        ask the Sentinels again and go to the new master.
        """
        other = await redis_server(self)
        sentinel = FakeSentinel(self, ("127.0.0.1", self.master.port))
        store = sentinel_store(self, [sentinel.address])
        await until(self, "store ready", lambda: store.set(b"k", b"v", 30).addCallback(bool_))
        sentinel.answer = ("127.0.0.1", other.port)
        await redis_command(self.master.port, "REPLICAOF", "127.0.0.1", str(other.port))
        outcomes: list[str] = []

        async def write() -> bool:
            try:
                await store.set(b"k2", b"w", 30)
            except StoreUnavailableError:
                outcomes.append("unavailable")
                return False
            except StoreError as e:
                outcomes.append(str(e))
                return False
            return True

        await until(self, "writes reach the new master", write)
        self.assertEqual(await RedisProbe(other).get(b"t:k2"), b"w")
        self.assertFalse([o for o in outcomes if o != "unavailable"], outcomes)

    async def test_passwords_of_the_sentinels_and_of_the_master(self) -> None:
        """
        C{sentinelUser}/C{sentinelPassword} authenticate to the Sentinels,
        C{user}/C{password} to the master (its ROLE check included): a Sentinel that
        refuses the credentials is passed over.
        """
        master = await redis_server(self, user="gw", password="master-pw")
        refusing = FakeSentinel(self, ("127.0.0.1", master.port), ("su", "other"))
        sentinel = FakeSentinel(self, ("127.0.0.1", master.port), ("su", "sentinel-pw"))
        store = sentinel_store(
            self,
            [refusing.address, sentinel.address],
            user="gw",
            password="master-pw",
            sentinel_user="su",
            sentinel_password="sentinel-pw",
        )
        await until(self, "store ready", lambda: store.set(b"k", b"v", 30).addCallback(bool_))
        self.assertEqual(sentinel.asked[0], [b"AUTH", b"su", b"sentinel-pw"])
        self.assertEqual(len(refusing.asked), 2)

    async def test_tls_to_the_sentinels_and_the_master(self) -> None:
        """
        C{tls} applies to the Sentinels too, verified against the same trust: a Sentinel
        whose certificate another authority issued is never asked (it could send the
        store anywhere); the one the trusted authority issued is, and the master is
        reached over TLS.
        """
        master = await redis_server(self, tls=True)
        assert master.ca is not None
        other_ca = TestCA(self.mktemp_dir(), "another CA")
        impostor = FakeSentinel(
            self, ("127.0.0.1", master.port), tls=other_ca.issue("impostor", ["127.0.0.1"])
        )
        sentinel = FakeSentinel(
            self, ("127.0.0.1", master.port), tls=master.ca.issue("sentinel", ["127.0.0.1"])
        )
        store = sentinel_store(
            self, [impostor.address, sentinel.address], master.ca.trust_root(), tls=True
        )
        await until(self, "store ready", lambda: store.set(b"k", b"v", 30).addCallback(bool_))
        self.assertEqual(await RedisProbe(master).get(b"t:k"), b"v")
        self.assertEqual(impostor.asked, [])
        self.assertTrue(sentinel.asked)

    def mktemp_dir(self) -> str:
        path = str(self.mktemp())
        os.makedirs(path)
        return path

    async def test_a_reload_with_the_same_sentinels_keeps_the_connections(self) -> None:
        sentinel = FakeSentinel(self, ("127.0.0.1", self.master.port))
        old = sentinel_store(self, [sentinel.address])
        await until(self, "store ready", lambda: old.set(b"k", b"v", 30).addCallback(bool_))
        config = old.config
        same = KvStoreService(config, "t:", reactor, first_retry=0.05, retry_cap=0.3)
        self.assertTrue(same.take_over(old))
        for changed in (
            {"sentinels": (sentinel.address, "127.0.0.1:1")},
            {"master_name": "other"},
            {"sentinel_password": "p"},
        ):
            other = KvStoreService(
                KvStoreConfig(**{**_fields(config), **changed}),
                "t:",
                reactor,
                first_retry=0.05,
                retry_cap=0.3,
            )
            self.assertFalse(other.take_over(old), changed)

    async def test_no_sentinel_answers(self) -> None:
        store = sentinel_store(self, [f"127.0.0.1:{await refused_port()}"])
        await sleep(0.3)
        with self.assertRaises(StoreUnavailableError):
            await store.get(b"k")
        self.assertFalse(store.connected)

    async def test_a_cancelled_discovery_asks_no_further_sentinel(self) -> None:
        """
        Cancelling a connection attempt while a Sentinel has not answered (the store
        stopping) ends the discovery: the next Sentinel is not asked and no master is
        connected. (A discovery that took the cancellation for a Sentinel's failure went
        on and connected a master for a connection service already stopped, whose later
        loss then raised in Twisted's state machine.)
        """
        silent = _Silent()
        listening = listen_local(silent)
        self.addCleanup(listening.stopListening)
        honest = FakeSentinel(self, ("127.0.0.1", self.master.port))
        config = KvStoreConfig(
            sentinels=(f"127.0.0.1:{port_of(listening)}", honest.address),
            master_name=MASTER_NAME,
            timeout=WITHIN,
        )
        endpoint = SentinelEndpoint(config, reactor, None)
        outcomes: list[object] = []
        attempt = endpoint.connect(Factory.forProtocol(Protocol))
        attempt.addBoth(outcomes.append)
        await until(self, "the silent Sentinel connected", lambda: succeed_(bool(silent.made)))
        attempt.cancel()
        self.assertEqual(len(outcomes), 1)
        self.assertIsInstance(outcomes[0], Failure)
        assert isinstance(outcomes[0], Failure)
        outcomes[0].trap(CancelledError)
        await until(self, "the silent Sentinel's connection closed", lambda: succeed_(silent.lost))
        self.assertEqual(honest.asked, [])
        self.assertIsNone(endpoint.current)


class _Silent(Factory):
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.made = 0
        self.lost = False

    def buildProtocol(self, addr: Any) -> Protocol:
        protocol = Protocol()
        protocol.connectionMade = self._made  # type: ignore[method-assign]
        protocol.connectionLost = self._lost  # type: ignore[method-assign]
        return protocol

    def _made(self) -> None:
        self.made += 1

    def _lost(self, reason: object = None) -> None:
        self.lost = True


class SentinelConfigTests(TestCase):
    """
    The kvstore fields for Sentinel, and their located errors.
    """

    def problems(self, config: dict[str, Any]) -> list[str]:
        return [str(p) for p in provider.validate(config, Location("f.yaml", 1), "config")]

    def test_valid(self) -> None:
        self.assertEqual(
            self.problems(
                {
                    "sentinels": ["127.0.0.1:26379", "[::1]:26380"],
                    "masterName": "m",
                    "sentinelUser": "s",
                    "sentinelPassword": "p",
                    "password": "x",
                }
            ),
            [],
        )

    def test_errors(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"sentinels": ["a:1"], "address": "b:2", "masterName": "m"}, "mutually exclusive"),
            ({"sentinels": ["a:1"]}, "config.masterName: required field is missing"),
            ({"sentinels": ["a:1"], "masterName": ""}, "config.masterName: must not be empty"),
            ({"sentinels": [], "masterName": "m"}, "config.sentinels: must not be an empty"),
            ({"sentinels": ["nohost"], "masterName": "m"}, 'config.sentinels[0]: "nohost"'),
            ({"sentinels": "a:1", "masterName": "m"}, "config.sentinels: expected a list"),
            ({"address": "a:1", "masterName": "m"}, "config.masterName: is only used with"),
            ({"address": "a:1", "sentinelPassword": "p"}, "config.sentinelPassword: is only"),
            (
                {"sentinels": ["a:1"], "masterName": "m", "sentinelUser": "u"},
                "config.sentinelUser: is only used with sentinelPassword",
            ),
            ({}, "config.address: required field is missing (or give sentinels)"),
        ]
        for config, expected in cases:
            problems = self.problems(config)
            self.assertTrue(
                any(expected in p and "f.yaml" in p for p in problems), (config, problems)
            )


class SentinelGatewayTests(TestCase):
    """
    A gateway with server-side sessions in Redis reached through the Sentinels.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.cluster = await SentinelCluster(self).start()
        self.idp = FakeIdP()
        await self.idp.start(self)
        self.backend, _ = stream_backend()
        self.addCleanup(self.backend.stop)
        self.gw = SentinelGateway(self, self.idp, self.backend, self.cluster)
        await self.gw.start()

    async def login(self) -> Browser:
        browser = Browser()
        back = await self.gw.login(browser)
        self.assertEqual(back.status, 302, back.body)
        self.assertIn(COOKIE, browser.cookies)
        return browser

    async def sessions_replicated(self, browsers: list[Browser]) -> None:
        keys = [self.gw.record_key(b) for b in browsers]
        master = self.cluster.servers[0]
        # Every record on both replicas before the master goes: only what had replicated
        # is promised to survive.
        for replica in self.cluster.servers[1:]:

            async def has_all(r: RedisServer = replica) -> bool:
                for key in keys:
                    if await redis_command(r.port, "EXISTS", key) != 1:
                        return False
                return True

            await until(self, "the sessions replicated", has_all)
        for key in keys:
            self.assertIsNotNone(await RedisProbe(master).get(key))

    async def outage(self, browsers: list[Browser], old: int) -> dict[str, int]:
        """
        Ask every session route and a public route over and over until every session
        answers 200 after a master other than C{old} is promoted; the statuses seen.
        """
        seen: dict[str, int] = {}
        promoted = False
        closed: list[float] = []

        async def round_() -> bool:
            nonlocal promoted
            public = await Browser().get(self.gw.url("/open/x"))
            seen[f"public {public.status}"] = seen.get(f"public {public.status}", 0) + 1
            ready = await Browser().get(self.gw.url("/readyz"))
            seen[f"readyz {ready.status}"] = seen.get(f"readyz {ready.status}", 0) + 1
            statuses = []
            for browser in browsers:
                answer = await browser.get(self.gw.url("/app/x"))
                statuses.append(answer.status)
                seen[f"app {answer.status}"] = seen.get(f"app {answer.status}", 0) + 1
                if answer.status != 200:
                    closed.append(reactor.seconds())
            if not promoted:
                port = await self.cluster.master_port()
                promoted = port is not None and port != old
            return promoted and all(s == 200 for s in statuses)

        started = reactor.seconds()
        await until(self, "every session answers 200 after the failover", round_)
        # Reported, never asserted: how long session routes failed closed.
        span = f"{closed[-1] - started:.1f}s" if closed else "none"
        print(f"\nfail-closed answers until {span} after the master went: {seen}")
        return seen

    async def failover(self, how: str) -> None:
        browsers = [await self.login() for _ in range(5)]
        for browser in browsers:
            self.assertEqual((await browser.get(self.gw.url("/app/x"))).status, 200)
        await self.sessions_replicated(browsers)
        await until(self, "ready", self.ready)
        master = self.cluster.servers[0]
        if how == "kill":
            await master.stop()
        else:
            master.pause()
        cookies = [b.cookies[COOKIE] for b in browsers]
        seen = await self.outage(browsers, master.port)
        # Session routes failed closed as documented for a store that does not answer (a
        # redirect to the login on an app route), never a 500; and no answer cleared a
        # session cookie: the same sessions answer afterwards, with no new login.
        self.assertEqual(
            {k for k in seen if k.startswith("app ")} - {"app 200", "app 302"}, set(), seen
        )
        self.assertEqual([b.cookies[COOKIE] for b in browsers], cookies)
        self.assertEqual({k for k in seen if k.startswith("public ")}, {"public 200"}, seen)
        self.assertEqual(
            {k for k in seen if k.startswith("readyz ")} - {"readyz 200", "readyz 503"},
            set(),
            seen,
        )
        # /readyz said not ready while no master answered (the failover lasts at least
        # down-after-milliseconds; the endpoint asks the store once a second).
        self.assertIn("readyz 503", seen)
        for browser in browsers:
            self.assertEqual((await browser.get(self.gw.url("/app/x"))).status, 200)
        await until(self, "ready again", self.ready)
        if how == "pause":
            master.resume()

    async def ready(self) -> bool:
        return (await Browser().get(self.gw.url("/readyz"))).status == 200

    async def test_sessions_survive_a_killed_master(self) -> None:
        await self.failover("kill")

    async def test_sessions_survive_a_frozen_master(self) -> None:
        await self.failover("pause")


class SentinelGateway(SessionGateway):
    """
    A L{SessionGateway} whose kvstore is given the cluster's Sentinels (and a readiness
    endpoint at C{/readyz}).
    """

    def __init__(self, test: TestCase, idp: FakeIdP, backend: Any, cluster: SentinelCluster):
        super().__init__(test, idp, backend, cluster.servers[0])
        self.cluster = cluster

    async def start(self, wait_for_store: bool = True) -> SentinelGateway:
        """
        Start as L{SessionGateway} does, and tell readiness that it listens (the service
        tree would).
        """
        await super().start(wait_for_store)
        readiness = self.gateway.readiness
        assert readiness is not None
        readiness.listening = True
        return self

    def config_text(self) -> str:
        text = super().config_text()
        address = f'address: "{self.redis.address}"'
        assert address in text
        sentinels = ", ".join(f'"{a}"' for a in self.cluster.sentinel_addresses)
        text = text.replace(address, f"sentinels: [{sentinels}], masterName: {MASTER_NAME}")
        readiness = "  readiness: {path: /readyz}\n"
        return text.replace("  stateProvider:\n", readiness + "  stateProvider:\n")


class TwoGatewaysUnderLoadTests(TestCase):
    """
    Two real gateway processes sharing the sessions through the Sentinels, under a
    steady load of session requests while the master is killed. The seconds of
    fail-closed answers are printed (never asserted); afterwards every session answers
    200 at both, with no new login.
    """

    async def test_kill_the_master_under_load(self) -> None:
        cluster = await SentinelCluster(self).start()
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend"))
        backend.start()
        self.addCleanup(backend.stop)
        text = server_session_config(
            key=KEY,
            redis_address=cluster.servers[0].address,
            issuer=idp.issuer,
            upstream=f"http://127.0.0.1:{backend.port}",
            timeout="1s",
        )
        sentinels = ", ".join(f'"{a}"' for a in cluster.sentinel_addresses)
        text = text.replace(
            f'address: "{cluster.servers[0].address}"',
            f"sentinels: [{sentinels}], masterName: {MASTER_NAME}",
        )
        gateways = [GatewayProcess(self, {"gateway.yaml": text}, name=f"gw{i}") for i in (1, 2)]
        for gw in gateways:
            await gw.start()
            idp.redirect_uris.append(gw.url("/auth/callback"))
        cookies = [await self.login(gateways[i % 2], idp) for i in range(6)]
        for gw in gateways:
            for cookie in cookies:

                async def served(g: GatewayProcess = gw, c: str = cookie) -> bool:
                    return (await self.get(g, c)).status == 200

                await until(self, f"{gw.name} serves the session", served)
        for replica in cluster.servers[1:]:

            async def has_all(r: RedisServer = replica) -> bool:
                keys = await redis_command(r.port, "KEYS", "gw:sess:*")
                return len([k for k in keys if len(k) == len(b"gw:sess:") + 32]) >= len(cookies)

            await until(self, "the sessions replicated", has_all)

        seen: dict[str, list[tuple[float, int]]] = {gw.name: [] for gw in gateways}
        stop = [False]
        killed_at = [0.0]

        async def load(gw: GatewayProcess) -> None:
            while not stop[0]:
                for cookie in cookies:
                    try:
                        status = (await self.get(gw, cookie)).status
                    except Exception:
                        status = 0
                    seen[gw.name].append((reactor.seconds(), status))
                await sleep(0.02)

        loads = [Deferred.fromCoroutine(load(gw)) for gw in gateways]
        await sleep(1.0)
        master = cluster.servers[0]
        killed_at[0] = reactor.seconds()
        await master.stop()
        await cluster.failed_over(master.port)
        promoted_after = reactor.seconds() - killed_at[0]

        async def all_served_again() -> bool:
            for gw in gateways:
                last = seen[gw.name][-len(cookies) :]
                if len(last) < len(cookies) or any(s != 200 for _, s in last):
                    return False
            return True

        await until(self, "both gateways serve every session again", all_served_again)
        stop[0] = True
        await gatherResults(loads)
        report = []
        for gw in gateways:
            failed = [t for t, s in seen[gw.name] if s != 200]
            statuses = {s for _, s in seen[gw.name]}
            self.assertEqual(statuses - {200, 302}, set(), (gw.name, statuses, gw.output))
            span = f"{failed[-1] - failed[0]:.1f}s" if failed else "0s"
            until_ok = f"{failed[-1] - killed_at[0]:.1f}s" if failed else "0s"
            report.append(
                f"{gw.name}: {len(failed)} of {len(seen[gw.name])} answers fail-closed, "
                f"over {span}, the last {until_ok} after the kill"
            )
        print(f"\npromotion seen {promoted_after:.1f}s after the kill\n" + "\n".join(report))
        for gw in gateways:
            for cookie in cookies:
                self.assertEqual((await self.get(gw, cookie)).status, 200)

    async def login(self, gw: GatewayProcess, idp: FakeIdP) -> str:
        browser = Browser()
        start = await browser.get(gw.url("/auth/login?return_to=%2Fopen%2Fx"))
        self.assertEqual(start.status, 302, start.body)
        assert start.absolute_location is not None
        authorized = await browser.get(start.absolute_location)
        assert authorized.absolute_location is not None
        callback = await browser.get(authorized.absolute_location)
        self.assertEqual(callback.status, 302, (callback.body, gw.output))
        return f"{COOKIE}={browser.cookies[COOKIE]}"

    async def get(self, gw: GatewayProcess, cookie: str) -> HttpAnswer:
        return await http_exchange(
            gw.port, "GET", "/app/x", {"Cookie": cookie, "User-Agent": USER_AGENT}
        )


class RefreshLockLostTests(TestCase):
    """
    The refresh lock lost as a failover may lose it (Redis replicates it asynchronously:
    a promoted replica may never have had it): here deleted on the master while one
    gateway holds it and waits for the IdP, so that a second gateway (own single flight,
    the same sessions through the same Sentinels) takes it and refreshes the same session
    with the same refresh token. The rule that holds (docs/architecture.md, "Refresh lock
    across a failover"): the rotating IdP refuses the reuse, the compare-and-set stores
    one refreshed record, both requests are served, and the session goes on everywhere
    with the one live refresh token.
    """

    async def test_a_duplicate_refresh_is_harmless(self) -> None:
        cluster = await SentinelCluster(self).start()
        idp = FakeIdP()
        await idp.start(self)
        backend, _ = stream_backend()
        self.addCleanup(backend.stop)
        first = await SentinelGateway(self, idp, backend, cluster).start()
        second = await SentinelGateway(self, idp, backend, cluster).start()
        # Issued for 30 s, inside the 60 s refreshSkew: the first request refreshes.
        idp.token_lifetime = 30
        browser = Browser()
        self.assertEqual((await first.login(browser)).status, 302)
        idp.token_lifetime = 3600
        idp.refresh_delay = 1.0
        session_id = first.session_id(browser.cookies[COOKIE])
        lock = f"{first.prefix}lock:{session_id}"
        probe = RedisProbe(cluster.servers[0])
        at_first = Deferred.fromCoroutine(browser.get(first.url("/app/one")))

        async def first_holds_the_lock() -> bool:
            return idp.refresh_grants == 1 and await probe.get(lock) is not None

        await until(self, "the first gateway refreshes", first_holds_the_lock)
        await probe.command("DEL", lock)
        at_second = Deferred.fromCoroutine(browser.get(second.url("/app/two")))
        answers = [await at_first, await at_second]
        self.assertEqual([a.status for a in answers], [200, 200])
        self.assertEqual(idp.refresh_grants, 2)
        record = await first.stored_record(browser)
        assert record is not None
        # The stored record is the refreshed one (3600 s), and its refresh token is the
        # live one: the session refreshes again with it (no new login).
        self.assertGreater(record.access_token_expires_at, reactor.seconds() + 600)
        for gw in (first, second):
            self.assertEqual((await browser.get(gw.url("/app/after"))).status, 200)
        assert record.refresh_token is not None
        # (The fake IdP's own table of the refresh tokens it would accept.)
        self.assertIn(record.refresh_token, set(idp._refresh_tokens))
