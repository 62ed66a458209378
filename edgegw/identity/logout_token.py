"""
OpenID Connect Back-Channel Logout 1.0: the logout token an IdP POSTs to the gateway.

Pure logic, like L{edgegw.identity.tokens}: the key set and the time are passed in. The
token is a JWT signed with a key of the IdP's id_token key set (section 2.4) whose
claims name the sessions to end: C{sid} (the IdP's session, as the id_token's C{sid}
claim named it at login), C{sub}, or both.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from edgegw.identity.keyset import KeySet
from edgegw.identity.tokens import TokenError, peek_header, verify_jwt

__all__ = ["BACKCHANNEL_LOGOUT_EVENT", "MAX_AGE", "LogoutToken", "verify_logout_token"]

BACKCHANNEL_LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
"""The member of the C{events} claim that makes a JWT a logout token."""

MAX_AGE = 600.0
"""
Seconds after its C{iat} a logout token is still accepted: its C{jti} is remembered this
long (plus the leeway), so a replay is refused whether or not the token has an C{exp}.
"""

_REQUIRED = ("iat", "jti", "events")
_TYPES = frozenset({"logout+jwt", "jwt", "application/logout+jwt"})
_MAX_CLAIM = 255


@attrs.frozen
class LogoutToken:
    """
    A verified logout token.

    @ivar jti: Its unique id, to refuse a replay.
    @ivar sid: The IdP session to end, if it names one.
    @ivar sub: The subject whose sessions to end, if it names one.
    @ivar issued_at: Its C{iat}.
    """

    jti: str
    sid: str | None
    sub: str | None
    issued_at: float


def verify_logout_token(
    token: str,
    keys: KeySet,
    *,
    algorithms: Collection[str],
    issuer: str,
    client_id: str,
    now: float,
) -> LogoutToken:
    """
    Verify a logout token (Back-Channel Logout 1.0, section 2.6): signature against the
    key set on an accepted asymmetric algorithm, C{iss}, C{aud} (C{client_id}), C{iat}
    (at most L{MAX_AGE} old, not in the future), C{exp} when present, C{jti}, an
    C{events} object holding the back-channel logout member as a JSON object, C{sid}
    and/or C{sub} (non-empty strings), and no C{nonce} (which would make it confusable
    with an id_token). A C{typ} header, when present, must be C{logout+jwt} (what the
    specification recommends) or plain C{JWT} (what many providers send): an access
    token's C{at+jwt}, say, is refused.

    @raise edgegw.identity.tokens.UnknownKeyError: It names a key id the set lacks.
    @raise TokenError: It is not a valid logout token; C{reason} says why.
    """
    typ = peek_header(token).get("typ")
    if typ is not None and (not isinstance(typ, str) or typ.lower() not in _TYPES):
        raise TokenError("typ is neither logout+jwt nor JWT")
    claims = verify_jwt(
        token,
        keys,
        algorithms=algorithms,
        issuer=issuer,
        audience=client_id,
        now=now,
        required=_REQUIRED,
    )
    if "nonce" in claims:
        raise TokenError("a logout token carries no nonce")
    events = claims["events"]
    if not isinstance(events, dict) or not isinstance(events.get(BACKCHANNEL_LOGOUT_EVENT), dict):
        raise TokenError("no back-channel logout event")
    iat = claims["iat"]
    assert isinstance(iat, int | float)  # verify_jwt checked the numeric dates
    if iat < now - MAX_AGE:
        raise TokenError("issued too long ago")
    jti = claims["jti"]
    if not isinstance(jti, str) or not jti or len(jti) > _MAX_CLAIM:
        raise TokenError("bad jti claim")
    sid, sub = claims.get("sid"), claims.get("sub")
    for name, value in (("sid", sid), ("sub", sub)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 1024):
            raise TokenError(f"bad {name} claim")
    if sid is None and sub is None:
        raise TokenError("names neither sid nor sub")
    assert sid is None or isinstance(sid, str)
    assert sub is None or isinstance(sub, str)
    return LogoutToken(jti=jti, sid=sid, sub=sub, issued_at=float(iat))
