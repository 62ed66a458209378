"""
Helpers for tests of server-side sessions (issue 14): a gateway with browser login and a
C{kvstore} state provider on a real redis-server (read and written behind the gateway's
back with L{tests.support.redis.RedisProbe}), and a server-sent-events client.

The gateway is served the way C{tests/test_login.py} serves one (build_gateway, a
listening port on 127.0.0.1, the IdP client started by hand), with the state store and
the server-side sessions started as the service tree would start them.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.identity.sealing import SESSION_ID_AAD, SESSION_RECORD_AAD, Sealer
from edgegw.identity.session_cookie import SessionRecord, decode_record
from edgegw.state.kvstore import KvStoreService
from edgegw.state.store import StoreUnavailableError
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend
from tests.support.browser import USER_AGENT, Browser, BrowserResponse
from tests.support.configs import write_tree
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of
from tests.support.rawclient import RawClient, connect
from tests.support.redis import RedisProbe, RedisServer

reactor: Any = _reactor

__all__ = [
    "COOKIE",
    "KEY",
    "OTHER_KEY",
    "PREFIX",
    "SessionGateway",
    "index_key",
    "open_stream",
    "sleep",
    "stream_backend",
]

KEY = "0123456789abcdef0123456789abcdef"
"""The session key (32 bytes) of every gateway here unless a test names another."""

OTHER_KEY = "fedcba9876543210fedcba9876543210"
"""Another valid session key."""

PREFIX = "gw:sess:"
"""The default key prefix."""

COOKIE = "gw_session"
"""The session cookie's name."""


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


def index_key(kind: str, value: str) -> bytes:
    """
    The store key (without the prefix) of the index of sessions for one subject
    (C{sub}) or one IdP session (C{idp}), as the issue's key layout documents it.
    """
    return kind.encode("ascii") + b":" + hashlib.sha256(value.encode()).hexdigest().encode()


# -- the backend -------------------------------------------------------------------------


def stream_backend() -> tuple[SiteBackend, list[Request]]:
    """
    A started recording backend answering C{backend}, except that a path ending in
    C{/events} gets a server-sent-events response that sends one event and stays open;
    the open ones are listed.
    """
    held: list[Request] = []

    def respond(request: Request) -> bytes | int:
        if (request.path or b"").endswith(b"/events"):
            request.setHeader(b"content-type", b"text/event-stream")
            request.write(b"data: hello\n\n")
            held.append(request)
            return NOT_DONE_YET
        return b"backend"

    return SiteBackend(respond).start(), held


async def open_stream(
    port: int, path: str, cookie: str | None, *, first_event: bool = True
) -> RawClient:
    """
    A raw client that has sent C{GET path} (as the test browser would, with its
    C{User-Agent}, and the session cookie value C{cookie}) and received the head and
    the first event of the stream (unless C{first_event} is false: nothing read yet).
    """
    client = await connect(port)
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"User-Agent: {USER_AGENT}",
        "Accept: text/event-stream",
    ]
    if cookie is not None:
        lines.append(f"Cookie: {COOKIE}={cookie}")
    client.send(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    if first_event:
        await client.until(b"data: hello").addTimeout(10, reactor)
    return client


# -- the gateway -------------------------------------------------------------------------


class SessionGateway:
    """
    A gateway with browser login through C{idp} and server-side sessions in C{redis},
    in front of C{backend}.

    Routes: C{/app/} (app, login required, forwardAccessToken), C{/api/} (service,
    login required, forwardAccessToken), C{/open/} (app, public).

    @param identity_extra: Lines added to the Gateway's C{identity} block, as for
        L{server_session_config}.
    """

    def __init__(
        self,
        test: TestCase,
        idp: FakeIdP,
        backend: SiteBackend,
        redis: RedisServer,
        *,
        key: str = KEY,
        prefix: str = PREFIX,
        skew: str = "60s",
        timeout: str = "1s",
        state_options: dict[str, Any] | None = None,
        identity_extra: str = "",
    ) -> None:
        self.test = test
        self.idp = idp
        self.backend = backend
        self.redis = redis
        self.key = key
        self.prefix = prefix
        self.skew = skew
        self.timeout = timeout
        self.identity_extra = identity_extra
        self.state_options: dict[str, Any] = {"first_retry": 0.1, "retry_cap": 0.5}
        if redis.ca is not None:
            self.state_options["trust_root"] = redis.ca.trust_root()
        self.state_options.update(state_options or {})
        self.sealer = Sealer(key.encode("ascii"))
        self.gateway: Gateway
        self.port = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    def config_text(self) -> str:
        return server_session_config(
            key=self.key,
            redis_address=self.redis.address,
            issuer=self.idp.issuer,
            upstream=f"http://127.0.0.1:{self.backend.port}",
            skew=self.skew,
            prefix=self.prefix,
            timeout=self.timeout,
            tls=self.redis.tls,
            identity_extra=self.identity_extra,
        )

    async def start(self, wait_for_store: bool = True) -> SessionGateway:
        """
        Build, listen, start the store, the sessions and the IdP client (in the service
        tree's order); everything stops when the test ends. Waits for discovery and,
        unless told not to, until the store answers.
        """
        test = self.test
        root = write_tree(test.mktemp(), {"a.yaml": self.config_text()})
        client = UpstreamClient(reactor)
        self.gateway = build_gateway(
            load_config(root, {}), reactor, client, state_options=self.state_options
        )
        listening = listen_local(self.gateway.site)
        test.addCleanup(listening.stopListening)
        test.addCleanup(client.close)
        self.port = port_of(listening)
        self.idp.redirect_uris.append(self.url("/auth/callback"))
        store = self.store
        sessions = self.gateway.sessions
        assert sessions is not None
        store.startService()
        test.addCleanup(store.stopService)
        sessions.startService()
        test.addCleanup(sessions.stopService)
        provider = self.gateway.idp
        assert provider is not None
        provider.first_retry = 0.05
        provider.retry_cap = 0.2
        provider.startService()
        test.addCleanup(provider.stopService)
        for _ in range(500):
            if provider.ready:
                break
            await sleep(0.02)
        else:
            raise AssertionError(f"IdP never discovered: {provider.last_error}")
        if wait_for_store:
            await self.store_ready()
        return self

    @property
    def store(self) -> KvStoreService:
        store: object = self.gateway.state
        assert isinstance(store, KvStoreService), store
        return store

    async def store_ready(self, within: float = 15.0) -> None:
        """
        Wait until the gateway's store answers.
        """
        deadline = reactor.seconds() + within
        while True:
            try:
                await self.store.get(b"readiness-probe")
                return
            except StoreUnavailableError:
                if reactor.seconds() > deadline:
                    raise
                await sleep(0.05)

    async def login(self, browser: Browser, return_to: str = "/open/landing") -> BrowserResponse:
        """
        Log C{browser} in without following the callback's redirect (so that no request
        with the new session is made yet); the callback's response.
        """
        start = await browser.get(self.url(f"/auth/login?return_to={quote(return_to, safe='')}"))
        if start.status != 302 or start.location is None:
            raise AssertionError(f"login did not start: {start.status} {start.body!r}")
        at_idp = await browser.get(start.location)
        if at_idp.location is None:
            raise AssertionError(f"the IdP did not redirect back: {at_idp.status}")
        return await browser.get(at_idp.location)

    def session_id(self, cookie: str) -> str:
        """
        The session id a session cookie value holds (sealed with the session key).
        """
        opened = self.sealer.unseal(cookie, SESSION_ID_AAD)
        if opened is None:
            raise AssertionError(f"the session cookie does not open: {cookie!r}")
        return opened.decode("ascii")

    def record_key(self, browser: Browser) -> bytes:
        """
        The Redis key of C{browser}'s session record.
        """
        return (self.prefix + self.session_id(browser.cookies[COOKIE])).encode("ascii")

    def open_record(self, session_id: str, sealed: bytes) -> SessionRecord | None:
        """
        A sealed record stored for C{session_id} under this gateway's prefix, opened.
        """
        aad = SESSION_RECORD_AAD + self.prefix.encode("ascii") + session_id.encode("ascii")
        plaintext = self.sealer.unseal(sealed, aad)
        return None if plaintext is None else decode_record(plaintext)

    async def stored_record(self, browser: Browser) -> SessionRecord | None:
        """
        C{browser}'s session record as it is in Redis now (L{None}: there is none).
        """
        session_id = self.session_id(browser.cookies[COOKIE])
        sealed = await RedisProbe(self.redis).get(self.prefix + session_id)
        if sealed is None:
            return None
        record = self.open_record(session_id, sealed)
        if record is None:
            raise AssertionError("the stored record does not open with the session key")
        return record

    def seal_session_id(self, session_id: str) -> str:
        """
        A session cookie value naming C{session_id}, as the gateway would set it.
        """
        return self.sealer.seal(session_id.encode("ascii"), SESSION_ID_AAD)


def server_session_config(
    *,
    key: str,
    redis_address: str,
    issuer: str,
    upstream: str,
    skew: str = "60s",
    prefix: str = "gw:sess:",
    timeout: str = "1s",
    tls: bool = False,
    identity_extra: str = "",
    extra_routes: str = "",
) -> str:
    """
    A gateway with server-side sessions in the kvstore at C{redis_address}, login at the
    IdP C{issuer} (client gw, secret gw-secret), and three routes to C{upstream}:
    C{/app/} (app, login required, forwards the access token), C{/api/} (service,
    required by default, forwards it) and C{/open/} (a public app route).

    @param identity_extra: Lines added to the C{identity} block (indented by four).
    @param extra_routes: More resources, appended as they are.
    """
    return f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  session: {{key: "{key}"}}
  identity:
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
{identity_extra}
  stateProvider:
    type: kvstore
    refreshSkew: {skew}
    keyPrefix: "{prefix}"
    config: {{address: "{redis_address}", timeout: {timeout}, tls: {"true" if tls else "false"}}}
---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{issuer}"
  clientID: gw
  clientSecret: gw-secret
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardAccessToken: true}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardAccessToken: true}}
---
kind: Route
metadata: {{name: open}}
spec:
  match: /open/
  type: app
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
{extra_routes}"""
