"""
WebSocket handshakes and the gateway's cookies.

A backend cannot set the session cookie through a handshake's C{101} either: the
C{Set-Cookie} filter covers C{Tunnel}'s response head as it does the proxy's, because
browsers process C{Set-Cookie} on a WebSocket handshake response (RFC 6455 4.1, RFC
6265), here on a public route that any page can open a socket to.

And the session cookie alone does not authenticate a cross-origin handshake.
Handshakes are GETs, so the security layer's CSRF check never looks at them; a page on a
I{same-site} origin (another subdomain: C{SameSite=Lax} cookies are sent to same-site
subresources, WebSocket handshakes included) could otherwise open a socket to an
authenticated route as the victim and read and write on it (cross-site WebSocket
hijacking). The handshake says where it comes from (C{Origin}, C{Sec-Fetch-Site:
same-site}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase

from tests.support.backends import RawBackend
from tests.support.rawclient import connect
from tests.test_login import world, world_with_routes

ROUTES = """\
kind: Route
metadata: {name: ws}
spec:
  match: /ws/
  type: app
  handler: {type: reverse-proxy, upstream: "http://127.0.0.1:RAWPORT"}
"""


class WebSocketSetCookie(TestCase):
    async def test_101_cannot_set_the_session_cookie(self) -> None:
        def respond(request: Any, connection: Any) -> None:
            if request.index in connection.answered:
                return
            connection.answered.add(request.index)
            connection.write(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
                b"Set-Cookie: gw_session=ATTACKERS_SEALED_SESSION; Path=/; HttpOnly\r\n\r\n"
            )

        raw = RawBackend(respond).start()
        self.addCleanup(lambda: ensureDeferred(raw.stop()))
        w = await world_with_routes(self, ROUTES.replace("RAWPORT", str(raw.port)))
        client = await connect(w.port)
        client.send(
            b"GET /ws/x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Origin: http://127.0.0.1:%d\r\n\r\n" % (w.port, w.port)
        )
        head = await client.until(b"\r\n\r\n")
        await client.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        self.assertNotIn(b"gw_session=", head, "the 101 relayed the backend's gw_session cookie")


class CrossOriginWebSocket(TestCase):
    async def test_cross_origin_upgrade_is_not_authenticated_by_the_cookie(self) -> None:
        w = await world(self)
        await w.login("/app/x")
        before = len(w.backend.requests)
        response = await w.browser.get(
            w.url("/api/socket"),
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Origin": "http://evil.127.0.0.1.nip.io",
                "Sec-Fetch-Site": "same-site",
                "Sec-Fetch-Mode": "websocket",
            },
        )
        reached = w.backend.requests[before:]
        identity = reached[-1].header(b"X-User-Id") if reached else None
        self.assertIsNone(
            identity,
            f"cross-origin WebSocket handshake authenticated as {identity!r} "
            f"(status {response.status})",
        )
