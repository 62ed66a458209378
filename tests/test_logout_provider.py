"""
Logout at the provider (issue 36, points 3 and 4), end to end on real sockets: a
listening gateway, the fake OpenID provider with its end-session endpoint
(L{FakeIdP.end_session}), a test browser, and (server-side sessions) a real redis-server.

  - C{POST /auth/logout} ends the gateway's session, then sends the browser to the
    provider's C{end_session_endpoint} with C{id_token_hint}, C{client_id},
    C{post_logout_redirect_uri} and C{state}; the provider's return to the gateway's
    logout path is checked against the logout-state cookie;
  - without an end-session endpoint the logout is local, as before;
  - the id_token is kept across refreshes (server-side sessions) and, in cookie mode,
    only while the session still fits in one cookie;
  - in cookie mode a copied session cookie outlives the logout (documented); with a
    state provider it does not.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import jwt
from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from edgegw.auth.logout_state import logout_cookie_name
from edgegw.identity.sealing import Sealer
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import problems_of
from tests.support.fake_idp import FakeIdP
from tests.support.redis import RedisProbe, redis_server
from tests.support.sessions import COOKIE, SessionGateway, stream_backend
from tests.test_login import KEY, LoginWorld

reactor: Any = _reactor

LOGOUT_COOKIE = logout_cookie_name(COOKIE)
"""The logout-state cookie of the default session cookie, as the gateway names it."""


def query_of(url: str | None) -> dict[str, str]:
    """
    The query parameters of C{url} (first values; a repeated one fails the test).
    """
    assert url is not None
    parsed = parse_qs(urlsplit(url).query, keep_blank_values=True)
    assert all(len(values) == 1 for values in parsed.values()), parsed
    return {name: values[0] for name, values in parsed.items()}


def claims_of(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


async def cookie_world(
    test: TestCase,
    *,
    end_session: bool = True,
    register: bool = True,
    extra: str = "",
    session_extra: str = "",
) -> LoginWorld:
    """
    A logged-out L{LoginWorld} whose IdP has an end-session endpoint (unless told not
    to) at which the gateway's logout path is registered (unless told not to).

    @param extra: Lines added to the Gateway's spec (two spaces of indentation).
    @param session_extra: Members added to the session block (C{, name: value}).
    """
    idp = FakeIdP()
    idp.end_session = end_session
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = LoginWorld(test, idp, backend)
    await w.start(identity_spec=extra, gateway_spec=session_extra)
    if register:
        idp.post_logout_redirect_uris.append(w.url("/auth/logout"))
    return w


async def log_out(browser: Browser, origin: str, **headers: str) -> BrowserResponse:
    """
    The app's logout button: a same-origin POST to the logout path.
    """
    return await browser.post(origin + "/auth/logout", headers={"Origin": origin, **headers})


class CookieModeLogoutTests(TestCase):
    async def test_logout_goes_to_the_provider_and_comes_back_checked(self) -> None:
        w = await cookie_world(self)
        await w.login()
        self.assertIn(COOKIE, w.browser.cookies)
        out = await log_out(w.browser, w.origin)
        # The gateway's session is over before the browser leaves.
        self.assertEqual(out.status, 302)
        self.assertNotIn(COOKIE, w.browser.cookies)
        self.assertEqual(out.header("Cache-Control"), "no-store")
        location = out.location or ""
        self.assertTrue(location.startswith(w.idp.issuer + "/session/end?"), location)
        query = query_of(location)
        self.assertEqual(
            set(query), {"id_token_hint", "client_id", "post_logout_redirect_uri", "state"}
        )
        self.assertEqual(query["client_id"], "gw")
        self.assertEqual(query["post_logout_redirect_uri"], w.url("/auth/logout"))
        # The hint is the login's id_token (its nonce is the authorization request's).
        hint = claims_of(query["id_token_hint"])
        self.assertEqual(
            (hint["sub"], hint["aud"], hint["nonce"]),
            ("alice", "gw", w.idp.authorize_requests[-1]["nonce"]),
        )
        self.assertIn(LOGOUT_COOKIE, w.browser.cookies)
        line = w.browser.set_cookie(LOGOUT_COOKIE) or ""
        self.assertIn("; HttpOnly", line)
        self.assertIn("; SameSite=Lax", line)
        self.assertIn("Max-Age=600", line)
        # At the provider, then back at the gateway with the state.
        at_idp = await w.browser.get(location)
        self.assertEqual(at_idp.status, 303)
        self.assertEqual(at_idp.location, w.url("/auth/logout?state=" + query["state"]))
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual((back.status, back.location), (302, "/"))
        self.assertEqual(back.header("Cache-Control"), "no-store")
        self.assertNotIn(LOGOUT_COOKIE, w.browser.cookies)
        # Logged out: the app asks for a login again.
        after = await w.browser.get(w.url("/app/x"))
        self.assertEqual(after.status, 302)
        self.assertTrue((after.location or "").startswith("/auth/login"), after.location)

    async def test_the_return_is_checked_against_this_browsers_logout(self) -> None:
        w = await cookie_world(self)
        await w.login()
        out = await log_out(w.browser, w.origin)
        state = query_of(out.location)["state"]
        # A wrong state, no state, or the right state without this browser's cookie:
        # 400, and nothing changes (the cookie stays for the genuine return).
        for path in (
            "/auth/logout?state=" + "A" * 43,
            "/auth/logout?state=",
            "/auth/logout?state=" + quote(state + "x"),
        ):
            wrong = await w.browser.get(w.url(path))
            self.assertEqual((wrong.status, wrong.location), (400, None), path)
            self.assertIsNone(wrong.header("Set-Cookie"), path)
        elsewhere = Browser()
        stolen = await elsewhere.get(w.url("/auth/logout?state=" + state))
        self.assertEqual((stolen.status, stolen.location), (400, None))
        # Without a state it is the POST-only logout, as before.
        plain = await w.browser.get(w.url("/auth/logout"))
        self.assertEqual((plain.status, plain.header("Allow")), (405, "POST"))
        # The genuine return still completes, once.
        back = await w.browser.get(w.url("/auth/logout?state=" + state))
        self.assertEqual((back.status, back.location), (302, "/"))
        again = await w.browser.get(w.url("/auth/logout?state=" + state))
        self.assertEqual(again.status, 400)

    async def test_an_expired_logout_state_is_refused(self) -> None:
        w = await cookie_world(self)
        await w.login()
        out = await log_out(w.browser, w.origin)
        state = query_of(out.location)["state"]
        sealer = Sealer(KEY.encode("ascii"))
        # The same cookie, sealed as the gateway would 601 seconds earlier.
        sealed = sealer.seal(
            json.dumps({"v": 1, "s": state, "t": int(reactor.seconds()) - 601}).encode(),
            b"edgegw logout-state v1",
        )
        w.browser.cookies[LOGOUT_COOKIE] = sealed
        late = await w.browser.get(w.url("/auth/logout?state=" + state))
        self.assertEqual(late.status, 400)
        # Sealed under another purpose (a login state), it does not open either.
        w.browser.cookies[LOGOUT_COOKIE] = sealer.seal(
            json.dumps({"v": 1, "s": state, "t": int(reactor.seconds())}).encode(),
            b"edgegw login-state v1",
        )
        other = await w.browser.get(w.url("/auth/logout?state=" + state))
        self.assertEqual(other.status, 400)

    async def test_configured_post_logout_url_and_redirect(self) -> None:
        w = await cookie_world(
            self,
            extra="  auth: {postLogoutRedirectURL: 'https://portal.example/signed-out'}\n",
        )
        await w.login()
        out = await log_out(w.browser, w.origin)
        query = query_of(out.location)
        self.assertEqual(query["post_logout_redirect_uri"], "https://portal.example/signed-out")
        # The return does not come to the gateway: no state it could never check.
        self.assertNotIn("state", query)
        self.assertNotIn(LOGOUT_COOKIE, w.browser.cookies)
        self.assertEqual(claims_of(query["id_token_hint"])["sub"], "alice")

    async def test_the_return_lands_on_session_post_logout_redirect(self) -> None:
        w = await cookie_world(self, session_extra=", postLogoutRedirect: /signed-out")
        await w.login()
        out = await log_out(w.browser, w.origin)
        at_idp = await w.browser.get(out.location or "")
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual((back.status, back.location), (302, "/signed-out"))

    async def test_without_an_end_session_endpoint_the_logout_is_local(self) -> None:
        w = await cookie_world(self, end_session=False)
        await w.login()
        out = await log_out(w.browser, w.origin)
        self.assertEqual((out.status, out.location), (302, "/"))
        self.assertNotIn(COOKIE, w.browser.cookies)
        self.assertNotIn(LOGOUT_COOKIE, w.browser.cookies)
        self.assertEqual(w.idp.end_session_requests, [])
        # An app's fetch() is answered as before too.
        await w.login()
        fetched = await log_out(w.browser, w.origin, **{"Sec-Fetch-Mode": "cors"})
        self.assertEqual((fetched.status, fetched.location), (302, "/"))

    async def test_an_apps_fetch_gets_the_end_session_url_as_json(self) -> None:
        w = await cookie_world(self)
        await w.login()
        out = await log_out(w.browser, w.origin, **{"Sec-Fetch-Mode": "cors"})
        self.assertEqual(out.status, 200)
        self.assertEqual(out.header("Content-Type"), "application/json")
        self.assertEqual(out.header("Cache-Control"), "no-store")
        self.assertNotIn(COOKIE, w.browser.cookies)
        location = out.json()["location"]
        self.assertEqual(set(out.json()), {"location"})
        self.assertTrue(location.startswith(w.idp.issuer + "/session/end?"), location)
        # The app navigates there: the same round trip as a form's.
        at_idp = await w.browser.get(location)
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual((back.status, back.location), (302, "/"))

    async def test_an_id_token_that_does_not_fit_one_cookie_is_not_kept(self) -> None:
        w = await cookie_world(self)
        # A name this long makes the id_token (and the passport) large: the session
        # fits in one cookie, but would need a second one to keep the id_token too, so
        # it goes without.
        w.idp.user["name"] = "N" * 1000
        final = await w.login()
        self.assertEqual(final.status, 200)
        self.assertIn(COOKIE, w.browser.cookies)
        self.assertFalse(any(name.startswith(COOKIE + ".") for name in w.browser.cookies))
        out = await log_out(w.browser, w.origin)
        query = query_of(out.location)
        self.assertNotIn("id_token_hint", query)
        self.assertEqual(query["client_id"], "gw")
        self.assertIn("state", query)
        at_idp = await w.browser.get(out.location or "")
        self.assertEqual(at_idp.status, 303)

    async def test_behind_a_trusted_https_proxy_the_return_is_the_browsers_origin(self) -> None:
        idp = FakeIdP()
        idp.end_session = True
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start(trusted='["127.0.0.1"]')
        https = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "app.example"}
        idp.redirect_uris.append("https://app.example/auth/callback")
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"), headers=https)
        at_idp = await w.browser.get(start.location or "")
        # The proxy's public origin is the gateway's listening port here.
        callback = urlsplit(at_idp.location or "")
        back = await w.browser.get(w.url(f"{callback.path}?{callback.query}"), headers=https)
        self.assertEqual(back.status, 302)
        out = await log_out(w.browser, w.origin, **https)
        query = query_of(out.location)
        self.assertEqual(query["post_logout_redirect_uri"], "https://app.example/auth/logout")
        # Secure, and __Host- like the gateway's other cookies on a secure request.
        self.assertIn("; Secure", w.browser.set_cookie("__Host-" + LOGOUT_COOKIE) or "")
        self.assertEqual(claims_of(query["id_token_hint"])["sub"], "alice")

    async def test_an_unregistered_return_is_refused_by_the_provider(self) -> None:
        # The operator has not registered the gateway's logout path: the provider
        # refuses (what oidc-provider and Keycloak do), and the gateway's session is
        # over all the same.
        w = await cookie_world(self, register=False)
        await w.login()
        out = await log_out(w.browser, w.origin)
        self.assertNotIn(COOKIE, w.browser.cookies)
        at_idp = await w.browser.get(out.location or "")
        self.assertEqual(at_idp.status, 400)


class LogoutAttackTests(TestCase):
    """
    Attacks of our own on the logout at the provider.
    """

    async def test_a_copied_cookie_from_another_browser_learns_no_id_token(self) -> None:
        # The id_token_hint travels in a URL the logout hands to the browser: a session
        # cookie copied into another browser (another fingerprint) must not buy it.
        w = await cookie_world(self)
        await w.login()
        thief = Browser(cookies={COOKIE: w.browser.cookies[COOKIE]}, user_agent="thief/1.0")
        out = await log_out(thief, w.origin)
        self.assertEqual(out.status, 302)
        query = query_of(out.location)
        self.assertNotIn("id_token_hint", query)
        self.assertEqual(query["client_id"], "gw")

    async def test_forged_returns_and_cross_site_logouts_change_nothing(self) -> None:
        w = await cookie_world(self)
        await w.login()
        # A link to the return with a made-up state and a target of the attacker's:
        # refused, the session intact, never a redirect.
        for path in (
            "/auth/logout?state=forged&post_logout_redirect_uri=https%3A%2F%2Fevil.example",
            "/auth/logout?state=forged&return_to=//evil.example",
        ):
            forged = await w.browser.get(w.url(path))
            self.assertEqual((forged.status, forged.location), (400, None), path)
        still = await w.browser.get(w.url("/app/x"))
        self.assertEqual(still.status, 200)
        # A cross-site POST (logout CSRF) is stopped before the logout: no redirect to
        # the provider, no logout state, the session intact.
        refused = await w.browser.post(
            w.url("/auth/logout"),
            headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        )
        self.assertEqual((refused.status, refused.location), (403, None))
        self.assertNotIn(LOGOUT_COOKIE, w.browser.cookies)
        self.assertEqual((await w.browser.get(w.url("/app/x"))).status, 200)
        # A genuine logout's return still only leads to the configured page, whatever
        # its query adds.
        out = await log_out(w.browser, w.origin)
        state = query_of(out.location)["state"]
        back = await w.browser.get(
            w.url(f"/auth/logout?state={state}&post_logout_redirect_uri=https%3A%2F%2Fevil.x")
        )
        self.assertEqual((back.status, back.location), (302, "/"))


class CopiedCookieTests(TestCase):
    """
    Point 4: what a logout revokes. In cookie mode the session is the cookie: a copy
    taken before the logout keeps working until it expires. With a state provider the
    record is deleted, and every copy is dead.
    """

    async def test_cookie_mode_a_copied_cookie_outlives_the_logout(self) -> None:
        w = await cookie_world(self, end_session=False)
        await w.login()
        copy = Browser(cookies={COOKIE: w.browser.cookies[COOKIE]})
        out = await log_out(w.browser, w.origin)
        self.assertEqual(out.status, 302)
        self.assertNotIn(COOKIE, w.browser.cookies)
        # The documented limit: the copy still authenticates.
        replayed = await copy.get(w.url("/app/x"))
        self.assertEqual((replayed.status, replayed.body), (200, b"backend"))

    async def test_server_side_sessions_a_copied_cookie_dies_with_the_logout(self) -> None:
        redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend, _ = stream_backend()
        self.addCleanup(backend.stop)
        gw = await SessionGateway(self, idp, backend, redis).start()
        browser = Browser()
        await gw.login(browser)
        copy = Browser(cookies={COOKIE: browser.cookies[COOKIE]})
        self.assertEqual((await copy.get(gw.url("/app/x"))).status, 200)
        out = await log_out(browser, gw.origin)
        self.assertEqual(out.status, 302)
        replayed = await copy.get(gw.url("/app/x"))
        self.assertEqual(replayed.status, 302)


class ServerSessionLogoutTests(TestCase):
    async def world(self, **knobs: Any) -> tuple[SessionGateway, FakeIdP, Browser]:
        redis = await redis_server(self)
        idp = FakeIdP()
        idp.end_session = True
        for name, value in knobs.items():
            setattr(idp, name, value)
        await idp.start(self)
        backend, _ = stream_backend()
        self.addCleanup(backend.stop)
        gw = await SessionGateway(self, idp, backend, redis, skew="1h").start()
        idp.post_logout_redirect_uris.append(gw.url("/auth/logout"))
        browser = Browser()
        back = await gw.login(browser)
        self.assertEqual(back.status, 302)
        return gw, idp, browser

    async def test_the_record_is_deleted_before_the_redirect_with_its_id_token(self) -> None:
        gw, _, browser = await self.world()
        record = await gw.stored_record(browser)
        assert record is not None and record.id_token is not None
        key = gw.record_key(browser)
        out = await log_out(browser, gw.origin)
        # By the time the answer is here, the record is gone.
        self.assertIsNone(await RedisProbe(gw.redis).get(key.decode()))
        self.assertNotIn(COOKIE, browser.cookies)
        query = query_of(out.location)
        self.assertEqual(query["id_token_hint"], record.id_token)
        self.assertEqual(query["post_logout_redirect_uri"], gw.url("/auth/logout"))
        at_idp = await browser.get(out.location or "")
        back = await browser.get(at_idp.location or "")
        self.assertEqual((back.status, back.location), (302, "/"))

    async def test_a_refresh_that_brings_an_id_token_replaces_the_kept_one(self) -> None:
        gw, idp, browser = await self.world(refresh_id_token=True)
        login_token = (await gw.stored_record(browser) or self.fail("no record")).id_token
        # refreshSkew 1h and 5-minute tokens: this request refreshes first.
        used = await browser.get(gw.url("/app/x"))
        self.assertEqual(used.status, 200)
        self.assertEqual(idp.refresh_grants, 1)
        record = await gw.stored_record(browser)
        assert record is not None
        self.assertEqual(record.id_token, idp.refreshed_id_tokens[-1])
        self.assertNotEqual(record.id_token, login_token)
        # Identity stays the login's; the hint is the latest id_token.
        self.assertEqual(record.subject, "alice")
        out = await log_out(browser, gw.origin)
        self.assertEqual(query_of(out.location)["id_token_hint"], idp.refreshed_id_tokens[-1])

    async def test_a_refresh_without_an_id_token_keeps_the_logins(self) -> None:
        gw, idp, browser = await self.world()
        login_token = (await gw.stored_record(browser) or self.fail("no record")).id_token
        await browser.get(gw.url("/app/x"))
        self.assertEqual(idp.refresh_grants, 1)
        record = await gw.stored_record(browser)
        assert record is not None
        self.assertEqual(record.id_token, login_token)

    async def test_a_copied_cookie_from_another_browser_learns_no_id_token(self) -> None:
        gw, _, browser = await self.world()
        thief = Browser(cookies={COOKIE: browser.cookies[COOKIE]}, user_agent="thief/1.0")
        out = await log_out(thief, gw.origin)
        query = query_of(out.location)
        self.assertNotIn("id_token_hint", query)
        self.assertEqual(query["client_id"], "gw")
        # It still ended the session (whoever holds the cookie may end it).
        self.assertEqual((await browser.get(gw.url("/app/x"))).status, 302)


GATEWAY = """\
kind: Gateway
metadata: {{name: g}}
spec:
  listen: "127.0.0.1:0"
  session: {{key: "{key}"}}
  auth: {{postLogoutRedirectURL: {url}}}
---
kind: IdP
metadata: {{name: i}}
spec:
  type: oidc
  issuer: "https://idp.example"
  clientID: c
  clientSecret: s
{redirect}
"""


class PostLogoutRedirectURLConfigTests(TestCase):
    def problems(self, url: str, redirect: str = "") -> list[str]:
        text = GATEWAY.format(key=KEY, url=json.dumps(url), redirect=redirect)
        try:
            return problems_of(self.mktemp(), text, gateway=False)
        except AssertionError:
            return []

    def test_https_anywhere_and_http_on_the_gateways_own_origin(self) -> None:
        self.assertEqual(self.problems("https://portal.example/bye"), [])
        own = '  redirectURL: "http://127.0.0.1:8080/auth/callback"'
        self.assertEqual(self.problems("http://127.0.0.1:8080/auth/logout", own), [])
        self.assertEqual(self.problems("http://127.0.0.1:8080/", own), [])

    def test_refused_values_are_located(self) -> None:
        own = '  redirectURL: "http://127.0.0.1:8080/auth/callback"'
        for url, redirect, expected in (
            ("http://evil.example/", own, "an http URL is allowed only on the gateway's own"),
            ("http://127.0.0.1:8081/", own, "(http://127.0.0.1:8080, that of the IdP's"),
            ("http://127.0.0.1:8080/", "", "which is not set"),
            ("javascript:alert(1)", "", "is not a valid URL"),
            ("//evil.example/", "", "is not a valid URL"),
            ("/signed-out", "", "is not a valid URL"),
            ("https://user:pw@evil.example/", "", "credentials in the URL"),
            ("https://portal.example/#x", "", "a query or fragment is not allowed"),
            ("", "", "must not be empty"),
        ):
            problems = self.problems(url, redirect)
            self.assertEqual(len(problems), 1, (url, problems))
            self.assertIn('Gateway "g": spec.auth.postLogoutRedirectURL: ', problems[0], url)
            self.assertIn(expected, problems[0], url)
