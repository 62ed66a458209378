"""
Browser login end to end on real sockets: a listening gateway, the in-repo fake OpenID
provider (tests/support/fake_idp.py), a backend recording what it receives, and a
cookie-keeping test browser.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from twisted.internet import reactor as _reactor
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.identity.session_cookie import SessionCookie
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import write_tree
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of

reactor: Any = _reactor

KEY = "0123456789abcdef0123456789abcdef"


class LoginWorld:
    """
    A gateway with browser login in front of a recording backend, and its fake IdP.

    Routes: C{/app/} (app, login required), C{/api/} (service, login required),
    C{/open/} (app, public), C{/admin/} (app, required, policy: group admins, onDeny
    /denied), all proxied to the backend with C{forwardCookies} on C{/app/}.
    """

    def __init__(self, test: TestCase, idp: FakeIdP, backend: SiteBackend) -> None:
        self.test = test
        self.idp = idp
        self.backend = backend
        self.gateway: Gateway
        self.port = 0
        self.browser = Browser()
        self.extra_routes = ""

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    async def start(
        self,
        gateway_spec: str = "",
        idp_spec: str = "",
        wait: bool = True,
        identity_spec: str = "",
        trusted: str = "[]",
    ) -> None:
        upstream = f"http://127.0.0.1:{self.backend.port}"
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  trustedProxies: {trusted}
  session: {{key: "{KEY}"{gateway_spec}}}
  identity:
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
{identity_spec}---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{self.idp.issuer}"
  clientID: gw
  clientSecret: gw-secret
{idp_spec}
---
kind: Policy
metadata: {{name: admins}}
spec: {{require: {{groups: [admins]}}}}
---
kind: Route
metadata: {{name: app}}
spec:
  match: /app/
  type: app
  access: {{auth: required}}
  handler: {{type: reverse-proxy, upstream: "{upstream}", forwardCookies: true,
             forwardAccessToken: true}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
---
kind: Route
metadata: {{name: open}}
spec:
  match: /open/
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
  type: app
---
kind: Route
metadata: {{name: admin}}
spec:
  match: /admin/
  type: app
  access: {{auth: required, authorize: [admins], onDeny: {{redirect: /denied}}}}
  handler: {{type: reverse-proxy, upstream: "{upstream}"}}
{self.extra_routes}"""
        await self.serve(text, wait)

    async def start_routes(
        self,
        routes: str,
        gateway_extra: str = "",
        session_extra: str = "",
        idp_spec: str = "",
        groups: str = '{source: groups, match: ["ou=groups"], render: cn}',
    ) -> None:
        """
        Serve C{routes} (Route resources in YAML, C{UPSTREAM} standing for the backend's
        URL) instead of the usual ones, behind the same Gateway and IdP: C{gateway_extra}
        lines added to the Gateway's spec, C{session_extra} to its session block,
        C{idp_spec} lines to the IdP's spec, and C{groups} as the identity's groups rule.
        """
        upstream = f"http://127.0.0.1:{self.backend.port}"
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  session: {{key: "{KEY}"{session_extra}}}
  identity:
    groups: {groups}
{gateway_extra}
---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{self.idp.issuer}"
  clientID: gw
  clientSecret: gw-secret
{idp_spec}
---
""" + routes.replace("UPSTREAM", upstream)
        await self.serve(text)

    async def serve(self, text: str, wait: bool = True) -> None:
        """
        Build the gateway from the configuration C{text}, listen, register the callback
        at the IdP and start discovery (waiting for it unless told not to).
        """
        root = write_tree(self.test.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = listen_local(self.gateway.site)
        self.test.addCleanup(listening.stopListening)
        self.test.addCleanup(client.close)
        self.port = port_of(listening)
        self.idp.redirect_uris.append(self.url("/auth/callback"))
        provider = self.gateway.idp
        assert provider is not None
        provider.first_retry = 0.05
        provider.retry_cap = 0.2
        provider.startService()
        self.test.addCleanup(provider.stopService)
        if wait:
            await self.ready()

    async def ready(self) -> None:
        provider = self.gateway.idp
        assert provider is not None
        for _ in range(200):
            if provider.ready:
                return
            await deferLater(reactor, 0.02, lambda: None)
        raise AssertionError(f"IdP never discovered: {provider.last_error}")

    async def login(self, path: str = "/app/page?x=1") -> BrowserResponse:
        """
        Visit C{path} anonymously and follow the whole login; the final response.
        """
        return await self.browser.follow(self.url(path))


async def world(test: TestCase, **start: Any) -> LoginWorld:
    idp = FakeIdP()
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    built = LoginWorld(test, idp, backend)
    await built.start(**start)
    return built


async def world_with_routes(test: TestCase, routes: str, **start: Any) -> LoginWorld:
    """
    A L{LoginWorld} serving C{routes} (L{LoginWorld.start_routes}, with C{start}'s
    options) in front of a backend answering C{backend}.
    """
    idp = FakeIdP()
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    built = LoginWorld(test, idp, backend)
    await built.start_routes(routes, **start)
    return built


def mint_session(sessions: SessionCookie, user_agent: str) -> str:
    """
    A session cookie value for C{alice}, sealed by C{sessions} at its clock's time.
    """
    minted = Request(DummyChannel())
    minted.requestHeaders.setRawHeaders(b"user-agent", [user_agent.encode("ascii")])
    sessions.write(minted, sessions.new_record(minted, "alice", {}, ()))
    line = (minted.responseHeaders.getRawHeaders(b"set-cookie") or [b""])[0]
    name, _, rest = line.partition(b"=")
    assert name == b"gw_session", line
    return rest.partition(b";")[0].decode("ascii")


def header_of(backend: SiteBackend, name: bytes) -> bytes | None:
    return backend.requests[-1].header(name)


class HappyPathTests(TestCase):
    async def test_login_lands_on_the_original_url_with_identity_headers(self) -> None:
        w = await world(self)
        first = await w.browser.get(w.url("/app/page?x=1"))
        self.assertEqual(first.status, 302)
        self.assertEqual(first.location, "/auth/login?return_to=%2Fapp%2Fpage%3Fx%3D1")
        self.assertEqual(first.header("Cache-Control"), "no-store")
        final = await w.login()
        self.assertEqual(final.status, 200)
        self.assertEqual(final.body, b"backend")
        self.assertEqual(w.browser.history[-1], w.url("/app/page?x=1"))
        # The authorization request: code flow, PKCE S256, state, nonce, scopes.
        query = w.idp.authorize_requests[-1]
        self.assertEqual(query["response_type"], "code")
        self.assertEqual(query["code_challenge_method"], "S256")
        self.assertEqual(query["scope"], "openid profile email")
        self.assertEqual(query["redirect_uri"], w.url("/auth/callback"))
        self.assertTrue(query["state"] and query["nonce"])
        self.assertEqual(w.idp.token_requests[-1]["auth_method"], "client_secret_basic")
        # The backend got the principal's identity, not the session cookie.
        self.assertEqual(header_of(w.backend, b"X-User-Id"), b"alice")
        self.assertEqual(header_of(w.backend, b"X-User-Email"), b"alice@example.com")
        self.assertEqual(header_of(w.backend, b"X-User-Name"), b"Alice Example")
        self.assertEqual(header_of(w.backend, b"X-User-Groups"), b"admins")
        self.assertIsNone(header_of(w.backend, b"Cookie"))
        token = header_of(w.backend, b"Authorization")
        assert token is not None
        self.assertTrue(token.startswith(b"Bearer ey"))
        # The session cookie's attributes; no login-state cookie is left.
        self.assertIn("gw_session", w.browser.cookies)
        self.assertEqual([name for name in w.browser.cookies if ".login." in name], [])

    async def test_session_cookie_attributes(self) -> None:
        w = await world(self)
        await w.login()
        callback = [url for url in w.browser.history if "/auth/callback" in url]
        self.assertEqual(len(callback), 1)
        # Replay the exchange's Set-Cookie check on a fresh login to see the lines.
        browser = Browser()
        start = await browser.get(w.url("/auth/login?return_to=/app/x"))
        login_cookie = start.header("Set-Cookie")
        assert login_cookie is not None
        self.assertIn("; HttpOnly", login_cookie)
        self.assertIn("; SameSite=Lax", login_cookie)
        self.assertIn("; Path=/", login_cookie)
        self.assertNotIn("Secure", login_cookie)
        at_idp = await browser.get(start.location or "")
        back = await browser.get(at_idp.location or "")
        self.assertEqual(back.status, 302)
        self.assertEqual(back.location, "/app/x")
        lines = browser.set_cookie_lines
        session = [line for line in lines if line.startswith("gw_session=")]
        self.assertEqual(len(session), 1)
        self.assertIn("; HttpOnly", session[0])
        self.assertIn("; SameSite=Lax", session[0])
        self.assertIn("Max-Age=28800", session[0])
        self.assertTrue(any(".login." in line and "Max-Age=0" in line for line in lines))

    async def test_secure_cookie_behind_a_trusted_https_proxy(self) -> None:
        w = await world(self, gateway_spec="")
        browser = Browser()
        # The peer (127.0.0.1) is not a trusted proxy: X-Forwarded-Proto is dropped.
        start = await browser.get(w.url("/auth/login"), headers={"X-Forwarded-Proto": "https"})
        line = start.header("Set-Cookie")
        assert line is not None
        self.assertNotIn("Secure", line)

    async def test_secure_cookies_when_a_trusted_proxy_says_https(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]')
        https = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "app.example"}
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"), headers=https)
        line = start.header("Set-Cookie")
        assert line is not None
        self.assertIn("; Secure", line)
        # The callback URL is the origin the browser used, as the proxy says.
        self.assertIn(
            "redirect_uri=https%3A%2F%2Fapp.example%2Fauth%2Fcallback", start.location or ""
        )

    async def test_expired_session_is_no_session(self) -> None:
        w = await world(self)
        session = w.gateway.config.gateway.session
        assert session is not None
        nine_hours_ago = Clock()
        nine_hours_ago.advance(reactor.seconds() - 9 * 3600)
        old = mint_session(SessionCookie(session, nine_hours_ago), w.browser.user_agent)
        w.browser.cookies["gw_session"] = old
        response = await w.browser.get(w.url("/app/x"), headers={"Sec-Fetch-Mode": "cors"})
        self.assertEqual(response.status, 401)
        # The same cookie minted now is a session: only its age made the difference.
        w.browser.cookies["gw_session"] = mint_session(
            SessionCookie(session, reactor), w.browser.user_agent
        )
        response = await w.browser.get(w.url("/app/x"), headers={"Sec-Fetch-Mode": "cors"})
        self.assertEqual(response.status, 200)

    async def test_two_tabs_each_land_where_they_started(self) -> None:
        w = await world(self)
        browser = w.browser
        one = await browser.get(w.url("/auth/login?return_to=/app/one"))
        two = await browser.get(w.url("/auth/login?return_to=/app/two"))
        # Tab two finishes first, then tab one.
        at_idp_two = await browser.get(two.location or "")
        back_two = await browser.get(at_idp_two.location or "")
        at_idp_one = await browser.get(one.location or "")
        back_one = await browser.get(at_idp_one.location or "")
        self.assertEqual((back_two.status, back_two.location), (302, "/app/two"))
        self.assertEqual((back_one.status, back_one.location), (302, "/app/one"))

    async def test_session_view(self) -> None:
        w = await world(self)
        anonymous = await w.browser.get(w.url("/auth/session"))
        self.assertEqual(anonymous.status, 401)
        self.assertEqual(anonymous.header("Cache-Control"), "no-store")
        await w.login()
        view = await w.browser.get(w.url("/auth/session"))
        self.assertEqual(view.status, 200)
        self.assertEqual(view.header("Cache-Control"), "no-store")
        document = view.json()
        self.assertEqual(
            sorted(document),
            ["expiresAt", "expiresIn", "groups", "issuedAt", "passport", "subject"],
        )
        self.assertEqual(document["subject"], "alice")
        self.assertEqual(document["groups"], ["admins"])
        self.assertEqual(
            document["passport"], {"email": "alice@example.com", "name": "Alice Example"}
        )
        self.assertEqual(document["expiresAt"] - document["issuedAt"], 8 * 3600)
        self.assertNotIn(b"ey", view.body)  # no token of any kind
        post = await w.browser.post(w.url("/auth/session"))
        self.assertEqual((post.status, post.header("Allow")), (405, "GET, HEAD"))

    async def test_spa_fetch_gets_401_and_service_routes_401(self) -> None:
        w = await world(self)
        fetch = await w.browser.get(w.url("/app/data"), headers={"Sec-Fetch-Mode": "cors"})
        self.assertEqual(fetch.status, 401)
        navigate = await w.browser.get(w.url("/app/data"), headers={"Sec-Fetch-Mode": "navigate"})
        self.assertEqual(navigate.status, 302)
        api = await w.browser.get(w.url("/api/data"))
        self.assertEqual((api.status, api.header("WWW-Authenticate")), (401, "Bearer"))
        # A service route reads the session cookie too.
        await w.login()
        api = await w.browser.get(w.url("/api/data"))
        self.assertEqual(api.status, 200)
        self.assertEqual(header_of(w.backend, b"X-User-Id"), b"alice")

    async def test_public_route_strips_spoofed_identity(self) -> None:
        w = await world(self)
        response = await w.browser.get(
            w.url("/open/x"), headers={"X-User-Id": "mallory", "X-User-Groups": "admins"}
        )
        self.assertEqual(response.status, 200)
        self.assertIsNone(header_of(w.backend, b"X-User-Id"))
        self.assertIsNone(header_of(w.backend, b"X-User-Groups"))

    async def test_forward_cookies_never_passes_the_gateway_cookies(self) -> None:
        w = await world(self)
        await w.login()
        w.browser.cookies["theme"] = "dark"
        w.browser.cookies["gw_session.login.zzz"] = "stale"
        await w.browser.get(w.url("/app/x"))
        self.assertEqual(header_of(w.backend, b"Cookie"), b"theme=dark")

    async def test_policy_denial_redirects_to_on_deny(self) -> None:
        w = await world(self)
        w.idp.user["groups"] = ["cn=users,ou=groups,dc=example,dc=com"]
        await w.login("/app/x")
        denied = await w.browser.get(w.url("/admin/x"))
        self.assertEqual((denied.status, denied.location), (302, "/denied"))

    async def test_userinfo_fills_claims_the_id_token_lacks(self) -> None:
        w = await world(self)
        w.idp.userinfo_only = {"email", "groups"}
        await w.login()
        self.assertEqual(w.idp.userinfo_requests, 1)
        self.assertEqual(header_of(w.backend, b"X-User-Email"), b"alice@example.com")
        self.assertEqual(header_of(w.backend, b"X-User-Groups"), b"admins")

    async def test_a_session_too_large_for_cookies_is_refused(self) -> None:
        w = await world(self)
        w.idp.user["name"] = "N" * 14000
        start = await w.browser.get(w.url("/auth/login"))
        at_idp = await w.browser.get(start.location or "")
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual(back.status, 502)
        self.assertEqual([name for name in w.browser.cookies if "session" in name], [])

    async def test_userinfo_failure_under_auto_fails_closed(self) -> None:
        # The subject is a claim only userinfo has: logging in under the token's sub
        # instead would make this user someone else.
        w = await world(self, identity_spec="    subjectClaim: preferred_username\n")
        w.idp.user["preferred_username"] = "alice.example"
        w.idp.userinfo_only = {"preferred_username"}
        w.idp.userinfo_status = 503
        start = await w.browser.get(w.url("/auth/login"))
        at_idp = await w.browser.get(start.location or "")
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual(back.status, 502)
        self.assertNotIn("gw_session", w.browser.cookies)
        self.assertEqual(w.idp.userinfo_requests, 1)
        w.idp.userinfo_status = 200
        final = await w.login()
        self.assertEqual(final.status, 200)
        self.assertEqual(header_of(w.backend, b"X-User-Id"), b"alice.example")

    async def test_userinfo_failure_under_always_fails_the_login(self) -> None:
        w = await world(self, gateway_spec="", identity_spec="    userInfo: always\n")
        w.idp.userinfo_status = 500
        start = await w.browser.get(w.url("/auth/login"))
        at_idp = await w.browser.get(start.location or "")
        back = await w.browser.get(at_idp.location or "")
        self.assertEqual(back.status, 502)
        self.assertNotIn("gw_session", w.browser.cookies)

    async def test_resource_indicator_is_sent_to_both_endpoints(self) -> None:
        w = await world(self, idp_spec="  resource: urn:edgegw:api\n")
        await w.login()
        self.assertEqual(w.idp.authorize_requests[-1]["resource"], "urn:edgegw:api")
        self.assertEqual(w.idp.token_requests[-1]["resource"], "urn:edgegw:api")

    async def test_userinfo_not_fetched_when_the_id_token_has_everything(self) -> None:
        w = await world(self)
        w.idp.user["given_name"] = "Alice"
        w.idp.user["family_name"] = "Example"
        await w.login()
        self.assertEqual(w.idp.userinfo_requests, 0)
        self.assertEqual(header_of(w.backend, b"X-User-Given-Name"), b"Alice")

    async def test_client_secret_post_when_only_that_is_supported(self) -> None:
        idp = FakeIdP()
        idp.token_auth_methods = ["client_secret_post"]
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start()
        final = await w.login()
        self.assertEqual(final.status, 200)
        self.assertEqual(idp.token_requests[-1]["auth_method"], "client_secret_post")

    async def test_large_passport_is_split_into_chunks(self) -> None:
        w = await world(self, gateway_spec=", fingerprintHeaders: []")
        w.idp.user["name"] = "N" * 6000
        final = await w.login()
        self.assertEqual(final.status, 200)
        chunks = sorted(name for name in w.browser.cookies if name.startswith("gw_session."))
        self.assertEqual(chunks, ["gw_session.0", "gw_session.1", "gw_session.2"])
        self.assertNotIn("gw_session", w.browser.cookies)
        view = (await w.browser.get(w.url("/auth/session"))).json()
        self.assertEqual(view["passport"]["name"], "N" * 6000)
        # A smaller session replaces it: every stale chunk is cleared.
        w.idp.user["name"] = "Short"
        await w.browser.follow(w.url("/auth/login?return_to=/app/x"))
        self.assertEqual(
            sorted(name for name in w.browser.cookies if name.startswith("gw_session")),
            ["gw_session"],
        )


class CatchAllRouteTests(TestCase):
    async def test_auth_endpoints_are_answered_before_a_catch_all_route(self) -> None:
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"spa")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        # A catch-all: everything the other routes do not match goes to the app.
        w.extra_routes = f"""\
---
kind: Route
metadata: {{name: spa}}
spec:
  match: /
  type: app
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}
"""
        await w.start()
        logout = await w.browser.get(w.url("/auth/logout"))
        self.assertEqual((logout.status, logout.header("Allow")), (405, "POST"))
        view = await w.browser.get(w.url("/auth/session"))
        self.assertEqual(view.status, 401)
        other = await w.browser.get(w.url("/auth/other"))
        self.assertEqual((other.status, other.body), (200, b"spa"))
        final = await w.login("/app/x")
        self.assertEqual(final.status, 200)


HOST_ROUTES = """\
kind: Route
metadata: {name: site}
spec:
  match: "127.0.0.1/"
  type: app
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: app}
spec:
  match: "127.0.0.1/app/"
  type: app
  access: {auth: required}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
"""


class HostPatternShadowing(TestCase):
    """
    Routes with a host pattern do not shadow the auth endpoints on that host (the mux
    prefers host patterns): login, callback, logout and the session view are still the
    gateway's, and logout really logs out.
    """

    async def test_auth_endpoints_win_over_host_routes(self) -> None:
        w = await world_with_routes(self, HOST_ROUTES)
        # The reference: requests to the auth endpoints are handled directly.
        login = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        self.assertEqual(login.status, 302, "login endpoint shadowed by the host route")
        self.assertTrue((login.location or "").startswith(w.idp.issuer))

    async def test_logout_really_logs_out_with_host_routes(self) -> None:
        w = await world_with_routes(self, HOST_ROUTES)
        # Log in by hand at the callback (the only way while the endpoints are shadowed
        # would be none at all); so just check logout: the POST must reach the gateway.
        before = len(w.backend.requests)
        out = await w.browser.post(w.url("/auth/logout"))
        self.assertEqual(len(w.backend.requests), before, "POST /auth/logout went to the backend")
        self.assertEqual(out.status, 302)


class LogoutTests(TestCase):
    async def test_logout_clears_the_session(self) -> None:
        w = await world(self)
        await w.login()
        out = await w.browser.post(w.url("/auth/logout"))
        self.assertEqual((out.status, out.location), (302, "/"))
        self.assertNotIn("gw_session", w.browser.cookies)
        after = await w.browser.get(w.url("/app/x"))
        self.assertEqual(after.status, 302)

    async def test_logout_by_get_is_405(self) -> None:
        w = await world(self)
        await w.login()
        response = await w.browser.get(w.url("/auth/logout"))
        self.assertEqual((response.status, response.header("Allow")), (405, "POST"))
        self.assertIn("gw_session", w.browser.cookies)

    async def test_cross_origin_logout_is_403(self) -> None:
        w = await world(self)
        await w.login()
        response = await w.browser.post(
            w.url("/auth/logout"),
            headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        )
        self.assertEqual(response.status, 403)
        self.assertIn("gw_session", w.browser.cookies)


class CallbackFailureTests(TestCase):
    async def begin(self, w: LoginWorld) -> str:
        """
        Start a login and let the IdP answer; the callback URL (not yet visited).
        """
        start = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        at_idp = await w.browser.get(start.location or "")
        assert at_idp.location is not None
        return at_idp.location

    async def assert_no_session(
        self, w: LoginWorld, response: BrowserResponse, status: int
    ) -> None:
        self.assertEqual(response.status, status)
        self.assertNotIn("gw_session", w.browser.cookies)
        self.assertNotIn("gw_session.0", w.browser.cookies)
        view = await w.browser.get(w.url("/auth/session"))
        self.assertEqual(view.status, 401)

    async def test_state_mismatch(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        forged = callback.replace("state=", "state=x")
        await self.assert_no_session(w, await w.browser.get(forged), 400)

    async def test_missing_login_cookie(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        for name in [name for name in w.browser.cookies if ".login." in name]:
            del w.browser.cookies[name]
        await self.assert_no_session(w, await w.browser.get(callback), 400)

    async def test_callback_in_another_browser(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        other = Browser()
        response = await other.get(callback)
        self.assertEqual(response.status, 400)
        self.assertEqual(other.cookies, {})

    async def test_idp_error(self) -> None:
        w = await world(self)
        w.idp.authorize_error = "access_denied"
        callback = await self.begin(w)
        self.assertIn("error=access_denied", callback)
        await self.assert_no_session(w, await w.browser.get(callback), 400)
        self.assertEqual(w.idp.token_requests, [])

    async def test_wrong_iss_on_the_callback(self) -> None:
        w = await world(self)
        w.idp.iss_override = "http://evil.example"
        callback = await self.begin(w)
        await self.assert_no_session(w, await w.browser.get(callback), 400)
        self.assertEqual(w.idp.token_requests, [])

    async def test_missing_iss_when_the_idp_always_sends_it(self) -> None:
        w = await world(self)
        w.idp.send_iss = False
        callback = await self.begin(w)
        await self.assert_no_session(w, await w.browser.get(callback), 400)

    async def test_token_endpoint_error(self) -> None:
        w = await world(self)
        w.idp.token_status = 500
        callback = await self.begin(w)
        await self.assert_no_session(w, await w.browser.get(callback), 502)

    async def test_token_endpoint_down(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        await w.idp.stop()
        await self.assert_no_session(w, await w.browser.get(callback), 502)

    async def test_replayed_code(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        login_cookies = {k: v for k, v in w.browser.cookies.items() if ".login." in k}
        first = await w.browser.get(callback)
        self.assertEqual(first.status, 302)
        # An attacker replays the same callback with a copy of the login cookie: the
        # state is spent, and the token endpoint is not even asked.
        thief = Browser(cookies=dict(login_cookies))
        second = await thief.get(callback)
        self.assertEqual(second.status, 400)
        self.assertNotIn("gw_session", thief.cookies)
        self.assertEqual(len(w.idp.token_requests), 1)
        # With a login of its own, the stolen code goes to the token endpoint with the
        # thief's PKCE verifier: refused there (the code is spent and bound to another
        # verifier), no session.
        own = await thief.get(w.url("/auth/login"))
        state = parse_qs(urlsplit(own.location or "").query)["state"][0]
        code = parse_qs(urlsplit(callback).query)["code"][0]
        injected = await thief.get(
            w.url(f"/auth/callback?code={code}&state={state}&iss={quote(w.idp.issuer)}")
        )
        self.assertEqual(injected.status, 502)
        self.assertNotIn("gw_session", thief.cookies)
        self.assertEqual(len(w.idp.token_requests), 2)

    async def test_many_callbacks_for_one_login_call_the_idp_once(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        login_cookies = {k: v for k, v in w.browser.cookies.items() if ".login." in k}
        w.idp.token_status = 500
        for _ in range(5):
            copy = Browser(cookies=dict(login_cookies))
            await copy.get(callback)
        self.assertEqual(len(w.idp.token_requests), 1)

    async def test_malformed_code(self) -> None:
        w = await world(self)
        callback = await self.begin(w)
        for bad in ("x" * 3000, "a%0Db", "%C3%A9"):
            response = await w.browser.get(callback.replace("code=", f"code={bad}&ignored=", 1))
            self.assertEqual(response.status, 400, bad)
        self.assertEqual(w.idp.token_requests, [])

    async def test_bad_id_tokens(self) -> None:
        for mode in (
            "bad_signature",
            "wrong_nonce",
            "wrong_aud",
            "wrong_iss",
            "expired",
            "alg_none",
            "hs256_public",
            "unknown_kid",
            "future_iat",
            "wrong_azp",
        ):
            w = await world(self)
            w.idp.id_token_mode = mode
            callback = await self.begin(w)
            response = await w.browser.get(callback)
            self.assertEqual(response.status, 502, mode)
            self.assertNotIn("gw_session", w.browser.cookies, mode)

    async def test_es256_id_token(self) -> None:
        w = await world(self)
        w.idp.signing_kid = "ec-1"
        final = await w.login()
        self.assertEqual(final.status, 200)


class ReturnToTests(TestCase):
    async def test_open_redirects_stay_on_the_gateway(self) -> None:
        w = await world(self)
        for attempt in (
            "//evil.example/x",
            "/\\evil.example/x",
            "https://evil.example/x",
            "%2F%2Fevil.example",
            "/%5Cevil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "http:/evil.example",
            "javascript:alert(1)",
            "/x?next=https://evil.example",
            "/" + "a" * 3000,
        ):
            browser = Browser()
            start = await browser.get(w.url("/auth/login?return_to=" + quote(attempt, safe="")))
            at_idp = await browser.get(start.location or "")
            back = await browser.get(at_idp.location or "")
            self.assertEqual(back.status, 302, attempt)
            location = back.location or ""
            target = urlsplit(location)
            self.assertEqual((target.scheme, target.netloc), ("", ""), attempt)
            self.assertTrue(location.startswith("/") and not location.startswith("//"), attempt)
            self.assertNotIn("\\", location, attempt)
        # "/%5Cevil": the escape stays an escape (a same-origin path).
        browser = Browser()
        start = await browser.get(w.url("/auth/login?return_to=" + quote("/%5Cevil", safe="")))
        at_idp = await browser.get(start.location or "")
        back = await browser.get(at_idp.location or "")
        self.assertEqual(back.location, "/%5Cevil")


class CookieTamperTests(TestCase):
    async def test_tampered_truncated_foreign_and_fingerprint(self) -> None:
        w = await world(self)
        await w.login()
        good = w.browser.cookies["gw_session"]

        async def status_with(value: str, agent: str | None = None) -> int:
            browser = Browser(cookies={"gw_session": value})
            if agent is not None:
                browser.user_agent = agent
            response = await browser.get(w.url("/app/x"), headers={"Sec-Fetch-Mode": "cors"})
            return response.status

        self.assertEqual(await status_with(good), 200)
        raw = bytearray(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))
        raw[20] ^= 1
        tampered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        self.assertEqual(await status_with(tampered), 401)
        self.assertEqual(await status_with(good[:-10]), 401)
        self.assertEqual(await status_with("garbage"), 401)
        self.assertEqual(await status_with(good, agent="another-browser"), 401)

    async def test_foreign_key_and_expiry(self) -> None:
        w = await world(self)
        other = await world(self, gateway_spec="")
        await other.login()
        stolen = other.browser.cookies["gw_session"]
        # Same key in both worlds: a cookie sealed under another key needs its own world.
        from edgegw.identity.sealing import SESSION_AAD, Sealer

        foreign = Sealer(b"k" * 32).seal(b'{"v":1}', SESSION_AAD)
        browser = Browser(cookies={"gw_session": foreign})
        response = await browser.get(w.url("/app/x"), headers={"Sec-Fetch-Mode": "cors"})
        self.assertEqual(response.status, 401)
        # The same key on another gateway reads it (shared key, as several instances do).
        browser = Browser(cookies={"gw_session": stolen})
        response = await browser.get(w.url("/app/x"), headers={"Sec-Fetch-Mode": "cors"})
        self.assertEqual(response.status, 200)


class IdPAvailabilityTests(TestCase):
    async def test_idp_down_at_start_then_up(self) -> None:
        idp = FakeIdP()
        await idp.start(self)
        await idp.stop()
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start(wait=False)
        # Public routes are served while the IdP is away; login answers 503.
        public = await w.browser.get(w.url("/open/x"))
        self.assertEqual(public.status, 200)
        login = await w.browser.get(w.url("/auth/login"))
        self.assertEqual(login.status, 503)
        retry = login.header("Retry-After")
        assert retry is not None
        self.assertGreaterEqual(int(retry), 1)
        await idp.restart()
        await w.ready()
        final = await w.login()
        self.assertEqual(final.status, 200)

    async def test_discovery_issuer_mismatch_is_not_used(self) -> None:
        idp = FakeIdP()
        idp.discovery_issuer = "http://other.example"
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start(wait=False)
        await deferLater(reactor, 0.3, lambda: None)
        provider = w.gateway.idp
        assert provider is not None
        self.assertFalse(provider.ready)
        self.assertIn("other.example", provider.last_error or "")
        login = await w.browser.get(w.url("/auth/login"))
        self.assertEqual(login.status, 503)

    async def test_key_rotation_is_picked_up(self) -> None:
        w = await world(self)
        provider = w.gateway.idp
        assert provider is not None
        provider.refetch_interval = 0.0
        before = w.idp.jwks_requests
        w.idp.rotate()
        final = await w.login()
        self.assertEqual(final.status, 200)
        self.assertEqual(w.idp.jwks_requests, before + 1)

    async def test_unknown_kids_are_refetched_rate_limited(self) -> None:
        w = await world(self)
        provider = w.gateway.idp
        assert provider is not None
        provider.refetch_interval = 60.0
        before = w.idp.jwks_requests
        for _ in range(3):
            w.idp.id_token_mode = "unknown_kid"
            browser = Browser()
            start = await browser.get(w.url("/auth/login"))
            at_idp = await browser.get(start.location or "")
            response = await browser.get(at_idp.location or "")
            self.assertEqual(response.status, 502)
        self.assertEqual(w.idp.jwks_requests, before + 1)


class ConfigTests(TestCase):
    def test_session_without_idp_and_idp_without_session(self) -> None:
        from tests.support.configs import problems_of

        problems = problems_of(
            self.mktemp(),
            f"""\
            kind: Gateway
            metadata: {{name: g}}
            spec:
              listen: "127.0.0.1:0"
              session: {{key: "{KEY}"}}
            """,
            gateway=False,
        )
        self.assertEqual(
            problems,
            [
                'document 1, Gateway "g": spec.session: a session needs an IdP resource to '
                "log users in (declare kind: IdP)"
            ],
        )

    def test_auth_path_conflicts_with_a_route(self) -> None:
        from tests.support.configs import problems_of

        problems = problems_of(
            self.mktemp(),
            f"""\
            kind: Gateway
            metadata: {{name: g}}
            spec:
              listen: "127.0.0.1:0"
              session: {{key: "{KEY}"}}
              auth: {{loginPath: /auth/session}}
            ---
            kind: IdP
            metadata: {{name: i}}
            spec: {{type: oidc, issuer: "https://idp.example", clientID: c, clientSecret: s}}
            ---
            kind: Route
            metadata: {{name: r}}
            spec: {{match: /auth/logout, handler: {{type: health}}}}
            """,
            gateway=False,
        )
        self.assertEqual(len(problems), 2, problems)
        self.assertIn(
            "spec.session.infoPath: /auth/session is also spec.auth.loginPath",
            problems[1] + problems[0],
        )
        self.assertIn(
            'document 3, Route "r": spec.match: never reached: /auth/logout is the '
            "gateway's own auth endpoint (spec.auth.logoutPath), answered before any Route",
            problems,
        )


class MethodRouteShadowing(TestCase):
    """
    A Route on an auth endpoint's path (here with a method) is never reached, and is
    refused at load; a host pattern that keeps every other path is fine.
    """

    def test_method_route_on_an_auth_path_is_a_config_error(self) -> None:
        from edgegw.config.errors import ConfigError
        from tests.support.configs import load_text

        text = f"""\
            kind: Gateway
            metadata: {{name: g}}
            spec:
              listen: "127.0.0.1:0"
              session: {{key: "{KEY}"}}
            ---
            kind: IdP
            metadata: {{name: i}}
            spec: {{type: oidc, issuer: "https://idp.example", clientID: c, clientSecret: s}}
            ---
            kind: Route
            metadata: {{name: r}}
            spec: {{match: "POST /auth/logout", handler: {{type: health}}}}
            ---
            kind: Route
            metadata: {{name: h}}
            spec: {{match: "example.com/", handler: {{type: health}}}}
            """
        # "POST /auth/logout" can never be reached (the endpoint answers first): reported.
        # "example.com/" keeps every other path and is fine.
        with self.assertRaises(ConfigError) as caught:
            load_text(self.mktemp(), text, gateway=False)
        self.assertEqual(len(caught.exception.problems), 1)
        self.assertIn("/auth/logout", str(caught.exception.problems[0]))
