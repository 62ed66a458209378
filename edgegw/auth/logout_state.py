"""
The logout-state cookie: what lets the gateway check the IdP's return from a logout.

A logout at the IdP (OpenID Connect RP-Initiated Logout 1.0) sends a random C{state};
the IdP hands it back on its redirect to the gateway's logout path. The state is kept,
sealed, in a short-lived cookie of this browser, so that only the browser that began the
logout can complete it: a return with another state, none, or without the cookie is
refused (and changes nothing).
"""

from __future__ import annotations

import hmac
import json
import os
import re

from twisted.internet.interfaces import IReactorTime
from twisted.web.server import Request

from edgegw.identity.cookies import CookieName, clear_cookie, duplicated_names, set_cookie
from edgegw.identity.login_state import LOGOUT_STATE_NAME, login_cookie_prefix
from edgegw.identity.sealing import Sealer, b64url, open_record

__all__ = ["LOGOUT_LIFETIME", "LOGOUT_STATE_AAD", "LogoutStates", "logout_cookie_name"]

LOGOUT_STATE_AAD = b"edgegw logout-state v1"
"""What a logout state is sealed as: it never opens as a session or a login state."""

LOGOUT_LIFETIME = 600
"""Seconds the IdP's return is awaited (its confirmation page included)."""

_VERSION = 1
_RANDOM_BYTES = 32
_STATE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def logout_cookie_name(cookie_name: str) -> str:
    """
    The logout-state cookie of the session cookie C{cookie_name}. It is named among the
    login-state cookies, so it is the gateway's own like them: never forwarded to a
    backend, never set by one, cleared by a new login.
    """
    return login_cookie_prefix(cookie_name) + LOGOUT_STATE_NAME


class LogoutStates:
    """
    Begins and checks the logouts at the IdP of one session cookie.
    """

    def __init__(
        self, sealer: Sealer, cookie_name: str, clock: IReactorTime, host_prefix: bool = True
    ) -> None:
        """
        @param sealer: Seals the cookie (the session key, under L{LOGOUT_STATE_AAD}).
        @param cookie_name: The session cookie's name (see L{logout_cookie_name}).
        @param clock: The time source.
        @param host_prefix: C{session.hostPrefix}: on a secure request the cookie is
            C{__Host-} like the gateway's other cookies.
        """
        self._sealer = sealer
        self._clock = clock
        self.names = CookieName.of(logout_cookie_name(cookie_name), host_prefix)

    def begin(self, request: Request) -> str:
        """
        Set this browser's logout-state cookie (replacing any earlier one) for a new
        logout, and return its state.
        """
        state = b64url(os.urandom(_RANDOM_BYTES))
        payload = json.dumps(
            {"v": _VERSION, "s": state, "t": int(self._clock.seconds())},
            separators=(",", ":"),
        ).encode("ascii")
        name, secure = self.names.for_request(request)
        set_cookie(
            request,
            name,
            self._sealer.seal(payload, LOGOUT_STATE_AAD),
            max_age=LOGOUT_LIFETIME,
            secure=secure,
        )
        return state

    def complete(self, request: Request, state: str | None) -> bool:
        """
        Whether C{state} is the one this browser's logout-state cookie holds, sealed by
        this gateway less than L{LOGOUT_LIFETIME} ago. The cookie is cleared only then:
        a forged return cannot spoil the genuine one still to come.
        """
        if state is None or _STATE.fullmatch(state) is None:
            return False
        name, secure = self.names.for_request(request)
        sealed = request.received_cookies.get(name)
        if sealed is None or name in duplicated_names(request):
            # Carried twice (one tossed by a sibling subdomain): not this browser's own.
            return False
        plaintext = self._sealer.unseal(sealed, LOGOUT_STATE_AAD)
        data = open_record(plaintext, _VERSION) if plaintext is not None else None
        if data is None:
            return False
        kept, created_at = data.get("s"), data.get("t")
        if not isinstance(kept, str) or type(created_at) is not int:
            return False
        if self._clock.seconds() >= created_at + LOGOUT_LIFETIME:
            return False
        if not hmac.compare_digest(kept.encode("ascii", "replace"), state.encode("ascii")):
            return False
        clear_cookie(request, name, secure=secure)
        return True
