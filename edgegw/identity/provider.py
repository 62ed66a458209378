"""
The gateway's client of its OpenID provider: discovery, key sets, the token endpoint and
userinfo, all through treq over the gateway's own upstream pool; and the child service
that keeps the discovery document and key set fresh.

Nothing here blocks the reactor. If the IdP cannot be reached at startup the gateway
starts anyway: discovery is retried with capped exponential backoff, and until it
succeeds L{IdentityProvider.metadata} is L{None} (the login endpoint answers 503 with
C{Retry-After}). The key set is refetched periodically and, rate limited, when a token
names a key it does not hold, so a key rotation at the IdP needs no restart.
"""

from __future__ import annotations

import random
from base64 import b64encode
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus, urlencode

from treq.client import HTTPClient
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from edgegw.config.model import IdpSpec
from edgegw.identity.discovery import (
    ProviderMetadata,
    discovery_url,
    parse_discovery,
)
from edgegw.identity.key_source import KeySource
from edgegw.identity.keyset import KeySet, KeySetError
from edgegw.identity.tokens import TokenError, UnknownKeyError, verify_id_token
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.upstream.agent import NullCookieJar, UpstreamAgent
from edgegw.upstream.shared import BodyTooLargeError, NotJSONError, read_body, read_json

if TYPE_CHECKING:
    from edgegw.identity.bearer import BearerVerifier

__all__ = [
    "IdPError",
    "IdentityProvider",
    "RefreshRejectedError",
    "TokenEndpointError",
    "UserInfoError",
]

MAX_DOCUMENT = 1024 * 1024
"""The largest discovery document, key set, token or userinfo response read (bytes)."""

MAX_ERROR_BODY = 64 * 1024
"""The most of an IdP error response's body drained before its connection is dropped."""

CALL_TIMEOUT = 10.0
"""Seconds for one whole IdP call: connecting, the request, the response and its body."""

_log = Logger(namespace="edgegw.idp")
_ACCEPT_JSON = Headers({b"Accept": [b"application/json"]})


class IdPError(Exception):
    """
    A call to the IdP failed; the message says why (for the log, never for the client).
    """


class TokenEndpointError(IdPError):
    """
    The token endpoint failed, was unreachable, or answered something unusable.
    """


class RefreshRejectedError(TokenEndpointError):
    """
    The token endpoint refused a refresh token (C{invalid_grant}: expired, revoked,
    already used): the session it belongs to cannot be refreshed, ever.
    """


class UserInfoError(IdPError):
    """
    The userinfo endpoint failed, was unreachable, or answered something unusable.

    @ivar status: The status it answered, when it answered one.
    """

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


class IdentityProvider(Service):
    """
    The configured IdP as the gateway sees it, and the service refreshing what it knows.

    @ivar metadata: The checked discovery document, or L{None} until discovery succeeds.
    @ivar keys: The current key set (empty until fetched).
    @ivar last_error: Why the last discovery or key-set fetch failed, or L{None}.
    @ivar bearer: The Bearer verifier over this IdP, when there is one (it says so):
        a reload hands its cache over with the discovery and keys (L{take_over}).
    """

    name = "idp"

    def __init__(
        self,
        spec: IdpSpec,
        agent: UpstreamAgent,
        reactor: IReactorTime,
        *,
        first_retry: float = 1.0,
        retry_cap: float = 60.0,
        refresh_every: float = 900.0,
        refetch_interval: float = 10.0,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        """
        @param agent: The gateway's upstream agent (treq runs over it); calls made with it
            time out after L{CALL_TIMEOUT} seconds.
        @param first_retry: Seconds before the first retry of a failed discovery; doubled
            at each failure up to C{retry_cap}.
        @param refresh_every: Seconds between refreshes of the discovery document and key
            set once they are known.
        @param refetch_interval: The least time between two key-set fetches caused by an
            unknown key id (a flood of random kids causes one fetch per interval).
        @param metrics: Counts discovery and key-set fetches by outcome.
        """
        self.spec = spec
        self.metrics = metrics
        self._reactor = reactor
        self._http = HTTPClient(agent, cookiejar=NullCookieJar())  # type: ignore[arg-type]
        self.first_retry = first_retry
        self.retry_cap = retry_cap
        self.refresh_every = refresh_every
        self.metadata: ProviderMetadata | None = None
        self.id_token_keys = KeySource("id_token", self._fetch_keys, reactor, refetch_interval)
        self.access_token_keys = KeySource(
            "access token", self._fetch_keys, reactor, refetch_interval
        )
        self.last_error: str | None = None
        self._failures = 0
        self._next: IDelayedCall | None = None
        self._next_at = 0.0
        self._running: Deferred[None] | None = None
        self.bearer: BearerVerifier | None = None

    # -- the service ------------------------------------------------------------------

    def startService(self) -> None:
        """
        Start discovery now; the gateway does not wait for it.
        """
        super().startService()
        if self.metadata is None:
            self._refresh()
        else:
            # Taken over from a reload's old gateway: refresh when it would have.
            delay = max(0.0, self._next_at - self._reactor.seconds())
            self._next = self._reactor.callLater(delay, self._refresh)

    def stopService(self) -> None:
        """
        Stop refreshing: cancel the timer and any call in flight.
        """
        super().stopService()
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = None
        if self._running is not None:
            self._running.cancel()
        self.id_token_keys.cancel()
        self.access_token_keys.cancel()

    def take_over(self, old: IdentityProvider) -> bool:
        """
        Start from what C{old} (the IdP client of the configuration a reload replaces)
        knows, when it reads the same IdP: its discovery document and key sets, and its
        refresh schedule. Otherwise (another issuer or key-set URL, or C{old} never
        discovered) this one starts cold, as at start. Called before L{startService}.

        @return: Whether it took over.
        """
        metadata = old.metadata
        if (
            metadata is None
            or old.spec.issuer != self.spec.issuer
            or self.access_token_keys_url(metadata) != old.access_token_keys_url(metadata)
        ):
            return False
        self.id_token_keys.seed(old.id_token_keys)
        self.access_token_keys.seed(old.access_token_keys)
        self.metadata = metadata
        self.last_error = old.last_error
        self._failures = old._failures
        self._next_at = old._next_at
        return True

    def seconds(self) -> float:
        """
        The current time on the gateway's clock.
        """
        return self._reactor.seconds()

    @property
    def ready(self) -> bool:
        """
        Whether discovery has succeeded (the login flow can start).
        """
        return self.metadata is not None

    def retry_after(self) -> int:
        """
        Whole seconds until the next discovery attempt (at least 1): for C{Retry-After}.
        """
        return max(1, int(self._next_at - self._reactor.seconds() + 0.999))

    def _refresh(self) -> None:
        self._next = None
        if self._running is not None:
            return
        self._running = Deferred.fromCoroutine(self._discover())
        self._running.addBoth(self._refreshed)

    @property
    def keys(self) -> KeySet:
        """
        The key set id_tokens are verified against.
        """
        return self.id_token_keys.keys

    @property
    def refetch_interval(self) -> float:
        """
        The least time between two key-set fetches caused by unknown key ids.
        """
        return self.id_token_keys.refetch_interval

    @refetch_interval.setter
    def refetch_interval(self, seconds: float) -> None:
        self.id_token_keys.refetch_interval = seconds
        self.access_token_keys.refetch_interval = seconds

    def access_token_keys_url(self, metadata: ProviderMetadata) -> str:
        """
        Where access tokens' keys are: C{bearer.jwksURL}, else the discovery document's
        C{jwks_access_token_uri}, else its C{jwks_uri}.
        """
        return self.spec.bearer.jwks_url or metadata.access_token_jwks_uri

    async def _discover(self) -> None:
        try:
            document = await self._get_json(discovery_url(self.spec.issuer), "discovery")
            metadata = parse_discovery(document, self.spec.issuer)
        except CancelledError:
            raise
        except Exception:
            # Counted here, not for the whole refresh: a key set that fails to load is
            # counted as keys/failed only.
            self.metrics.idp_fetch("discovery", "failed")
            raise
        self.metrics.idp_fetch("discovery", "ok")
        await self.id_token_keys.load(metadata.jwks_uri)
        access_url = self.access_token_keys_url(metadata)
        if access_url == metadata.jwks_uri:
            self.access_token_keys.url = access_url
            self.access_token_keys.keys = self.id_token_keys.keys
        else:
            await self.access_token_keys.load(access_url)
        self.metadata = metadata

    def _refreshed(self, result: object) -> None:
        self._running = None
        if not self.running:
            return
        if isinstance(result, Failure):
            if result.check(CancelledError):
                return
            self._failures += 1
            self.last_error = _reason(result)
            delay = min(self.retry_cap, self.first_retry * 2 ** (self._failures - 1))
            # Jitter, so that many gateways restarted together do not retry in step.
            delay *= random.uniform(0.8, 1.0)
            if self.metadata is None:
                _log.warn(
                    "IdP {issuer} unavailable ({reason}); login answers 503 until "
                    "discovery succeeds; retrying in {delay:.1f}s",
                    issuer=self.spec.issuer,
                    reason=self.last_error,
                    delay=delay,
                )
            else:
                _log.warn(
                    "IdP {issuer} refresh failed ({reason}); keeping what is known; "
                    "retrying in {delay:.1f}s",
                    issuer=self.spec.issuer,
                    reason=self.last_error,
                    delay=delay,
                )
        else:
            if self._failures or self.last_error is not None or not self._next_at:
                _log.info(
                    "IdP {issuer} discovered: {count} signing keys",
                    issuer=self.spec.issuer,
                    count=len(self.keys),
                )
            self._failures = 0
            self.last_error = None
            delay = self.refresh_every
        self._next_at = self._reactor.seconds() + delay
        self._next = self._reactor.callLater(delay, self._refresh)

    # -- key sets ---------------------------------------------------------------------

    async def _fetch_keys(self, url: str) -> KeySet:
        try:
            keys = await self._fetch_key_set(url)
        except CancelledError:
            raise
        except Exception:
            self.metrics.idp_fetch("keys", "failed")
            raise
        self.metrics.idp_fetch("keys", "ok")
        return keys

    async def _fetch_key_set(self, url: str) -> KeySet:
        document = await self._get_json(url, "key set")
        try:
            return KeySet.from_jwks(document)
        except KeySetError as e:
            raise IdPError(f"key set {url}: {e}") from None

    async def keys_for(self, kid: str | None) -> KeySet:
        """
        The id_token key set, refetched first (rate limited) when it lacks C{kid}.
        """
        return await self.id_token_keys.keys_for(kid)

    # -- the login flow ---------------------------------------------------------------

    def authorization_url(
        self,
        metadata: ProviderMetadata,
        *,
        redirect_uri: str,
        state: str,
        nonce: str,
        code_challenge: str,
    ) -> str:
        """
        The authorization request (code flow, PKCE S256) the browser is sent to.
        """
        parameters = {
            "response_type": "code",
            "client_id": self.spec.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self.spec.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": code_challenge,
            "code_challenge_method": "S256",
        }
        if self.spec.resource is not None:
            parameters["resource"] = self.spec.resource
        query = urlencode(parameters, quote_via=quote)
        endpoint = metadata.authorization_endpoint
        return endpoint + ("&" if "?" in endpoint else "?") + query

    async def exchange_code(
        self, metadata: ProviderMetadata, *, code: str, verifier: str, redirect_uri: str
    ) -> Mapping[str, Any]:
        """
        Exchange an authorization code (with its PKCE verifier) at the token endpoint.

        @raise TokenEndpointError: The endpoint failed, was unreachable, took longer than
            L{CALL_TIMEOUT} in all, or answered without an C{id_token}.
        """
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        body = await self._token_request(metadata, form)
        if not isinstance(body.get("id_token"), str):
            raise TokenEndpointError("token endpoint answered no id_token")
        return body

    async def refresh(self, metadata: ProviderMetadata, refresh_token: str) -> Mapping[str, Any]:
        """
        Trade a refresh token for a new access token (RFC 6749 section 6).

        @return: The token response: C{access_token} is a non-empty string; it may carry
            a new C{refresh_token} (rotation), C{expires_in} and an C{id_token}.
        @raise RefreshRejectedError: The endpoint answered C{invalid_grant}.
        @raise TokenEndpointError: Any other failure (unreachable, another error, no
            access token, past L{CALL_TIMEOUT}).
        """
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        body = await self._token_request(metadata, form)
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenEndpointError("token endpoint answered no access_token to a refresh")
        return body

    async def _token_request(
        self, metadata: ProviderMetadata, form: dict[str, str]
    ) -> Mapping[str, Any]:
        """
        POST C{form} to the token endpoint with this client's authentication.

        @raise RefreshRejectedError: A 400 C{invalid_grant} to a refresh.
        @raise TokenEndpointError: Any other failure.
        """
        if self.spec.resource is not None:
            # RFC 8707: asked for again at the token endpoint, or some providers (node's
            # oidc-provider) issue an opaque token for userinfo instead of the API's JWT.
            form["resource"] = self.spec.resource
        headers = Headers({b"Accept": [b"application/json"]})
        secret = self.spec.client_secret
        if secret is None:
            # A public client: PKCE (or the refresh token's binding) alone.
            form["client_id"] = self.spec.client_id
        elif metadata.token_auth_method == "client_secret_post":
            form["client_id"] = self.spec.client_id
            form["client_secret"] = secret
        else:
            headers.setRawHeaders(b"Authorization", [_basic(self.spec.client_id, secret)])
        try:
            code_, body = await self._call(
                "POST", metadata.token_endpoint, headers, form, "token endpoint", errors=True
            )
        except IdPError as e:
            raise TokenEndpointError(str(e)) from None
        if code_ != 200:
            error = body.get("error") if isinstance(body, Mapping) else None
            if code_ == 400 and error == "invalid_grant" and form["grant_type"] == "refresh_token":
                raise RefreshRejectedError("token endpoint refused the refresh token")
            named = f" ({error[:64]!r})" if isinstance(error, str) else ""
            raise TokenEndpointError(f"token endpoint answered {code_}{named}")
        if not isinstance(body, Mapping):
            raise TokenEndpointError("token endpoint answered something other than an object")
        return body

    async def verify_id_token(
        self, metadata: ProviderMetadata, token: str, nonce: str
    ) -> dict[str, object]:
        """
        Verify an id_token: signature against the key set (refetched, rate limited, for
        an unknown key id), algorithm, issuer, audience, azp, times (5 s leeway), nonce.

        @raise TokenError: The token is not valid; its C{reason} says why.
        """
        now = self._reactor.seconds()
        try:
            return verify_id_token(
                token,
                self.keys,
                algorithms=metadata.id_token_algorithms,
                issuer=self.spec.issuer,
                client_id=self.spec.client_id,
                nonce=nonce,
                now=now,
            )
        except UnknownKeyError as e:
            keys = await self.keys_for(e.kid)
            return verify_id_token(
                token,
                keys,
                algorithms=metadata.id_token_algorithms,
                issuer=self.spec.issuer,
                client_id=self.spec.client_id,
                nonce=nonce,
                now=self._reactor.seconds(),
            )

    async def userinfo(self, metadata: ProviderMetadata, access_token: str) -> dict[str, object]:
        """
        The userinfo claims for C{access_token}.

        @raise UserInfoError: The IdP has no userinfo endpoint, the call failed or took
            longer than L{CALL_TIMEOUT}, or the answer is not a JSON object.
        """
        url = metadata.userinfo_endpoint
        if url is None:
            raise UserInfoError("the IdP has no userinfo endpoint")
        headers = Headers(
            {
                b"Authorization": [b"Bearer " + access_token.encode("ascii", "replace")],
                b"Accept": [b"application/json"],
            }
        )
        try:
            code, body = await self._call("GET", url, headers, None, "userinfo")
        except IdPError as e:
            raise UserInfoError(str(e)) from None
        if code != 200:
            raise UserInfoError(f"userinfo answered {code}", code)
        if not isinstance(body, dict):
            raise UserInfoError("userinfo answered something other than a JSON object")
        return body

    # -- plumbing ---------------------------------------------------------------------

    async def _get_json(self, url: str, what: str) -> Any:
        code, body = await self._call("GET", url, _ACCEPT_JSON, None, what)
        if code != 200:
            raise IdPError(f"{what} {url} answered {code}")
        return body

    async def _call(
        self,
        method: str,
        url: str,
        headers: Headers,
        form: Mapping[str, str] | None,
        what: str,
        errors: bool = False,
    ) -> tuple[int, Any]:
        """
        One IdP call, all of it (connecting, the head, the body) within L{CALL_TIMEOUT}:
        the status and, for a 200, the JSON body (at most L{MAX_DOCUMENT} bytes); any
        other status's body is read up to L{MAX_ERROR_BODY} bytes and dropped.

        @param errors: A 400's body is read as JSON too (at most L{MAX_ERROR_BODY}
            bytes; L{None} when it is not JSON): an OAuth error response.
        @raise IdPError: The call failed or timed out, or a 200's body is not JSON.
        """
        running = Deferred.fromCoroutine(self._exchange(method, url, headers, form, errors))
        running.addTimeout(CALL_TIMEOUT, self._reactor)
        try:
            return await running
        except CancelledError:
            raise
        except TimeoutError:
            raise IdPError(f"{what}: no complete answer within {CALL_TIMEOUT:g}s") from None
        except Exception as e:  # any transport failure: unreachable, reset, bad framing
            raise IdPError(f"{what}: {_describe(e)}") from None

    async def _exchange(
        self,
        method: str,
        url: str,
        headers: Headers,
        form: Mapping[str, str] | None,
        errors: bool = False,
    ) -> tuple[int, Any]:
        response = await self._http.request(
            method,
            url,
            headers=headers,
            data=dict(form) if form is not None else None,
            allow_redirects=False,
        )
        if errors and response.code == 400:
            try:
                return 400, await read_json(response, MAX_ERROR_BODY)
            except (NotJSONError, BodyTooLargeError):
                return 400, None
        if response.code != 200:
            # The status says it all: the body is only drained (or dropped past the cap).
            await read_body(response, MAX_ERROR_BODY).addErrback(_ignore_unless_cancelled)
            return response.code, None
        return response.code, await read_json(response, MAX_DOCUMENT)


def _ignore_unless_cancelled(failure: Failure) -> Failure | None:
    return failure if failure.check(CancelledError) else None


def _basic(client_id: str, secret: str) -> bytes:
    # RFC 6749 2.3.1: both are form-urlencoded before the Basic encoding.
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}"
    return b"Basic " + b64encode(pair.encode("utf-8"))


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text[:300]


def _reason(failure: Failure) -> str:
    if failure.check(TokenError):
        return str(getattr(failure.value, "reason", failure.value))
    return _describe(failure.value) if failure.value is not None else "unknown error"
