"""
Identity stays warm across a reload (issue 35, point 2).

  - the Bearer verifier's cache of verified tokens (and of userinfo's refusals) is handed
    to the new configuration when every setting that decides a token's verification and
    principal is unchanged (L{BearerVerifier.take_over}); anything else starts cold;
  - the state store keeps its Redis connections and logout subscription when its
    settings are unchanged (L{KvStoreService.take_over}): no reconnection, the old
    generation's stop closes nothing, a logout published after the reload reaches the
    new configuration's sessions;
  - what was not carried over warms up before it serves, at most the new
    configuration's C{reload.warmupTimeout}; past it the reload switches anyway, logged;
  - under steady load on a Bearer route and a session route of a real gateway process
    (real redis-server, the fake IdP), 20 reloads answer every request as before.

The in-process tests run the service tree the daemon runs (L{build_service}) on real
sockets, with a real redis-server.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any, cast

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.model import KvStoreConfig
from edgegw.config.parse import load_config
from edgegw.generation import GenerationService
from edgegw.service import GatewayService, build_service
from edgegw.sessions.server import LOGOUT_CHANNEL, ServerSessions
from edgegw.state.kvstore import KvStoreService
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import write_tree
from tests.support.daemons import GatewayProcess, HttpAnswer, http_exchange, sleep
from tests.support.fake_idp import FakeIdP
from tests.support.processes import free_port, port_of
from tests.support.redis import RedisProbe, RedisServer, TestCA, redis_command, redis_server
from tests.support.sessions import KEY, server_session_config

reactor: Any = _reactor

PREFIX = "gw:sess:"
CHANNEL = PREFIX.encode() + LOGOUT_CHANNEL
WAIT = 15.0
"""The most seconds a test waits for something that happens within milliseconds."""

STATE_OPTIONS = {"first_retry": 0.05, "retry_cap": 0.3}


def bearer_config(
    issuer: str,
    upstream: str,
    *,
    client_id: str = "gw",
    bearer: str = "",
    identity: str = "",
    gateway: str = "",
    forward: bool = True,
    routes: str = "",
) -> str:
    """
    A gateway verifying Bearer tokens of C{issuer} on C{/api/} (a service route, auth
    required, to C{upstream}), asking userinfo for every token it verifies.

    @param bearer: The IdP's C{bearer} block (a flow mapping), when given.
    @param identity: Lines added to the Gateway's C{identity} (indented by four).
    @param gateway: Lines added to the Gateway's spec (indented by two).
    @param forward: Whether C{/api/} forwards the access token.
    @param routes: More resources, appended.
    """
    forwards = "true" if forward else "false"
    return f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
{gateway}  identity:
    claims: [email, name]
    userInfo: always
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
{identity}---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{issuer}"
  clientID: {client_id}
  verificationOnly: true
{f"  bearer: {bearer}" if bearer else ""}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  type: service
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardAccessToken: {forwards}}}
{routes}"""


def extra_route(number: int) -> str:
    """
    A health route of its own: a change no identity setting sees.
    """
    return (
        f"---\nkind: Route\nmetadata: {{name: extra{number}}}\n"
        f"spec: {{match: /extra{number}, handler: {{type: health}}}}\n"
    )


async def until(condition: Any, what: str) -> None:
    """
    Wait until C{condition()} is true (at most L{WAIT} seconds: then fail with C{what}).
    """
    deadline = reactor.seconds() + WAIT
    while not condition():
        if reactor.seconds() > deadline:
            raise AssertionError(f"not within {WAIT:g}s: {what}")
        await sleep(0.01)


class WarmTestCase(TestCase):
    timeout = 60

    def serve(self, text: str) -> tuple[GatewayService, str]:
        """
        Build the tree of the configuration C{text}, bind and start it; it stops when the
        test ends. Reload it after L{rewrite}.
        """
        root = write_tree(self.mktemp(), {"a.yaml": text})
        service = build_service(
            load_config(root, {}), reactor, source=root, state_options=STATE_OPTIONS
        )
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        return service, root

    def backend(self) -> SiteBackend:
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        return backend

    async def idp(self) -> FakeIdP:
        idp = FakeIdP()
        await idp.start(self)
        return idp

    async def world(self) -> tuple[RedisServer, FakeIdP, str]:
        """
        A started redis-server, fake IdP, and backend (its URL).
        """
        redis = await redis_server(self)
        idp = await self.idp()
        return redis, idp, f"http://127.0.0.1:{self.backend().port}"

    async def bearer_call(self, service: GatewayService, token: str) -> BrowserResponse:
        return await Browser().get(
            f"http://127.0.0.1:{port_of(service)}/api/x",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def reload(self, service: GatewayService, root: str, text: str) -> GenerationService:
        """
        Reload C{service} into C{text}; the generation it replaced, once retired (its
        services stopped).
        """
        old = service.generation
        write_tree(root, {"a.yaml": text})
        self.assertTrue(await service.reload())
        self.assertIsNot(service.generation, old)
        await until(lambda: not old.running, "the old generation retired")
        return old

    def warnings(self) -> list[dict[str, Any]]:
        """
        The events logged at warning level from now on (the list fills as they come).
        """
        events: list[dict[str, Any]] = []

        def observe(event: dict[str, Any]) -> None:
            level = event.get("log_level")
            if level is not None and level.name == "warn":
                events.append(event)

        observer = cast(ILogObserver, observe)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        return events


class BearerCacheCarriedTests(WarmTestCase):
    async def test_unchanged_settings_carry_the_verified_tokens(self) -> None:
        idp = await self.idp()
        upstream = f"http://127.0.0.1:{self.backend().port}"
        text = bearer_config(idp.issuer, upstream)
        service, root = self.serve(text)
        await until(lambda: service.gateway.idp is not None and service.gateway.idp.ready, "IdP")
        token = idp.mint_access_token({"aud": "gw"})
        first = await self.bearer_call(service, token)
        self.assertEqual(first.status, 200, first.body)
        # userInfo: always: verifying the token asked userinfo once.
        self.assertEqual(idp.userinfo_tokens.count(token), 1)
        # An unrelated change (a route), then none at all: the token is trusted as it was.
        for number, changed in enumerate((text + extra_route(1), text + extra_route(1))):
            await self.reload(service, root, changed)
            again = await self.bearer_call(service, token)
            self.assertEqual(again.status, 200, again.body)
            self.assertEqual(idp.userinfo_tokens.count(token), 1, f"reload {number}")
        # A changed claim mapping starts cold: the token is verified (userinfo asked) again.
        await self.reload(service, root, text.replace("claims: [email, name]", "claims: [email]"))
        cold = await self.bearer_call(service, token)
        self.assertEqual(cold.status, 200, cold.body)
        self.assertEqual(idp.userinfo_tokens.count(token), 2)

    async def test_a_refusal_is_carried_too(self) -> None:
        idp = await self.idp()
        text = bearer_config(idp.issuer, f"http://127.0.0.1:{self.backend().port}")
        service, root = self.serve(text)
        await until(lambda: service.gateway.idp is not None and service.gateway.idp.ready, "IdP")
        token = idp.mint_access_token({"aud": "gw"})
        idp.userinfo_status = 401
        refused = await self.bearer_call(service, token)
        self.assertEqual(refused.status, 401, refused.body)
        self.assertEqual(idp.userinfo_tokens.count(token), 1)
        await self.reload(service, root, text + extra_route(1))
        # Refused again without asking userinfo (for REFUSAL_SECONDS, as before the reload).
        again = await self.bearer_call(service, token)
        self.assertEqual(again.status, 401, again.body)
        self.assertEqual(idp.userinfo_tokens.count(token), 1)

    async def test_each_setting_decides(self) -> None:
        """
        Every setting that decides a token's verification or principal, changed alone,
        makes the new verifier start cold; the others leave the cache carried over.
        """
        idp = await self.idp()
        upstream = "http://127.0.0.1:9"
        old = self.build(bearer_config(idp.issuer, upstream))
        assert old.idp is not None
        old.idp.startService()
        self.addCleanup(old.idp.stopService)
        await until(lambda: old.idp is not None and old.idp.ready, "IdP")
        other = await self.idp()

        def variant(**changes: Any) -> str:
            return bearer_config(changes.pop("issuer", idp.issuer), upstream, **changes)

        carried = {
            "nothing": variant(),
            "a route": variant(routes=extra_route(1)),
            "drainTimeout and reload": variant(
                gateway="  drainTimeout: 5s\n  reload: {warmupTimeout: 1s}\n"
            ),
            "the clientID as bearer.audience": variant(bearer="{audience: gw}"),
            "the default audienceClaim and cacheTTL": variant(
                bearer="{audienceClaim: aud, cacheTTL: 5m}"
            ),
        }
        cold = {
            "issuer": variant(issuer=other.issuer),
            "bearer.jwksURL": variant(bearer=f'{{jwksURL: "{idp.issuer}/access-jwks"}}'),
            "clientID": variant(client_id="other"),
            "bearer.audience": variant(bearer="{audience: api}"),
            "bearer.audienceClaim": variant(bearer="{audienceClaim: client_id}"),
            "bearer.signingAlgs": variant(bearer="{signingAlgs: [RS256]}"),
            "bearer.cacheTTL": variant(bearer="{cacheTTL: 1m}"),
            "identity.claims": variant().replace("[email, name]", "[email]"),
            "identity.groups": variant().replace("render: cn", "render: dn"),
            "identity.userInfo": variant().replace("userInfo: always", "userInfo: auto"),
            "identity.subjectClaim": variant(identity="    subjectClaim: email\n"),
            "forwardAccessToken": variant(forward=False),
        }
        for name, text in [*carried.items(), *cold.items()]:
            new = self.build(text)
            assert new.idp is not None and new.idp.bearer is not None
            assert old.idp.bearer is not None
            took = new.idp.take_over(old.idp) and new.idp.bearer.take_over(old.idp.bearer)
            self.assertEqual(took, name in carried, name)

    def build(self, text: str) -> Gateway:
        root = write_tree(self.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.addCleanup(client.close)
        return build_gateway(load_config(root, {}), reactor, client)


def store_of(service: GatewayService) -> KvStoreService:
    """
    The serving configuration's state store.
    """
    store = cast(Any, service.gateway.state)
    assert isinstance(store, KvStoreService)
    return store


def client_ids(listing: bytes) -> set[int]:
    """
    The ids of the connections C{CLIENT LIST} lists, but for the one that asked.
    """
    ids = set()
    for line in listing.decode().splitlines():
        fields = dict(field.split("=", 1) for field in line.split(" ") if "=" in field)
        if not fields.get("cmd", "").startswith("client"):
            ids.add(int(fields["id"]))
    return ids


async def connections(redis: RedisServer) -> set[int]:
    """
    The ids of every client connection of C{redis} (the gateway's).
    """
    return client_ids(await redis_command(redis.port, "CLIENT", "LIST"))


class StoreCarriedTests(WarmTestCase):
    def config(self, redis: RedisServer, idp: FakeIdP, upstream: str, **more: Any) -> str:
        return server_session_config(
            key=KEY,
            redis_address=redis.address,
            issuer=idp.issuer,
            upstream=upstream,
            prefix=PREFIX,
            **more,
        )

    async def subscribed(self, service: GatewayService, redis: RedisServer) -> set[int]:
        """
        Wait until the serving store is connected and subscribed to the logout channel
        (both its connections up); their ids.
        """
        probe = RedisProbe(redis)
        deadline = reactor.seconds() + WAIT
        while True:
            ids = await connections(redis)
            if (
                len(ids) == 2
                and store_of(service).connected
                and await probe.subscribers(CHANNEL) == 1
            ):
                return ids
            if reactor.seconds() > deadline:
                raise AssertionError(f"store not connected and subscribed: {ids}")
            await sleep(0.02)

    def closes(self, sessions: ServerSessions | None) -> list[list[str]]:
        """
        The session ids C{sessions} is told (by a logout published) to close the streams
        of, from now on.
        """
        assert sessions is not None
        told: list[list[str]] = []
        close = sessions.streams.close

        def record(ids: Any) -> int:
            told.append(list(ids))
            return close(ids)

        sessions.streams.close = record  # type: ignore[method-assign,assignment]
        return told

    async def test_unchanged_settings_keep_the_connections(self) -> None:
        redis, idp, upstream = await self.world()
        text = self.config(redis, idp, upstream)
        service, root = self.serve(text)
        before = await self.subscribed(service, redis)
        old_store, old_sessions = service.gateway.state, service.gateway.sessions
        old_told = self.closes(old_sessions)
        # An unrelated change, then none: the new configuration uses the same
        # connections, and the old one's stop (it has retired) closed none of them.
        for changed in (self.config(redis, idp, upstream, extra_routes=extra_route(1)), text):
            await self.reload(service, root, changed)
            store = store_of(service)
            self.assertIsNot(store, old_store)
            self.assertTrue(store.carried_over)
            self.assertTrue(store.connected)
            self.assertEqual(await connections(redis), before)
            self.assertEqual(await RedisProbe(redis).subscribers(CHANNEL), 1)
        # A logout published now reaches the serving configuration's sessions only.
        told = self.closes(service.gateway.sessions)
        session_id = "A" * 32
        self.assertEqual(await redis_command(redis.port, "PUBLISH", CHANNEL, session_id), 1)
        await until(lambda: told == [[session_id]], "the logout reached the new sessions")
        self.assertEqual(old_told, [])
        # The store answers on the connections it carried.
        self.assertIsNone(await store.get(b"nothing-here"))
        self.assertEqual(await connections(redis), before)

    async def test_changed_settings_reconnect(self) -> None:
        redis, idp, upstream = await self.world()
        service, root = self.serve(self.config(redis, idp, upstream, timeout="1s"))
        before = await self.subscribed(service, redis)
        await self.reload(service, root, self.config(redis, idp, upstream, timeout="2s"))
        store = store_of(service)
        self.assertFalse(store.carried_over)
        after = await self.subscribed(service, redis)
        # New connections, the old ones closed with the generation that retired.
        self.assertEqual(after & before, set())
        told = self.closes(service.gateway.sessions)
        await redis_command(redis.port, "PUBLISH", CHANNEL, "B" * 32)
        await until(lambda: told == [["B" * 32]], "the logout reached the new sessions")


class StoreTakeOverTests(TestCase):
    """
    L{KvStoreService.take_over} on its own: which settings decide, and who closes the
    connections.
    """

    timeout = 60

    def store(self, config: KvStoreConfig, prefix: str = PREFIX, **options: Any) -> KvStoreService:
        store = KvStoreService(config, prefix, reactor, **{**STATE_OPTIONS, **options})
        self.addCleanup(lambda: store.stopService() if store.running else None)
        return store

    async def started(self, config: KvStoreConfig) -> KvStoreService:
        store = self.store(config)
        store.startService()
        await until(lambda: store.connected, "the store connected")
        return store

    async def test_each_setting_decides(self) -> None:
        redis = await redis_server(self)
        base = KvStoreConfig(address=redis.address, timeout=2.0)
        old = await self.started(base)
        directory = self.mktemp()
        os.makedirs(directory)
        ca = TestCA(directory)
        with_ca = await self.started(KvStoreConfig(**{**_fields(base), "ca_file": ca.path}))
        self.assertTrue(self.store(base).take_over(old))
        self.assertTrue(
            self.store(KvStoreConfig(address=redis.address, timeout=2.0)).take_over(old)
        )
        changed: dict[str, dict[str, Any]] = {
            "address": {"address": f"127.0.0.1:{free_port()}"},
            "user": {"user": "someone"},
            "password": {"password": "secret"},
            "db": {"db": 1},
            "tls": {"tls": True},
            "timeout": {"timeout": 3.0},
            "caFile": {"ca_file": ca.path},
        }
        for name, fields in changed.items():
            config = KvStoreConfig(**{**_fields(base), **fields})
            self.assertFalse(self.store(config).take_over(old), name)
        self.assertFalse(self.store(base, prefix="other:").take_over(old), "keyPrefix")
        self.assertFalse(self.store(base, first_retry=1.0).take_over(old), "retry timings")
        # The same caFile path with other bytes in it (a renewed CA) is a change too.
        self.assertTrue(self.store(with_ca.config).take_over(with_ca))
        TestCA(directory, name="another CA")
        self.assertFalse(self.store(with_ca.config).take_over(with_ca), "caFile's bytes")
        # Only a running store is taken over.
        stopped = self.store(base)
        stopped.startService()
        await stopped.stopService()
        self.assertFalse(self.store(base).take_over(stopped))

    async def test_the_last_holder_closes_the_connections(self) -> None:
        redis = await redis_server(self)
        config = KvStoreConfig(address=redis.address, timeout=2.0)
        old = await self.started(config)
        messages: list[bytes] = []
        await old.subscribe(LOGOUT_CHANNEL, messages.append)
        ids = await connections(redis)
        self.assertEqual(len(ids), 2)
        # A new configuration's store that never serves (an abandoned reload): its stop
        # leaves the old one's connections and subscription as they were.
        abandoned = self.store(config)
        self.assertTrue(abandoned.take_over(old))
        abandoned.startService()
        theirs: list[bytes] = []
        await abandoned.subscribe(LOGOUT_CHANNEL, theirs.append)
        await abandoned.unsubscribe(LOGOUT_CHANNEL, theirs.append)
        await abandoned.stopService()
        self.assertTrue(old.connected)
        self.assertEqual(await connections(redis), ids)
        await redis_command(redis.port, "PUBLISH", CHANNEL, b"one")
        await until(lambda: messages == [b"one"], "the old subscriber got the message")
        # One that takes over and serves: the old one's stop closes nothing it holds.
        new = self.store(config)
        self.assertTrue(new.take_over(old))
        new.startService()
        mine: list[bytes] = []
        await new.subscribe(LOGOUT_CHANNEL, mine.append)
        await old.unsubscribe(LOGOUT_CHANNEL, messages.append)
        await old.stopService()
        self.assertTrue(new.connected)
        self.assertEqual(await connections(redis), ids)
        self.assertEqual(await RedisProbe(redis).subscribers(CHANNEL), 1)
        await redis_command(redis.port, "PUBLISH", CHANNEL, b"two")
        await until(lambda: mine == [b"two"], "the new subscriber got the message")
        self.assertEqual(messages, [b"one"])
        self.assertIsNone(await new.get(b"k"))
        # The last holder's stop closes them.
        await new.stopService()
        await until_async(lambda: _none_left(redis), "the connections closed")


def _fields(config: KvStoreConfig) -> dict[str, Any]:
    return {
        "address": config.address,
        "user": config.user,
        "password": config.password,
        "db": config.db,
        "tls": config.tls,
        "timeout": config.timeout,
        "ca_file": config.ca_file,
    }


async def _none_left(redis: RedisServer) -> bool:
    return not await connections(redis)


async def until_async(condition: Any, what: str) -> None:
    """
    As L{until}, with a C{condition} that is a coroutine function.
    """
    deadline = reactor.seconds() + WAIT
    while not await condition():
        if reactor.seconds() > deadline:
            raise AssertionError(f"not within {WAIT:g}s: {what}")
        await sleep(0.02)


class WarmUpTimeoutTests(WarmTestCase):
    async def test_the_new_configurations_bound(self) -> None:
        """
        An IdP that cannot be reached: the reload waits the new configuration's
        C{warmupTimeout} (not the old one's, not a fixed one), then switches, logged.
        """
        backend = self.backend()
        idp = await self.idp()
        upstream = f"http://127.0.0.1:{backend.port}"
        service, root = self.serve(
            bearer_config(idp.issuer, upstream, gateway="  reload: {warmupTimeout: 0s}\n")
        )
        await until(lambda: service.gateway.idp is not None and service.gateway.idp.ready, "IdP")
        warnings = self.warnings()
        write_tree(
            root,
            {
                "a.yaml": bearer_config(
                    f"http://127.0.0.1:{free_port()}",
                    upstream,
                    gateway="  reload: {warmupTimeout: 300ms}\n",
                )
            },
        )
        started = reactor.seconds()
        self.assertTrue(await service.reload())
        took = reactor.seconds() - started
        idp_client = service.gateway.idp
        assert idp_client is not None
        self.assertFalse(idp_client.ready)
        # At least its own 300 ms (the old configuration's 0s would not wait), and far
        # from the 5 s the bound used to be.
        self.assertGreaterEqual(took, 0.3)
        self.assertLess(took, 4.5)
        [warning] = [e for e in warnings if "before it is warm" in e.get("log_format", "")]
        self.assertEqual(warning["parts"], "IdP discovery")
        self.assertEqual(warning["bound"], 0.3)

    async def test_an_unreachable_store(self) -> None:
        redis = await redis_server(self)
        idp = await self.idp()
        upstream = f"http://127.0.0.1:{self.backend().port}"

        def config(address: str) -> str:
            text = server_session_config(
                key=KEY, redis_address=address, issuer=idp.issuer, upstream=upstream
            )
            return text.replace("spec:\n", "spec:\n  reload: {warmupTimeout: 300ms}\n", 1)

        service, root = self.serve(config(redis.address))
        await until(lambda: service.gateway.idp is not None and service.gateway.idp.ready, "IdP")
        warnings = self.warnings()
        write_tree(root, {"a.yaml": config(f"127.0.0.1:{free_port()}")})
        started = reactor.seconds()
        self.assertTrue(await service.reload())
        took = reactor.seconds() - started
        self.assertGreaterEqual(took, 0.3)
        self.assertLess(took, 4.5)
        store = store_of(service)
        self.assertFalse(store.carried_over)
        self.assertFalse(store.connected)
        [warning] = [e for e in warnings if "before it is warm" in e.get("log_format", "")]
        self.assertEqual(warning["parts"], "state store")
        # The IdP, unchanged, was carried over: not waited for.
        idp_client = service.gateway.idp
        assert idp_client is not None
        self.assertTrue(idp_client.ready)

    async def test_a_carried_store_is_not_waited_for(self) -> None:
        """
        Redis away, the store's settings unchanged: the new configuration takes the old
        store's connections (reconnecting as they were) and switches without waiting
        for a store that would be no warmer than the one serving.
        """
        redis, idp, upstream = await self.world()
        text = server_session_config(
            key=KEY, redis_address=redis.address, issuer=idp.issuer, upstream=upstream
        )
        service, root = self.serve(text)
        await until(lambda: service.gateway.idp is not None and service.gateway.idp.ready, "IdP")
        await until(lambda: store_of(service).connected, "the store connected")
        await redis.stop()
        await until(lambda: not store_of(service).connected, "the store disconnected")
        warnings = self.warnings()
        await self.reload(service, root, text + extra_route(1))
        self.assertTrue(store_of(service).carried_over)
        self.assertEqual(
            [e for e in warnings if "before it is warm" in e.get("log_format", "")], []
        )
        # Redis back: the carried connections reconnect for the new configuration.
        await redis.start()
        await until(lambda: store_of(service).connected, "the store reconnected")
        self.assertIsNone(await store_of(service).get(b"k"))


# -- a real gateway process under load -------------------------------------------------

RELOADED = re.compile(rb"configuration reloaded from")


class UnderLoadTests(TestCase):
    timeout = 120

    async def test_twenty_reloads_under_load(self) -> None:
        """
        A Bearer route and a session route, each asked again and again while the gateway
        reloads 20 times (unchanged settings, or an unrelated field changed): every
        request is answered 200 for the same user; the Bearer token is verified once,
        the Redis connections are never made again, and a back-channel logout after the
        reloads closes the session's stream.
        """
        redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(_respond).start()
        self.addCleanup(backend.stop)
        upstream = f"http://127.0.0.1:{backend.port}"

        def config(number: int) -> str:
            text = server_session_config(
                key=KEY,
                redis_address=redis.address,
                issuer=idp.issuer,
                upstream=upstream,
                prefix=PREFIX,
                timeout="2s",
                identity_extra="    userInfo: always",
                extra_routes=extra_route(number) if number % 2 else "",
            )
            return text

        gateway = GatewayProcess(self, {"a.yaml": config(0)})
        await gateway.start()
        idp.redirect_uris.append(gateway.url("/auth/callback"))
        await until_async(lambda: _discovered(gateway, idp), "the IdP discovered")
        cookie, user_agent = await _login(self, gateway, idp)
        token = idp.mint_access_token({"aud": "gw"})
        bearer = {"Authorization": f"Bearer {token}"}
        session = {"Cookie": cookie, "User-Agent": user_agent}
        first = await http_exchange(gateway.port, "GET", "/api/warm", bearer)
        self.assertEqual(first.status, 200, first.raw[:300])
        before = await connections(redis)
        self.assertEqual(len(before), 2)
        verified = idp.userinfo_tokens.count(token)

        answers: dict[str, list[HttpAnswer]] = {"bearer": [], "session": []}
        running = [True]

        async def load(kind: str, path: str, headers: dict[str, str]) -> None:
            number = 0
            while running[0]:
                number += 1
                answers[kind].append(
                    await http_exchange(gateway.port, "GET", f"{path}{number}", headers)
                )

        loads = [
            Deferred.fromCoroutine(load("bearer", "/api/b", bearer)),
            Deferred.fromCoroutine(load("session", "/app/s", session)),
        ]
        try:
            for number in range(1, 21):
                # Odd: a route added (or taken away again); even: the same file again.
                write_tree(gateway.directory, {"a.yaml": config(number)})
                reloads = len(RELOADED.findall(gateway.output.encode()))
                os.kill(gateway.pid, signal.SIGHUP)
                await until(
                    lambda reloads=reloads: (
                        len(RELOADED.findall(gateway.output.encode())) > reloads
                    ),
                    f"reload {number}\n{gateway.output[-3000:]}",
                )
                # Some requests of each kind on each configuration.
                counts = {kind: len(got) for kind, got in answers.items()}
                await until(
                    lambda counts=counts: all(
                        len(answers[kind]) >= counts[kind] + 3 for kind in answers
                    ),
                    "requests answered",
                )
        finally:
            running[0] = False
            await gatherResults(loads)
        for kind, got in answers.items():
            # Every request answered (none lost: tests/test_reload_load.py), as before
            # the reloads.
            answered = [answer for answer in got if answer.raw]
            self.assertEqual(len(answered), len(got), kind)
            self.assertGreater(len(answered), 60, kind)
            self.assertEqual(
                [answer.status for answer in answered if answer.status != 200],
                [],
                f"{kind}: {[a.raw[:200] for a in answered if a.status != 200][:3]}",
            )
            self.assertEqual({answer.body for answer in answered}, {b"alice"}, kind)
        # Not verified again (userinfo asked once for the token), not reconnected.
        self.assertEqual(idp.userinfo_tokens.count(token), verified)
        self.assertEqual(await connections(redis), before)
        self.assertEqual(gateway.output.count("Bearer tokens verified before carried over"), 20)
        self.assertEqual(gateway.output.count("state store: connections carried over"), 20)
        # A back-channel logout now reaches the serving configuration's streams.
        stream = await _open_stream(gateway, session)
        [sid] = idp.sessions
        logout_token = idp.mint_logout_token(sid=sid, header={"typ": "logout+jwt"})
        logout = await Browser().post(
            gateway.url("/auth/backchannel-logout"), {"logout_token": logout_token}, cookies=False
        )
        self.assertEqual(logout.status, 200, logout.body)
        await stream.closed.addTimeout(WAIT, reactor)
        after = await http_exchange(gateway.port, "GET", "/app/after", session)
        self.assertEqual(after.status, 302, after.raw[:300])


def _respond(request: Any) -> bytes | int:
    """
    The backend: the user the gateway vouches for; an endless event stream at /app/events.
    """
    from twisted.web.server import NOT_DONE_YET

    if request.path == b"/app/events":
        request.setHeader(b"content-type", b"text/event-stream")
        request.write(b"data: hello\n\n")
        return NOT_DONE_YET
    return request.getHeader(b"x-user-id") or b"nobody"


async def _discovered(gateway: GatewayProcess, idp: FakeIdP) -> bool:
    login = await http_exchange(gateway.port, "GET", "/auth/login?return_to=%2Fapp%2F")
    return login.status == 302 and (login.header(b"location") or b"").startswith(
        idp.issuer.encode()
    )


async def _login(test: TestCase, gateway: GatewayProcess, idp: FakeIdP) -> tuple[str, str]:
    """
    Log in through C{gateway}; the Cookie header value and the User-Agent of the browser.
    """
    from tests.support.browser import USER_AGENT

    browser = Browser()
    start = await browser.get(gateway.url("/auth/login?return_to=%2Fapp%2Fdone"))
    test.assertEqual(start.status, 302, start.body)
    assert start.absolute_location is not None
    authorized = await browser.get(start.absolute_location)
    assert authorized.absolute_location is not None
    callback = await browser.get(authorized.absolute_location)
    test.assertEqual(callback.status, 302, (callback.body, gateway.output))
    return "; ".join(f"{k}={v}" for k, v in browser.cookies.items()), USER_AGENT


async def _open_stream(gateway: GatewayProcess, headers: dict[str, str]) -> Any:
    from tests.support.rawclient import connect

    client = await connect(gateway.port)
    lines = [
        "GET /app/events HTTP/1.1",
        f"Host: 127.0.0.1:{gateway.port}",
        "Accept: text/event-stream",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    client.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    received = await client.until(b"data: hello").addTimeout(WAIT, reactor)
    assert received.startswith(b"HTTP/1.1 200 "), received
    return client
