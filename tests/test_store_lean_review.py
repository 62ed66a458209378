"""
Review of the state store's lean path (dfb4fb7, 616608b): commands straight to the
connection's protocol, scripts by EVALSHA with EVAL on NOSCRIPT, the one-pass command
encoding (L{edgegw.seam.LeanRedisCommands}) and the rate limiter's one-part key.

The tests outside L{NoFindingTests} are findings: each fails at 616608b and passed at
dfb4fb7's parent (checked by putting that parent's kvstore.py, seam.py and
rate_limit.py back). L{NoFindingTests} are attacks that found nothing, kept as checks
(they pass; the hanging-EVAL one needs the EVALSHA-first path, so it is new with dfb4fb7).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any, cast

import txredisapi  # type: ignore[import-untyped]
from twisted.internet import reactor
from twisted.internet.defer import succeed
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.config.model import KvStoreConfig
from edgegw.plugins.rate_limit import plugin as rate_limit
from edgegw.state.kvstore import KvStoreService, _Protocol
from edgegw.state.store import StoreError, StoreUnavailableError
from tests.support.processes import listen_local, port_of
from tests.support.redis import RedisProbe, redis_command, redis_server
from tests.support.sentinel import FakeSentinel
from tests.test_sentinel import sentinel_store, until
from tests.test_state_store import connected_store, ready


class EncodingErrorTests(SynchronousTestCase):
    """
    A str that UTF-8 cannot encode (a lone surrogate) is refused as txredisapi refuses
    it: with its L{txredisapi.InvalidData}, not a bare C{UnicodeEncodeError}.
    """

    def test_unencodable_str_same_error_as_txredisapi(self) -> None:
        args = ("SET", b"k", "\ud800")
        theirs = txredisapi.BaseRedisProtocol(charset=None)
        self.assertRaises(txredisapi.InvalidData, theirs._build_command, *args)
        self.assertRaises(txredisapi.InvalidData, _Protocol(charset=None)._build_command, *args)


class DeferredContractTests(TestCase):
    """
    Every store operation returns a Deferred (docs/plugins.md: "each operation returns a
    Deferred that fires within the store's timeout, or fails"): a bad argument fails
    it, as it did through txredisapi's handler, instead of raising out of the call (a
    plugin's errback never sees it; the request fails in the middle of the hook).
    """

    async def setUp(self) -> None:  # type: ignore[override]
        self.server = await redis_server(self)
        self.store = await connected_store(self, self.server)

    async def test_unencodable_value_fails_the_deferred(self) -> None:
        try:
            d = self.store.set(b"k", cast(bytes, "\ud800"), 10)
        except Exception as e:  # the finding
            self.fail(f"set() raised {e!r} instead of returning a failed Deferred")
        try:
            await d
        except (txredisapi.InvalidData, StoreError):
            return
        self.fail("an unencodable value was stored")

    async def test_str_script_runs(self) -> None:
        """
        A script given as str (a plugin without type checking): txredisapi's eval
        encoded it; the digest cache hashes it as it is and raises TypeError.
        """
        try:
            d = self.store.run_script(cast(bytes, "return 7"), [], [])
        except TypeError as e:  # the finding
            self.fail(f"run_script() raised {e!r}")
        self.assertEqual(await d, 7)


class RateLimitKeyTests(SynchronousTestCase):
    """
    A one-part key (the default, C{[client]}) keeps the Redis key it had: during a
    rolling upgrade old and new instances share one limit. With the key derived two
    ways, each client has two counters -- up to twice its rate and burst -- until the
    last old instance is gone (and again on a rollback).
    """

    def test_one_part_key_as_before(self) -> None:
        limiter = rate_limit.request_hook({"rate": "10/s"})
        request: Any = SimpleNamespace(client_address="192.0.2.7")
        part = "c192.0.2.7/32"
        before = hashlib.blake2b(f"{len(part)}:{part}".encode(), digest_size=16).digest()
        self.assertEqual(limiter.key_of(request), before)


class _NoScriptThenSilent(Protocol):
    """
    A Redis that answers C{NOSCRIPT} to EVALSHA, then never answers (the EVAL hangs).
    """

    factory: _FakeRedis

    def dataReceived(self, data: bytes) -> None:
        self.factory.seen.append(data)
        if b"EVALSHA" in data:
            assert self.transport is not None
            self.transport.write(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")

    def connectionLost(self, reason: object = None) -> None:
        self.factory.lost.append(reason)


class _FakeRedis(ServerFactory):
    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.lost: list[object] = []

    def buildProtocol(self, addr: Any) -> Protocol:
        protocol = _NoScriptThenSilent()
        protocol.factory = self
        return protocol


class NoFindingTests(TestCase):
    """
    Attacks that found nothing: kept as checks.
    """

    async def test_hanging_eval_fallback_is_bounded(self) -> None:
        """
        The EVAL sent after NOSCRIPT never answered: the one timeout fails the
        operation with L{StoreUnavailableError} and drops the connection.
        """
        factory = _FakeRedis()
        port = listen_local(factory)
        self.addCleanup(port.stopListening)
        store = KvStoreService(
            KvStoreConfig(address=f"127.0.0.1:{port_of(port)}", timeout=0.3),
            "t:",
            reactor,
            first_retry=5.0,
            retry_cap=5.0,
        )
        store.startService()
        self.addCleanup(store.stopService)
        await until(self, "connected", lambda: succeed(store.connected))
        with self.assertRaises(StoreUnavailableError):
            await store.run_script(b"return 1", [b"k"], [1])
        sent = b"".join(factory.seen)
        self.assertIn(b"EVALSHA", sent)
        self.assertIn(b"$4\r\nEVAL\r\n", sent)
        await until(self, "the connection dropped", lambda: succeed(factory.lost))

    async def test_script_error_not_noscript_is_not_retried(self) -> None:
        """
        A script's own error is reported once (no EVAL retry of a failing script).
        """
        server = await redis_server(self)
        store = await connected_store(self, server)
        with self.assertRaises(StoreError):
            await store.run_script(b"return redis.error_reply('boom')", [], [])
        await ready(store)

    async def test_readonly_answer_to_a_script_is_a_failover_signal(self) -> None:
        """
        The master demoted under the live connection answers a writing script (EVALSHA
        of a script it knows, or EVAL after NOSCRIPT) with C{READONLY}: the store goes
        to the new master, never reporting it as a script error.
        """
        master = await redis_server(self)
        other = await redis_server(self)
        sentinel = FakeSentinel(self, ("127.0.0.1", master.port))
        store = sentinel_store(self, [sentinel.address])
        script = b"redis.call('SET', KEYS[1], ARGV[1]) return 1"
        await until(self, "store ready", lambda: store.run_script(script, [b"k"], [b"v"]))
        sentinel.answer = ("127.0.0.1", other.port)
        await redis_command(master.port, "REPLICAOF", "127.0.0.1", str(other.port))
        outcomes: list[str] = []

        async def write() -> bool:
            try:
                await store.run_script(script, [b"k2"], [b"w"])
            except StoreUnavailableError:
                outcomes.append("unavailable")
                return False
            except StoreError as e:
                outcomes.append(str(e))
                return False
            return True

        await until(self, "scripts reach the new master", write)
        self.assertEqual(await RedisProbe(other).get(b"t:k2"), b"w")
        self.assertFalse([o for o in outcomes if o != "unavailable"], outcomes)
