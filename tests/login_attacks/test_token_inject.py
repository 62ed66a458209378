"""
Finding (low): the access token from the token endpoint is kept in the session without
checking that it can ever be sent as "Authorization: Bearer <token>" (RFC 6750 b64token).
A token with CR/LF is refused by the upstream head writer (no injection: ValueError ->
502), a non-ASCII one raises UnicodeEncodeError in ProxyHandler.request_headers (500).
Either way the login "succeeds" and every forwardAccessToken request of that session
then fails for the whole ttl.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import TestCase

from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP
from tests.test_login import LoginWorld


class OddTokenIdP(FakeIdP):
    odd_token = "tok\r\nX-Injected: yes"

    def _render_token(self, request: Any) -> Any:
        result = super()._render_token(request)
        if isinstance(result, dict) and "access_token" in result:
            result["access_token"] = self.odd_token
        return result


async def odd_world(test: TestCase, token: str) -> LoginWorld:
    idp = OddTokenIdP()
    idp.odd_token = token
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = LoginWorld(test, idp, backend)
    await w.start()
    return w


class AccessTokenValidation(TestCase):
    async def test_crlf_access_token_does_not_leave_a_broken_session(self) -> None:
        w = await odd_world(self, "tok\r\nX-Injected: yes")
        await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            again = await w.browser.get(w.url("/app/y"))
            self.assertEqual(again.status, 200, "session set with a token that cannot be sent")
            self.assertIsNone(w.backend.requests[-1].header(b"X-Injected"))

    async def test_non_ascii_access_token_does_not_leave_a_broken_session(self) -> None:
        w = await odd_world(self, "tok\u00e9")
        await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            again = await w.browser.get(w.url("/app/y"))
            self.assertEqual(again.status, 200, "session set with a token that cannot be sent")
