"""
Bearer access tokens on service routes: verified against the IdP's access-token key set,
turned into a principal, and kept in a bounded cache of verified tokens so that a
client's repeated requests cost a dictionary lookup, not a signature check.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from edgegw.config.model import GroupsSpec, IdentitySpec
from edgegw.identity.claims import merge_userinfo, needs_userinfo, principal_of
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.keyset import KeySet
from edgegw.identity.principal import Principal
from edgegw.identity.provider import IdentityProvider, UserInfoError
from edgegw.identity.tokens import (
    DEFAULT_LEEWAY,
    TokenError,
    UnknownKeyError,
    peek_header,
    verify_jwt,
)

__all__ = [
    "BearerRejectedError",
    "BearerSettings",
    "BearerUnavailableError",
    "BearerVerifier",
    "bearer_token",
    "shows_access_token",
]

MAX_CACHED = 10_000
"""Verified tokens kept (the least recently used go first)."""

MAX_CACHED_BYTES = 32 * 1024 * 1024
"""About the most memory the verified tokens kept may take."""

MAX_CACHED_ENTRY = 64 * 1024
"""A verified token whose principal is larger is not kept (it is verified each time)."""

REFUSAL_SECONDS = 10.0
"""
How long a token that userinfo refused (or could not answer for) is refused again without
asking: a replayed token must not turn into a userinfo call per request.
"""

# Members only ID tokens, logout tokens or security-event tokens carry (OIDC Core 3.1.3.6,
# Back-Channel Logout 2.4, RFC 8417): such a token is never accepted as an access token.
_NOT_ACCESS_CLAIMS = ("nonce", "at_hash", "c_hash", "s_hash", "events")
_ACCESS_TYPES = frozenset({"jwt", "at+jwt", "application/jwt", "application/at+jwt"})
# The header types of RFC 9068 JWT access tokens (media types are case-insensitive).
_AT_JWT_TYPES = frozenset({"at+jwt", "application/at+jwt"})
# Keycloak marks its tokens with a "typ" claim.
_NOT_ACCESS_TYP_CLAIMS = frozenset({"id", "logout", "refresh"})


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


class BearerUnavailableError(BearerRejectedError):
    """
    The token could not be checked because the IdP is not reachable (not discovered
    yet, userinfo down): not the token's fault, so the client is told to retry (503)
    rather than to throw its token away (C{invalid_token}).
    """


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


@attrs.frozen
class BearerSettings:
    """
    Every setting that decides whether a Bearer token verifies and which principal it
    yields (besides the IdP's discovery document and key sets, which
    L{IdentityProvider.take_over} carries): two verifiers with equal settings over the
    same discovery and keys accept the same tokens as the same principals, so a reload
    may hand the cache of one to the other (L{BearerVerifier.take_over}).

    @ivar issuer: C{iss}, checked exactly (C{IdP.spec.issuer}).
    @ivar jwks_url: C{bearer.jwksURL} (where the access-token keys come from).
    @ivar audience: The audience required (C{bearer.audience}, else C{clientID}).
    @ivar audience_claim: C{bearer.audienceClaim}.
    @ivar algorithms: C{bearer.signingAlgs} (L{None}: the discovery document's).
    @ivar cache_ttl: C{bearer.cacheTTL}: how long the entries kept are trusted.
    @ivar leeway: Seconds tolerated on C{exp}, C{nbf}, C{iat}.
    @ivar claims: C{identity.claims}: the principal's passport.
    @ivar groups: C{identity.groups}: the principal's groups.
    @ivar user_info: C{identity.userInfo}: whether userinfo is asked.
    @ivar subject_claim: C{identity.subjectClaim}: the principal's subject.
    @ivar keep_token: Whether the principal keeps the access token (a route forwards it).
    @ivar require_access_evidence: Whether L{audience} is the IdP's C{clientID}: then a
        token must show it is an access token (L{shows_access_token}), since the
        client's id_tokens have that audience too.
    """

    issuer: str
    jwks_url: str | None
    audience: str
    audience_claim: str
    algorithms: tuple[str, ...] | None
    cache_ttl: float
    leeway: float
    claims: tuple[str, ...]
    groups: GroupsSpec
    user_info: str
    subject_claim: str
    keep_token: bool
    require_access_evidence: bool


class _TokenCache:
    """
    What a verifier remembers of the tokens it saw: those verified (with their
    principals) and those userinfo refused; shared by the verifiers a reload hands it to.
    """

    def __init__(self) -> None:
        # token -> (principal, trusted until, size); only verified tokens get in. Keyed
        # by the token itself, not a digest of it: a look-up hashes it with the dict's
        # keyed SipHash (-1.3 µs a request with a 900-byte token against SHA-256), and
        # the size bound counts it.
        self.verified: OrderedDict[bytes, tuple[Principal, float, int]] = OrderedDict()
        self.bytes = 0
        # sha256(token) -> (error, until): tokens userinfo refused, for a few seconds.
        self.refused: OrderedDict[bytes, tuple[BearerRejectedError, float]] = OrderedDict()


class BearerVerifier:
    """
    Verifies Bearer access tokens for the configured IdP.

    Verification (L{edgegw.identity.tokens.verify_jwt}): the key only from the
    access-token key set (C{bearer.jwksURL}, else the discovery document's
    C{jwks_access_token_uri}, else C{jwks_uri}; refetched once, rate limited, for an
    unknown kid); the algorithm in C{bearer.signingAlgs} (default: the discovery
    document's id_token list), asymmetric only, fitting the key; C{iss} exactly; the
    claim C{bearer.audienceClaim} containing C{bearer.audience} (default: clientID);
    C{exp}, C{nbf}, C{iat} with 5 s leeway. A token of another kind is refused: a C{typ}
    header other than a JWT or access-token type, an id_token, logout or security-event
    claim (C{nonce}, C{at_hash}, C{c_hash}, C{s_hash}, C{events}), a Keycloak C{typ}
    claim C{ID}, C{Logout} or C{Refresh}; and when the audience required is the
    clientID (the default), a token without positive access-token evidence
    (L{shows_access_token}): an id_token without a nonce has that audience as well.
    Then the principal per C{identity} (userinfo
    with the token when the rules ask for it; its failure rejects the token: fail closed).

    Verified tokens are trusted again without verification for C{bearer.cacheTTL}
    (default 5 minutes, never past their C{exp}; C{0s}: no cache): userinfo that changes
    is noticed within that time, a key the IdP withdraws within the key set's periodic
    refresh plus that time.

    A reload's new verifier takes over the old one's cache when nothing that decides a
    token's verification or principal changed (L{take_over}).
    """

    def __init__(
        self,
        provider: IdentityProvider,
        identity: IdentitySpec,
        groups: GroupRenderer,
        clock: IReactorTime,
        keep_token: bool = True,
    ) -> None:
        """
        @param keep_token: Some route forwards the access token: the principal keeps it.
        """
        spec = provider.spec
        self.provider = provider
        self.identity = identity
        self.groups = groups
        self.cache_ttl = spec.bearer.cache_ttl
        self._clock = clock
        self._issuer = spec.issuer
        self._audience = spec.bearer.audience or spec.client_id
        self._require_access_evidence = self._audience == spec.client_id
        self._audience_claim = spec.bearer.audience_claim
        self._algorithms = spec.bearer.signing_algs
        self._tokens = _TokenCache()
        self.keep_token = keep_token
        self._pending: dict[bytes, list[Deferred[Principal]]] = {}
        self.settings = BearerSettings(
            issuer=spec.issuer,
            jwks_url=spec.bearer.jwks_url,
            audience=self._audience,
            audience_claim=self._audience_claim,
            algorithms=self._algorithms,
            cache_ttl=self.cache_ttl,
            leeway=DEFAULT_LEEWAY,
            claims=identity.claims,
            groups=identity.groups,
            user_info=identity.user_info,
            subject_claim=identity.subject_claim,
            keep_token=keep_token,
            require_access_evidence=self._require_access_evidence,
        )
        # A reload hands this verifier's cache on through the IdP client.
        provider.bearer = self

    @property
    def _verified(self) -> OrderedDict[bytes, tuple[Principal, float, int]]:
        return self._tokens.verified

    @property
    def _bytes(self) -> int:
        return self._tokens.bytes

    def take_over(self, old: BearerVerifier) -> bool:
        """
        Share what C{old} (the verifier of the configuration a reload replaces) has
        verified and refused, from now on (the old one, draining, adds to the same
        cache), when nothing that decides a token's verification and its principal
        changed: the IdP client took over C{old}'s discovery document and key sets
        (L{IdentityProvider.take_over}), and the L{settings} are equal. Otherwise
        this one starts cold. Called before the new configuration serves.

        @return: Whether it took over.
        """
        metadata = self.provider.metadata
        if (
            metadata is None
            or metadata is not old.provider.metadata
            or self.provider.access_token_keys.keys is not old.provider.access_token_keys.keys
            or self.settings != old.settings
        ):
            return False
        self._tokens = old._tokens
        return True

    def cached(self, token: bytes) -> Principal | None:
        """
        The principal of a token verified before and still trusted, or L{None}.
        """
        if not self.cache_ttl:
            return None
        verified = self._tokens.verified
        entry = verified.get(token)
        if entry is None:
            return None
        principal, until, _ = entry
        if until <= self._clock.seconds():
            return None
        verified.move_to_end(token)  # least recently used goes first
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
            raise BearerUnavailableError("the IdP is not discovered yet")
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
        _refuse_other_token_types(token, claims, self._require_access_evidence)
        identity = self.identity
        if needs_userinfo(identity, claims):
            refused = self._tokens.refused.get(key)
            if refused is not None and refused[1] > self._clock.seconds():
                raise refused[0]
            try:
                userinfo = await provider.userinfo(metadata, token)
            except UserInfoError as e:
                error = (
                    BearerRejectedError(f"userinfo: {e}")
                    if e.status in (401, 403)
                    else BearerUnavailableError(f"userinfo: {e}")
                )
                self._remember_refusal(key, error)
                raise error from None
            claims = merge_userinfo(claims, userinfo)
        principal = principal_of(
            identity, self.groups, claims, access_token=token if self.keep_token else None
        )
        if principal is None:
            raise BearerRejectedError("the token names no subject")
        if self.cache_ttl:
            self._cache(token.encode("ascii"), principal, claims.get("exp"))
        return principal

    def _cache(self, token: bytes, principal: Principal, expires: object) -> None:
        now = self._clock.seconds()
        until = now + self.cache_ttl
        if isinstance(expires, int | float) and not isinstance(expires, bool) and expires < until:
            until = float(expires)
        # What an entry keeps, roughly: the token (as the key, and in the principal when
        # kept) and the principal's claims.
        size = len(token) + len(principal.access_token or "")
        size += len(principal.subject) + sum(len(group) for group in principal.groups)
        size += sum(len(name) + len(str(value)) for name, value in principal.passport.items())
        if size > MAX_CACHED_ENTRY:
            return  # verified again next time rather than held
        tokens = self._tokens
        verified = tokens.verified
        # A token verified again (its entry had lapsed) replaces its entry and its size.
        replaced = verified.pop(token, None)
        if replaced is not None:
            tokens.bytes -= replaced[2]
        while verified and (len(verified) >= MAX_CACHED or tokens.bytes + size > MAX_CACHED_BYTES):
            _, (_, _, dropped) = verified.popitem(last=False)
            tokens.bytes -= dropped
        verified[token] = (principal, until, size)
        tokens.bytes += size

    def _remember_refusal(self, key: bytes, error: BearerRejectedError) -> None:
        refused = self._tokens.refused
        now = self._clock.seconds()
        while refused and next(iter(refused.values()))[1] <= now:
            refused.popitem(last=False)
        if len(refused) >= MAX_CACHED:
            refused.popitem(last=False)
        refused[key] = (error, now + REFUSAL_SECONDS)

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


def _refuse_other_token_types(
    token: str, claims: Mapping[str, object], require_evidence: bool
) -> None:
    """
    Refuse a verified JWT of the IdP that is not an access token: an id_token (it has
    the client as audience, so it would pass the default audience check), a logout
    token, a refresh token.

    @param require_evidence: The audience required is the login client's (clientID):
        the token must also show it is an access token (L{shows_access_token}).
    @raise BearerRejectedError: It is one of those, or shows nothing of an access token
        where it must.
    """
    try:
        typ = peek_header(token).get("typ")
    except TokenError as e:
        raise BearerRejectedError(e.reason) from None
    if typ is not None and (not isinstance(typ, str) or typ.lower() not in _ACCESS_TYPES):
        raise BearerRejectedError("not an access token (typ)")
    for name in _NOT_ACCESS_CLAIMS:
        if name in claims:
            raise BearerRejectedError(f"not an access token ({name})")
    kind = claims.get("typ")
    if isinstance(kind, str) and kind.lower() in _NOT_ACCESS_TYP_CLAIMS:
        raise BearerRejectedError("not an access token (typ claim)")
    if require_evidence and not shows_access_token(typ, claims):
        raise BearerRejectedError(
            "not an access token (audience the login client, and no at+jwt typ, "
            "scope, scp or client_id)"
        )


def shows_access_token(typ: object, claims: Mapping[str, object]) -> bool:
    """
    Whether a token shows positively that it is an OAuth access token, not an id_token:
    its C{typ} header is C{at+jwt} or C{application/at+jwt} (RFC 9068 2.1, any case), or
    it has a C{scope} or C{scp} claim (RFC 9068 2.2.3, RFC 8693 4.2: a space-separated
    string, not blank; or a non-empty list of non-empty strings, as Azure AD and Okta
    write C{scp} and Spring Authorization Server C{scope}) or a C{client_id} claim (RFC 9068 2.2,
    RFC 8693 4.3: a string, not blank). OpenID Connect defines none of these for
    id_tokens.

    @param typ: The token's C{typ} header (L{None} when absent).
    """
    if isinstance(typ, str) and typ.lower() in _AT_JWT_TYPES:
        return True
    if _scopes(claims.get("scope")) or _scopes(claims.get("scp")):
        return True
    client = claims.get("client_id")
    return isinstance(client, str) and bool(client.strip())


def _scopes(value: object) -> bool:
    """
    Whether C{value} is a scope claim with something in it: a string not blank, or a
    non-empty list of strings none of which is blank.
    """
    if isinstance(value, str):
        return bool(value.strip())
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, str) and item.strip() for item in value)
    )


def _key(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()
