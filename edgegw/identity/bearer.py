"""
Bearer access tokens on service routes: verified against the IdP's access-token key set,
turned into a principal, and kept in a bounded cache of verified tokens so that a
client's repeated requests cost a dictionary lookup, not a signature check.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from edgegw.config.model import IdentitySpec
from edgegw.identity.claims import merge_userinfo, needs_userinfo, principal_of
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.keyset import KeySet
from edgegw.identity.principal import Principal
from edgegw.identity.provider import IdentityProvider, IdPError
from edgegw.identity.tokens import TokenError, UnknownKeyError, verify_jwt

__all__ = ["BearerRejectedError", "BearerVerifier", "bearer_token"]

MAX_CACHED = 10_000
"""Verified tokens kept (the oldest go first)."""


MAX_TOKEN = 16 * 1024
"""The longest Authorization credential looked at."""

_SCHEME = b"bearer "


class BearerRejectedError(Exception):
    """
    A Bearer token that does not authenticate anyone; C{reason} is for the access log
    and the span (never the token itself, never the response body).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bearer_token(headers: Headers) -> bytes | bool | None:
    """
    The Bearer credential of a request: its token (C{bytes}, its characters not yet
    checked: L{BearerVerifier.cached} looks it up as it is) when there is exactly one
    C{Authorization} header with the C{Bearer} scheme (any case); L{False} when a Bearer
    credential is there but malformed (two headers, no token, too long); L{None} when no
    Bearer credential was sent (no header, or another scheme).
    """
    values = headers.getRawHeaders(b"authorization")
    if not values:
        return None
    if len(values) != 1:
        return False
    value = values[0]
    if value[:7].lower() != _SCHEME:
        # Twisted strips trailing whitespace from header values: "Bearer " arrives as
        # "Bearer", a Bearer credential without its token.
        return False if value.lower() == _SCHEME[:-1] else None
    token = value[7:].strip(b" ")
    if not token or len(token) > MAX_TOKEN:
        return False
    return token


# RFC 6750 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_B64TOKEN_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"


def is_b64token(token: bytes) -> bool:
    """
    Whether C{token} is made of RFC 6750 token characters.
    """
    body = token.rstrip(b"=")
    # translate() deletes the allowed bytes: anything left is not allowed.
    return bool(body) and not body.translate(None, _B64TOKEN_BYTES)


class BearerVerifier:
    """
    Verifies Bearer access tokens for the configured IdP.

    Verification (L{edgegw.identity.tokens.verify_jwt}): the key only from the
    access-token key set (C{bearer.jwksURL}, else the discovery document's
    C{jwks_access_token_uri}, else C{jwks_uri}; refetched once, rate limited, for an
    unknown kid); the algorithm in C{bearer.signingAlgs} (default: the discovery
    document's id_token list), asymmetric only, fitting the key; C{iss} exactly; the
    claim C{bearer.audienceClaim} containing C{bearer.audience} (default: clientID);
    C{exp}, C{nbf}, C{iat} with 5 s leeway. Then the principal per C{identity} (userinfo
    with the token when the rules ask for it; its failure rejects the token: fail closed).

    Verified tokens are trusted again without verification for C{bearer.cacheTTL}
    (default 5 minutes, never past their C{exp}; C{0s}: no cache), so that a key the
    IdP withdraws, or userinfo that changes, is noticed within that time.
    """

    def __init__(
        self,
        provider: IdentityProvider,
        identity: IdentitySpec,
        groups: GroupRenderer,
        clock: IReactorTime,
    ) -> None:
        spec = provider.spec
        self.provider = provider
        self.identity = identity
        self.groups = groups
        self.cache_ttl = spec.bearer.cache_ttl
        self._clock = clock
        self._issuer = spec.issuer
        self._audience = spec.bearer.audience or spec.client_id
        self._audience_claim = spec.bearer.audience_claim
        self._algorithms = spec.bearer.signing_algs
        # sha256(token) -> (principal, trusted until); only verified tokens get in.
        self._verified: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self._pending: dict[bytes, list[Deferred[Principal]]] = {}

    def cached(self, token: bytes) -> Principal | None:
        """
        The principal of a token verified before and still trusted, or L{None}.
        """
        if not self.cache_ttl:
            return None
        entry = self._verified.get(_key(token))
        if entry is None:
            return None
        principal, until = entry
        if until <= self._clock.seconds():
            return None
        return principal

    async def verify(self, token: bytes) -> Principal:
        """
        Verify C{token} and resolve its principal (concurrent requests with the same new
        token share one verification).

        @raise BearerRejectedError: The token does not authenticate anyone.
        """
        if not is_b64token(token):
            raise BearerRejectedError("malformed Bearer credential")
        key = _key(token)
        waiting: Deferred[Principal] = Deferred()
        waiters = self._pending.get(key)
        if waiters is not None:
            waiters.append(waiting)
        else:
            self._pending[key] = [waiting]
            Deferred.fromCoroutine(self._verify(token.decode("ascii"), key)).addBoth(
                self._settled, key
            )
        return await waiting

    def _settled(self, result: Principal | Failure, key: bytes) -> None:
        for waiting in self._pending.pop(key, ()):
            if waiting.called:
                continue  # its request went away (cancelled)
            if isinstance(result, Failure):
                waiting.errback(result)
            else:
                waiting.callback(result)

    async def _verify(self, token: str, key: bytes) -> Principal:
        provider = self.provider
        metadata = provider.metadata
        if metadata is None:
            raise BearerRejectedError("the IdP is not discovered yet")
        algorithms = self._algorithms or metadata.id_token_algorithms
        source = provider.access_token_keys
        try:
            claims = self._check(token, source.keys, algorithms)
        except UnknownKeyError as e:
            keys = await source.keys_for(e.kid)
            try:
                claims = self._check(token, keys, algorithms)
            except TokenError as again:
                raise BearerRejectedError(again.reason) from None
        except TokenError as e:
            raise BearerRejectedError(e.reason) from None
        identity = self.identity
        if needs_userinfo(identity, claims):
            try:
                userinfo = await provider.userinfo(metadata, token)
            except IdPError as e:
                raise BearerRejectedError(f"userinfo: {e}") from None
            claims = merge_userinfo(claims, userinfo)
        principal = principal_of(identity, self.groups, claims, access_token=token)
        if principal is None:
            raise BearerRejectedError("the token names no subject")
        if self.cache_ttl:
            expires = claims.get("exp")
            now = self._clock.seconds()
            until = now + self.cache_ttl
            if isinstance(expires, int | float) and not isinstance(expires, bool):
                until = min(until, float(expires))
            verified = self._verified
            if len(verified) >= MAX_CACHED:
                verified.popitem(last=False)
            verified[key] = (principal, until)
        return principal

    def _check(self, token: str, keys: KeySet, algorithms: tuple[str, ...]) -> dict[str, object]:
        return verify_jwt(
            token,
            keys,
            algorithms=algorithms,
            issuer=self._issuer,
            audience=self._audience,
            audience_claim=self._audience_claim,
            now=self._clock.seconds(),
            required=("exp",),
        )


def _key(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()
