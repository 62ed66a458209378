"""
The session stage: resolve the caller's session cookie into the request's principal.

A missing or invalid credential rejects nothing here; the request simply stays
unauthenticated and the auth-gate decides.
"""

from __future__ import annotations

from collections.abc import Callable

from edgegw.chain.exchange import Exchange
from edgegw.chain.pipeline import Handler, Stage
from edgegw.identity.principal import Principal
from edgegw.identity.session_cookie import SessionCookie

__all__ = ["session_stage"]


def session_stage(cookie: SessionCookie, seconds: Callable[[], float]) -> Stage:
    """
    Make the session stage (the same for app and service routes: Bearer tokens join it
    on service routes in their own stage).

    @param cookie: Reads and checks the sealed session cookie.
    @param seconds: The reactor's C{seconds}: a stored access token past its expiry
        is not forwarded (the backend would refuse it; the session itself lives on).
    """

    async def session(exchange: Exchange, next: Handler) -> None:
        record = cookie.read(exchange.request)
        if record is not None:
            token = record.access_token
            expires = record.access_token_expires_at
            if token is not None and expires is not None and expires <= seconds():
                token = None
            exchange.principal = Principal(
                subject=record.subject,
                passport=record.passport,
                groups=record.groups,
                access_token=token,
            )
        await next(exchange)

    return session
