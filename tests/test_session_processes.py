"""
Server-side sessions shared by several gateway processes (issue 14): two real
C{twistd -n edgegw} processes with the same configuration (session key, IdP, Redis
state provider), a real redis-server, the fake IdP and test backends in the test
process.

  - a due access token is refreshed once, whichever process and however many requests
    ask for it at once (single flight in each process, the Redis lock across them);
  - a back-channel logout posted to one process ends the session for the other too and
    closes the session's open SSE stream and WebSocket tunnel there;
  - a plain logout at one process closes the session's SSE stream at the other.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from typing import Any

import jwt
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from tests.support.backends import RawBackend, RawConnection, RawRequest, SiteBackend, answer
from tests.support.browser import USER_AGENT, Browser
from tests.support.daemons import GatewayProcess, HttpAnswer, http_exchange, sleep
from tests.support.fake_idp import FakeIdP
from tests.support.rawclient import RawClient, connect
from tests.support.redis import RedisServer, redis_command, redis_server
from tests.support.sessions import server_session_config

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"
KEY_PREFIX = "gw:sess:"
READY_TIMEOUT = 30.0
STREAM_CLOSE_LIMIT = 2.0
"""Seconds a stream may stay open after its session ended (the issue says within a
second; twice that on a loaded machine)."""

SESSION_KEY = re.compile(re.escape(KEY_PREFIX.encode()) + rb"[A-Za-z0-9_-]{32}")
"""A session record's key in Redis."""

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _config(redis: RedisServer, idp: FakeIdP, upstream: str, sse: str, ws: str) -> str:
    return server_session_config(
        key=KEY,
        redis_address=redis.address,
        issuer=idp.issuer,
        upstream=upstream,
        prefix=KEY_PREFIX,
        timeout="2s",
        extra_routes=f"""\
---
kind: Route
metadata: {{name: events}}
spec:
  match: /events/
  type: service
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{sse}"}}
---
kind: Route
metadata: {{name: ws}}
spec:
  match: /ws/
  type: service
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{ws}"}}
""",
    )


def _event_stream(request: Request) -> int:
    """
    A server-sent event response that sends its head and one event, then stays open.
    """
    request.setHeader(b"Content-Type", b"text/event-stream")
    request.setHeader(b"Cache-Control", b"no-store")
    request.write(b"data: hello\n\n")
    return NOT_DONE_YET


def _websocket_echo(request: RawRequest, connection: RawConnection) -> None:
    """
    A L{RawBackend} responder (on heads) that accepts a WebSocket handshake with a 101 and
    then echoes every byte (no framing: the gateway relays bytes).
    """
    if request.index in connection.answered:
        return
    connection.answered.add(request.index)
    key = b""
    for line in request.head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            key = value.strip()
    accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())
    connection.write(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    connection.takeover = connection.write


class World:
    """
    Redis, the fake IdP, the backends and two gateway processes in front of them.
    """

    def __init__(self, test: TestCase) -> None:
        self.test = test
        self.idp = FakeIdP()
        self.backend = SiteBackend(answer(body=b"backend"))
        self.sse = SiteBackend(_event_stream)
        self.ws = RawBackend(_websocket_echo, on_head=True)
        self.redis: RedisServer
        self.gateways: list[GatewayProcess] = []
        self.browser = Browser()

    async def start(self) -> None:
        test = self.test
        self.redis = await redis_server(test)
        await self.idp.start(test)
        for backend in (self.backend, self.sse, self.ws):
            backend.start()
            test.addCleanup(backend.stop)
        text = _config(
            self.redis,
            self.idp,
            f"http://127.0.0.1:{self.backend.port}",
            f"http://127.0.0.1:{self.sse.port}",
            f"http://127.0.0.1:{self.ws.port}",
        )
        # Cleanups run last first: the processes go before the IdP, backends and Redis.
        self.gateways = [
            GatewayProcess(test, {"gateway.yaml": text}, name=f"gw{index}") for index in (1, 2)
        ]
        await gatherResults([Deferred.fromCoroutine(gw.start()) for gw in self.gateways])
        for gw in self.gateways:
            self.idp.redirect_uris.append(gw.url("/auth/callback"))
        await self.ready()

    @property
    def gw1(self) -> GatewayProcess:
        return self.gateways[0]

    @property
    def gw2(self) -> GatewayProcess:
        return self.gateways[1]

    async def ready(self) -> None:
        """
        Wait until both processes have discovered the IdP and hold their connections to
        Redis: commands, and the subscription to the logout channel.
        """
        deadline = reactor.seconds() + READY_TIMEOUT
        channel = KEY_PREFIX + "logout"
        state = ""
        while reactor.seconds() < deadline:
            numsub = await redis_command(self.redis.port, "PUBSUB", "NUMSUB", channel)
            clients = await redis_command(self.redis.port, "CLIENT", "LIST")
            # Every process: a command connection and a pub/sub one; and this query's.
            connections = len(clients.strip().splitlines()) - 1
            logins = [
                await http_exchange(gw.port, "GET", "/auth/login?return_to=%2Fapp%2F")
                for gw in self.gateways
            ]
            discovered = all(
                answer.status == 302
                and (answer.header(b"location") or b"").startswith(self.idp.issuer.encode())
                for answer in logins
            )
            state = f"subscribers {numsub[1]}, connections {connections}, logins " + ", ".join(
                str(answer.status) for answer in logins
            )
            if numsub[1] == 2 and connections >= 4 and discovered:
                return
            await sleep(0.1)
        outputs = "\n".join(f"--- {gw.name}:\n{gw.output}" for gw in self.gateways)
        self.test.fail(f"gateways not ready ({state}):\n{outputs}")

    async def login(self) -> str:
        """
        Log in through gateway 1, stopping at the callback's redirect (no request is made
        with the new session yet); the C{Cookie} header value that carries the session.
        """
        gw1 = self.gw1
        browser = self.browser
        start = await browser.get(gw1.url("/auth/login?return_to=%2Fapp%2Fdone"))
        self.test.assertEqual(start.status, 302, start.body)
        assert start.absolute_location is not None
        self.test.assertTrue(start.absolute_location.startswith(self.idp.issuer))
        authorized = await browser.get(start.absolute_location)
        self.test.assertEqual(authorized.status, 302, authorized.body)
        assert authorized.absolute_location is not None
        self.test.assertTrue(authorized.absolute_location.startswith(gw1.url("/auth/callback")))
        callback = await browser.get(authorized.absolute_location)
        self.test.assertEqual(callback.status, 302, (callback.body, gw1.output))
        self.test.assertEqual(callback.location, "/app/done")
        self.test.assertIn("gw_session", browser.cookies)
        return "; ".join(f"{name}={value}" for name, value in browser.cookies.items())

    def headers(self, cookie: str, **more: str) -> dict[str, str]:
        """
        The headers of the logged-in browser: its cookie, and its User-Agent (the session
        fingerprint).
        """
        return {"Cookie": cookie, "User-Agent": USER_AGENT, **more}

    async def open_event_stream(self, gw: GatewayProcess, cookie: str) -> RawClient:
        """
        Open C{GET /events/feed} at C{gw} with the session and wait for its first event.
        """
        client = await connect(gw.port)
        self.test.addCleanup(_abort, client)
        lines = [
            "GET /events/feed HTTP/1.1",
            f"Host: 127.0.0.1:{gw.port}",
            "Accept: text/event-stream",
            *(f"{name}: {value}" for name, value in self.headers(cookie).items()),
        ]
        client.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        received = await client.until(b"data: hello").addTimeout(10, reactor)
        self.test.assertTrue(received.startswith(b"HTTP/1.1 200 "), received)
        self.test.assertIn(b"text/event-stream", received.lower())
        return client

    async def open_websocket(self, gw: GatewayProcess, cookie: str) -> RawClient:
        """
        Open a WebSocket tunnel to C{/ws/chat} at C{gw} with the session, and check that
        bytes go through it.
        """
        client = await connect(gw.port)
        self.test.addCleanup(_abort, client)
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        lines = [
            "GET /ws/chat HTTP/1.1",
            f"Host: 127.0.0.1:{gw.port}",
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Key: {key}",
            *(f"{name}: {value}" for name, value in self.headers(cookie).items()),
        ]
        client.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await client.until(b"\r\n\r\n").addTimeout(10, reactor)
        self.test.assertTrue(head.startswith(b"HTTP/1.1 101 "), head)
        client.received = b""
        client.send(b"ping")
        await client.until(b"ping").addTimeout(10, reactor)
        return client

    async def get(self, gw: GatewayProcess, target: str, cookie: str) -> HttpAnswer:
        return await http_exchange(gw.port, "GET", target, self.headers(cookie))


def _abort(client: RawClient) -> None:
    transport = client.transport
    if transport is not None and not client.closed.called:
        transport.abortConnection()  # type: ignore[attr-defined]


async def closed_within(clients: list[RawClient], limit: float) -> list[float | None]:
    """
    Wait until every client's connection is closed, at most C{limit} seconds; how long
    each took (L{None}: still open).
    """
    started = reactor.seconds()
    took: list[float | None] = [None] * len(clients)
    while True:
        now = reactor.seconds()
        for index, client in enumerate(clients):
            if took[index] is None and client.closed.called:
                took[index] = now - started
        if all(t is not None for t in took) or now - started > limit:
            return took
        await sleep(0.01)


async def world(test: TestCase) -> World:
    built = World(test)
    await built.start()
    return built


class SingleFlightAcrossProcessesTests(TestCase):
    timeout = 120

    async def test_due_token_refreshed_once_by_two_processes(self) -> None:
        w = await world(self)
        idp = w.idp
        # Issued for 30s, within the 60s refreshSkew: due at once.
        idp.token_lifetime = 30
        cookie = await w.login()
        self.assertEqual(idp.refresh_grants, 0)
        # The refreshed token lasts: nothing is due again in this test. A slow answer
        # keeps the refresh in flight while every request arrives.
        idp.token_lifetime = 3600
        idp.refresh_delay = 0.5
        requests = [
            Deferred.fromCoroutine(w.get(gw, f"/app/burst/{gw.name}/{index}", cookie))
            for index in range(10)
            for gw in w.gateways
        ]
        answers = await gatherResults(requests)
        self.assertEqual(
            [a.status for a in answers],
            [200] * 20,
            [a.raw[:300] for a in answers if a.status != 200],
        )
        self.assertEqual(idp.refresh_grants, 1, "\n".join(gw.output for gw in w.gateways))
        refresh_requests = [r for r in idp.token_requests if r.get("grant_type") == "refresh_token"]
        self.assertEqual(len(refresh_requests), 1)
        seen = {
            r.uri.decode(): r.header(b"authorization")
            for r in w.backend.requests
            if r.uri.startswith(b"/app/burst/")
        }
        expected = {f"/app/burst/{gw.name}/{index}" for index in range(10) for gw in w.gateways}
        self.assertEqual(set(seen), expected)
        tokens = set(seen.values())
        self.assertEqual(len(tokens), 1, tokens)
        [authorization] = tokens
        assert authorization is not None
        scheme, _, token = authorization.partition(b" ")
        self.assertEqual(scheme, b"Bearer")
        claims = jwt.decode(token, options={"verify_signature": False})
        # The refreshed token (issued for 3600s), not the one of the login (30s).
        self.assertEqual(claims["exp"] - claims["iat"], 3600)
        # Stored for both processes: a later request anywhere sends it without refreshing.
        for gw in w.gateways:
            later = await w.get(gw, "/app/later", cookie)
            self.assertEqual(later.status, 200)
            self.assertEqual(w.backend.requests[-1].header(b"authorization"), authorization)
        self.assertEqual(idp.refresh_grants, 1)


class LogoutAcrossProcessesTests(TestCase):
    timeout = 120

    async def test_backchannel_logout_at_one_process_ends_streams_at_the_other(self) -> None:
        w = await world(self)
        cookie = await w.login()
        [sid] = w.idp.sessions
        # The session works at gateway 2, which never saw the login.
        api = await w.get(w.gw2, "/api/before", cookie)
        self.assertEqual(api.status, 200, api.raw[:300])
        events = await w.open_event_stream(w.gw2, cookie)
        socket = await w.open_websocket(w.gw2, cookie)
        token = w.idp.mint_logout_token(sid=sid, header={"typ": "logout+jwt"})
        started = reactor.seconds()
        logout = await w.browser.post(
            w.gw1.url("/auth/backchannel-logout"), {"logout_token": token}, cookies=False
        )
        self.assertEqual(logout.status, 200, (logout.body, w.gw1.output))
        took = await closed_within(
            [events, socket], STREAM_CLOSE_LIMIT - (reactor.seconds() - started)
        )
        self.assertNotIn(
            None,
            took,
            f"streams at gateway 2 still open (SSE, WebSocket): {took}\n{w.gw2.output}",
        )
        # The session is gone for gateway 2 as well.
        app = await w.get(w.gw2, "/app/after", cookie)
        self.assertEqual(app.status, 302, app.raw[:300])
        self.assertTrue((app.header(b"location") or b"").startswith(b"/auth/login?"), app.raw)
        api = await w.get(w.gw2, "/api/after", cookie)
        self.assertEqual(api.status, 401, api.raw[:300])
        # No session record is left in Redis.
        stored = await redis_command(w.redis.port, "KEYS", KEY_PREFIX + "*")
        self.assertEqual([key for key in stored if SESSION_KEY.fullmatch(key)], [], stored)

    async def test_logout_at_one_process_closes_the_stream_at_the_other(self) -> None:
        w = await world(self)
        cookie = await w.login()
        events = await w.open_event_stream(w.gw2, cookie)
        started = reactor.seconds()
        logout = await w.browser.post(w.gw1.url("/auth/logout"), headers={"Origin": w.gw1.origin})
        self.assertEqual(logout.status, 302, (logout.body, w.gw1.output))
        took = await closed_within([events], STREAM_CLOSE_LIMIT - (reactor.seconds() - started))
        self.assertNotIn(None, took, f"SSE stream at gateway 2 still open\n{w.gw2.output}")
        # The old cookie no longer opens the session at gateway 2.
        app = await w.get(w.gw2, "/app/after", cookie)
        self.assertEqual(app.status, 302, app.raw[:300])
        api = await w.get(w.gw2, "/api/after", cookie)
        self.assertEqual(api.status, 401, api.raw[:300])
