"""
Finding (low): id_token claims are parsed with plain json.loads, which accepts a lone
UTF-16 surrogate escape ("\\ud800") -- read_json refuses those for userinfo, tokens.py
does not. Such a claim is kept in the passport, sealed into the session (ensure_ascii
hides it), and then breaks everything that encodes it as UTF-8: the session view and the
projected X-User-<Claim> header. The login "succeeds" and the session is unusable.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.test_login import world


class LoneSurrogateClaim(TestCase):
    async def test_session_usable_or_login_refused(self) -> None:
        w = await world(self)
        w.idp.user["name"] = "Al\ud800ice"
        w.idp.user["given_name"] = "x"
        w.idp.user["family_name"] = "y"
        final = await w.login("/app/x")
        if "gw_session" in w.browser.cookies:
            self.assertEqual(final.status, 200, "proxied request of the new session failed")
            view = await w.browser.get(w.url("/auth/session"))
            self.assertEqual(view.status, 200, "session view failed")
