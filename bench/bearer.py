"""
C{python -m bench bearer}: what verifying a Bearer access token costs edgegw per request.

A static OpenID provider runs in the harness (L{StaticIssuer}: a thread serving the
discovery document and a key set holding one RSA key made for the run, a L{SigningKey}
of the tests' fake provider; the issuer is its URL). Three edgegw processes, one per
variant, have the same C{verificationOnly} C{IdP} resource for it (C{clientID}
L{CLIENT_ID}) and the same Gateway C{identity} block (groups from the token's C{groups}
claim), and serve the same C{health} route C{GET /x} as a C{service} route, loaded with
wrk in interleaved rounds (L{bench.variants}):

  - a. C{public}: C{access: {auth: public}}, wrk without an C{Authorization} header.
    The session stage still runs (it finds no credential).
  - b. C{bearer-cached}: C{access: {auth: required}}, wrk sending
    C{Authorization: Bearer <token>}; the verified-token cache at its default
    (C{bearer.cacheTTL} 5 minutes): the token is verified once, then found in the cache.
  - c. C{bearer-uncached}: as b, with C{bearer.cacheTTL: 0s}: every request verifies
    the RS256 signature and the claims.

The token is minted in the harness (L{SigningKey.sign}): RS256 with the run's key, C{iss}
the issuer, C{aud} the client id, C{exp} an hour ahead, a subject and the claims edgegw
projects by default (C{email}, C{name}, C{given_name}, C{family_name}) plus three
groups, so that C{identity.userInfo: auto} never calls userinfo (the discovery
document has no userinfo endpoint: a call would fail and reject the token).

edgegw discovers the IdP when it starts; until then it answers 401. Before the load each
variant is asked for C{/x} until it answers 200 (b and c with the token), for up to
L{READY_WITHIN} seconds: a variant still answering 401 then is reported unavailable,
never measured (b and c are asked again after every run too).

Before the load, the Bearer path of the session stage is also timed in-process, with
no HTTP: C{bearer_token} on the request headers, then C{BearerVerifier.cached} (b), or
C{BearerVerifier.verify} with the cache off (c), and C{verify_jwt} alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from bench import gateway, variants
from bench.rounds import say
from bench.targets import Target
from bench.tools import ensure_wrk
from edgegw.config.model import BearerSpec, GroupsSpec, IdentitySpec, IdpSpec
from edgegw.handlers.health import BODY as HEALTH_BODY
from edgegw.identity.bearer import BearerVerifier, bearer_token
from edgegw.identity.discovery import parse_discovery
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.keyset import KeySet
from edgegw.identity.principal import Principal
from edgegw.identity.provider import IdentityProvider
from edgegw.identity.tokens import verify_jwt
from edgegw.upstream.agent import UpstreamAgent
from tests.support.fake_idp import SigningKey

ROUTE_NAME = "x"
ROUTE_MATCH = "GET /x"
ROUTE_PATH = "/x"
CLIENT_ID = "edgegw-bench"
"""The IdP's C{clientID}: the audience (C{aud}) access tokens must carry."""
KEY_ID = "bench-rs256"
ALGORITHM = "RS256"
KEY_BITS = 2048
"""The size of the RSA key L{SigningKey.generate} makes for RS256."""
TOKEN_LIFETIME = 3600
"""Seconds from minting to the token's C{exp}."""
SUBJECT = "00u1a2b3c4d5e6f7g8h9"
"""The token's subject (an IdP user id)."""
CLAIMS: Mapping[str, str] = {
    "email": "jane.doe@example.com",
    "name": "Jane Doe",
    "given_name": "Jane",
    "family_name": "Doe",
}
"""The token's passport claims: the default C{identity.claims}."""
GROUPS = ("platform-engineers", "billing-readers", "vpn-users")
"""The token's C{groups} claim (the Gateway's C{identity.groups.source})."""
IDENTITY_BLOCK: Mapping[str, Any] = {"identity": {"groups": {"source": "groups"}}}
"""The Gateway's C{identity} block: groups from the token's C{groups} claim."""
IDENTITY = IdentitySpec(groups=GroupsSpec(source="groups"))
"""L{IDENTITY_BLOCK} as edgegw reads it."""
DEFAULT_CACHE_TTL = BearerSpec().cache_ttl
TARGET_RATIO = 0.9
"""The issue's target: b's throughput at least this much of a's."""
READY_WITHIN = 15.0
"""Seconds a variant has, after it listens, to discover the IdP and accept the token."""
LOOKUPS = 20_000
"""In-process cache lookups timed (after L{WARMUP_CALLS} unrecorded ones)."""
VERIFICATIONS = 2_000
"""In-process verifications timed, each way (after L{WARMUP_CALLS} unrecorded ones)."""
WARMUP_CALLS = 200


def make_key() -> SigningKey:
    """
    The run's signing key: RSA, L{KEY_BITS} bits, under L{KEY_ID}; its
    C{public_jwk()} has C{use: sig} and C{alg}, its C{sign(claims)} mints a token.
    """
    return SigningKey.generate(KEY_ID, ALGORITHM)


def token_claims(issuer: str, now: float) -> dict[str, Any]:
    """The access token's claims, issued at C{now}."""
    issued = int(now)
    return {
        "iss": issuer,
        "aud": CLIENT_ID,
        "sub": SUBJECT,
        "iat": issued,
        "exp": issued + TOKEN_LIFETIME,
        "scope": "openid profile email",
        **CLAIMS,
        "groups": list(GROUPS),
    }


def discovery_document(issuer: str) -> dict[str, Any]:
    """
    The provider's discovery document: the endpoints edgegw requires (authorization and
    token are never called by a verification-only gateway), the key set, RS256. No
    userinfo endpoint: a userinfo call would fail, and reject the token.
    """
    return {
        "issuer": issuer,
        "authorization_endpoint": issuer + "/authorize",
        "token_endpoint": issuer + "/token",
        "jwks_uri": issuer + "/jwks",
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ALGORITHM],
    }


class StaticIssuer:
    """
    A static OpenID provider on loopback, in a thread of the harness: C{GET
    /.well-known/openid-configuration} and C{GET /jwks}, each answered with a fixed JSON
    document; anything else is a 404. It counts the requests per path.

    @ivar url: Its base URL, also the issuer.
    @ivar requests: Requests received, per path.
    """

    def __init__(self, jwk: Mapping[str, Any]) -> None:
        requests: Counter[str] = Counter()
        documents: dict[str, bytes] = {}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with lock:
                    requests[path] += 1
                body = documents.get(path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.discovery = discovery_document(self.url)
        self.jwks = {"keys": [dict(jwk)]}
        documents["/.well-known/openid-configuration"] = json.dumps(self.discovery).encode()
        documents["/jwks"] = json.dumps(self.jwks).encode()
        self.requests = requests
        self._lock = lock
        self._thread: threading.Thread | None = None

    def start(self, stack: ExitStack) -> None:
        """Serve in a daemon thread until C{stack} closes."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="static-issuer", daemon=True
        )
        self._thread.start()
        stack.callback(self._stop)

    def _stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def counts(self) -> dict[str, int]:
        """The requests received so far, per path."""
        with self._lock:
            return dict(self.requests)


def idp_resource(issuer: str, cache_ttl: str | None) -> dict[str, Any]:
    """
    The C{IdP} resource: verification only (no client secret, no login), the token's
    audience being L{CLIENT_ID}; C{bearer.cacheTTL} when given.
    """
    spec: dict[str, Any] = {
        "type": "oidc",
        "issuer": issuer,
        "clientID": CLIENT_ID,
        "verificationOnly": True,
    }
    if cache_ttl is not None:
        spec["bearer"] = {"cacheTTL": cache_ttl}
    return gateway.resource("IdP", "idp", spec)


def make_variants(issuer: str, token: str) -> list[variants.Variant]:
    """The three variants, in round order."""

    def resources(cache_ttl: str | None) -> list[dict[str, Any]]:
        return [gateway.gateway_fields(IDENTITY_BLOCK), idp_resource(issuer, cache_ttl)]

    def route(auth: str) -> list[gateway.RouteConfig]:
        return [gateway.health(ROUTE_NAME, ROUTE_MATCH, auth=auth, route_type="service")]

    bearer = (("Authorization", f"Bearer {token}"),)
    return [
        variants.Variant(
            "a",
            "public",
            "service route, auth public, no Authorization header",
            route("public"),
            resources(None),
            body=HEALTH_BODY,
        ),
        variants.Variant(
            "b",
            "bearer-cached",
            f"auth required, valid RS256 token ({len(token):,} B), verified-token cache "
            f"at its default ({DEFAULT_CACHE_TTL:g}s)",
            route("required"),
            resources(None),
            body=HEALTH_BODY,
            headers=bearer,
            recheck=True,
        ),
        variants.Variant(
            "c",
            "bearer-uncached",
            "as b, bearer.cacheTTL: 0s: every request verifies the signature",
            route("required"),
            resources("0s"),
            body=HEALTH_BODY,
            headers=bearer,
            recheck=True,
        ),
    ]


def wait_until_accepted(variant: variants.Variant, target: Target, within: float) -> None:
    """
    Ask C{target} for L{ROUTE_PATH} again while it answers 401 (edgegw has not
    discovered the IdP yet), for up to C{within} seconds; then a 401 marks it
    unavailable: the token is not accepted.
    """
    deadline = time.monotonic() + within
    while (
        target.unavailable is not None
        and " answered 401" in target.unavailable
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
        target.unavailable = variant.expect(target.port, ROUTE_PATH)
    if target.unavailable is not None and " answered 401" in target.unavailable:
        target.unavailable = (
            f"token not accepted after {within:g}s: {target.unavailable} (the reason is "
            "in edgegw's access log: --keep-tmp)"
        )


@attrs.frozen
class PathTiming:
    """
    One in-process figure of the session stage's Bearer path.

    @ivar key: The variant it stands for.
    @ivar what: What was timed.
    @ivar calls: How many calls were timed.
    @ivar us: Microseconds per call.
    @ivar valid: Whether each call gave the token's principal.
    """

    key: str
    what: str
    calls: int
    us: float
    valid: bool


def _verifier(
    issuer: str, discovery: Mapping[str, Any], jwks: Mapping[str, Any], cache_ttl: float
) -> BearerVerifier:
    """
    A L{BearerVerifier} as a gateway has it once the IdP is discovered (discovery
    document and key set given, no network), with the cache at C{cache_ttl}.
    """
    clock = Clock()
    clock.advance(time.time())
    spec = IdpSpec(
        name="idp",
        issuer=issuer,
        client_id=CLIENT_ID,
        verification_only=True,
        bearer=BearerSpec(cache_ttl=cache_ttl),
    )
    # Never started: it makes no call, so it needs no agent.
    provider = IdentityProvider(spec, cast(UpstreamAgent, None), clock)
    provider.metadata = parse_discovery(dict(discovery), issuer)
    provider.access_token_keys.keys = KeySet.from_jwks(dict(jwks))
    return BearerVerifier(provider, IDENTITY, GroupRenderer(IDENTITY.groups), clock)


def _verified(verifier: BearerVerifier, token: bytes) -> Principal | None:
    """C{verifier.verify(token)}, which completes at once when the keys are known."""
    got: list[Principal | None] = []
    done = Deferred.fromCoroutine(verifier.verify(token))
    done.addCallbacks(got.append, lambda failure: got.append(None))
    return got[0] if got else None


def _timed(call: Callable[[], object], count: int) -> tuple[float, bool]:
    """Microseconds per C{call()} over C{count} calls, and whether every one was truthy."""
    for _ in range(WARMUP_CALLS):
        call()
    ok = True
    started = time.perf_counter()
    for _ in range(count):
        ok = bool(call()) and ok
    return (time.perf_counter() - started) / count * 1e6, ok


def time_paths(
    issuer: str, discovery: Mapping[str, Any], jwks: Mapping[str, Any], token: str
) -> list[PathTiming]:
    """
    Time, in-process, what the session stage does with b's and c's request: the
    credential from the headers and a cache hit (b); the credential and a full
    verification, cache off (c); and C{verify_jwt} alone (the signature and claims).
    """
    headers = Headers({b"Authorization": [f"Bearer {token}".encode("ascii")]})
    cached = _verifier(issuer, discovery, jwks, DEFAULT_CACHE_TTL)
    valid = _verified(cached, token.encode("ascii")) is not None

    def lookup() -> Principal | None:
        credential = bearer_token(headers)
        return cached.cached(credential) if isinstance(credential, bytes) else None

    uncached = _verifier(issuer, discovery, jwks, 0.0)

    def verify() -> Principal | None:
        credential = bearer_token(headers)
        return _verified(uncached, credential) if isinstance(credential, bytes) else None

    keys = KeySet.from_jwks(dict(jwks))
    now = time.time()

    def signature() -> dict[str, object]:
        return verify_jwt(
            token,
            keys,
            algorithms=(ALGORITHM,),
            issuer=issuer,
            audience=CLIENT_ID,
            now=now,
            required=("exp",),
        )

    lookup_us, lookup_ok = _timed(lookup, LOOKUPS)
    verify_us, verify_ok = _timed(verify, VERIFICATIONS)
    jwt_us, jwt_ok = _timed(signature, VERIFICATIONS)
    return [
        PathTiming(
            "b",
            "bearer_token + BearerVerifier.cached (a hit)",
            LOOKUPS,
            lookup_us,
            valid and lookup_ok,
        ),
        PathTiming(
            "c",
            "bearer_token + BearerVerifier.verify (cache off)",
            VERIFICATIONS,
            verify_us,
            verify_ok,
        ),
        PathTiming(
            "c", f"  of which verify_jwt ({ALGORITHM}, claims)", VERIFICATIONS, jwt_us, jwt_ok
        ),
    ]


def path_lines(timings: Sequence[PathTiming], token: str) -> list[str]:
    """The in-process figures, for under the table."""
    lines = [
        f"BEARER PATH in-process, no HTTP ({len(token):,} B token, {ALGORITHM}, {KEY_BITS}-bit key)"
    ]
    for t in timings:
        state = "" if t.valid else "  WRONG: the token's principal was not given"
        lines.append(f"  {t.key} {t.what:<50} {t.us:7.1f} µs  ({t.calls:,} calls){state}")
    return lines


def idp_lines(counts: Mapping[str, int]) -> list[str]:
    """What the static IdP was asked over the whole run (the three gateways together)."""
    shown = ", ".join(f"{path} {count}" for path, count in sorted(counts.items())) or "nothing"
    return [f"IDP requests over the whole run (3 gateways): {shown}"]


def notes(settings: variants.Settings, issuer: str) -> list[str]:
    """How to read this run's numbers; printed under the table and saved in the JSON."""
    return [
        f"Every variant serves the same health route {ROUTE_MATCH} as a service route (200 "
        f"{HEALTH_BODY.decode()}) with the same verificationOnly IdP ({issuer}: a static "
        "provider in the harness, serving discovery and a key set with one RSA key) and "
        "identity block; a is public and gets no Authorization header (its session stage "
        "looks for a credential and finds none), b and c require authentication and send "
        "the same valid RS256 token. +CPU µs/req is what a Bearer token costs per request: "
        "the larger request head, the credential's parsing, the cache lookup (sha256 of the "
        "token) or, in c, the RS256 signature and claims checks and building the principal, "
        "the auth gate and projecting the identity headers (X-User-*).",
        "edgegw discovers the IdP when it starts and answers 401 until then: each variant "
        f"is asked until it answers 200 (up to {READY_WITHIN:g}s) before the load, b and c "
        "again after every run; a variant left answering 401 is reported unavailable, "
        "never measured.",
        "The in-process figures are the session stage's Bearer path alone, in the harness "
        "process, on a verifier given the discovery document and key set (no HTTP, no "
        "chain).",
        *variants.common_notes(settings),
    ]


def run(settings: variants.Settings) -> int:
    """
    Start the IdP, mint the token, time the Bearer path in-process, run the HTTP
    benchmark, print both and write the JSON results.

    @return: The exit status: 0, or 1 if a variant could not be measured.
    """
    wrk_path = ensure_wrk()
    key = make_key()
    issuer = StaticIssuer(key.public_jwk())
    claims = token_claims(issuer.url, time.time())
    token = key.sign(claims)
    configs = make_variants(issuer.url, token)
    timings: list[PathTiming] = []

    def prepare(
        stack: ExitStack, tmp: Path
    ) -> tuple[list[variants.Variant], list[Target], Mapping[str, variants.AfterRun]]:
        issuer.start(stack)
        say(f"static OpenID provider at {issuer.url}")
        say("timing the Bearer path in-process")
        timings.extend(time_paths(issuer.url, issuer.discovery, issuer.jwks, token))
        for line in path_lines(timings, token):
            say(line)
        targets = variants.start(stack, tmp, configs, ROUTE_PATH, "edgegw")
        for variant, target in zip(configs, targets, strict=True):
            wait_until_accepted(variant, target, READY_WITHIN)
        return configs, targets, {}

    done = variants.measure("bearer", settings, wrk_path, ROUTE_PATH, prepare)
    if done is None:
        return 1
    ratio, reached, lines = variants.target_verdict(
        done, "b bearer-cached vs a public", TARGET_RATIO
    )
    counts = issuer.counts()
    run_notes = notes(settings, issuer.url)
    variants.print_results(
        done, (), [*lines, "", *path_lines(timings, token), "", *idp_lines(counts)], run_notes
    )
    variants.write_results(
        "bearer",
        done,
        settings,
        wrk_path,
        configs,
        run_notes,
        {},
        {
            "route": {"match": ROUTE_MATCH, "type": "service"},
            "idp": {"issuer": issuer.url, "client_id": CLIENT_ID, "requests": counts},
            "token": {
                "alg": ALGORITHM,
                "kid": KEY_ID,
                "key_bits": KEY_BITS,
                "bytes": len(token),
                "claims": {k: v for k, v in claims.items() if k not in ("iat", "exp")},
                "lifetime_s": TOKEN_LIFETIME,
            },
            "cache_ttl_s": {"a": DEFAULT_CACHE_TTL, "b": DEFAULT_CACHE_TTL, "c": 0.0},
            "target": {"ratio": TARGET_RATIO, "b_vs_a": ratio, "reached": reached},
            "bearer_path": [attrs.asdict(t) for t in timings],
        },
    )
    wrong = any(not t.valid for t in timings)
    return 1 if wrong else variants.exit_status(done)
