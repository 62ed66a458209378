"""
Cookie tossing (issue 36, point 1), on real sockets: a page on a sibling subdomain can set
a cookie of the session's name for the parent domain, and the browser then sends it
beside its own. The gateway reads none of a cookie of its own that a request carries
more than once (the session, a chunk, a login state): no session, logged; a callback
with an ambiguous login-state cookie answers 400. On a secure request (TLS, or a trusted
proxy saying https) its cookies are named C{__Host-...}, which no other host can set,
and the unprefixed names are not read there.

The browser here is the test client (L{tests.support.browser.Browser}); the tossed
cookies are written into the C{Cookie} header as a browser would send them (its own
first: older, same path). The same attacks in Chromium with a real sibling subdomain:
tests/e2e/test_browser_toss.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.identity.cookies import (
    AMBIGUITY_LOG_INTERVAL,
    AmbiguityLog,
    CookieName,
)
from tests.support.backends import SiteBackend, answer
from tests.support.browser import USER_AGENT, Browser, BrowserResponse
from tests.support.configs import load_text, problems_of
from tests.support.fake_idp import FakeIdP
from tests.support.h2client import connect_h2, listen_tls
from tests.support.log_capture import capture_log
from tests.support.redis import redis_server
from tests.support.sessions import SessionGateway
from tests.test_login import LoginWorld, world

NAVIGATE = {"Sec-Fetch-Mode": "navigate"}
HTTPS = {"X-Forwarded-Proto": "https"}
"""What a trusted proxy in front says of a browser on https."""


def cookie_header(pairs: list[tuple[str, str]]) -> str:
    return "; ".join(f"{name}={value}" for name, value in pairs)


async def log_in(w: LoginWorld, user: str, headers: dict[str, str] | None = None) -> Browser:
    """
    A browser of its own logged in as C{user} through the gateway and the fake IdP
    (C{headers} sent to the gateway on every step: L{HTTPS} for a secure login).
    """
    return await log_in_at(w.url, w.idp, user, headers)


async def log_in_at(
    url: Callable[[str], str], idp: FakeIdP, user: str, headers: dict[str, str] | None = None
) -> Browser:
    """
    L{log_in} at the gateway whose URLs C{url} makes.
    """
    idp.user["sub"] = user
    browser = Browser()
    start = await browser.get(url("/auth/login?return_to=/app/x"), headers=headers)
    assert start.status == 302, start
    at_idp = await browser.get(start.location or "")
    back = urlsplit(at_idp.location or "")
    # The IdP sends the browser to the redirect_uri, https:// when the proxy said so:
    # the proxy's part is played by this test, which brings it to the gateway.
    done = await browser.get(url(f"{back.path}?{back.query}"), headers=headers)
    assert done.status == 302, (done, done.body)
    return browser


async def user_at(
    w: LoginWorld, cookies: str, headers: dict[str, str] | None = None, path: str = "/app/x"
) -> tuple[BrowserResponse, bytes | None]:
    """
    Visit C{path} (a navigation) with exactly the C{Cookie} header C{cookies}; the
    response and the user the backend was told of (L{None} when it was not reached).
    """
    before = len(w.backend.requests)
    response = await Browser().get(
        w.url(path), headers={**NAVIGATE, **(headers or {}), "Cookie": cookies}
    )
    reached = w.backend.requests[before:]
    return response, (reached[-1].header(b"X-User-Id") if reached else None)


def ambiguity_lines(events: list[dict[str, Any]]) -> list[str]:
    return [
        text
        for text in (formatEvent(event) for event in events)
        if text and text.startswith("ambiguous ")
    ]


def idp_redirect_uris(w: LoginWorld) -> None:
    """
    Let the fake IdP send the browser back to the gateway's https origin (what the
    browser used, as a trusted proxy says).
    """
    w.idp.redirect_uris.append(f"https://127.0.0.1:{w.port}/auth/callback")


class DuplicatedSessionCookie(TestCase):
    """
    Over plain http, where the names stay as configured (a tossed cookie can carry the
    session's own name): a request carrying it twice has no session.
    """

    async def test_the_session_cookie_twice_is_no_session(self) -> None:
        w = await world(self)
        alice = (await log_in(w, "alice")).cookies["gw_session"]
        mallory = (await log_in(w, "mallory")).cookies["gw_session"]
        response, user = await user_at(w, cookie_header([("gw_session", alice)]))
        self.assertEqual(user, b"alice")
        events = capture_log(self)
        for pairs in (
            [("gw_session", alice), ("gw_session", mallory)],
            [("gw_session", mallory), ("gw_session", alice)],
        ):
            response, user = await user_at(w, cookie_header(pairs))
            self.assertIsNone(user, f"{[name for name, _ in pairs]} authenticated as {user!r}")
            self.assertEqual(response.status, 302)
            self.assertTrue((response.location or "").startswith("/auth/login?"))
            # A service route: 401, not the login redirect.
            response, user = await user_at(w, cookie_header(pairs), path="/api/x")
            self.assertEqual((response.status, user), (401, None))
        lines = ambiguity_lines(events)
        self.assertTrue(lines, "the ambiguous session cookie was not logged")
        self.assertIn("gw_session", lines[0])

    async def test_a_chunk_twice_is_no_session(self) -> None:
        w = await world(self, gateway_spec=", fingerprintHeaders: []")
        w.idp.user["name"] = "N" * 4000
        alice = await log_in(w, "alice")
        chunks = sorted((n, v) for n, v in alice.cookies.items() if n.startswith("gw_session."))
        self.assertGreaterEqual(len(chunks), 2)
        self.assertEqual([n for n, _ in chunks], [f"gw_session.{i}" for i in range(len(chunks))])
        mallory = await log_in(w, "mallory")
        _, user = await user_at(w, cookie_header(chunks))
        self.assertEqual(user, b"alice")
        theirs = sorted((n, v) for n, v in mallory.cookies.items() if n.startswith("gw_session."))
        # Every chunk of mallory's tossed (the last of each name used to win), or one.
        tossings = [theirs] + [[(f"gw_session.{i}", theirs[i][1])] for i in range(len(chunks))]
        for tossed in tossings:
            response, user = await user_at(w, cookie_header([*chunks, *tossed]))
            self.assertIsNone(user, f"{[n for n, _ in tossed]} authenticated as {user!r}")
            self.assertEqual(response.status, 302)

    async def test_a_single_cookie_beside_the_chunks_is_no_session(self) -> None:
        """
        An attack of our own: the victim's session is chunked (a large passport), and
        the sibling tosses a single C{gw_session}: no name is carried twice, but a
        single cookie used to win over chunks.
        """
        w = await world(self, gateway_spec=", fingerprintHeaders: []")
        w.idp.user["name"] = "N" * 4000
        alice = await log_in(w, "alice")
        chunks = sorted((n, v) for n, v in alice.cookies.items() if n.startswith("gw_session."))
        w.idp.user["name"] = "Mallory"
        mallory = (await log_in(w, "mallory")).cookies["gw_session"]
        events = capture_log(self)
        for pairs in ([*chunks, ("gw_session", mallory)], [("gw_session", mallory), *chunks]):
            response, user = await user_at(w, cookie_header(pairs))
            self.assertIsNone(user, f"a tossed single cookie authenticated as {user!r}")
            self.assertEqual(response.status, 302)
        self.assertTrue(ambiguity_lines(events))

    async def test_names_that_are_not_the_session_s_do_not_count(self) -> None:
        """
        Other cookies carried twice (the app's own) leave the session alone, and so do
        look-alike names: they are not the gateway's.
        """
        w = await world(self)
        alice = (await log_in(w, "alice")).cookies["gw_session"]
        mallory = (await log_in(w, "mallory")).cookies["gw_session"]
        for extra in (
            [("theme", "dark"), ("theme", "light")],
            [("GW_SESSION", mallory), ("gw_session ", mallory), ("gw_sessionx", mallory)],
            [("gw_session.login.x", "a"), ("gw_session.login.x", "b")],
        ):
            _, user = await user_at(w, cookie_header([("gw_session", alice), *extra]))
            self.assertEqual(user, b"alice", extra)


class DirectTLS(TestCase):
    """
    The gateway's own TLS (C{request.isSecure()}), over HTTP/2, where a browser may send
    each cookie in a C{cookie} field of its own (RFC 9113, 8.2.3).
    """

    async def test_host_names_and_duplicates_over_h2(self) -> None:
        w = await world(self)
        # A sealed value does not depend on the name it is sent under.
        a = (await log_in(w, "alice")).cookies["gw_session"]
        b = (await log_in(w, "bob")).cookies["gw_session"]
        client = await connect_h2(self, listen_tls(self, w.gateway.site))
        self.addCleanup(client.shut)

        async def user(*cookies: str) -> tuple[int | None, bytes | None]:
            before = len(w.backend.requests)
            fields = [(b"user-agent", USER_AGENT.encode()), (b"sec-fetch-mode", b"navigate")]
            fields += [(b"cookie", cookie.encode()) for cookie in cookies]
            response = await client.request(b"GET", b"/app/x", fields)
            reached = w.backend.requests[before:]
            return response.status, (reached[-1].header(b"X-User-Id") if reached else None)

        self.assertEqual(await user(f"__Host-gw_session={a}"), (200, b"alice"))
        self.assertEqual(await user(f"__Host-gw_session={a}", f"gw_session={b}"), (200, b"alice"))
        self.assertEqual(await user(f"gw_session={a}"), (302, None))
        self.assertEqual(
            await user(f"__Host-gw_session={a}", f"__Host-gw_session={b}"), (302, None)
        )
        self.assertEqual(await user(f"__Host-gw_session={a}; __Host-gw_session={b}"), (302, None))
        login = await client.request(b"GET", b"/auth/login?return_to=/app/x")
        line = (login.header(b"set-cookie") or b"").decode()
        self.assertTrue(line.startswith("__Host-gw_session.login."), line)
        self.assertIn("; Secure", line)


class LoginStateToss(TestCase):
    async def begin(
        self, w: LoginWorld, browser: Browser, headers: dict[str, str] | None = None
    ) -> tuple[str, str]:
        """
        Begin a login in C{browser} and go through the IdP; the login cookie's name and
        the callback's path and query.
        """
        start = await browser.get(w.url("/auth/login?return_to=/app/x"), headers=headers)
        name = browser.set_cookie_lines[0].split("=", 1)[0]
        self.assertIn(".login.", name)
        at_idp = await browser.get(start.location or "")
        back = urlsplit(at_idp.location or "")
        return name, f"{back.path}?{back.query}"

    async def test_a_login_cookie_twice_answers_400(self) -> None:
        w = await world(self)
        victim = Browser()
        name, callback = await self.begin(w, victim)
        own = victim.cookies[name]
        events = capture_log(self)
        for pairs in ([(name, own), (name, own)], [(name, own), (name, "tossed")]):
            response = await Browser().get(
                w.url(callback), headers={"Cookie": cookie_header(pairs)}
            )
            self.assertEqual(response.status, 400, response.body)
            self.assertFalse(
                [
                    line
                    for line in response.headers.getRawHeaders("Set-Cookie", [])
                    if line.startswith("gw_session=")
                ],
                "a session was set",
            )
        self.assertTrue(any(name in line for line in ambiguity_lines(events)))
        # The same callback with the cookie once would have logged in (a fresh login).
        name, callback = await self.begin(w, victim)
        response = await victim.get(w.url(callback))
        self.assertEqual(response.status, 302)

    async def test_a_tossed_login_state_cannot_log_the_victim_in_over_https(self) -> None:
        """
        An attack of our own, login CSRF: mallory begins a login in her own browser and
        goes through the IdP, then tosses her login-state cookie (unprefixed, as a
        sibling can) into the victim's browser and sends it to her callback URL. Over
        https the gateway reads only the C{__Host-} login cookies: 400, no session.
        """
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        w.idp.user["sub"] = "mallory"
        mallory = Browser()
        name, callback = await self.begin(w, mallory, HTTPS)
        self.assertTrue(name.startswith("__Host-gw_session.login."), name)
        tossed = name.removeprefix("__Host-")
        response = await Browser().get(
            w.url(callback),
            headers={**HTTPS, "Cookie": cookie_header([(tossed, mallory.cookies[name])])},
        )
        self.assertEqual(response.status, 400, response.body)
        self.assertIsNone(
            next(
                (
                    line
                    for line in response.headers.getRawHeaders("Set-Cookie", [])
                    if "gw_session=" in line and "Max-Age=0" not in line
                ),
                None,
            )
        )


class HostPrefix(TestCase):
    """
    The C{__Host-} names on secure requests, the configured ones over http, and
    C{session.hostPrefix: false}.
    """

    def assert_host_cookie(self, line: str) -> None:
        attributes = [part.strip().lower() for part in line.split(";")[1:]]
        self.assertTrue(line.startswith("__Host-"), line)
        self.assertIn("secure", attributes)
        self.assertIn("path=/", attributes)
        self.assertFalse([a for a in attributes if a.startswith("domain")], line)

    async def test_https_behind_a_trusted_proxy_names_cookies_host(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        browser = Browser()
        start = await browser.get(w.url("/auth/login?return_to=/app/x"), headers=HTTPS)
        [login_line] = browser.set_cookie_lines
        self.assertTrue(login_line.startswith("__Host-gw_session.login."), login_line)
        self.assert_host_cookie(login_line)
        at_idp = await browser.get(start.location or "")
        back = urlsplit(at_idp.location or "")
        await browser.get(w.url(f"{back.path}?{back.query}"), headers=HTTPS)
        session = browser.set_cookie("__Host-gw_session")
        assert session is not None, browser.set_cookie_lines
        self.assert_host_cookie(session)
        self.assertEqual(sorted(browser.cookies), ["__Host-gw_session"])
        value = browser.cookies["__Host-gw_session"]
        _, user = await user_at(w, f"__Host-gw_session={value}", HTTPS)
        self.assertEqual(user, b"alice")
        # Over plain http the names are as configured: the __Host- one is not read.
        _, user = await user_at(w, f"__Host-gw_session={value}")
        self.assertIsNone(user)
        _, user = await user_at(w, f"gw_session={value}")
        self.assertEqual(user, b"alice")

    async def test_plain_http_keeps_the_configured_names(self) -> None:
        w = await world(self)
        browser = await log_in(w, "alice")
        self.assertEqual(sorted(browser.cookies), ["gw_session"])
        # The peer is not a trusted proxy: its X-Forwarded-Proto is not believed.
        browser = await log_in(w, "bob", HTTPS)
        self.assertEqual(sorted(browser.cookies), ["gw_session"])

    async def test_over_https_the_unprefixed_name_is_not_read(self) -> None:
        """
        The name a sibling can toss (and the one a gateway before the prefix set) is
        not a session on a secure request, alone or beside the browser's own.
        """
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        alice = (await log_in(w, "alice", HTTPS)).cookies["__Host-gw_session"]
        mallory = (await log_in(w, "mallory", HTTPS)).cookies["__Host-gw_session"]
        response, user = await user_at(w, f"gw_session={mallory}", HTTPS)
        self.assertIsNone(user)
        self.assertEqual(response.status, 302)
        for pairs in (
            [("__Host-gw_session", alice), ("gw_session", mallory)],
            [("gw_session", mallory), ("__Host-gw_session", alice)],
            [("__Host-gw_session", alice), ("gw_session.0", mallory)],
        ):
            _, user = await user_at(w, cookie_header(pairs), HTTPS)
            self.assertEqual(user, b"alice", pairs)

    async def test_look_alike_prefixes_are_not_read(self) -> None:
        """
        An attack of our own: names a browser might let a sibling set that a lenient
        reader could take for the session: C{__host-} in lower case, C{__HOST-}, a
        trailing space, C{__Secure-}. None is a session; beside the browser's own they
        change nothing.
        """
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        alice = (await log_in(w, "alice", HTTPS)).cookies["__Host-gw_session"]
        mallory = (await log_in(w, "mallory", HTTPS)).cookies["__Host-gw_session"]
        for name in (
            "__host-gw_session",
            "__HOST-gw_session",
            "__Host-gw_session ",
            "__Secure-gw_session",
            "__Host-GW_SESSION",
        ):
            _, user = await user_at(w, f"{name}={mallory}", HTTPS)
            self.assertIsNone(user, f"{name!r} authenticated as {user!r}")
            _, user = await user_at(w, f"__Host-gw_session={alice}; {name}={mallory}", HTTPS)
            self.assertEqual(user, b"alice", name)
        # The prefixed name twice is as ambiguous as any (a browser never sends it so).
        _, user = await user_at(w, f"__Host-gw_session={alice}; __Host-gw_session={mallory}", HTTPS)
        self.assertIsNone(user)

    async def test_logout_over_https_clears_the_host_names(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        browser = await log_in(w, "alice", HTTPS)
        # A leftover of a gateway before the prefix, host-only: cleared too.
        browser.cookies["gw_session"] = "old"
        origin = f"https://127.0.0.1:{w.port}"
        response = await browser.post(
            w.url("/auth/logout"),
            headers={**HTTPS, "Origin": origin, "Sec-Fetch-Site": "same-origin"},
        )
        self.assertEqual(response.status, 302, response.body)
        cleared = {
            line.split("=", 1)[0] for line in browser.set_cookie_lines if "Max-Age=0" in line
        }
        self.assertEqual(cleared, {"__Host-gw_session", "gw_session"})
        for line in browser.set_cookie_lines:
            self.assertIn("; Secure", line)
        self.assertEqual(browser.cookies, {})

    async def test_backends_never_get_the_host_cookies(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        alice = (await log_in(w, "alice", HTTPS)).cookies["__Host-gw_session"]
        before = len(w.backend.requests)
        await Browser().get(
            w.url("/app/x"),
            headers={
                **HTTPS,
                "Cookie": f"__Host-gw_session={alice}; theme=dark; gw_session=tossed;"
                " __Host-gw_session.login.abc=x",
            },
        )
        [seen] = w.backend.requests[before:]
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(seen.header(b"Cookie"), b"theme=dark")

    async def test_a_backend_cannot_set_the_host_cookies(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        alice = (await log_in(w, "alice", HTTPS)).cookies["__Host-gw_session"]
        w.backend.responder = answer(
            body=b"backend",
            headers=[
                (b"Set-Cookie", b"__Host-gw_session=evil; Path=/; Secure"),
                (b"Set-Cookie", b"__Host-gw_session.0=evil; Path=/; Secure"),
                (b"Set-Cookie", b"__Host-gw_session.login.x=evil; Path=/; Secure"),
                (b"Set-Cookie", b"theme=dark; Path=/"),
            ],
        )
        response = await Browser().get(
            w.url("/app/x"), headers={**HTTPS, "Cookie": f"__Host-gw_session={alice}"}
        )
        self.assertEqual(response.headers.getRawHeaders("Set-Cookie"), ["theme=dark; Path=/"])

    async def test_host_prefix_off(self) -> None:
        w = await world(self, trusted='["127.0.0.1"]', gateway_spec=", hostPrefix: false")
        idp_redirect_uris(w)
        browser = await log_in(w, "alice", HTTPS)
        self.assertEqual(sorted(browser.cookies), ["gw_session"])
        self.assertIn("; Secure", browser.set_cookie("gw_session") or "")
        _, user = await user_at(w, f"gw_session={browser.cookies['gw_session']}", HTTPS)
        self.assertEqual(user, b"alice")


class LogoutStateCookie(TestCase):
    """
    The logout-state cookie (edgegw/auth/logout_state.py, named among the login-state
    cookies) is a cookie of the gateway's too: C{__Host-} on a secure request, and
    refused when carried twice.
    """

    async def test_host_name_and_duplicates(self) -> None:
        idp = FakeIdP()
        idp.end_session = True
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        w = LoginWorld(self, idp, backend)
        await w.start(trusted='["127.0.0.1"]')
        idp_redirect_uris(w)
        origin = f"https://127.0.0.1:{w.port}"
        idp.post_logout_redirect_uris.append(origin + "/auth/logout")
        browser = await log_in(w, "alice", HTTPS)
        out = await browser.post(
            w.url("/auth/logout"),
            headers={**HTTPS, "Origin": origin, "Sec-Fetch-Site": "same-origin"},
        )
        self.assertEqual(out.status, 302)
        state = parse_qs(urlsplit(out.location or "").query)["state"][0]
        named = sorted(name for name in browser.cookies if name.endswith(".login.logout"))
        self.assertEqual(named, ["__Host-gw_session.login.logout"])
        [name] = named
        own = browser.cookies[name]
        # The browser's own beside a tossed one (in either order): not the return of
        # this browser's logout.
        for pairs in ([(name, own), (name, "tossed")], [(name, "tossed"), (name, own)]):
            response = await Browser().get(
                w.url(f"/auth/logout?state={state}"),
                headers={**HTTPS, "Cookie": cookie_header(pairs)},
            )
            self.assertEqual(response.status, 400, pairs)


class _BehindTrustedProxy(SessionGateway):
    """
    A server-side-session gateway that trusts its peer (the test) as a proxy.
    """

    def config_text(self) -> str:
        listen = '  listen: "127.0.0.1:0"\n'
        return (
            super().config_text().replace(listen, listen + '  trustedProxies: ["127.0.0.1"]\n', 1)
        )


class ServerSideSessionCookie(TestCase):
    """
    With a state provider the cookie holds a sealed session id: the same rules.
    """

    async def gateway(self) -> tuple[SessionGateway, SiteBackend]:
        redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        gateway = await _BehindTrustedProxy(self, idp, backend, redis).start()
        idp.redirect_uris.append(f"https://127.0.0.1:{gateway.port}/auth/callback")
        return gateway, backend

    async def user(
        self,
        gateway: SessionGateway,
        backend: SiteBackend,
        cookies: str,
        headers: dict[str, str] | None = None,
    ) -> bytes | None:
        before = len(backend.requests)
        await Browser().get(
            gateway.url("/app/x"), headers={**NAVIGATE, **(headers or {}), "Cookie": cookies}
        )
        reached = backend.requests[before:]
        return reached[-1].header(b"X-User-Id") if reached else None

    async def test_the_session_id_cookie_twice_is_no_session(self) -> None:
        gateway, backend = await self.gateway()
        a = (await log_in_at(gateway.url, gateway.idp, "alice")).cookies["gw_session"]
        b = (await log_in_at(gateway.url, gateway.idp, "bob")).cookies["gw_session"]
        self.assertEqual(await self.user(gateway, backend, f"gw_session={a}"), b"alice")
        events = capture_log(self)
        self.assertIsNone(await self.user(gateway, backend, f"gw_session={a}; gw_session={b}"))
        self.assertIsNone(await self.user(gateway, backend, f"gw_session={b}; gw_session={a}"))
        self.assertTrue(ambiguity_lines(events))

    async def test_over_https_host_names_and_logout(self) -> None:
        gateway, backend = await self.gateway()
        alice = await log_in_at(gateway.url, gateway.idp, "alice", HTTPS)
        self.assertEqual(sorted(alice.cookies), ["__Host-gw_session"])
        a = alice.cookies["__Host-gw_session"]
        b = (await log_in_at(gateway.url, gateway.idp, "bob", HTTPS)).cookies["__Host-gw_session"]
        user = await self.user(gateway, backend, f"__Host-gw_session={a}", HTTPS)
        self.assertEqual(user, b"alice")
        for cookies in (
            f"gw_session={b}",
            f"__host-gw_session={b}",
            f"__Host-gw_session={a}; __Host-gw_session={b}",
        ):
            self.assertIsNone(await self.user(gateway, backend, cookies, HTTPS), cookies)
        user = await self.user(gateway, backend, f"__Host-gw_session={a}; gw_session={b}", HTTPS)
        self.assertEqual(user, b"alice")
        # Logout over https clears the __Host- cookie and ends the stored session.
        same_origin = {
            "Origin": f"https://127.0.0.1:{gateway.port}",
            "Sec-Fetch-Site": "same-origin",
        }
        response = await alice.post(gateway.url("/auth/logout"), headers={**HTTPS, **same_origin})
        self.assertEqual(response.status, 302)
        self.assertTrue(
            any(
                line.startswith("__Host-gw_session=;") and "Max-Age=0" in line
                for line in alice.set_cookie_lines
            ),
            alice.set_cookie_lines,
        )
        self.assertIsNone(await self.user(gateway, backend, f"__Host-gw_session={a}", HTTPS))


class AmbiguityLogTests(SynchronousTestCase):
    def test_logged_at_most_once_per_interval_with_a_count(self) -> None:
        clock = Clock()
        log = AmbiguityLog(clock, "session")
        events = capture_log(self)
        log.ambiguous(b"gw_session")
        log.ambiguous(b"gw_session")
        log.ambiguous(b"gw_session.0")
        self.assertEqual(len(ambiguity_lines(events)), 1)
        clock.advance(AMBIGUITY_LOG_INTERVAL)
        log.ambiguous(b"gw_session")
        lines = ambiguity_lines(events)
        self.assertEqual(len(lines), 2)
        self.assertIn("(2 more such requests since the last report)", lines[1])


class CookieNameTests(SynchronousTestCase):
    def test_names(self) -> None:
        self.assertEqual(
            CookieName.of("gw_session", True), CookieName(b"gw_session", b"__Host-gw_session")
        )
        self.assertEqual(
            CookieName.of("gw_session", False), CookieName(b"gw_session", b"gw_session")
        )
        # A configured name that already has the prefix does not get it twice.
        self.assertEqual(CookieName.of("__Host-s", True), CookieName(b"__Host-s", b"__Host-s"))


class HostPrefixConfig(SynchronousTestCase):
    def text(self, extra: str) -> str:
        return (
            "kind: Gateway\nmetadata: {name: g}\nspec:\n"
            f'  session: {{key: "0123456789abcdef0123456789abcdef"{extra}}}\n'
            "---\nkind: IdP\nmetadata: {name: i}\nspec:\n  type: oidc\n"
            "  issuer: https://idp.example\n  clientID: c\n  clientSecret: s\n"
            "  redirectURL: https://gw.example/auth/callback\n"
        )

    def test_default_and_false(self) -> None:
        for extra, expected in (("", True), (", hostPrefix: false", False)):
            config = load_text(self.mktemp(), self.text(extra), gateway=False)
            assert config.gateway.session is not None
            self.assertIs(config.gateway.session.host_prefix, expected)

    def test_not_a_boolean_is_a_located_error(self) -> None:
        problems = problems_of(self.mktemp(), self.text(', hostPrefix: "maybe"'), gateway=False)
        self.assertEqual(
            problems,
            [
                'document 1, Gateway "g": spec.session.hostPrefix: expected a boolean'
                " (true or false), got a string"
            ],
        )
