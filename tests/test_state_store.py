"""
Tests for L{edgegw.state}: the C{kvstore} store against a real redis-server (started on a
free loopback port by L{tests.support.redis}), and provider discovery through entry
points.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application.service import IService
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogEvent, LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import provider
from zope.interface.verify import verifyObject

from edgegw.config.errors import ConfigError, Location
from edgegw.config.model import KvStoreConfig
from edgegw.state import kvstore
from edgegw.state.kvstore import KvStoreService
from edgegw.state.providers import (
    IStateProviderFactory,
    UnknownProviderError,
    find_provider,
    provider_types,
)
from edgegw.state.store import IStateStore, StoreError, StoreUnavailableError
from tests.support.redis import RedisServer, TestCA, redis_server


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def ready(store: KvStoreService, within: float = 5.0) -> None:
    """
    Wait until C{store} answers (it connects in the background once started).
    """
    deadline = reactor.seconds() + within
    while True:
        try:
            await store.get(b"readiness-probe")
            return
        except StoreUnavailableError:
            if reactor.seconds() > deadline:
                raise
            await sleep(0.05)


def make_store(
    test: TestCase,
    server: RedisServer,
    prefix: str = "test:",
    *,
    trust_root: Any = None,
    **config: Any,
) -> KvStoreService:
    """
    A started store on C{server}, stopped when the test ends.
    """
    config.setdefault("timeout", 1.0)
    if trust_root is None and server.ca is not None:
        trust_root = server.ca.trust_root()
    config.setdefault("tls", server.tls)
    store = KvStoreService(
        KvStoreConfig(address=server.address, **config),
        prefix,
        reactor,
        trust_root=trust_root
        if trust_root is not None or server.ca is None
        else server.ca.trust_root(),
        first_retry=0.05,
        retry_cap=0.3,
    )
    store.startService()
    test.addCleanup(store.stopService)
    return store


async def connected_store(test: TestCase, server: RedisServer, *args: Any, **kw: Any) -> Any:
    store = make_store(test, server, *args, **kw)
    await ready(store)
    return store


def store_warnings(test: TestCase) -> list[str]:
    """
    The state store's warnings logged from now until C{test} ends, as text.
    """
    warnings: list[str] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "edgegw.state" and event["log_level"] == LogLevel.warn:
            warnings.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    test.addCleanup(globalLogPublisher.removeObserver, observe)
    return warnings


class StoreOperationTests(TestCase):
    """
    Every operation, against a plain redis-server.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.server = await redis_server(self)
        self.store = await connected_store(self, self.server)

    def test_interface(self) -> None:
        self.assertTrue(verifyObject(IStateStore, self.store))
        self.assertTrue(verifyObject(IService, self.store))
        self.assertEqual(self.store.name, "state")

    async def test_round_trip(self) -> None:
        store = self.store
        self.assertIsNone(await store.get(b"k"))
        await store.set(b"k", b"\x00binary\xff", 30)
        self.assertEqual(await store.get(b"k"), b"\x00binary\xff")
        await store.set(b"k", b"replaced", 30)
        self.assertEqual(await store.get(b"k"), b"replaced")
        await store.set(b"other", b"v", 30)
        self.assertEqual(await store.delete(b"k", b"other", b"missing"), 2)
        self.assertIsNone(await store.get(b"k"))
        self.assertEqual(await store.delete(), 0)

    async def test_replace_only_what_was_read(self) -> None:
        store = self.store
        await store.set(b"k", b"old", 30)
        self.assertTrue(await store.replace(b"k", b"old", b"new", 60))
        self.assertEqual(await store.get(b"k"), b"new")
        left = await store.ttl(b"k")
        assert left is not None
        self.assertGreater(left, 30)
        # Changed meanwhile, or deleted meanwhile: left as it is.
        self.assertFalse(await store.replace(b"k", b"old", b"newer", 60))
        self.assertEqual(await store.get(b"k"), b"new")
        await store.delete(b"k")
        self.assertFalse(await store.replace(b"k", b"new", b"back", 60))
        self.assertIsNone(await store.get(b"k"))

    async def test_ttl(self) -> None:
        store = self.store
        await store.set(b"long", b"v", 30)
        left = await store.ttl(b"long")
        assert left is not None
        self.assertTrue(29 < left <= 30, left)
        self.assertIsNone(await store.ttl(b"missing"))
        await store.set(b"short", b"v", 0.3)
        self.assertEqual(await store.get(b"short"), b"v")
        await sleep(0.5)
        self.assertIsNone(await store.get(b"short"))

    async def test_key_prefix(self) -> None:
        await self.store.set(b"k", b"mine", 30)
        bare = await connected_store(self, self.server, "")
        self.assertEqual(await bare.get(b"test:k"), b"mine")
        self.assertIsNone(await bare.get(b"k"))
        other = await connected_store(self, self.server, "other:")
        self.assertIsNone(await other.get(b"k"))

    async def test_lock_by_owner_only(self) -> None:
        store = self.store
        self.assertTrue(await store.acquire(b"lock", b"one", 5))
        self.assertFalse(await store.acquire(b"lock", b"two", 5))
        self.assertFalse(await store.release(b"lock", b"two"))
        self.assertFalse(await store.acquire(b"lock", b"two", 5))
        lease = await store.ttl(b"lock")
        assert lease is not None
        self.assertTrue(4 < lease <= 5, lease)
        self.assertTrue(await store.release(b"lock", b"one"))
        self.assertFalse(await store.release(b"lock", b"one"))
        self.assertTrue(await store.acquire(b"lock", b"two", 5))

    async def test_lapsed_lock_not_released_by_former_owner(self) -> None:
        store = self.store
        self.assertTrue(await store.acquire(b"lock", b"one", 0.2))
        await sleep(0.4)
        self.assertTrue(await store.acquire(b"lock", b"two", 5))
        self.assertFalse(await store.release(b"lock", b"one"))
        self.assertEqual(await store.get(b"lock"), b"two")

    async def test_index(self) -> None:
        store = self.store
        self.assertEqual(await store.index_members(b"sid:1"), frozenset())
        await store.add_to_index(b"sid:1", b"a", 30)
        await store.add_to_index(b"sid:1", b"b", 5)
        self.assertEqual(await store.index_members(b"sid:1"), {b"a", b"b"})
        left = await store.ttl(b"sid:1")
        assert left is not None
        self.assertTrue(29 < left <= 30, f"a shorter TTL shortened the index: {left}")
        await store.add_to_index(b"sid:1", b"c", 60)
        left = await store.ttl(b"sid:1")
        assert left is not None
        self.assertTrue(59 < left <= 60, left)
        self.assertEqual(await store.remove_from_index(b"sid:1", b"a", b"zz"), 1)
        self.assertEqual(await store.index_members(b"sid:1"), {b"b", b"c"})
        self.assertEqual(await store.remove_from_index(b"sid:1"), 0)

    async def test_index_expires(self) -> None:
        await self.store.add_to_index(b"sub:x", b"a", 0.3)
        await sleep(0.5)
        self.assertEqual(await self.store.index_members(b"sub:x"), frozenset())

    async def test_pubsub(self) -> None:
        received: list[bytes] = []
        other: list[bytes] = []
        await self.store.subscribe(b"logout", received.append)
        await self.store.subscribe(b"logout", other.append)
        # Another gateway process, sharing the Redis and the prefix.
        publisher = await connected_store(self, self.server)
        self.assertEqual(await publisher.publish(b"logout", b"sid-1"), 1)
        await self._until(lambda: received == [b"sid-1"] and other == [b"sid-1"])
        # Another prefix is another namespace.
        stranger = await connected_store(self, self.server, "other:")
        self.assertEqual(await stranger.publish(b"logout", b"nope"), 0)
        await self.store.unsubscribe(b"logout", other.append)
        await publisher.publish(b"logout", b"sid-2")
        await self._until(lambda: received == [b"sid-1", b"sid-2"])
        self.assertEqual(other, [b"sid-1"])
        await self.store.unsubscribe(b"logout", received.append)
        await sleep(0.05)
        self.assertEqual(await publisher.publish(b"logout", b"sid-3"), 0)

    async def _until(self, condition: Any, within: float = 1.0) -> None:
        waited = 0.0
        while not condition():
            if waited > within:
                self.fail("not delivered within a second")
            await sleep(0.02)
            waited += 0.02

    async def test_not_started(self) -> None:
        store = KvStoreService(KvStoreConfig(address=self.server.address), "", reactor)
        with self.assertRaises(StoreUnavailableError):
            await store.get(b"k")
        with self.assertRaises(StoreUnavailableError):
            await store.subscribe(b"c", lambda m: None)


class AuthTests(TestCase):
    """
    AUTH with a Redis 6 ACL user, and SELECT.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.server = await redis_server(self, user="gw", password="s3cret pass")

    async def test_user_password_and_db(self) -> None:
        in3 = await connected_store(self, self.server, user="gw", password="s3cret pass", db=3)
        await in3.set(b"k", b"three", 30)
        self.assertEqual(await in3.get(b"k"), b"three")
        in0 = await connected_store(self, self.server, user="gw", password="s3cret pass")
        self.assertIsNone(await in0.get(b"k"))
        await in0.set(b"k", b"zero", 30)
        self.assertEqual(await in3.get(b"k"), b"three")
        received: list[bytes] = []
        await in3.subscribe(b"c", received.append)
        self.assertEqual(await in0.publish(b"c", b"m"), 1)

    async def test_wrong_password(self) -> None:
        store = make_store(self, self.server, user="gw", password="wrong")
        await sleep(0.3)
        for _ in range(3):
            with self.assertRaises(StoreUnavailableError):
                await store.get(b"k")
            await sleep(0.1)

    async def test_no_password(self) -> None:
        store = make_store(self, self.server)
        await sleep(0.3)
        # Connected as the default user, which is off: NOAUTH.
        with self.assertRaises(StoreError):
            await store.get(b"k")


class TLSTests(TestCase):
    """
    TLS through optionsForClientTLS: the server's certificate is verified.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.server = await redis_server(self, tls=True)

    async def test_trusted(self) -> None:
        store = await connected_store(self, self.server)
        await store.set(b"k", b"over tls", 30)
        self.assertEqual(await store.get(b"k"), b"over tls")
        received: list[bytes] = []
        await store.subscribe(b"c", received.append)
        self.assertEqual(await store.publish(b"c", b"m"), 1)

    async def test_wrong_ca(self) -> None:
        wrong = TestCA(self.server.directory, "some other CA")
        store = make_store(self, self.server, trust_root=wrong.trust_root())
        await sleep(0.5)
        for _ in range(3):
            with self.assertRaises(StoreUnavailableError):
                await store.get(b"k")
            await sleep(0.1)

    async def test_wrong_ca_logged(self) -> None:
        warnings = store_warnings(self)
        wrong = TestCA(self.server.directory, "some other CA")
        make_store(self, self.server, trust_root=wrong.trust_root())
        await sleep(0.5)
        self.assertTrue(warnings)
        self.assertIn("certificate verify failed", warnings[0])

    async def test_wrong_ca_with_password(self) -> None:
        wrong = TestCA(self.server.directory, "some other CA")
        store = make_store(self, self.server, trust_root=wrong.trust_root(), password="p")
        await sleep(0.5)
        with self.assertRaises(StoreUnavailableError):
            await store.get(b"k")

    def _ca_file_store(self, ca_file: str) -> KvStoreService:
        # No trust_root given: the store reads caFile itself, as a configured one does.
        store = find_provider("kvstore").build(
            {"address": self.server.address, "tls": True, "caFile": ca_file, "timeout": "1s"},
            "test:",
            reactor,
            first_retry=0.05,
            retry_cap=0.3,
        )
        assert isinstance(store, KvStoreService)
        store.startService()
        self.addCleanup(store.stopService)
        return store

    async def test_ca_file(self) -> None:
        assert self.server.ca is not None
        store = self._ca_file_store(self.server.ca.path)
        await ready(store)
        await store.set(b"k", b"verified by caFile", 30)
        self.assertEqual(await store.get(b"k"), b"verified by caFile")

    async def test_ca_file_of_another_ca(self) -> None:
        other = os.path.join(self.server.directory, "other")
        os.mkdir(other)
        store = self._ca_file_store(TestCA(other, "some other CA").path)
        await sleep(0.5)
        with self.assertRaises(StoreUnavailableError):
            await store.get(b"k")

    async def test_plaintext_to_tls_port(self) -> None:
        store = make_store(self, self.server, tls=False)
        await sleep(0.3)
        with self.assertRaises(StoreUnavailableError):
            await store.get(b"k")


class OutageTests(TestCase):
    """
    Redis going away and coming back: fail fast, then recover without a new store.
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.server = await redis_server(self)
        self.store = await connected_store(self, self.server)

    async def _fails_fast(self, operation: Any) -> None:
        started = reactor.seconds()
        with self.assertRaises(StoreUnavailableError):
            await operation()
        elapsed = reactor.seconds() - started
        self.assertLess(elapsed, self.store.timeout + 0.5)

    async def test_stopped_then_restarted(self) -> None:
        store = self.store
        received: list[bytes] = []
        await store.subscribe(b"c", received.append)
        await store.set(b"k", b"v", 30)
        await self.server.stop()
        await sleep(0.1)
        for operation in (
            lambda: store.get(b"k"),
            lambda: store.set(b"k", b"v", 30),
            lambda: store.acquire(b"l", b"o", 5),
            lambda: store.release(b"l", b"o"),
            lambda: store.add_to_index(b"i", b"m", 5),
            lambda: store.index_members(b"i"),
            lambda: store.publish(b"c", b"m"),
        ):
            await self._fails_fast(operation)
        await self.server.start()
        await ready(store)
        self.assertIsNone(await store.get(b"k"))  # nothing persisted
        await store.set(b"k", b"again", 30)
        self.assertEqual(await store.get(b"k"), b"again")
        # The subscription was made again on the new pub/sub connection.
        for _ in range(50):
            if await store.publish(b"c", b"after") == 1:
                break
            await sleep(0.05)
        waited = 0.0
        while received != [b"after"] and waited < 1:
            await sleep(0.02)
            waited += 0.02
        self.assertEqual(received, [b"after"])

    async def test_failures_logged_once_per_interval(self) -> None:
        warnings = store_warnings(self)
        await self.server.stop()
        await sleep(0.1)
        for _ in range(20):
            with self.assertRaises(StoreUnavailableError):
                await self.store.get(b"k")
        # One for the lost connection, none for the twenty refused operations.
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("command connection to Redis at", warnings[0])

    async def test_frozen_redis_times_out(self) -> None:
        self.server.pause()
        await self._fails_fast(lambda: self.store.get(b"k"))
        self.server.resume()
        await ready(self.store)
        self.assertIsNone(await self.store.get(b"k"))


class ProviderDiscoveryTests(SynchronousTestCase):
    """
    Providers are found through the C{edgegw.state_providers} entry points.
    """

    def test_kvstore_registered(self) -> None:
        self.assertIn("kvstore", provider_types())
        factory = find_provider("kvstore")
        self.assertIs(factory, kvstore.provider)
        self.assertTrue(verifyObject(IStateProviderFactory, factory))

    def test_unknown_type(self) -> None:
        with self.assertRaises(UnknownProviderError) as caught:
            find_provider("memcache")
        self.assertIn('"memcache"', str(caught.exception))
        self.assertIn("kvstore", str(caught.exception))

    def test_validate(self) -> None:
        where = Location("gateway.yaml", 1, "Gateway", "edge")
        path = "spec.stateProvider.config"
        factory = find_provider("kvstore")
        self.assertEqual(factory.validate({"address": "redis:6379", "tls": True}, where, path), [])
        problems = factory.validate({"db": -1, "colour": "red"}, where, path)
        fields = {p.field for p in problems}
        self.assertEqual(
            fields,
            {f"{path}.address", f"{path}.db", f"{path}.colour"},
        )
        self.assertTrue(all(p.location == where for p in problems))
        bad = factory.validate({"address": "no-port"}, where, path)
        self.assertEqual([p.field for p in bad], [f"{path}.address"])

    def test_validate_ca_file(self) -> None:
        where = Location("gateway.yaml", 1, "Gateway", "edge")
        path = "spec.stateProvider.config"
        factory = find_provider("kvstore")
        directory = os.path.abspath(self.mktemp())
        os.mkdir(directory)
        ca = TestCA(directory)
        garbage = os.path.join(directory, "garbage.pem")
        with open(garbage, "wb") as f:
            f.write(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        good = {"address": "redis:6379", "tls": True, "caFile": ca.path}
        self.assertEqual(factory.validate(good, where, path), [])
        for config, words in (
            ({**good, "tls": False}, "only used with tls"),
            ({**good, "caFile": "ca.pem"}, "not an absolute path"),
            ({**good, "caFile": os.path.join(directory, "missing.pem")}, "cannot be read"),
            ({**good, "caFile": garbage}, "cannot be loaded"),
        ):
            problems = factory.validate(config, where, path)
            self.assertEqual([p.field for p in problems], [f"{path}.caFile"], config)
            self.assertIn(words, problems[0].message)

    def test_build(self) -> None:
        factory = find_provider("kvstore")
        store = factory.build(
            {"address": "127.0.0.1:6379", "db": 2, "timeout": "500ms"}, "gw:sess:", reactor
        )
        self.assertTrue(IStateStore.providedBy(store))
        self.assertTrue(IService.providedBy(store))
        assert isinstance(store, KvStoreService)
        self.assertEqual(store.name, "state")
        self.assertEqual(store.timeout, 0.5)
        self.assertEqual(store.config.db, 2)
        self.assertEqual(store.key_prefix, b"gw:sess:")
        self.assertRaises(ConfigError, factory.build, {"db": 1}, "", reactor)


class ProviderChecksAtBuildTests(SynchronousTestCase):
    """
    Building the gateway (as startup and C{edgegw check} do) looks every state provider
    type up among the installed ones and has it validate its config, each problem
    located; the Gateway's stateProvider is then still refused (sessions do not use the
    store yet).
    """

    def problems(self, text: str) -> list[str]:
        from edgegw.assembly.assemble import build_gateway
        from edgegw.config.errors import ConfigError
        from edgegw.config.parse import load_config
        from tests.support.configs import write_tree

        root = write_tree(self.mktemp(), {"a.yaml": text})
        config = load_config(root, {})
        try:
            build_gateway(config, Clock())
        except ConfigError as e:
            prefix = root + "/a.yaml, "
            return [str(problem).removeprefix(prefix) for problem in e.problems]
        raise AssertionError("expected a ConfigError")

    GATEWAY = """\
kind: Gateway
metadata: {name: g}
spec:
  listen: "127.0.0.1:0"
"""

    def test_unknown_state_provider_resource_type(self) -> None:
        problems = self.problems(
            self.GATEWAY
            + "---\nkind: StateProvider\nmetadata: {name: mem}\nspec: {type: memcached}\n"
        )
        self.assertEqual(
            problems,
            [
                'document 2, StateProvider "mem": spec.type: no state provider of type '
                '"memcached" is installed (installed: kvstore)'
            ],
        )

    def test_state_provider_resource_config_is_validated_by_its_provider(self) -> None:
        problems = self.problems(
            self.GATEWAY
            + "---\nkind: StateProvider\nmetadata: {name: r}\n"
            + 'spec: {type: kvstore, config: {address: "nohost", db: -1}}\n'
        )
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(
            problems[0].startswith('document 2, StateProvider "r": spec.config.address:'),
            problems,
        )
        self.assertTrue(
            problems[1].startswith('document 2, StateProvider "r": spec.config.db:'), problems
        )

    def test_unknown_gateway_state_provider_type(self) -> None:
        from tests.test_login import KEY

        text = f"""\
kind: Gateway
metadata: {{name: g}}
spec:
  listen: "127.0.0.1:0"
  session: {{key: "{KEY}"}}
  stateProvider: {{type: memcached, config: {{}}}}
---
kind: IdP
metadata: {{name: i}}
spec: {{type: oidc, issuer: "https://idp.example", clientID: c, clientSecret: s}}
---
kind: StateProvider
metadata: {{name: memcached}}
spec: {{type: memcached}}
"""
        problems = self.problems(text)
        unknown = 'no state provider of type "memcached" is installed (installed: kvstore)'
        self.assertIn(f'document 1, Gateway "g": spec.stateProvider.type: {unknown}', problems)
        self.assertIn(f'document 3, StateProvider "memcached": spec.type: {unknown}', problems)


class WholeReadsTests(SynchronousTestCase):
    """
    Every reply a read brings is parsed in that read (txredisapi 1.6 alone parses one
    bulk reply a reactor turn, so replies arriving together wait for each other).
    """

    def test_replies_of_one_read_parsed_at_once(self) -> None:
        protocol = kvstore._Protocol(charset=None, convertNumbers=False)
        protocol.transport = StringTransport()
        protocol.connected = 1
        got: list[bytes | None] = []
        for key in ("a", "b", "c", "d"):
            protocol.execute_command("GET", key).addCallback(got.append)
        protocol.dataReceived(b"$1\r\nx\r\n$2\r\nyy\r\n$-1\r\n$3\r\nz")
        self.assertEqual(got, [b"x", b"yy", None])
        protocol.dataReceived(b"zz\r\n")
        self.assertEqual(got, [b"x", b"yy", None, b"zzz"])
