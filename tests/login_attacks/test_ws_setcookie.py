"""
Finding: the backend Set-Cookie filter lives in ProxyHandler.relay_head only. A WebSocket
handshake's 101 goes through Tunnel._head, which copies every upstream header but the
hop-by-hop ones, Set-Cookie for the gateway's own cookie included. Browsers process
Set-Cookie on a WebSocket handshake response (RFC 6455 4.1, RFC 6265), so any backend
behind a proxy route still replaces a visitor's session (here on a public route that any
page can open a socket to).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase

from tests.login_attacks.world import rworld
from tests.support.backends import RawBackend
from tests.support.rawclient import connect

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
        w = await rworld(self, ROUTES.replace("RAWPORT", str(raw.port)))
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
