"""
Regressions from the review of the Sentinel store and the rate-limit plugin (issues 37
and 38): each failed against the reviewed code.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from edgegw.plugins.plugin_context import PluginContext
from edgegw.plugins.rate_limit import RateLimit, parse_rate, plugin


def _limiter(config: dict[str, object], clock: Clock) -> RateLimit:
    return plugin.request_hook_in(config, PluginContext("rl", clock))


class HugeRateTests(TestCase):
    """
    A rate above 2,000,000/s (or 120,000,000/m) was accepted by the config check, but
    its interval rounded to 0 microseconds: the GCRA never moved the TAT and no request
    was ever limited (locally, and in GCRA_SCRIPT with ARGV[1] = 0 likewise). Rates
    faster than 1,000,000/s are now refused at load.
    """

    def test_huge_rate_is_refused(self) -> None:
        for rate in ("3000000/s", "99999999999999999999/s", "1000001/s", "60000001/m"):
            with self.assertRaises(ValueError) as raised:
                parse_rate(rate)
            self.assertIn("faster than 1000000/s", str(raised.exception))

    def test_the_fastest_rate_still_limits(self) -> None:
        """
        At 1,000,000/s (an interval of one microsecond) a second request in the same
        instant is over a burst of 1.
        """
        limiter = _limiter({"rate": "1000000/s", "burst": 1}, Clock())
        self.assertEqual(limiter.interval, 1)
        key = b"k" * 16
        self.assertTrue(limiter.table.take(key)[0])
        self.assertFalse(limiter.table.take(key)[0])


from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

from edgegw.edge.forwarded import ForwardedFilter  # noqa: E402
from edgegw.plugins.messages import client_after_proxies  # noqa: E402
from tests.support.backends import SiteBackend  # noqa: E402
from tests.support.gateways import start_gateway  # noqa: E402
from tests.support.plugin_dists import install_plugins  # noqa: E402
from tests.test_plugins import fetch, request_plugin  # noqa: E402
from tests.test_rate_limit import RATE_LIMIT  # noqa: E402


class TrustAllClientKeyTests(TestCase):
    """
    trustedProxies: ["*"] (documented in configuration.md) makes every
    X-Forwarded-For entry "trusted", so client_after_proxies (messages.py:145) falls
    back to the LEFTMOST entry -- the one the client wrote itself. Behind a load
    balancer that appends the real client, the rate-limit key is attacker-chosen:
    a fresh key per request (bypass), or a victim's address (lock the victim out).
    """

    def setUp(self) -> None:
        install_plugins(self, RATE_LIMIT, name="edgegw-rate-limit-review")
        self.backend = SiteBackend().start()
        self.addCleanup(self.backend.stop)
        self.clock = Clock()

    def serve(self, config: Mapping[str, Any], gateway_spec: str) -> int:
        _, port = start_gateway(
            self,
            f"http://127.0.0.1:{self.backend.port}",
            gateway_spec=gateway_spec,
            clock=self.clock,
            routes=request_plugin("limit", "rate-limit", config=dict(config)),
        )
        return port

    def test_client_after_trust_all_is_proxy_appended(self) -> None:
        trusted = ForwardedFilter(["*"]).is_trusted
        self.assertEqual(
            client_after_proxies("127.0.0.1", ["198.51.100.9, 192.0.2.7"], trusted),
            "192.0.2.7",
        )

    async def test_spoofed_forwarded_for_behind_trust_all(self) -> None:
        port = self.serve({"rate": "1/h"}, 'trustedProxies: ["*"]\n')
        # The load balancer (127.0.0.1) appends the real client 192.0.2.7 to whatever
        # the client sent; the client sends a new address each time.
        statuses = [
            (await fetch(port, "GET", "/x", [("X-Forwarded-For", f"198.51.100.{i}, 192.0.2.7")]))[0]
            for i in range(3)
        ]
        self.assertEqual(statuses, [200, 429, 429])
        self.assertEqual(len(self.backend.requests), 1)


from tests.support.redis import redis_command, redis_server  # noqa: E402
from tests.support.sentinel import FakeSentinel  # noqa: E402
from tests.test_sentinel import bool_, sentinel_store, succeed_, until  # noqa: E402


class PubSubFollowsByNameTests(TestCase):
    """
    kvstore.py:_follow_master (about line 412) compares the pub/sub connection's peer
    (an IP address, as the socket has it) with the master's address AS THE SENTINEL
    NAMED IT. A Sentinel that names the master by host name (announce-hostnames yes /
    resolve-hostnames, usual on Kubernetes) never matches: every reconnection of the
    command connection drops a healthy pub/sub connection to the very same master
    (messages published meanwhile -- back-channel logouts -- are lost).
    """

    async def test_pubsub_kept_when_master_named_by_host_name(self) -> None:
        master = await redis_server(self)
        sentinel = FakeSentinel(self, ("localhost", master.port))
        store = sentinel_store(self, [sentinel.address])
        await until(self, "store ready", lambda: store.set(b"k", b"v", 30).addCallback(bool_))
        received: list[bytes] = []
        await store.subscribe(b"chan", received.append)
        await store.publish(b"chan", b"before")
        await until(self, "message before", lambda: succeed_(b"before" in received))
        link = store._link
        assert link.subscriber is not None
        [subscribed] = list(link.subscriber.pool)
        # The command connection alone is lost (CLIENT KILL of normal clients skips
        # pub/sub ones); it reconnects to the same master.
        await redis_command(master.port, "CLIENT", "KILL", "TYPE", "normal")
        await until(self, "commands again", lambda: store.set(b"k", b"w", 30).addCallback(bool_))

        async def after() -> bool:
            await redis_command(master.port, "PUBLISH", "t:chan", "after")
            return b"after" in received

        await until(self, "a message after", after)
        self.assertIn(subscribed, list(link.subscriber.pool))
