"""
Tests for L{edgegw.identity.login_state}, and for the callback's record of spent login
states (L{edgegw.identity.login_state.SpentStates}): one login state buys one token request.
"""

from __future__ import annotations

import json
import re

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

import edgegw.identity.login_state as login_state
from edgegw.identity.login_state import (
    LOGIN_LIFETIME,
    MAX_PENDING,
    LoginState,
    LoginStates,
    SpentStates,
    login_cookie_prefix,
)
from edgegw.identity.sealing import LOGIN_STATE_AAD, SESSION_AAD, Sealer
from tests.support.browser import Browser
from tests.test_login import world
from tests.test_session_cookie import (
    apply_set_cookies,
    cleared,
    make_request,
    set_cookie_lines,
    set_names,
)

KEY = bytes(range(32))
NOW = 1_700_000_000
PREFIX = b"gw_session.login."
TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")


class LoginStateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW)
        self.sealer = Sealer(KEY)
        self.states = LoginStates(self.sealer, "gw_session", self.clock)
        self.jar: dict[bytes, bytes] = {}

    def begin(self, return_to: str = "/app", secure: bool = False) -> LoginState:
        """
        Begin a login in the browser whose cookies are C{self.jar}, and keep the cookies
        of the response.
        """
        request = make_request(self.jar, secure=secure)
        login = self.states.begin(request, return_to)
        self.jar = apply_set_cookies(self.jar, request)
        return login

    def take(self, state: str) -> LoginState | None:
        """
        Finish a login in the same browser, and keep the cookies of the response.
        """
        request = make_request(self.jar)
        login = self.states.take(request, state)
        self.jar = apply_set_cookies(self.jar, request)
        return login

    def test_prefix(self) -> None:
        """
        Login cookies are named C{<session cookie>.login.<state>}.
        """
        self.assertEqual(login_cookie_prefix("gw_session"), "gw_session.login.")
        self.assertEqual(login_cookie_prefix("sid"), "sid.login.")
        self.assertTrue(self.states.is_login_cookie(b"gw_session.login.abc"))
        self.assertFalse(self.states.is_login_cookie(b"gw_session"))
        self.assertFalse(self.states.is_login_cookie(b"gw_session.0"))
        self.assertFalse(self.states.is_login_cookie(b"gw_session.loginx"))
        self.assertFalse(self.states.is_login_cookie(b"other.login.abc"))

    def test_begin(self) -> None:
        """
        A login has fresh 43-character state, nonce and verifier, and one cookie named
        after its state, living L{LOGIN_LIFETIME} seconds.
        """
        request = make_request()
        login = self.states.begin(request, "/app?x=1")
        self.assertEqual(login.return_to, "/app?x=1")
        self.assertEqual(login.created_at, NOW)
        for token in (login.state, login.nonce, login.verifier):
            self.assertTrue(TOKEN.fullmatch(token), token)
        self.assertEqual(len({login.state, login.nonce, login.verifier}), 3)
        [line] = set_cookie_lines(request)
        name, rest = line.split(b"=", 1)
        value, attributes = rest.split(b";", 1)
        self.assertEqual(name, PREFIX + login.state.encode())
        self.assertEqual(attributes, b" Path=/; Max-Age=600; HttpOnly; SameSite=Lax")
        plaintext = self.sealer.unseal(value, LOGIN_STATE_AAD)
        assert plaintext is not None
        self.assertEqual(json.loads(plaintext)["s"], login.state)
        self.assertIsNone(self.sealer.unseal(value, SESSION_AAD))
        other = self.states.begin(make_request(), "/app")
        self.assertNotEqual(other.state, login.state)
        self.assertNotEqual(other.nonce, login.nonce)
        self.assertNotEqual(other.verifier, login.verifier)

    def test_secure(self) -> None:
        """
        The cookie is C{Secure} when the browser came over https, and so are its clears.
        """
        login = self.begin(secure=True)
        request = make_request(self.jar, secure=True)
        self.states.begin(request, "/")
        self.assertTrue(set_cookie_lines(request)[0].endswith(b"; SameSite=Lax; Secure"))
        request = make_request(self.jar, headers=[(b"X-Forwarded-Proto", b"https")])
        self.states.take(request, login.state)
        self.assertEqual(
            set_cookie_lines(request),
            [
                b"__Host-"
                + PREFIX
                + login.state.encode()
                + b"=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure"
            ],
        )

    def test_round_trip(self) -> None:
        """
        A login is taken back exactly as it began.
        """
        login = self.begin("/reports/7")
        self.clock.advance(30)
        self.assertEqual(self.take(login.state), login)
        self.assertEqual(repr(login).count(login.verifier), 0, "the verifier stays out of the repr")

    def test_two_tabs(self) -> None:
        """
        Two logins begun in one browser both complete, in either order.
        """
        first = self.begin("/one")
        second = self.begin("/two")
        self.assertEqual(
            sorted(self.jar),
            sorted([PREFIX + first.state.encode(), PREFIX + second.state.encode()]),
        )
        self.assertEqual(self.take(first.state), first)
        self.assertEqual(self.take(second.state), second)
        self.assertEqual(self.jar, {})

        first = self.begin("/one")
        second = self.begin("/two")
        self.assertEqual(self.take(second.state), second)
        self.assertEqual(self.take(first.state), first)

    def test_take_clears(self) -> None:
        """
        Taking a login clears its cookie (and no other); it cannot be taken twice.
        """
        login = self.begin()
        other = self.begin()
        request = make_request(self.jar)
        self.assertEqual(self.states.take(request, login.state), login)
        self.assertEqual(cleared(request), [PREFIX + login.state.encode()])
        self.assertEqual(set_names(request), [])
        self.jar = apply_set_cookies(self.jar, request)
        self.assertIsNone(self.take(login.state))
        self.assertEqual(list(self.jar), [PREFIX + other.state.encode()])

    def test_wrong_state(self) -> None:
        """
        Another state finds no cookie and clears nothing; a cookie whose sealed state is
        not its name is refused and cleared.
        """
        login = self.begin()
        request = make_request(self.jar)
        self.assertIsNone(self.states.take(request, "A" * 43))
        self.assertEqual(set_cookie_lines(request), [])
        for state in ("", "a;b", "é", "a b", login.state + "\n", "gw_session"):
            request = make_request(self.jar)
            self.assertIsNone(self.states.take(request, state), state)
            self.assertEqual(set_cookie_lines(request), [])

        swapped = "B" * 43
        self.jar[PREFIX + swapped.encode()] = self.jar[PREFIX + login.state.encode()]
        request = make_request(self.jar)
        self.assertIsNone(self.states.take(request, swapped))
        self.assertEqual(cleared(request), [PREFIX + swapped.encode()])

    def test_unreadable(self) -> None:
        """
        A cookie that does not open as a login state is refused and cleared.
        """
        state = "C" * 43
        name = PREFIX + state.encode()
        payload = json.dumps(
            {"v": 1, "s": state, "n": "n", "c": "c", "r": "/", "t": NOW}, separators=(",", ":")
        ).encode()
        for value in (
            b"garbage",
            self.sealer.seal(payload, SESSION_AAD).encode(),
            Sealer(bytes(32)).seal(payload, LOGIN_STATE_AAD).encode(),
            self.sealer.seal(payload.replace(b'"v":1', b'"v":2'), LOGIN_STATE_AAD).encode(),
            self.sealer.seal(
                payload.replace(b'"t":%d' % NOW, b'"t":"%d"' % NOW), LOGIN_STATE_AAD
            ).encode(),
            self.sealer.seal(b"[]", LOGIN_STATE_AAD).encode(),
        ):
            request = make_request({name: value})
            self.assertIsNone(self.states.take(request, state), value)
            self.assertEqual(cleared(request), [name])
        request = make_request({name: self.sealer.seal(payload, LOGIN_STATE_AAD).encode()})
        self.assertEqual(self.states.take(request, state), LoginState(state, "n", "c", "/", NOW))

    def test_expired(self) -> None:
        """
        A login taken L{LOGIN_LIFETIME} seconds or more after it began is refused and its
        cookie cleared.
        """
        login = self.begin()
        jar = dict(self.jar)
        self.clock.advance(LOGIN_LIFETIME - 1)
        self.assertEqual(self.take(login.state), login)
        self.jar = jar
        self.clock.advance(1)
        request = make_request(self.jar)
        self.assertIsNone(self.states.take(request, login.state))
        self.assertEqual(cleared(request), [PREFIX + login.state.encode()])

    def test_begin_clears_stale(self) -> None:
        """
        Beginning a login clears the unreadable and expired login cookies the browser
        sent, and keeps the live ones.
        """
        old = self.begin()
        self.clock.advance(LOGIN_LIFETIME)
        live = self.begin()
        self.assertNotIn(PREFIX + old.state.encode(), self.jar)
        self.jar[PREFIX + old.state.encode()] = b"expired-but-sent"
        self.jar[PREFIX + b"junk"] = b"garbage"
        self.jar[b"gw_session"] = b"the session"
        request = make_request(self.jar)
        new = self.states.begin(request, "/")
        self.assertEqual(set_names(request), [PREFIX + new.state.encode()])
        self.assertEqual(
            sorted(cleared(request)), sorted([PREFIX + old.state.encode(), PREFIX + b"junk"])
        )
        self.jar = apply_set_cookies(self.jar, request)
        self.assertEqual(
            sorted(self.jar),
            sorted([b"gw_session", PREFIX + live.state.encode(), PREFIX + new.state.encode()]),
        )

    def test_expired_readable_cleared(self) -> None:
        """
        A readable login cookie past its lifetime (still sent by a browser with a skewed
        clock) is cleared by the next login.
        """
        old = self.begin()
        jar = dict(self.jar)
        self.clock.advance(LOGIN_LIFETIME)
        request = make_request(jar)
        self.states.begin(request, "/")
        self.assertEqual(cleared(request), [PREFIX + old.state.encode()])

    def test_bounded(self) -> None:
        """
        At most L{MAX_PENDING} logins are pending in one browser: the oldest go first.
        """
        logins = []
        for _ in range(MAX_PENDING + 3):
            logins.append(self.begin())
            self.clock.advance(1)
            self.assertLessEqual(len(self.jar), MAX_PENDING)
        self.assertEqual(
            sorted(self.jar),
            sorted(PREFIX + login.state.encode() for login in logins[-MAX_PENDING:]),
        )
        for login in logins[:-MAX_PENDING]:
            self.assertIsNone(self.take(login.state))
        for login in logins[-MAX_PENDING:]:
            self.assertEqual(self.take(login.state), login)
        self.assertEqual(self.jar, {})

    def test_bound_with_many_sent(self) -> None:
        """
        A browser that sends more than L{MAX_PENDING} live logins keeps only the newest
        L{MAX_PENDING} - 1 of them, plus the new one.
        """
        logins = []
        for _ in range(MAX_PENDING + 2):
            request = make_request()
            logins.append(self.states.begin(request, "/"))
            self.jar.update(apply_set_cookies({}, request))
            self.clock.advance(1)
        request = make_request(self.jar)
        new = self.states.begin(request, "/")
        self.assertEqual(
            sorted(cleared(request)), sorted(PREFIX + login.state.encode() for login in logins[:3])
        )
        self.jar = apply_set_cookies(self.jar, request)
        self.assertEqual(len(self.jar), MAX_PENDING)
        self.assertIn(PREFIX + new.state.encode(), self.jar)

    def test_clear_all(self) -> None:
        """
        Clearing all clears every login cookie sent, and nothing else.
        """
        first = self.begin()
        second = self.begin()
        self.jar[b"gw_session"] = b"s"
        self.jar[b"gw_session.0"] = b"s"
        request = make_request(self.jar)
        self.states.clear_all(request)
        self.assertEqual(
            sorted(cleared(request)),
            sorted([PREFIX + first.state.encode(), PREFIX + second.state.encode()]),
        )
        self.assertEqual(set_names(request), [])

    def test_challenge_rfc7636(self) -> None:
        """
        The S256 challenge of the RFC 7636 appendix B verifier.
        """
        login = LoginState("s", "n", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk", "/", NOW)
        self.assertEqual(login.challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        self.assertEqual(len(self.begin().challenge), 43)


class SpentEviction(SynchronousTestCase):
    """
    When L{SpentStates} is full of unexpired states, C{spend()} refuses a new one rather
    than evict the oldest unexpired one: a state spent earlier would be accepted again
    (a replayed callback buys a second token-endpoint call). Filling it is cheap:
    C{GET /auth/login}, then C{GET /auth/callback?state=S&error=x} with that login
    cookie spends S with no IdP call at all (2 requests per state, 50,000 states inside
    the 600 s login lifetime).
    """

    def test_unexpired_state_is_not_forgotten(self) -> None:
        self.patch(login_state, "MAX_SPENT", 3)
        clock = Clock()
        clock.advance(1000)
        spent = SpentStates(clock)
        self.assertTrue(spent.spend("victim", 1000))
        for filler in ("a", "b"):
            self.assertTrue(spent.spend(filler, 1000))
        # Full of unexpired states: a new one is refused (the callback answers 503)
        # rather than one being forgotten.
        self.assertIsNone(spent.spend("c", 1000))
        self.assertFalse(spent.spend("victim", 1000), "a spent, unexpired state was accepted again")
        # Once the first ones expire, there is room again.
        clock.advance(601)
        self.assertTrue(spent.spend("c", 1000 + 601))


class ConsumedStates(TestCase):
    """
    A login state is used once: the gateway remembers a consumed state, not only asks
    the browser to drop its cookie. A client that kept the cookie could otherwise replay
    one C{/auth/login}'s state for its whole 10-minute lifetime, one token-endpoint call
    (with the gateway's client credentials) per C{GET /auth/callback} with made-up
    codes, exhausting the gateway's token-endpoint quota at the IdP (IdPs rate-limit and
    lock out per client id: every user's login would fail).
    """

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
