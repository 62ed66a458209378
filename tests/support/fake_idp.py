"""
A fake OpenID Connect provider for tests: a real Twisted site on 127.0.0.1 with real
signing keys, whose behaviour tests change through plain attributes (knobs).

It implements the authorization code flow with PKCE (S256 required): discovery,
C{/authorize} (no login page: it grants L{FakeIdP.user} at once), C{/token}
(C{client_secret_basic} and C{client_secret_post}), C{/userinfo}, C{/jwks} and, when
L{FakeIdP.end_session} is set, C{/session/end} (RP-Initiated Logout); and it
can be told to misbehave: a discovery document with another issuer or an error status,
an authorization error, a missing or wrong C{iss} in the authorization response, an
error from the token endpoint, or an ID token that is bad in one chosen way
(L{ID_TOKEN_MODES}).

For Bearer tests it also mints access tokens directly (L{FakeIdP.mint_access_token}:
any claims, header members, signing key or algorithm), can hold an Ed25519 key
(C{key_algs}), publish extra JWKS entries (L{FakeIdP.extra_jwks}: an C{enc}-use key)
and a separate access-token key set (L{FakeIdP.access_token_keys}, announced as
C{jwks_access_token_uri}); L{compact_jws} builds what PyJWT refuses to (C{alg: none},
HMAC keyed with a public key).

Usage::

    idp = FakeIdP(redirect_uris=["http://127.0.0.1:8080/callback"])
    await idp.start(self)          # listens, and stops when the test ends
    idp.redirect_uris.append(...)  # once the gateway's port is known
    idp.id_token_mode = "expired"  # the next ID token is expired
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlencode

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm, get_default_algorithms
from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

reactor: Any = _global_reactor

__all__ = [
    "DEFAULT_USER",
    "ID_TOKEN_MODES",
    "FakeIdP",
    "SigningKey",
    "b64url",
    "compact_jws",
    "pkce_challenge",
]

#: The user L{FakeIdP} grants unless a test sets another.
DEFAULT_USER: dict[str, Any] = {
    "sub": "alice",
    "email": "alice@example.com",
    "name": "Alice Example",
    "groups": ["cn=admins,ou=groups,dc=example,dc=com"],
}

#: The ways L{FakeIdP.id_token_mode} can spoil an ID token (L{None}: a good one).
ID_TOKEN_MODES = (
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
)

#: The client authentication methods of the token endpoint.
TOKEN_AUTH_METHODS = ("client_secret_basic", "client_secret_post")

#: The audience (and authorized party) the "wrong_aud" and "wrong_azp" modes name.
OTHER_CLIENT = "another-client"

#: The issuer the "wrong_iss" mode names.
OTHER_ISSUER = "http://issuer.invalid"

_PKCE_VALUE = re.compile(r"[A-Za-z0-9\-._~]{43,128}")
_S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")


def b64url(data: bytes) -> str:
    """
    Unpadded base64url (RFC 7515 2), as JWS and PKCE use it.
    """
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def pkce_challenge(verifier: str) -> str:
    """
    The S256 code challenge of C{verifier} (RFC 7636 4.2).
    """
    return b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def compact_jws(
    header: dict[str, Any], claims: dict[str, Any], sign: Callable[[bytes], bytes]
) -> str:
    """
    A compact JWS built by hand: C{sign} gets the signing input and returns the
    signature (what PyJWT refuses to produce: C{alg: none}, HMAC keyed with a PEM). An
    empty signature leaves the token ending in C{.}.
    """
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    return signing_input + "." + b64url(sign(signing_input.encode("ascii")))


PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
"""A private signing key of one of the types L{SigningKey} generates."""

#: The key id prefix of each algorithm's generated keys (C{rsa-1}, C{ec-1}, C{ed-1}).
_KID_PREFIXES = {"RS256": "rsa", "ES256": "ec", "EdDSA": "ed"}


@dataclass
class SigningKey:
    """
    One private signing key of the provider, with its key id and JWS algorithm.
    """

    kid: str
    alg: str
    private: PrivateKey

    @classmethod
    def generate(cls, kid: str, alg: str) -> SigningKey:
        """
        A new key for C{alg}: RSA 2048 for RS256, P-256 for ES256, Ed25519 for EdDSA.
        """
        private: PrivateKey
        if alg == "RS256":
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif alg == "ES256":
            private = ec.generate_private_key(ec.SECP256R1())
        elif alg == "EdDSA":
            private = ed25519.Ed25519PrivateKey.generate()
        else:
            raise ValueError(f"unsupported algorithm {alg}")
        return cls(kid, alg, private)

    @property
    def public_pem(self) -> bytes:
        """
        The public key as PEM (SubjectPublicKeyInfo).
        """
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def public_jwk(self) -> dict[str, Any]:
        """
        The public key as a JWK with C{kid}, C{use: sig} and C{alg}.
        """
        public = self.private.public_key()
        jwk: dict[str, Any]
        if isinstance(public, rsa.RSAPublicKey):
            jwk = dict(RSAAlgorithm.to_jwk(public, as_dict=True))
        elif isinstance(public, ec.EllipticCurvePublicKey):
            jwk = dict(ECAlgorithm.to_jwk(public, as_dict=True))
        else:
            jwk = dict(OKPAlgorithm.to_jwk(public, as_dict=True))
        jwk.update(kid=self.kid, use="sig", alg=self.alg)
        return jwk

    def sign(self, claims: dict[str, Any]) -> str:
        """
        C{claims} as a JWT signed with this key (header: C{alg}, C{typ}, C{kid}).
        """
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid})

    def signature(self, data: bytes, alg: str | None = None) -> bytes:
        """
        The JWS signature of C{data} with this key under C{alg} (default: the key's own;
        another one the key type supports, PS256 with an RSA key say, when given).
        """
        return get_default_algorithms()[alg or self.alg].sign(data, self.private)


@dataclass
class _Grant:
    """
    What an authorization code stands for.
    """

    client_id: str
    redirect_uri: str
    scope: str
    nonce: str
    code_challenge: str
    issued_at: float
    used: bool = False
    access_tokens: list[str] = field(default_factory=list)
    sid: str = field(default_factory=lambda: secrets.token_urlsafe(12))


@dataclass
class _RefreshGrant:
    """
    What a refresh token stands for.
    """

    sub: str
    sid: str
    scope: str
    client_id: str


class _OAuthError(Exception):
    """
    An error answered as JSON C{{"error": ..., "error_description": ...}}.
    """

    def __init__(
        self, status: int, error: str, description: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        super().__init__(f"{status} {error}: {description}")
        self.status = status
        self.error = error
        self.description = description
        self.headers = list(headers)


class _Endpoint(Resource):
    """
    A leaf answering the methods of C{handlers}; handlers return a JSON-able value or
    raise L{_OAuthError}, or return L{None} after answering themselves (a redirect).
    """

    isLeaf = True

    def __init__(self, handlers: dict[bytes, Callable[[Request], Any]]) -> None:
        super().__init__()
        self._handlers = handlers

    def render(self, request: Request) -> bytes | int:
        if request.postpath not in ([], [b""]):
            request.setResponseCode(404)
            return b"not found"
        handler = self._handlers.get(request.method or b"")
        if handler is None:
            request.setResponseCode(405)
            request.setHeader(b"Allow", b", ".join(self._handlers))
            return b"method not allowed"
        request.setHeader(b"Cache-Control", b"no-store")
        try:
            result = handler(request)
        except _OAuthError as error:
            result = self._error(request, error)
        if isinstance(result, Deferred):
            # A handler answering later (a slow token endpoint).
            def answer(outcome: Any) -> None:
                if isinstance(outcome, Failure):
                    outcome.trap(_OAuthError)
                    outcome = self._error(request, outcome.value)
                if request._disconnected or request.finished:
                    return
                request.setHeader(b"Content-Type", b"application/json")
                request.write(json.dumps(outcome).encode())
                request.finish()

            result.addBoth(answer)
            return NOT_DONE_YET
        if result is None:
            return b""
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(result).encode()

    @staticmethod
    def _error(request: Request, error: Any) -> dict[str, Any]:
        request.setResponseCode(error.status)
        for name, value in error.headers:
            request.setHeader(name, value)
        return {"error": error.error, "error_description": error.description}


class _Channel(HTTPChannel):
    """
    A server connection that the provider tracks, so that L{FakeIdP.stop} can drop it.
    """

    idp: FakeIdP

    def connectionMade(self) -> None:
        super().connectionMade()
        self.idp._channels.append(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.idp._channel_lost(self)


class FakeIdP:
    """
    An OpenID provider on C{http://127.0.0.1:<port>}, for one client.

    Knobs (plain attributes; each request reads them as they are then):

    @ivar client_id: The registered client.
    @ivar client_secret: Its secret.
    @ivar redirect_uris: Its registered redirect URIs, compared exactly.
    @ivar user: The claims of the user C{/authorize} grants (and C{/userinfo} answers).
    @ivar userinfo_only: Claims of L{user} left out of ID tokens.
    @ivar signing_kid: The key that signs ID tokens and access tokens.
    @ivar token_auth_methods: The client authentication methods the token endpoint
        accepts (and discovery announces).
    @ivar discovery_issuer: The C{issuer} of the discovery document when not L{None}
        (the real issuer otherwise).
    @ivar discovery_status: The status discovery answers; not 200: an error, no document.
    @ivar authorize_error: When set, C{/authorize} redirects with this C{error}.
    @ivar send_iss: Whether the authorization response carries C{iss} (RFC 9207).
    @ivar iss_override: The C{iss} of the authorization response when not L{None}.
    @ivar token_status: The status of token responses; not 200: an error, no tokens.
    @ivar userinfo_status: The status of userinfo responses; not 200: an error.
    @ivar id_token_mode: L{None} for good ID tokens, or one of L{ID_TOKEN_MODES}.
    @ivar access_token_audience: The C{aud} of access tokens.
    @ivar token_lifetime: Seconds ID and access tokens are valid (C{expires_in}).
    @ivar code_lifetime: Seconds an authorization code can be exchanged. Only a
        successful exchange uses a code up: a failed one leaves it usable.
    @ivar clock: The provider's time (seconds since the epoch).
    @ivar extra_jwks: JWKS entries published after the signing keys, as they are (an
        C{enc}-use key, say).
    @ivar access_token_keys: When not L{None}, a key set of its own for access tokens,
        published at C{/access-jwks} (404 while L{None}).
    @ivar announce_access_jwks: Whether discovery names C{/access-jwks} as
        C{jwks_access_token_uri} (only while L{access_token_keys} is set).
    @ivar signing_algs: Discovery's C{id_token_signing_alg_values_supported}; L{None}:
        the algorithms of L{keys}, in order.
    @ivar rotate_refresh_tokens: Whether a refresh grant answers a new refresh token and
        revokes the one used (a reused one is then C{invalid_grant}).
    @ivar refresh_error: When set, every refresh grant fails: C{"invalid_grant"} (400)
        or any other error code (answered with status 500).
    @ivar refresh_delay: Seconds the token endpoint takes to answer a refresh grant.
    @ivar refresh_id_token: Whether a refresh grant's answer carries a new ID token
        (without a nonce, as OIDC Core 12.2 allows).
    @ivar end_session: Whether discovery names C{/session/end} as its
        C{end_session_endpoint} (RP-Initiated Logout 1.0; off by default).
    @ivar post_logout_redirect_uris: The client's registered post-logout redirect URIs,
        compared exactly: C{/session/end} redirects (303) to one of them with the
        request's C{state}, and refuses (400) any other.

    Records:

    @ivar authorize_requests: The query of every C{/authorize} request (first values).
    @ivar token_requests: The form of every C{/token} request (first values) plus
        C{auth_method}: C{client_secret_basic}, C{client_secret_post}, C{none}, or
        C{basic+post} when both were used.
    @ivar replayed_codes: The codes presented again after a successful exchange (the
        access tokens issued for them are revoked, RFC 6749 10.5).
    @ivar discovery_requests: How many discovery requests were received.
    @ivar jwks_requests: How many JWKS requests were received.
    @ivar access_jwks_requests: How many C{/access-jwks} requests were received.
    @ivar userinfo_requests: How many userinfo requests were received.
    @ivar userinfo_tokens: The Bearer credential of every userinfo request, in order.
    @ivar refresh_grants: How many refresh grants were received (any outcome).
    @ivar sessions: The IdP session id (the id_tokens' C{sid}) of every code exchanged,
        in order.
    @ivar end_session_requests: The query of every C{/session/end} request (first
        values).
    @ivar refreshed_id_tokens: The ID tokens refresh grants answered, in order.
    """

    def __init__(
        self,
        client_id: str = "gw",
        client_secret: str = "gw-secret",
        redirect_uris: Iterable[str] = (),
        key_algs: Iterable[str] = ("RS256", "ES256"),
    ) -> None:
        """
        @param key_algs: The algorithms of the signing keys (one key each, also after
            L{rotate}): C{RS256}, C{ES256}, C{EdDSA}.
        """
        self.client_id = client_id
        self.client_secret = client_secret
        self.redirect_uris: list[str] = list(redirect_uris)
        self.user: dict[str, Any] = json.loads(json.dumps(DEFAULT_USER))
        self.userinfo_only: set[str] = set()
        self._id_token_claims: dict[str, Any] | None = None
        self.token_auth_methods: list[str] = list(TOKEN_AUTH_METHODS)
        self.discovery_issuer: str | None = None
        self.discovery_status = 200
        self.authorize_error: str | None = None
        self.send_iss = True
        self.iss_override: str | None = None
        self.token_status = 200
        self.userinfo_status = 200
        self.id_token_mode: str | None = None
        self.access_token_audience = "api"
        self.token_lifetime = 300
        self.code_lifetime = 60
        self.clock: Callable[[], float] = time.time
        self.extra_jwks: list[dict[str, Any]] = []
        self.access_token_keys: list[SigningKey] | None = None
        self.announce_access_jwks = True
        self.signing_algs: list[str] | None = None
        self.key_algs = tuple(key_algs)
        self.rotate_refresh_tokens = True
        self.refresh_error: str | None = None
        self.refresh_delay = 0.0
        self.refresh_id_token = False
        self.end_session = False
        self.post_logout_redirect_uris: list[str] = []
        unknown = set(self.key_algs) - set(_KID_PREFIXES)
        if unknown:
            raise ValueError(f"unsupported key algorithms {sorted(unknown)}")

        self.authorize_requests: list[dict[str, str]] = []
        self.token_requests: list[dict[str, str]] = []
        self.replayed_codes: list[str] = []
        self.discovery_requests = 0
        self.jwks_requests = 0
        self.access_jwks_requests = 0
        self.userinfo_requests = 0
        self.userinfo_tokens: list[str] = []
        self.refresh_grants = 0
        self.sessions: list[str] = []
        self.end_session_requests: list[dict[str, str]] = []
        self.refreshed_id_tokens: list[str] = []
        self._refresh_tokens: dict[str, _RefreshGrant] = {}

        self.generation = 1
        self.keys: list[SigningKey] = self._generate_keys()
        self.signing_kid = "rsa-1"
        self._rogue_keys: dict[str, SigningKey] = {}
        self._codes: dict[str, _Grant] = {}
        self._access_tokens: dict[str, float] = {}  # token -> expiry
        self._port_number: int | None = None
        self._listening: Any = None
        self._channels: list[_Channel] = []
        self._lost_waiters: list[Deferred[None]] = []

    # -- keys ------------------------------------------------------------------------

    def _generate_keys(self) -> list[SigningKey]:
        return [
            SigningKey.generate(f"{_KID_PREFIXES[alg]}-{self.generation}", alg)
            for alg in self.key_algs
        ]

    def key(self, kid: str) -> SigningKey:
        """
        The current key with id C{kid}.

        @raise KeyError: When there is none (any more).
        """
        for key in self.keys:
            if key.kid == kid:
                return key
        raise KeyError(kid)

    @property
    def signing_key(self) -> SigningKey:
        """
        The key named by L{signing_kid}.
        """
        return self.key(self.signing_kid)

    @property
    def rsa_key(self) -> SigningKey:
        """
        The current RSA key.
        """
        return next(key for key in self.keys if key.alg == "RS256")

    @property
    def ec_key(self) -> SigningKey:
        """
        The current EC key.
        """
        return next(key for key in self.keys if key.alg == "ES256")

    @property
    def ed_key(self) -> SigningKey:
        """
        The current Ed25519 key (only with C{EdDSA} in C{key_algs}).
        """
        return next(key for key in self.keys if key.alg == "EdDSA")

    def rotate(self) -> None:
        """
        Replace both keys with new ones under new key ids (C{rsa-2}, C{ec-2}, ...): the
        old ones disappear from the JWKS. L{signing_kid} moves to the new key of the
        same type.
        """
        kind = self.signing_kid.split("-", 1)[0]
        self.generation += 1
        self.keys = self._generate_keys()
        self.signing_kid = f"{kind}-{self.generation}"

    def jwks(self) -> dict[str, Any]:
        """
        The JWKS document (public keys, then L{extra_jwks}).
        """
        return {"keys": [key.public_jwk() for key in self.keys] + list(self.extra_jwks)}

    # -- access tokens ---------------------------------------------------------------

    def access_token_claims(self, user_claims: bool = False) -> dict[str, Any]:
        """
        The claims of an access token as the token endpoint issues them, for L{user},
        valid now for L{token_lifetime}; with L{user}'s other claims too when
        C{user_claims}.
        """
        now = int(self.clock())
        claims: dict[str, Any] = dict(self.user) if user_claims else {}
        claims.update(
            {
                "iss": self.issuer,
                "sub": self.user["sub"],
                "aud": self.access_token_audience,
                "client_id": self.client_id,
                "exp": now + self.token_lifetime,
                "iat": now,
                "scope": "openid profile email",
                "jti": secrets.token_urlsafe(12),
            }
        )
        return claims

    def mint_access_token(
        self,
        claims: dict[str, Any] | None = None,
        *,
        key: SigningKey | None = None,
        alg: str | None = None,
        header: dict[str, Any] | None = None,
        drop: Iterable[str] = (),
        user_claims: bool = False,
        register: bool = True,
    ) -> str:
        """
        An access token as the test wants it: L{access_token_claims} updated with
        C{claims}, without the claims named in C{drop}, signed by C{key} (default: the
        signing key; any L{SigningKey}, one the JWKS never lists included) with C{alg}
        (default: the key's own). The header is C{alg}, C{typ} and the key's C{kid},
        updated with C{header}; a member set to L{None} there is left out.

        @param register: Whether the userinfo endpoint accepts the token (until its
            C{exp}), as it does the tokens it issued.
        """
        key = key or self.signing_key
        alg = alg or key.alg
        body = self.access_token_claims(user_claims)
        body.update(claims or {})
        for name in drop:
            body.pop(name, None)
        head: dict[str, Any] = {"alg": alg, "typ": "at+jwt", "kid": key.kid}
        head.update(header or {})
        head = {name: value for name, value in head.items() if value is not None}
        token = compact_jws(head, body, lambda data: key.signature(data, alg))
        if register:
            expires = body.get("exp")
            if not isinstance(expires, int | float):
                expires = self.clock() + self.token_lifetime
            self._access_tokens[token] = float(expires)
        return token

    # -- claims ----------------------------------------------------------------------

    @property
    def id_token_claims_from_user(self) -> dict[str, Any]:
        """
        The claims of L{user} that ID tokens carry: all but L{userinfo_only}, unless a
        test set its own dict (setting L{None} restores that default).
        """
        if self._id_token_claims is not None:
            return dict(self._id_token_claims)
        return {name: value for name, value in self.user.items() if name not in self.userinfo_only}

    @id_token_claims_from_user.setter
    def id_token_claims_from_user(self, claims: dict[str, Any] | None) -> None:
        self._id_token_claims = claims

    # -- listening -------------------------------------------------------------------

    @property
    def port(self) -> int:
        """
        The port listened on (kept while stopped, for L{restart}).
        """
        if self._port_number is None:
            raise RuntimeError("FakeIdP has not been started")
        return self._port_number

    @property
    def issuer(self) -> str:
        """
        C{http://127.0.0.1:<port>}, no trailing slash.
        """
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """
        Whether the provider is listening.
        """
        return self._listening is not None

    @property
    def open_connections(self) -> int:
        """
        How many client connections are open now.
        """
        return len(self._channels)

    def url(self, path: str) -> str:
        """
        The absolute URL of C{path} (which starts with C{/}) on this provider.
        """
        return self.issuer + path

    async def start(self, test: SynchronousTestCase) -> None:
        """
        Listen on 127.0.0.1 on a free port; C{test} stops the provider when it ends.
        """
        if self._port_number is not None:
            raise RuntimeError("FakeIdP already started; use restart()")
        self._listen(0)
        test.addCleanup(self.stop)

    async def restart(self) -> None:
        """
        Listen again on the same port (stopping first when listening).
        """
        await self.stop()
        self._listen(self.port)

    def _listen(self, port: int) -> None:
        idp = self

        class Channel(_Channel):
            pass

        Channel.idp = idp
        site = Site(self._resource(), timeout=None)
        site.protocol = Channel  # type: ignore[assignment]
        site.noisy = False
        site.log = lambda request: None  # type: ignore[method-assign]
        self._listening = reactor.listenTCP(port, site, interface="127.0.0.1")
        self._port_number = int(self._listening.getHost().port)

    async def stop(self) -> None:
        """
        Stop listening and drop every open connection (clients see the provider down);
        waits until they are gone.
        """
        if self._listening is not None:
            listening, self._listening = self._listening, None
            await listening.stopListening()
        while self._channels:
            lost: Deferred[None] = Deferred()
            self._lost_waiters.append(lost)
            transport = self._channels[0].transport
            if transport is not None:
                transport.abortConnection()  # type: ignore[attr-defined]
            await lost

    def _channel_lost(self, channel: _Channel) -> None:
        if channel in self._channels:
            self._channels.remove(channel)
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _resource(self) -> Resource:
        root = Resource()
        well_known = Resource()
        root.putChild(b".well-known", well_known)
        well_known.putChild(b"openid-configuration", _Endpoint({b"GET": self._render_discovery}))
        root.putChild(b"authorize", _Endpoint({b"GET": self._render_authorize}))
        root.putChild(b"token", _Endpoint({b"POST": self._render_token}))
        root.putChild(
            b"userinfo",
            _Endpoint({b"GET": self._render_userinfo, b"POST": self._render_userinfo}),
        )
        root.putChild(b"jwks", _Endpoint({b"GET": self._render_jwks}))
        root.putChild(b"access-jwks", _Endpoint({b"GET": self._render_access_jwks}))
        session = Resource()
        root.putChild(b"session", session)
        session.putChild(b"end", _Endpoint({b"GET": self._render_end_session}))
        return root

    # -- endpoints -------------------------------------------------------------------

    def discovery(self) -> dict[str, Any]:
        """
        The discovery document as it is now.
        """
        issuer = self.issuer
        algs = self.signing_algs
        if algs is None:
            algs = list(dict.fromkeys(key.alg for key in self.keys))
        document = {
            "issuer": self.discovery_issuer if self.discovery_issuer is not None else issuer,
            "authorization_endpoint": issuer + "/authorize",
            "token_endpoint": issuer + "/token",
            "userinfo_endpoint": issuer + "/userinfo",
            "jwks_uri": issuer + "/jwks",
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "backchannel_logout_supported": True,
            "backchannel_logout_session_supported": True,
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": list(algs),
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": list(self.token_auth_methods),
            "scopes_supported": ["openid", "profile", "email", "groups"],
            "claims_supported": sorted({"iss", "sub", "aud", "exp", "iat", "nonce", *self.user}),
            "authorization_response_iss_parameter_supported": True,
        }
        if self.access_token_keys is not None and self.announce_access_jwks:
            document["jwks_access_token_uri"] = issuer + "/access-jwks"
        if self.end_session:
            document["end_session_endpoint"] = issuer + "/session/end"
        return document

    def _render_discovery(self, request: Request) -> Any:
        self.discovery_requests += 1
        if self.discovery_status != 200:
            raise _OAuthError(self.discovery_status, "temporarily_unavailable", "discovery")
        return self.discovery()

    def _render_jwks(self, request: Request) -> Any:
        self.jwks_requests += 1
        return self.jwks()

    def _render_access_jwks(self, request: Request) -> Any:
        self.access_jwks_requests += 1
        if self.access_token_keys is None:
            raise _OAuthError(404, "not_found", "no access-token key set")
        return {"keys": [key.public_jwk() for key in self.access_token_keys]}

    def _render_authorize(self, request: Request) -> Any:
        query = parse_qs(
            (request.uri or b"").partition(b"?")[2].decode("latin-1"), keep_blank_values=True
        )
        params = {name: values[0] for name, values in query.items()}
        self.authorize_requests.append(params)

        def bad(description: str) -> _OAuthError:
            return _OAuthError(400, "invalid_request", description)

        repeated = sorted(name for name, values in query.items() if len(values) > 1)
        if repeated:
            raise bad(f"repeated parameters: {', '.join(repeated)}")
        if params.get("client_id") != self.client_id:
            raise _OAuthError(400, "unauthorized_client", "unknown client_id")
        redirect_uri = params.get("redirect_uri", "")
        if redirect_uri not in self.redirect_uris:
            raise bad("redirect_uri is not registered")
        if params.get("response_type") != "code":
            raise _OAuthError(400, "unsupported_response_type", "response_type must be code")
        scope = params.get("scope", "")
        if "openid" not in scope.split(" "):
            raise _OAuthError(400, "invalid_scope", "scope must contain openid")
        challenge = params.get("code_challenge")
        if not challenge:
            raise bad("code_challenge is required")
        if params.get("code_challenge_method") != "S256":
            raise bad("code_challenge_method must be S256")
        if not _S256_CHALLENGE.fullmatch(challenge):
            raise bad("code_challenge is not a base64url SHA-256 digest")
        state = params.get("state")
        if not state:
            raise bad("state is required")
        nonce = params.get("nonce")
        if not nonce:
            raise bad("nonce is required")

        answer: dict[str, str]
        if self.authorize_error is not None:
            answer = {"error": self.authorize_error, "state": state}
        else:
            code = secrets.token_urlsafe(24)
            self._codes[code] = _Grant(
                self.client_id, redirect_uri, scope, nonce, challenge, self.clock()
            )
            answer = {"code": code, "state": state}
        if self.send_iss:
            answer["iss"] = self.iss_override if self.iss_override is not None else self.issuer
        separator = "&" if "?" in redirect_uri else "?"
        request.redirect((redirect_uri + separator + urlencode(answer)).encode("ascii"))
        return None

    def _render_end_session(self, request: Request) -> Any:
        """
        RP-Initiated Logout 1.0, without a confirmation page: C{client_id} (or the
        C{id_token_hint}'s audience) must be this client, and C{post_logout_redirect_uri}
        a registered one; 303 there with C{state}, or 200 C{{"logged_out": true}} when
        no redirect was asked for.
        """
        query = parse_qs(
            (request.uri or b"").partition(b"?")[2].decode("latin-1"), keep_blank_values=True
        )
        params = {name: values[0] for name, values in query.items()}
        self.end_session_requests.append(params)
        client = params.get("client_id")
        hint = params.get("id_token_hint")
        if hint is not None:
            payload = hint.split(".")[1]
            audience = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            if client is not None and audience.get("aud") != client:
                raise _OAuthError(400, "invalid_request", "client_id does not match the hint")
            client = audience.get("aud")
        if client != self.client_id:
            raise _OAuthError(400, "invalid_client", "unknown client")
        target = params.get("post_logout_redirect_uri")
        if target is None:
            return {"logged_out": True}
        if target not in self.post_logout_redirect_uris:
            raise _OAuthError(400, "invalid_request", "post_logout_redirect_uri not registered")
        state = params.get("state")
        if state is not None:
            target += ("&" if "?" in target else "?") + urlencode({"state": state})
        request.setResponseCode(303)
        request.setHeader(b"Location", target.encode("ascii"))
        return None

    def _basic_credentials(self, request: Request) -> tuple[str, str] | None:
        """
        The client id and secret of an C{Authorization: Basic} header (each
        form-urlencoded, RFC 6749 2.3.1), or L{None} without one.

        @raise _OAuthError: When the header is malformed.
        """
        scheme, _, credentials = (request.getHeader("Authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            raise _OAuthError(401, "invalid_client", "malformed Basic credentials") from None
        client_id, colon, secret = decoded.partition(":")
        if not colon:
            raise _OAuthError(401, "invalid_client", "malformed Basic credentials")
        return unquote_plus(client_id), unquote_plus(secret)

    def _authenticate(self, method: str, form: dict[str, str], request: Request) -> None:
        """
        Check that the client authenticated with C{method}, an accepted one.
        """
        challenge = [("WWW-Authenticate", 'Basic realm="fake-idp"')]
        if method == "basic+post":
            raise _OAuthError(400, "invalid_request", "more than one authentication method")
        if method == "none":
            raise _OAuthError(401, "invalid_client", "client authentication required", challenge)
        if method not in self.token_auth_methods:
            raise _OAuthError(401, "invalid_client", f"{method} is not accepted", challenge)
        if method == "client_secret_basic":
            basic = self._basic_credentials(request)
            assert basic is not None
            client_id, secret = basic
            if "client_id" in form and form["client_id"] != client_id:
                raise _OAuthError(400, "invalid_request", "client_id differs from Basic's")
        else:
            client_id, secret = form.get("client_id", ""), form["client_secret"]
        if not (
            hmac.compare_digest(client_id.encode(), self.client_id.encode())
            and hmac.compare_digest(secret.encode(), self.client_secret.encode())
        ):
            raise _OAuthError(401, "invalid_client", "bad client credentials", challenge)

    def _render_token(self, request: Request) -> Any:
        assert request.content is not None
        request.content.seek(0)
        body = request.content.read().decode("latin-1")
        parsed = parse_qs(body, keep_blank_values=True)
        form = {name: values[0] for name, values in parsed.items()}
        has_basic = (request.getHeader("Authorization") or "").lower().startswith("basic ")
        has_post = "client_secret" in form
        method = {
            (True, True): "basic+post",
            (True, False): "client_secret_basic",
            (False, True): "client_secret_post",
            (False, False): "none",
        }[has_basic, has_post]
        self.token_requests.append({**form, "auth_method": method})
        if self.token_status != 200:
            raise _OAuthError(self.token_status, "server_error", "token endpoint failure")
        content_type = (request.getHeader("Content-Type") or "").split(";")[0].strip()
        if content_type.lower() != "application/x-www-form-urlencoded":
            raise _OAuthError(400, "invalid_request", "not a form")
        repeated = sorted(name for name, values in parsed.items() if len(values) > 1)
        if repeated:
            raise _OAuthError(400, "invalid_request", f"repeated: {', '.join(repeated)}")
        self._authenticate(method, form, request)
        if form.get("grant_type") == "refresh_token":
            return self._refresh_grant(form)
        if form.get("grant_type") != "authorization_code":
            raise _OAuthError(400, "unsupported_grant_type", "only authorization_code")

        def invalid_grant(description: str) -> _OAuthError:
            return _OAuthError(400, "invalid_grant", description)

        code = form.get("code", "")
        grant = self._codes.get(code)
        if grant is None:
            raise invalid_grant("unknown code")
        if grant.used:
            self.replayed_codes.append(code)
            for token in grant.access_tokens:
                self._access_tokens.pop(token, None)
            raise invalid_grant("code already used")
        if self.clock() > grant.issued_at + self.code_lifetime:
            raise invalid_grant("code expired")
        if grant.client_id != self.client_id:
            raise invalid_grant("code issued to another client")
        if form.get("redirect_uri") != grant.redirect_uri:
            raise invalid_grant("redirect_uri differs from the authorization request's")
        verifier = form.get("code_verifier")
        if verifier is None:
            raise invalid_grant("code_verifier is required")
        if not _PKCE_VALUE.fullmatch(verifier):
            raise _OAuthError(400, "invalid_request", "malformed code_verifier")
        if not hmac.compare_digest(pkce_challenge(verifier), grant.code_challenge):
            raise invalid_grant("PKCE verification failed")
        grant.used = True

        now = int(self.clock())
        access_token = self._issue_access_token(self.user["sub"], grant.scope, now)
        grant.access_tokens.append(access_token)
        refresh_token = secrets.token_urlsafe(24)
        self._refresh_tokens[refresh_token] = _RefreshGrant(
            self.user["sub"], grant.sid, grant.scope, self.client_id
        )
        self.sessions.append(grant.sid)
        return {
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": self.token_lifetime,
            "id_token": self.make_id_token(grant.nonce, now, sid=grant.sid),
            "refresh_token": refresh_token,
            "scope": grant.scope,
        }

    def _issue_access_token(self, sub: str, scope: str, now: int) -> str:
        access_token = self.signing_key.sign(
            {
                "iss": self.issuer,
                "sub": sub,
                "aud": self.access_token_audience,
                "client_id": self.client_id,
                "exp": now + self.token_lifetime,
                "iat": now,
                "scope": scope,
                "jti": secrets.token_urlsafe(12),
            }
        )
        self._access_tokens[access_token] = now + self.token_lifetime
        return access_token

    def _refresh_grant(self, form: dict[str, str]) -> Any:
        self.refresh_grants += 1
        delay = self.refresh_delay
        if delay > 0:
            return deferLater(reactor, delay, self._refresh_answer, form)
        return self._refresh_answer(form)

    def _refresh_answer(self, form: dict[str, str]) -> dict[str, Any]:
        if self.refresh_error is not None:
            status = 400 if self.refresh_error == "invalid_grant" else 500
            raise _OAuthError(status, self.refresh_error, "refresh refused")
        token = form.get("refresh_token", "")
        grant = self._refresh_tokens.get(token)
        if grant is None:
            raise _OAuthError(400, "invalid_grant", "unknown or spent refresh token")
        if grant.client_id != self.client_id:
            raise _OAuthError(400, "invalid_grant", "refresh token of another client")
        now = int(self.clock())
        answer: dict[str, Any] = {
            "access_token": self._issue_access_token(grant.sub, grant.scope, now),
            "token_type": "Bearer",
            "expires_in": self.token_lifetime,
            "scope": grant.scope,
        }
        if self.refresh_id_token:
            claims = {
                **self.id_token_claims_from_user,
                "iss": self.issuer,
                "sub": grant.sub,
                "aud": self.client_id,
                "exp": now + self.token_lifetime,
                "iat": now,
                "azp": self.client_id,
                "sid": grant.sid,
                "jti": secrets.token_urlsafe(8),
            }
            answer["id_token"] = self.signing_key.sign(claims)
            self.refreshed_id_tokens.append(answer["id_token"])
        if self.rotate_refresh_tokens:
            del self._refresh_tokens[token]
            rotated = secrets.token_urlsafe(24)
            self._refresh_tokens[rotated] = grant
            answer["refresh_token"] = rotated
        return answer

    def revoke_refresh_tokens(self) -> None:
        """
        Forget every refresh token issued: each is C{invalid_grant} from now on.
        """
        self._refresh_tokens.clear()

    def mint_logout_token(
        self,
        *,
        sid: str | None = None,
        sub: str | None = None,
        key: SigningKey | None = None,
        header: dict[str, Any] | None = None,
        drop: Iterable[str] = (),
        **claims: Any,
    ) -> str:
        """
        A Back-Channel Logout 1.0 logout token naming C{sid} and/or C{sub}, signed with
        C{key} (the signing key by default); C{claims} add or replace claims, C{drop}
        removes them, C{header} adds header members (C{typ}).
        """
        now = int(self.clock())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.client_id,
            "iat": now,
            "exp": now + 120,
            "jti": secrets.token_urlsafe(12),
            "events": {"http://schemas.openid.net/event/backchannel-logout": {}},
        }
        if sid is not None:
            body["sid"] = sid
        if sub is not None:
            body["sub"] = sub
        body.update(claims)
        for name in drop:
            body.pop(name, None)
        signer = key or self.signing_key
        return jwt.encode(
            body,
            signer.private,
            algorithm=signer.alg,
            headers={"kid": signer.kid, **(header or {})},
        )

    def make_id_token(self, nonce: str, now: int | None = None, sid: str | None = None) -> str:
        """
        An ID token for L{user} with C{nonce} (and the IdP session C{sid}), spoilt as
        L{id_token_mode} says.
        """
        mode = self.id_token_mode
        if mode is not None and mode not in ID_TOKEN_MODES:
            raise ValueError(f"unknown id_token_mode {mode!r}")
        now = int(self.clock()) if now is None else now
        claims: dict[str, Any] = {
            **self.id_token_claims_from_user,
            "iss": self.issuer,
            "sub": self.user["sub"],
            "aud": self.client_id,
            "exp": now + self.token_lifetime,
            "iat": now,
            "nonce": nonce,
            "azp": self.client_id,
        }
        if sid is not None:
            claims["sid"] = sid
        key = self.signing_key
        if mode == "wrong_nonce":
            claims["nonce"] = "not-" + nonce
        elif mode == "wrong_aud":
            claims["aud"] = OTHER_CLIENT
        elif mode == "wrong_iss":
            claims["iss"] = OTHER_ISSUER
        elif mode == "expired":
            claims["iat"] = now - self.token_lifetime - 60
            claims["exp"] = now - 60
        elif mode == "future_iat":
            claims["iat"] = now + 60
            claims["exp"] = now + 60 + self.token_lifetime
        elif mode == "wrong_azp":
            claims["azp"] = OTHER_CLIENT
        elif mode == "alg_none":
            return compact_jws({"alg": "none", "typ": "JWT"}, claims, lambda _: b"")
        elif mode == "hs256_public":
            secret = self.rsa_key.public_pem
            return compact_jws(
                {"alg": "HS256", "typ": "JWT", "kid": self.rsa_key.kid},
                claims,
                lambda data: hmac.new(secret, data, hashlib.sha256).digest(),
            )
        elif mode == "unknown_kid":
            key = self._rogue_key(key.alg)
        token = key.sign(claims)
        if mode == "bad_signature":
            head, payload, signature = token.split(".")
            raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
            raw[len(raw) // 2] ^= 0xFF
            raw[0] ^= 0x01
            token = f"{head}.{payload}.{b64url(bytes(raw))}"
        return token

    def _rogue_key(self, alg: str) -> SigningKey:
        """
        A key of type C{alg} that the JWKS never lists (its kid neither).
        """
        if alg not in self._rogue_keys:
            self._rogue_keys[alg] = SigningKey.generate(f"unknown-{alg.lower()}", alg)
        return self._rogue_keys[alg]

    def _render_userinfo(self, request: Request) -> Any:
        self.userinfo_requests += 1
        challenge = [("WWW-Authenticate", 'Bearer error="invalid_token"')]
        scheme, _, token = (request.getHeader("Authorization") or "").partition(" ")
        self.userinfo_tokens.append(token.strip())
        expiry = self._access_tokens.get(token.strip())
        if scheme.lower() != "bearer" or expiry is None:
            raise _OAuthError(401, "invalid_token", "unknown access token", challenge)
        if self.clock() >= expiry:
            raise _OAuthError(401, "invalid_token", "expired access token", challenge)
        if self.userinfo_status != 200:
            raise _OAuthError(self.userinfo_status, "server_error", "userinfo knob")
        return self.user
