"""
Finding: a login state is "used once" only in the sense that the callback asks the browser
to drop its cookie. Nothing on the gateway remembers a consumed state, so a client that
keeps the cookie can replay one /auth/login's state for its whole 10-minute lifetime.
An unauthenticated client therefore gets one token-endpoint call (with the gateway's
client credentials) per GET /auth/callback, as fast as it can send them: one /auth/login,
then any number of callbacks with made-up codes. IdPs rate-limit and lock out per client
id, so this lets anyone exhaust the gateway's token-endpoint quota (every user's login
then fails), and each call holds an IdP connection for up to CALL_TIMEOUT.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.support.browser import Browser
from tests.test_login import world


class ConsumedStates(TestCase):
    async def test_one_login_state_buys_one_token_request(self) -> None:
        w = await world(self)
        attacker = Browser()
        await attacker.get(w.url("/auth/login"))
        login_cookies = {k: v for k, v in attacker.cookies.items() if ".login." in k}
        state = next(iter(login_cookies)).split(".login.", 1)[1]
        for index in range(20):
            replay = Browser(cookies=dict(login_cookies))
            response = await replay.get(
                w.url(f"/auth/callback?state={state}&code=guess{index}&iss={w.idp.issuer}")
            )
            self.assertIn(response.status, (400, 502))
        self.assertLessEqual(
            len(w.idp.token_requests), 1, f"{len(w.idp.token_requests)} token requests"
        )
