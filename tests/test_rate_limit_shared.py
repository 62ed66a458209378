"""
The C{rate-limit} plugin shared through the state store (issue 38, point 3): real
C{twistd -n edgegw} processes, a real redis-server, a test backend in the test process.

  - two instances enforce one limit: driven at three times the rate for 10 s, the
    requests that pass are within 5% of what one limiter allows (burst + rate x time);
  - the GCRA state is one Redis key per client under the store's prefix, expiring;
  - Redis stopped mid-run: with C{onStoreDown: allow} each instance limits alone (a
    fresh per-process table), logged once; with C{deny} every request gets 503;
  - the script is loaded again after SCRIPT FLUSH (NOSCRIPT).
"""

from __future__ import annotations

import base64
import os
import time

from nacl.signing import SigningKey
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.internet.task import LoopingCall
from twisted.trial.unittest import TestCase

from edgegw.plugins.registry import plugin_context_of
from tests.support.backends import SiteBackend
from tests.support.configs import load_text
from tests.support.daemons import (
    START_TIMEOUT,
    GatewayProcess,
    HttpAnswer,
    http_exchange,
    sleep,
    spawn_twistd,
)
from tests.support.plugin_dists import install_plugins
from tests.support.processes import REPO_ROOT
from tests.support.redis import RedisServer, redis_command, redis_server
from tests.test_rate_limit import RATE_LIMIT
from tests.test_state_store import connected_store

KEY_PREFIX = "gw:rl:"
READY_TIMEOUT = 30.0
# A stateProvider is refused without a session block or accepted identity assertions
# (edgegw/config/gateway_kind.py), even when plugins use it: reported, not changed
# here (StoreForPluginsOnlyTests); these gateways accept assertions to have one.
PUBLIC_KEY = base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()


def gateway(backend: int, redis: RedisServer, config: str) -> str:
    """
    A gateway with C{redis} as its state provider and the rate-limit plugin (config:
    a YAML flow mapping) on C{/x}.
    """
    return f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  readiness: {{}}
  identity:
    assertion:
      accept:
        issuer: other
        requireBearer: false
        keys: [{{keyId: k, publicKey: "{PUBLIC_KEY}"}}]
  stateProvider:
    type: kvstore
    keyPrefix: "{KEY_PREFIX}"
    config: {{address: "{redis.address}", timeout: 1s}}
---
kind: Route
metadata: {{name: x, labels: {{limited: "yes"}}}}
spec:
  match: /x
  type: app
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend}"}}
---
kind: RequestPlugin
metadata: {{name: limit}}
spec:
  plugin: rate-limit
  selector: {{matchLabels: {{limited: "yes"}}}}
  config: {config}
"""


class LimitedProcess(GatewayProcess):
    """
    A L{GatewayProcess} that also finds the plugin distribution in C{plugins} (for a
    checkout whose installed metadata predates the C{rate-limit} entry point).
    """

    def __init__(self, test: TestCase, files: dict[str, str], name: str, plugins: str) -> None:
        super().__init__(test, files, name)
        self.plugins = plugins

    async def start(self) -> int:
        protocol, self._process = spawn_twistd(
            self.directory,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), self.plugins])},
            log_path=os.path.join(self.directory, "gateway.log"),
        )
        self._protocol = protocol
        self.test.addCleanup(self.stop)
        self.port = await protocol.listening.addTimeout(START_TIMEOUT, reactor)
        return self.port


class SharedLimitTests(TestCase):
    """
    Two instances sharing one redis-server.
    """

    async def instances(self, config: str, count: int = 2) -> list[LimitedProcess]:
        self.redis = await redis_server(self)
        self.backend = SiteBackend().start()
        self.addCleanup(self.backend.stop)
        plugins = install_plugins(self, RATE_LIMIT, name="edgegw-rate-limit-test")
        started = []
        for index in range(count):
            process = LimitedProcess(
                self,
                {"a.yaml": gateway(self.backend.port, self.redis, config)},
                f"g{index}",
                plugins,
            )
            await process.start()
            await self.ready(process)
            started.append(process)
        return started

    async def ready(self, process: LimitedProcess) -> None:
        """Wait until C{process} is ready (its store connected)."""
        waited = 0.0
        while (await http_exchange(process.port, "GET", "/readyz")).status != 200:
            self.assertLess(waited, READY_TIMEOUT, process.output[-3000:])
            await sleep(0.1)
            waited += 0.1

    async def statuses(self, processes: list[LimitedProcess], each: int) -> list[int]:
        """C{each} requests to every process, one after another; their statuses."""
        out = []
        for process in processes:
            for _ in range(each):
                out.append((await http_exchange(process.port, "GET", "/x")).status)
        return out

    async def test_one_limit_for_two_instances(self) -> None:
        """
        20/s, burst 5, two instances driven together at 60 requests a second for 10 s:
        the passes are burst + 20 x the time between the first and last request, within
        5% (per process it would be about twice that).
        """
        processes = await self.instances("{rate: 20/s, burst: 5}")
        answers: list[Deferred[HttpAnswer]] = []
        tick = [0]

        def send() -> None:
            process = processes[tick[0] % 2]
            tick[0] += 1
            answers.append(ensureDeferred(http_exchange(process.port, "GET", "/x")))

        loop = LoopingCall(send)
        started = time.monotonic()
        done = loop.start(1 / 60)
        await sleep(10.0)
        loop.stop()
        await done
        elapsed = time.monotonic() - started
        results = await gatherResults(answers)
        statuses = [answer.status for answer in results]
        self.assertEqual(set(statuses) - {200, 429}, set(), processes[0].output[-3000:])
        passed = statuses.count(200)
        expected = 5 + 20 * elapsed
        self.assertGreaterEqual(len(statuses), 2.5 * 20 * elapsed)  # really at ~3x
        self.assertLess(abs(passed - expected), 0.05 * expected, (passed, expected, len(statuses)))
        self.assertEqual(len(self.backend.requests), passed)
        # One key (every request comes from 127.0.0.1), under the prefix, expiring.
        keys = await redis_command(self.redis.port, "KEYS", "*")
        self.assertEqual(len(keys), 1)
        self.assertTrue(keys[0].startswith(KEY_PREFIX.encode() + b"plugin:limit:"), keys)
        self.assertGreater(await redis_command(self.redis.port, "PTTL", keys[0]), 0)

    async def test_store_down_allow(self) -> None:
        """
        1/h, burst 2: shared, exactly 2 pass over both instances; Redis killed: each
        instance then limits alone (2 more each), and logs it once.
        """
        processes = await self.instances("{rate: 1/h, burst: 2}")
        self.assertEqual(sorted(await self.statuses(processes, 3)), [200, 200] + [429] * 4)
        await self.redis.stop()
        self.assertEqual(await self.statuses(processes, 4), [200, 200, 429, 429] * 2)
        for process in processes:
            self.assertEqual(process.output.count("state store unavailable"), 1, process.output)
            self.assertIn("limiting per process", process.output)
        # Redis back (empty): one shared limit again. Readiness answers from a probe
        # up to a second old (docs/configuration.md): one taken before Redis stopped
        # would say ready while the store still reconnects.
        await self.redis.start()
        await sleep(1.1)
        for process in processes:
            await self.ready(process)
        self.assertEqual(sorted(await self.statuses(processes, 2)), [200, 200, 429, 429])

    async def test_store_down_deny(self) -> None:
        processes = await self.instances("{rate: 1/h, burst: 2, onStoreDown: deny}")
        self.assertEqual(sorted(await self.statuses(processes, 2)), [200, 200, 429, 429])
        await self.redis.stop()
        answer = await http_exchange(processes[0].port, "GET", "/x")
        self.assertEqual((answer.status, answer.header(b"retry-after")), (503, b"1"))
        self.assertEqual(await self.statuses(processes, 3), [503] * 6)
        self.assertEqual(len(self.backend.requests), 2)

    async def test_passing_headers_shared(self) -> None:
        """
        C{headers: always} with the shared limit: the fields on passing responses count
        the key's requests across both instances.
        """
        processes = await self.instances("{rate: 1/h, burst: 3, headers: always}")
        seen = []
        for process in (processes[0], processes[1], processes[0], processes[1]):
            answer = await http_exchange(process.port, "GET", "/x")
            seen.append((answer.status, answer.headers.get(b"ratelimit")))
        self.assertEqual(
            [(status, [v.split(b";")[1] for v in fields or []]) for status, fields in seen],
            [(200, [b"r=2"]), (200, [b"r=1"]), (200, [b"r=0"]), (429, [b"r=0"])],
        )

    async def test_script_reloaded_after_flush(self) -> None:
        """
        Attack on the store side: Redis forgets the script (SCRIPT FLUSH, a restart,
        a failover); the next request sends it again (NOSCRIPT) and the limit holds.
        """
        processes = await self.instances("{rate: 1/h, burst: 1}", count=1)
        self.assertEqual(await self.statuses(processes, 1), [200])
        await redis_command(self.redis.port, "SCRIPT", "FLUSH")
        self.assertEqual(await self.statuses(processes, 2), [429, 429])
        self.assertNotIn("state store unavailable", processes[0].output)


class StoreForPluginsOnlyTests(TestCase):
    """
    A Gateway whose stateProvider only plugins use (rate limits shared, no sessions).
    """

    def test_state_provider_for_plugins_alone(self) -> None:
        load_text(
            self.mktemp(),
            'kind: Gateway\nmetadata: {name: g}\nspec:\n  listen: "127.0.0.1:0"\n'
            '  stateProvider: {type: kvstore, config: {address: "127.0.0.1:6379"}}\n'
            "---\nkind: RequestPlugin\nmetadata: {name: limit}\n"
            "spec: {plugin: rate-limit, config: {rate: 10/s}}\n",
            gateway=False,
        )


class PluginStoreTests(TestCase):
    """
    The store interface any plugin gets (L{PluginContext.store}), on a real Redis.
    """

    async def test_get_set_and_scripts_under_the_resource_prefix(self) -> None:
        redis = await redis_server(self)
        store = await connected_store(self, redis, "gw:")
        plugin_store = plugin_context_of("res", reactor, store, None).store
        assert plugin_store is not None
        await plugin_store.set(b"k", b"v", 5)
        self.assertEqual(await plugin_store.get(b"k"), b"v")
        self.assertEqual(await redis_command(redis.port, "GET", "gw:plugin:res:k"), b"v")
        self.assertTrue(0 < await redis_command(redis.port, "PTTL", "gw:plugin:res:k") <= 5000)
        self.assertTrue(plugin_store.can_run_scripts())
        reply = await plugin_store.run_script(b"return {KEYS[1], ARGV[1]}", [b"a"], [b"x"])
        self.assertEqual(reply, [b"gw:plugin:res:a", b"x"])
