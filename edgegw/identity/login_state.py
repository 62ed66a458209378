"""
The per-login state cookie: what the callback needs to finish one browser login.

Each login gets its own short-lived sealed cookie, named after its C{state} value, that
holds the state, the OpenID nonce, the PKCE verifier and the local path to return to.
One cookie per login, rather than one per browser, lets two logins begun in two tabs both
complete; the number pending in one browser is bounded by L{MAX_PENDING}. On a secure
request the cookies carry the C{__Host-} prefix as the session cookie does
(L{CookieName}), and one carried more than once is refused (L{AmbiguousCookieError}).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections import OrderedDict

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.web.server import Request

from edgegw.identity.cookies import (
    AmbiguityLog,
    AmbiguousCookieError,
    CookieName,
    clear_cookie,
    duplicated_names,
    is_token,
    set_cookie,
)
from edgegw.identity.sealing import LOGIN_STATE_AAD, Sealer, b64url, open_record

LOGIN_LIFETIME = 600
MAX_PENDING = 3

_VERSION = 1
_RANDOM_BYTES = 32
_STATE = re.compile(r"[A-Za-z0-9_-]+")


LOGOUT_STATE_NAME = "logout"
"""
The name, after the login prefix, of the logout-state cookie
(L{edgegw.auth.logout_state}): never a login's state.
"""


def login_cookie_prefix(cookie_name: str) -> str:
    """
    The prefix of the login-state cookies that belong to the session cookie
    C{cookie_name}; a login's cookie is this prefix followed by its state.
    """
    return f"{cookie_name}.login."


def _random_token() -> str:
    return b64url(os.urandom(_RANDOM_BYTES))


@attrs.frozen
class LoginState:
    """
    One pending browser login.

    @ivar state: The OAuth 2.0 C{state}, also the suffix of the cookie's name.
    @ivar nonce: The OpenID Connect C{nonce} the id_token must carry.
    @ivar verifier: The PKCE code verifier (RFC 7636), 43 characters.
    @ivar return_to: The local path to redirect to once logged in.
    @ivar created_at: When the login began, unix seconds.
    """

    state: str
    nonce: str
    verifier: str = attrs.field(repr=False)
    return_to: str
    created_at: int

    @property
    def challenge(self) -> str:
        """
        The PKCE C{S256} code challenge: base64url, unpadded, of SHA-256 of the verifier.
        """
        return b64url(hashlib.sha256(self.verifier.encode("ascii")).digest())


def _parse(plaintext: bytes) -> LoginState | None:
    data = open_record(plaintext, _VERSION)
    if data is None:
        return None
    state, nonce, verifier = data.get("s"), data.get("n"), data.get("c")
    return_to, created_at = data.get("r"), data.get("t")
    if not (
        isinstance(state, str)
        and isinstance(nonce, str)
        and isinstance(verifier, str)
        and isinstance(return_to, str)
        and type(created_at) is int
    ):
        return None
    return LoginState(state, nonce, verifier, return_to, created_at)


class LoginStates:
    """
    Begins and finishes browser logins through their login-state cookies.
    """

    def __init__(
        self, sealer: Sealer, cookie_name: str, clock: IReactorTime, host_prefix: bool = True
    ) -> None:
        """
        @param sealer: Seals the cookies (the session key; a distinct associated data
            keeps a login state from ever opening as a session).
        @param cookie_name: The session cookie's name; the login cookies are named after
            it (L{login_cookie_prefix}).
        @param clock: The time source.
        @param host_prefix: C{session.hostPrefix}: on a secure request the cookies are
            named with the C{__Host-} prefix.
        """
        self._sealer = sealer
        self._clock = clock
        self.prefix = login_cookie_prefix(cookie_name)
        self._prefixes = CookieName.of(self.prefix, host_prefix)
        self._ambiguity = AmbiguityLog(clock, "login-state")

    def is_login_cookie(self, name: bytes) -> bool:
        """
        Whether a cookie name is one of these login-state cookies (with or without the
        C{__Host-} prefix).
        """
        return name.startswith(self._prefixes.plain) or name.startswith(self._prefixes.secure)

    def _now(self) -> int:
        return int(self._clock.seconds())

    def _expired(self, login: LoginState, now: int) -> bool:
        return now >= login.created_at + LOGIN_LIFETIME

    def _open(self, prefix: bytes, name: bytes, sealed: bytes) -> LoginState | None:
        plaintext = self._sealer.unseal(sealed, LOGIN_STATE_AAD)
        if plaintext is None:
            return None
        login = _parse(plaintext)
        if login is None or not hmac.compare_digest(
            login.state.encode("utf-8"), name[len(prefix) :]
        ):
            return None
        return login

    def _carried(self, request: Request, prefix: bytes) -> list[bytes]:
        return [
            name for name in request.received_cookies if name.startswith(prefix) and is_token(name)
        ]

    def begin(self, request: Request, return_to: str) -> LoginState:
        """
        Start a login: set its cookie, and tidy the login cookies the browser carries
        (unreadable and expired ones are cleared, then the oldest, so that at most
        L{MAX_PENDING} remain, this one included).

        @param return_to: The local path to come back to; the caller has checked it.
        """
        now = self._now()
        login = LoginState(_random_token(), _random_token(), _random_token(), return_to, now)
        payload = json.dumps(
            {
                "v": _VERSION,
                "s": login.state,
                "n": login.nonce,
                "c": login.verifier,
                "r": login.return_to,
                "t": login.created_at,
            },
            separators=(",", ":"),
        ).encode("ascii")
        prefix, secure = self._prefixes.for_request(request)
        set_cookie(
            request,
            prefix + login.state.encode("ascii"),
            self._sealer.seal(payload, LOGIN_STATE_AAD),
            max_age=LOGIN_LIFETIME,
            secure=secure,
        )
        pending: list[tuple[int, bytes]] = []
        for name in self._carried(request, prefix):
            other = self._open(prefix, name, request.received_cookies[name])
            if other is None or self._expired(other, now):
                clear_cookie(request, name, secure=secure)
            else:
                pending.append((other.created_at, name))
        pending.sort()
        for _, name in pending[: max(0, len(pending) + 1 - MAX_PENDING)]:
            clear_cookie(request, name, secure=secure)
        return login

    def take(self, request: Request, state: str) -> LoginState | None:
        """
        Finish the login named by C{state}: its cookie is cleared whenever the request
        carried it.

        @return: The login, or L{None} when its cookie is absent, unreadable, holds
            another state, or the login is older than L{LOGIN_LIFETIME}.
        @raise AmbiguousCookieError: The request carried the login's cookie more than
            once (one of them tossed from a sibling domain, say): none is used (logged).
        """
        if _STATE.fullmatch(state) is None or state == LOGOUT_STATE_NAME:
            # The logout's cookie shares the prefix: a callback never reads or clears it.
            return None
        prefix, secure = self._prefixes.for_request(request)
        name = prefix + state.encode("ascii")
        sealed = request.received_cookies.get(name)
        if sealed is None:
            return None
        clear_cookie(request, name, secure=secure)
        if name in duplicated_names(request):
            self._ambiguity.ambiguous(name)
            raise AmbiguousCookieError(name)
        login = self._open(prefix, name, sealed)
        if login is None or self._expired(login, self._now()):
            return None
        return login

    def clear_all(self, request: Request) -> None:
        """
        Clear every login-state cookie the request carries (on a secure request, the
        unprefixed ones too).
        """
        prefix, secure = self._prefixes.for_request(request)
        names = self._carried(request, prefix)
        if secure and self._prefixes.prefixed:
            names += self._carried(request, self._prefixes.plain)
        for name in names:
            clear_cookie(request, name, secure=secure)


MAX_SPENT = 50_000
"""Spent login states remembered (each for the login-state lifetime)."""


class SpentStates:
    """
    The login states this instance has taken a callback for, each remembered until its
    login could no longer complete anyway (L{LOGIN_LIFETIME}), at most L{MAX_SPENT}.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def take_over(self, old: SpentStates) -> None:
        """
        Share C{old}'s record (a reload): a login state spent before the reload, or by
        the replaced configuration while it drains, stays spent.
        """
        self._until = old._until

    def spend(self, state: str, created_at: int) -> bool | None:
        """
        Mark C{state} used; L{False} when it already was; L{None} when L{MAX_SPENT}
        states are remembered and none has expired (forgetting one would let its login
        cookie be replayed: the callback is refused instead).
        """
        now = self._clock.seconds()
        until = self._until
        while until and next(iter(until.values())) <= now:
            until.popitem(last=False)
        if state in until:
            return False
        if len(until) >= MAX_SPENT:
            return None
        until[state] = created_at + LOGIN_LIFETIME
        return True
