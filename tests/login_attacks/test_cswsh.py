"""
Finding: WebSocket handshakes are GETs, so the security layer's CSRF check never looks at
them, and the new session stage authenticates them by the session cookie alone. A page on a
*same-site* origin (another subdomain: SameSite=Lax cookies are sent to same-site
subresources, WebSocket handshakes included) can open a socket to an authenticated route
as the victim, and read and write on it (cross-site WebSocket hijacking). The handshake
says where it comes from (Origin, Sec-Fetch-Site: same-site); the gateway ignores both.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.test_login import world


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
