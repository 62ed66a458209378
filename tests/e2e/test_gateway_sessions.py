"""
Server-side sessions (issue 14) end to end: a gateway with C{stateProvider: kvstore} on a
real redis-server, logging in through the real OpenID provider (node's oidc-provider,
tests/e2e/provider.mjs), with the provider's refresh-token rotation (a spent refresh
token replayed revokes the whole grant) and its OIDC Back-Channel Logout (the provider
posts a logout_token to the gateway when the user logs out at the provider).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin

import attrs
import txredisapi  # type: ignore[import-untyped]
from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.sessions.server import ServerSessions
from edgegw.state.store import StoreUnavailableError
from edgegw.upstream.pool import UpstreamClient
from tests.e2e.provider import (
    CookieClient,
    Provider,
    login_through_forms,
    parse_forms,
    start_provider,
)
from tests.support.backends import SiteBackend, answer
from tests.support.configs import write_tree
from tests.support.processes import free_port
from tests.support.redis import RedisServer, redis_server

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"
PREFIX = "gw:sess:"
BACKCHANNEL_PATH = "/auth/backchannel-logout"
# A session id: 24 random bytes, base64url (edgegw.sessions.server).
RECORD_KEY = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_-]{32}")


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def redis_command(server: RedisServer, *command: str) -> Any:
    """
    One command on a connection of its own to C{server} (replies decoded as UTF-8).
    """
    connection = await txredisapi.Connection("127.0.0.1", server.port, reconnect=False)
    try:
        return await connection.execute_command(*command)
    finally:
        await connection.disconnect()


async def session_keys(server: RedisServer) -> list[str]:
    """
    Every key under the gateway's prefix, sorted.
    """
    keys = await redis_command(server, "KEYS", PREFIX + "*")
    return sorted(keys)


@attrs.define
class Setup:
    """
    One gateway with server-side sessions and what it talks to.
    """

    origin: str
    gateway: Gateway
    sessions: ServerSessions
    backend: SiteBackend
    provider: Provider
    redis: RedisServer


class SessionGateway(TestCase):
    """
    A gateway with server-side sessions in a real Redis and browser login against the
    real provider (no tests of its own).
    """

    async def serve(
        self, *, provider_env: dict[str, str] | None = None, refresh_skew: str = "60s"
    ) -> Setup:
        redis = await redis_server(self)
        port = free_port()
        origin = f"http://127.0.0.1:{port}"
        provider = await start_provider(
            self,
            [origin + "/auth/callback"],
            backchannel_logout_uri=origin + BACKCHANNEL_PATH,
            env=provider_env,
        )
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:{port}"
  session: {{key: "{KEY}"}}
  stateProvider:
    type: kvstore
    refreshSkew: {refresh_skew}
    config: {{address: "{redis.address}", timeout: 2s}}
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  clientSecret: "{provider.client_secret}"
  redirectURL: "{origin}/auth/callback"
  scopes: [openid, profile, email, groups]
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler:
    type: reverse-proxy
    upstream: "http://127.0.0.1:{backend.port}"
    forwardAccessToken: true
"""
        root = write_tree(self.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        gateway = build_gateway(
            load_config(root, {}),
            reactor,
            client,
            state_options={"first_retry": 0.05, "retry_cap": 0.3},
        )
        self.assertIn(("POST", BACKCHANNEL_PATH), gateway.auth_endpoints)
        sessions = gateway.sessions
        store: Any = gateway.state
        idp = gateway.idp
        assert sessions is not None and store is not None and idp is not None
        listening = reactor.listenTCP(port, gateway.site, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        self.addCleanup(client.close)
        # As the daemon's service tree does: the store, then the sessions, then the IdP;
        # stopped in reverse order (cleanups run last-added first).
        store.startService()
        self.addCleanup(store.stopService)
        sessions.startService()
        self.addCleanup(sessions.stopService)
        idp.startService()
        self.addCleanup(idp.stopService)
        for _ in range(250):
            if idp.ready:
                break
            await sleep(0.02)
        self.assertTrue(idp.ready, idp.last_error)
        await self.until(lambda: self.store_answers(store), "the state store never answered")
        return Setup(origin, gateway, sessions, backend, provider, redis)

    async def store_answers(self, store: Any) -> bool:
        try:
            await store.get(b"readiness-probe")
        except StoreUnavailableError:
            return False
        return True

    async def until(
        self, condition: Callable[[], Awaitable[bool]], message: str, within: float = 5.0
    ) -> None:
        """
        Poll C{condition} every 50 ms until it holds; fail with C{message} after
        C{within} seconds.
        """
        deadline = reactor.seconds() + within
        while not await condition():
            if reactor.seconds() > deadline:
                self.fail(message)
            await sleep(0.05)

    async def login(self, setup: Setup, user: str = "alice") -> CookieClient:
        """
        Log C{user} in through the gateway and the provider's forms; the browser (its
        gateway and provider cookies) is returned, the app page not yet visited.
        """
        browser = CookieClient()
        callback = await login_through_forms(
            browser.get, browser.post, setup.origin + "/app/page?x=1", user
        )
        self.assertTrue(callback.startswith(setup.origin + "/auth/callback?"), callback)
        back = await browser.get(callback)
        self.assertEqual(back.status, 302, back.body[:300])
        self.assertEqual(back.headers.get("location"), "/app/page?x=1")
        return browser

    def forwarded_token(self, setup: Setup) -> bytes:
        seen = setup.backend.requests[-1]
        token = seen.header(b"Authorization")
        assert token is not None
        self.assertTrue(token.startswith(b"Bearer "), token[:40])
        return token


class ServerSessionTests(SessionGateway):
    async def test_login_stores_the_session_in_redis(self) -> None:
        setup = await self.serve()
        browser = await self.login(setup)

        keys = await session_keys(setup.redis)
        records = [k for k in keys if RECORD_KEY.fullmatch(k)]
        self.assertEqual(len(records), 1, keys)
        (record,) = records
        session_id = record[len(PREFIX) :]
        subjects = [k for k in keys if k.startswith(PREFIX + "sub:")]
        idp_sessions = [k for k in keys if k.startswith(PREFIX + "idp:")]
        # oidc-provider puts sid in the id_token for a client with a back-channel
        # logout URI: the IdP session's index is kept.
        self.assertEqual((len(subjects), len(idp_sessions)), (1, 1), keys)
        self.assertEqual(sorted(keys), sorted([record, *subjects, *idp_sessions]))
        for index in (subjects[0], idp_sessions[0]):
            members = await redis_command(setup.redis, "SMEMBERS", index)
            self.assertEqual(set(members), {session_id}, index)
        # Expiring with the session (the default session life, well under a day).
        ttl = await redis_command(setup.redis, "PTTL", record)
        self.assertGreater(ttl, 0)
        self.assertLessEqual(ttl, 24 * 3600 * 1000)
        # The cookie holds only the sealed id: no token, nothing of the record.
        stored = await redis_command(setup.redis, "GET", record)
        self.assertNotIn("alice", stored)
        cookies = {c.name: c.value for c in browser.cookies if c.domain.startswith("127.0.0.1")}
        self.assertTrue(cookies, "no gateway cookie")
        for value in cookies.values():
            self.assertLess(len(value or ""), 200, cookies)
            self.assertNotIn(stored, value or "")

        page = await browser.get(setup.origin + "/app/page?x=1")
        self.assertEqual((page.status, page.body), (200, b"backend"))
        seen = setup.backend.requests[-1]
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(seen.header(b"X-User-Email"), b"alice@example.com")
        self.forwarded_token(setup)
        view = await browser.get(setup.origin + "/auth/session")
        self.assertEqual(view.status, 200, view.body)
        self.assertEqual(view.json()["subject"], "alice")
        # The default skew (60 s) is well within the access token's 120 s: no refresh.
        self.assertEqual(setup.sessions.refresher.refreshes, 0)

    async def test_silent_refresh_stores_the_rotated_refresh_token(self) -> None:
        # The provider's access tokens live 120 s, the skew is 300 s: every request with
        # the session refreshes its access token first, each time with the refresh token
        # the previous refresh rotated in.
        setup = await self.serve(
            provider_env={"E2E_OIDC_TTL_ACCESS_TOKEN": "120"}, refresh_skew="300s"
        )
        browser = await self.login(setup)
        (record,) = [k for k in await session_keys(setup.redis) if RECORD_KEY.fullmatch(k)]
        at_login = await redis_command(setup.redis, "GET", record)

        first = await browser.get(setup.origin + "/app/one")
        self.assertEqual((first.status, first.body), (200, b"backend"), first.headers)
        token_one = self.forwarded_token(setup)
        self.assertEqual(setup.sessions.refresher.refreshes, 1)
        after_first = await redis_command(setup.redis, "GET", record)
        self.assertNotEqual(after_first, at_login, "the refreshed record was not stored")

        second = await browser.get(setup.origin + "/app/two")
        self.assertEqual((second.status, second.body), (200, b"backend"), second.headers)
        token_two = self.forwarded_token(setup)
        self.assertEqual(setup.sessions.refresher.refreshes, 2)
        # Had the first refresh's rotated refresh token not been stored, the second
        # refresh would have replayed a spent one: the provider refuses it (and revokes
        # the grant), the gateway goes on with the first refresh's access token.
        self.assertNotEqual(token_one, token_two)
        self.assertNotIn("grant.error", setup.provider.stderr)

        third = await browser.get(setup.origin + "/app/three")
        self.assertEqual(third.status, 200)
        token_three = self.forwarded_token(setup)
        self.assertEqual(len({token_one, token_two, token_three}), 3)
        self.assertEqual(setup.sessions.refresher.refreshes, 3)
        self.assertEqual(setup.backend.requests[-1].header(b"X-User-Id"), b"alice")
        self.assertNotIn("grant.error", setup.provider.stderr)
        # No refresh lock left behind.
        keys = await session_keys(setup.redis)
        self.assertEqual([k for k in keys if k.startswith(PREFIX + "lock:")], [])

    async def test_backchannel_logout_from_the_provider(self) -> None:
        setup = await self.serve()
        browser = await self.login(setup)
        page = await browser.get(setup.origin + "/app/page")
        self.assertEqual((page.status, page.body), (200, b"backend"))
        keys = await session_keys(setup.redis)
        (record,) = [k for k in keys if RECORD_KEY.fullmatch(k)]
        (idp_index,) = [k for k in keys if k.startswith(PREFIX + "idp:")]

        # RP-initiated logout at the provider, with the browser's provider cookies: its
        # confirmation form, then the logout, which posts a logout token to the gateway.
        discovery = await browser.get(setup.provider.discovery_url)
        end_session = discovery.json()["end_session_endpoint"]
        confirm = await browser.get(end_session, {"client_id": setup.provider.client_id})
        self.assertEqual(confirm.status, 200, confirm.body[:600])
        forms = [f for f in parse_forms(confirm.body) if f.method == "post"]
        self.assertEqual(len(forms), 1, confirm.body[:600])
        (form,) = forms
        self.assertIn(("logout", "yes"), form.buttons)
        done = await browser.post(urljoin(end_session, form.action), form.submission())
        self.assertIn(done.status, (302, 303), done.body[:600])

        async def record_gone() -> bool:
            return bool(await redis_command(setup.redis, "EXISTS", record) == 0)

        await self.until(
            record_gone,
            "the session record is still in Redis after the back-channel logout; "
            f"provider log:\n{setup.provider.stderr}",
        )
        self.assertIn("back-channel logout of alice", setup.provider.stderr)
        self.assertNotIn("backchannel.error", setup.provider.stderr)
        self.assertEqual(await redis_command(setup.redis, "EXISTS", idp_index), 0)

        # The browser still sends its cookie: no session any more, back to the login.
        requests = len(setup.backend.requests)
        after = await browser.get(setup.origin + "/app/page")
        self.assertEqual(after.status, 302, after.body[:300])
        self.assertTrue(after.headers.get("location", "").startswith("/auth/login"), after.headers)
        self.assertEqual(len(setup.backend.requests), requests)
        view = await browser.get(setup.origin + "/auth/session")
        self.assertEqual(view.status, 401, view.body)
