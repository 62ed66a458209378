"""
Regressions from the independent review of issue 36 (identity hardening): each test failed
against the reviewed code.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser
from tests.support.fake_idp import FakeIdP
from tests.support.redis import redis_server
from tests.support.sessions import SessionGateway
from tests.test_bearer import BearerTestCase, bearer_world
from tests.test_cookie_tossing import NAVIGATE, log_in_at


class AmbiguousCookieLogout(TestCase):
    """
    Server-side sessions over plain http (or with C{hostPrefix: false}), where a sibling
    can toss a C{gw_session} for the parent domain: the browser then sends it beside
    its own on every request, the logout included.
    """

    async def test_logout_with_a_tossed_cookie_still_ends_the_users_session(self) -> None:
        """
        The user's logout must revoke her stored session (docs/architecture.md: "with a
        state provider the record is deleted first"). With a tossed cookie beside hers,
        L{ServerSessions.end} finds no session id (ambiguous) and deletes nothing: her
        cookie, copied before the logout, keeps working until the record's TTL.
        """
        redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        gateway = await SessionGateway(self, idp, backend, redis).start()
        alice = await log_in_at(gateway.url, idp, "alice")
        a = alice.cookies["gw_session"]
        m = (await log_in_at(gateway.url, idp, "mallory")).cookies["gw_session"]

        async def user(cookies: str) -> bytes | None:
            before = len(backend.requests)
            await Browser().get(gateway.url("/app/x"), headers={**NAVIGATE, "Cookie": cookies})
            reached = backend.requests[before:]
            return reached[-1].header(b"X-User-Id") if reached else None

        self.assertEqual(await user(f"gw_session={a}"), b"alice")
        # Her browser (her own cookie first, the tossed one after) logs out.
        response = await alice.post(
            gateway.url("/auth/logout"),
            headers={
                "Origin": gateway.origin,
                "Sec-Fetch-Site": "same-origin",
                "Cookie": f"gw_session={a}; gw_session={m}",
            },
        )
        self.assertEqual(response.status, 302)
        # Her session is over: a copy of her cookie is no session any more.
        self.assertIsNone(
            await user(f"gw_session={a}"),
            "the logout left the user's stored session alive (its cookie still works)",
        )


class ScopeListEvidence(BearerTestCase):
    """
    Access tokens whose C{scope} claim is a JSON array of scope names (Spring
    Authorization Server writes C{"scope": ["message.read"]}, with C{aud} the client id
    and no C{typ} header or C{client_id} claim) are access tokens as much as C{scp}
    arrays are; OpenID Connect gives id_tokens no C{scope} claim.
    """

    async def test_a_scope_array_is_access_token_evidence(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        for typ in (None, "JWT"):
            token = w.token(
                {"scope": ["message.read", "message.write"]},
                drop=["client_id"],
                header={"typ": typ},
            )
            # With bearer.audience unset (the clientID, which is also these tokens'
            # audience: setting it explicitly changes nothing) there is no way to take
            # such a token at all.
            await self.assert_accepted(w, token)


class LogoutStateNamespace(TestCase):
    """
    The logout-state cookie is named among the login-state cookies
    (C{<cookieName>.login.logout}), and C{logout} is a well-formed login state
    (L{edgegw.identity.login_state._STATE}): the callback takes it for one.
    """

    async def test_a_callback_with_state_logout_does_not_spoil_the_logout_return(self) -> None:
        """
        Attack: a cross-site page navigates the user (a top-level GET: her SameSite=Lax
        cookies go along) to C{/auth/callback?state=logout} while she is at the IdP's
        logout confirmation. C{LoginStates.take} clears her logout-state cookie (and
        answers 400); the IdP's genuine return then gets 400 "logout not recognised"
        instead of C{postLogoutRedirect}. The callback has no business with the logout
        cookie.
        """
        from tests.test_logout_provider import cookie_world, log_out, query_of

        w = await cookie_world(self)
        await w.login()
        out = await log_out(w.browser, w.origin)
        state = query_of(out.location)["state"]
        await w.browser.get(w.url("/auth/callback?state=logout&code=x"))
        back = await w.browser.get(w.url("/auth/logout?state=" + state))
        self.assertEqual(
            (back.status, back.location),
            (302, "/"),
            "a request to the callback cleared the logout-state cookie",
        )


class OwnLogoutURLSpelling(SynchronousTestCase):
    def test_the_own_logout_url_however_written(self) -> None:
        """
        C{auth.postLogoutRedirectURL} naming the gateway's own logout URL with a default
        port or another host case is still the gateway's own: the logout sends a
        C{state} (without one the IdP's return, a C{GET} without C{state}, got 405).
        """
        from edgegw.auth.logout import _same_place

        own = "https://app.example/auth/logout"
        for spelled in (
            own,
            "https://app.example:443/auth/logout",
            "https://APP.example/auth/logout",
            "HTTPS://app.example/auth/logout",
        ):
            self.assertTrue(_same_place(spelled, own), spelled)
        for other in (
            "https://app.example:8443/auth/logout",
            "http://app.example/auth/logout",
            "https://app.example/auth/logout/",
            "https://app.example/auth/logout?x=1",
            "https://evil.example/auth/logout",
        ):
            self.assertFalse(_same_place(other, own), other)
