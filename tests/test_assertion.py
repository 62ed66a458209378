"""
Identity assertions between gateway instances (issue 13), end to end on real sockets:
gateway A authenticates a Bearer token (the in-repo fake OpenID provider,
tests/support/fake_idp.py) and hands the principal on as an Ed25519-signed compact JWS;
gateway B accepts it and projects X-User-* to its backend; C behind a middle hop.

Every backend is a recording Twisted site (tests/support/backends.py). Each gateway runs
on the real reactor with its clock moved at will (L{ShiftedReactor}), so that expiry and
the 30 s leeway are tested without waiting; each gateway's access-log lines are kept in
L{Instance.log} (the C{assertion} note says why an assertion was ignored).

Hand-made assertions are signed here with PyNaCl (L{World.assertion}), so that every
header and claim can be what an attacker would send.
"""

from __future__ import annotations

import base64
import json
import secrets
import textwrap
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey as Ed25519Key
from nacl.signing import VerifyKey
from twisted.internet import reactor as _reactor
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import RecordedRequest, SiteBackend, answer
from tests.support.browser import Browser, BrowserResponse
from tests.support.configs import load_text, problems_of, write_tree
from tests.support.fake_idp import FakeIdP, SigningKey, compact_jws
from tests.support.gateways import serve_yaml
from tests.support.processes import listen_local, port_of
from tests.test_bearer import ShiftedReactor, hmac_signer, raw_get

reactor: Any = _reactor

CLIENT_ID = "gw"
HEADER = "X-Gw-Identity"
UNAUTHORIZED = (401, b"unauthorized\n")
BODY_A = b'{"from":"a"}'
BODY_B = b'{"from":"b"}'
BODY_C = b'{"from":"c"}'
#: The claims of the fake IdP's user that gateway A keeps (identity.claims).
PASSPORT = {"email": "alice@example.com", "name": "Alice Example", "given_name": "Alice"}


def b64(data: bytes) -> str:
    """
    Standard, padded base64: how keys are written in configuration.
    """
    return base64.b64encode(data).decode("ascii")


def unb64url(segment: str | bytes) -> bytes:
    if isinstance(segment, bytes):
        segment = segment.decode("ascii")
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def ed25519_signer(key: Ed25519Key) -> Callable[[bytes], bytes]:
    def sign(data: bytes) -> bytes:
        return bytes(key.sign(data).signature)

    return sign


def decode(token: bytes | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """
    The header and the claims of a compact JWS (nothing verified).
    """
    text = token.decode("ascii") if isinstance(token, bytes) else token
    head, payload, _ = text.split(".")
    return json.loads(unb64url(head)), json.loads(unb64url(payload))


def challenges(response: BrowserResponse) -> list[str]:
    return list(response.headers.getRawHeaders("WWW-Authenticate") or [])


def headers_named(request: RecordedRequest, name: bytes) -> list[bytes]:
    return [value for key, value in request.headers if key.lower() == name.lower()]


# -- the gateways ------------------------------------------------------------------------


@attrs.define
class Instance:
    """
    One listening gateway: its port, its clock, and the access-log lines it wrote.
    """

    gateway: Gateway
    port: int
    clock: ShiftedReactor
    log: list[dict[str, Any]]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def now(self) -> int:
        return int(self.clock.seconds())

    @property
    def note(self) -> Any:
        """
        The C{assertion} note of the last logged request (L{None} when there is none).
        """
        return self.log[-1].get("assertion") if self.log else None


def route(name: str, match: str, handler: str, auth: str = "required") -> str:
    """
    A service Route document (with its leading C{---}); C{handler} is a YAML flow mapping.
    """
    return f"""---
kind: Route
metadata: {{name: {name}}}
spec:
  match: "{match}"
  type: service
  access: {{auth: {auth}}}
  handler: {handler}
"""


def proxy(port: int, **options: bool) -> str:
    extra = "".join(f", {name}: {str(value).lower()}" for name, value in options.items())
    return f'{{type: reverse-proxy, upstream: "http://127.0.0.1:{port}"{extra}}}'


class World:
    """
    The fake IdP, three recording backends (C{rec_a} behind A, C{rec_b} behind B, C{rec_c}
    behind C, each answering a small JSON object), and the Ed25519 keys: C{a-1} (A's
    signing key), C{a-2} (a second key B accepts for A), C{b-1} (the middle hop's).
    """

    def __init__(self, test: TestCase) -> None:
        self.test = test
        self.idp = FakeIdP()
        self.idp.user["given_name"] = "Alice"
        self.keys = {kid: Ed25519Key.generate() for kid in ("a-1", "a-2", "b-1")}
        self.rec_a = SiteBackend(answer(body=BODY_A))
        self.rec_b = SiteBackend(answer(body=BODY_B))
        self.rec_c = SiteBackend(answer(body=BODY_C))

    async def open(self) -> World:
        await self.idp.start(self.test)
        for backend in (self.rec_a, self.rec_b, self.rec_c):
            backend.start()
            self.test.addCleanup(backend.stop)
        return self

    # -- keys and tokens -----------------------------------------------------------------

    def seed(self, kid: str) -> bytes:
        return bytes(self.keys[kid])

    def public(self, kid: str) -> bytes:
        return bytes(self.keys[kid].verify_key.encode())

    def bearer(self, now: int | None = None, **claims: Any) -> str:
        """
        A valid access token of the fake IdP for alice (her claims included), valid at
        C{now} (by default the real time).
        """
        now = int(reactor.seconds()) if now is None else now
        base = {"aud": CLIENT_ID, "iat": now, "exp": now + 300, **claims}
        return self.idp.mint_access_token(base, user_claims=True)

    def claims(self, now: int | None = None, **changes: Any) -> dict[str, Any]:
        """
        Valid assertion claims from C{gw-a} about alice (groups C{asserted}, claims
        C{email} and C{team}), issued C{now}, with a fresh token id; C{changes} update
        them (a value of L{None} removes the claim).
        """
        now = int(reactor.seconds()) if now is None else now
        claims: dict[str, Any] = {
            "iss": "gw-a",
            "sub": "alice",
            "iat": now,
            "exp": now + 60,
            "jti": secrets.token_urlsafe(16),
            "groups": ["asserted"],
            "claims": {"email": "alice@example.com", "team": "blue"},
        }
        claims.update(changes)
        return {name: value for name, value in claims.items() if value is not None}

    def assertion(
        self,
        claims: dict[str, Any] | None = None,
        *,
        kid: str | None = "a-1",
        key: Ed25519Key | None = None,
        header: dict[str, Any] | None = None,
        sign: Callable[[bytes], bytes] | None = None,
    ) -> str:
        """
        An assertion signed here: C{claims} (default L{claims}), header C{{alg: EdDSA,
        kid}} (or C{header} as it is), signed by C{key} (default: the key C{kid} names) or
        by C{sign}.
        """
        if header is None:
            header = {"alg": "EdDSA"} if kid is None else {"alg": "EdDSA", "kid": kid}
        if sign is None:
            sign = ed25519_signer(key or self.keys[kid or "a-1"])
        return compact_jws(header, self.claims() if claims is None else claims, sign)

    # -- configuration -------------------------------------------------------------------

    def issue(self, name: str = "gw-a", kid: str = "a-1", extra: str = "") -> str:
        """
        An C{issue} block (to go under C{identity.assertion}).
        """
        return f'issue: {{name: {name}, keyId: {kid}, key: "{b64(self.seed(kid))}"{extra}}}\n'

    def accept(
        self,
        issuer: str = "gw-a",
        kids: Iterable[str] = ("a-1", "a-2"),
        require_bearer: bool = True,
        extra: str = "",
    ) -> str:
        """
        An C{accept} block (to go under C{identity.assertion}).
        """
        keys = "".join(
            f'    - {{keyId: {kid}, publicKey: "{b64(self.public(kid))}"}}\n' for kid in kids
        )
        return (
            f"accept:\n  issuer: {issuer}\n  requireBearer: {str(require_bearer).lower()}\n"
            f"{extra}  keys:\n{keys}"
        )

    def config(
        self,
        name: str,
        assertion: str,
        routes: str,
        idp: bool = True,
        claims: str = "[email, name, given_name]",
    ) -> str:
        """
        A whole configuration: Gateway C{name} with C{assertion} as its
        C{identity.assertion} block, the fake IdP (verificationOnly) when C{idp}, and
        C{routes}.
        """
        text = f"""\
kind: Gateway
metadata: {{name: {name}}}
spec:
  listen: "127.0.0.1:0"
  identity:
    claims: {claims}
    groups: {{source: groups, match: ["ou=groups"], render: cn}}
    assertion:
{textwrap.indent(assertion, "      ")}"""
        if idp:
            text += f"""\
---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{self.idp.issuer}"
  clientID: {CLIENT_ID}
  verificationOnly: true
"""
        return text + routes

    async def serve(self, text: str) -> Instance:
        """
        Build, listen and (with an IdP) discover: a gateway on its own shifted clock.
        """
        test = self.test
        root = write_tree(test.mktemp(), {"a.yaml": text})
        clock = ShiftedReactor()
        client = UpstreamClient(reactor)
        gateway = build_gateway(load_config(root, {}), cast(Any, clock), client)
        log: list[dict[str, Any]] = []
        test.patch(gateway.access_log, "emit", log.append)
        listening = listen_local(gateway.site)
        test.addCleanup(listening.stopListening)
        test.addCleanup(client.close)
        provider = gateway.idp
        if provider is not None:
            provider.first_retry = 0.05
            provider.retry_cap = 0.2
            provider.startService()
            test.addCleanup(provider.stopService)
            for _ in range(200):
                if provider.ready:
                    break
                await deferLater(reactor, 0.02, lambda: None)
            else:
                raise AssertionError(f"IdP never discovered: {provider.last_error}")
        return Instance(gateway, port_of(listening), clock, log)

    # -- the usual instances ---------------------------------------------------------------

    async def gateway_a(
        self,
        b: Instance | None = None,
        forward_token: bool = False,
        issue_extra: str | None = None,
    ) -> Instance:
        """
        Gateway A: issues as C{gw-a} with key C{a-1} (ttl 45 s unless C{issue_extra} says
        otherwise), verifies Bearer tokens. Routes (service, auth required unless said):

          - C{/to-b/}: proxy to B, C{forwardIdentity} (and C{forwardAccessToken} with
            C{forward_token});
          - C{/token-only/}: proxy to B, C{forwardAccessToken} only;
          - C{/agg/{id}}: api with backends C{b} (B's C{/svc/agg/{id}}, forwardIdentity,
            and the token with C{forward_token}), C{direct} (A's backend C{/direct/{id}},
            forwardIdentity) and C{bare} (A's backend C{/bare/{id}}, nothing);
          - C{/rec/}: proxy to A's backend, forwardIdentity;
          - C{/plain/}: proxy to A's backend;
          - C{/pub/}: public, proxy to A's backend, forwardIdentity.
        """
        b_port = b.port if b is not None else self.rec_b.port
        a_port = self.rec_a.port
        token = str(forward_token).lower()
        agg = (
            "{type: api, backends: ["
            f'{{group: b, upstream: "http://127.0.0.1:{b_port}", path: "/svc/agg/{{id}}", '
            f"forwardIdentity: true, forwardAccessToken: {token}}}, "
            f'{{group: direct, upstream: "http://127.0.0.1:{a_port}", path: "/direct/{{id}}", '
            "forwardIdentity: true}, "
            f'{{group: bare, upstream: "http://127.0.0.1:{a_port}", path: "/bare/{{id}}"}}]}}'
        )
        routes = (
            route(
                "to-b",
                "/to-b/",
                proxy(b_port, forwardIdentity=True, forwardAccessToken=forward_token),
            )
            + route("token-only", "/token-only/", proxy(b_port, forwardAccessToken=True))
            + route("agg", "/agg/{id}", agg)
            + route("rec", "/rec/", proxy(a_port, forwardIdentity=True))
            + route("plain", "/plain/", proxy(a_port))
            + route("pub", "/pub/", proxy(a_port, forwardIdentity=True), auth="public")
        )
        issue = self.issue(extra=", ttl: 45s" if issue_extra is None else issue_extra)
        return await self.serve(self.config("a", issue, routes))

    async def gateway_b(
        self,
        require_bearer: bool,
        idp: bool | None = None,
        accept_extra: str = "",
        issue: str = "",
        routes: str = "",
        backend: SiteBackend | None = None,
    ) -> Instance:
        """
        Gateway B: accepts C{gw-a} (keys C{a-1}, C{a-2}); claims C{[email]} only (what a
        Bearer token gives it alone); C{/pub/} public and C{/} required, both proxied to
        C{backend} (B's), after C{routes}. It verifies Bearer tokens when C{idp} (by
        default: with C{require_bearer}).
        """
        port = (backend or self.rec_b).port
        assertion = self.accept(require_bearer=require_bearer, extra=accept_extra) + issue
        all_routes = (
            routes
            + route("pub", "/pub/", proxy(port), auth="public")
            + route("svc", "/", proxy(port))
        )
        with_idp = require_bearer if idp is None else idp
        return await self.serve(
            self.config("b", assertion, all_routes, idp=with_idp, claims="[email]")
        )


async def world(test: TestCase) -> World:
    return await World(test).open()


async def get(
    at: Instance,
    path: str,
    assertion: str | bytes | None = None,
    bearer: str | None = None,
    headers: dict[str, str] | None = None,
) -> BrowserResponse:
    sent = dict(headers or {})
    if assertion is not None:
        sent[HEADER] = assertion.decode("ascii") if isinstance(assertion, bytes) else assertion
    if bearer is not None:
        sent["Authorization"] = f"Bearer {bearer}"
    return await Browser().get(at.url(path), headers=sent)


class AssertionTestCase(TestCase):
    """
    Checks of what gateway B made of an assertion.
    """

    def assert_identity(
        self,
        request: RecordedRequest,
        groups: bytes | None,
        claims: dict[bytes, bytes | None],
        subject: bytes | None = b"alice",
    ) -> None:
        self.assertEqual(request.header(b"X-User-Id"), subject)
        self.assertEqual(request.header(b"X-User-Groups"), groups)
        for name, value in claims.items():
            self.assertEqual(request.header(name), value, name)
        # The assertion itself never reaches the backend.
        self.assertEqual(headers_named(request, HEADER.encode()), [])

    async def assert_alone_accepted(
        self, b: Instance, backend: SiteBackend, token: str, message: str = ""
    ) -> None:
        """
        B (requireBearer false) authenticates alice by C{token} alone (a L{World.claims}
        assertion: groups C{asserted}, claims C{email}, C{team}).
        """
        before = len(backend.requests)
        response = await get(b, "/svc/x", token)
        self.assertEqual((response.status, response.body), (200, BODY_B), message)
        self.assertEqual(len(backend.requests), before + 1, message)
        self.assert_identity(
            backend.requests[-1],
            b"asserted",
            {b"X-User-Email": b"alice@example.com", b"X-User-Team": b"blue"},
        )
        self.assertEqual(b.note, "accepted", message)

    async def assert_alone_ignored(
        self, b: Instance, backend: SiteBackend, token: str, reason: str, message: str = ""
    ) -> None:
        """
        B (requireBearer false) ignores C{token}: 401 on its required route (the backend
        not called), anonymous on its public one; the reason noted in the access log.
        """
        message = message or reason
        before = len(backend.requests)
        response = await get(b, "/svc/x", token)
        self.assertEqual((response.status, response.body), UNAUTHORIZED, message)
        self.assertEqual(challenges(response), ["Bearer"], message)
        self.assertEqual(len(backend.requests), before, message)
        self.assertEqual(b.note, f"ignored: {reason}", message)
        # The reason only: never the token.
        if len(token) > 40:
            self.assertNotIn(token[-24:], json.dumps(b.log[-1]), message)
        response = await get(b, "/pub/x", token)
        self.assertEqual((response.status, response.body), (200, BODY_B), message)
        self.assert_identity(backend.requests[-1], None, {}, subject=None)
        self.assertEqual(b.note, f"ignored: {reason}", message)

    async def assert_enriched(
        self, b: Instance, backend: SiteBackend, token: str, bearer: str, message: str = ""
    ) -> None:
        """
        B (requireBearer true) takes the groups and claims of C{token} for the Bearer
        principal.
        """
        response = await get(b, "/svc/x", token, bearer)
        self.assertEqual((response.status, response.body), (200, BODY_B), message)
        self.assert_identity(
            backend.requests[-1],
            b"asserted",
            {b"X-User-Email": b"alice@example.com", b"X-User-Team": b"blue"},
        )
        self.assertEqual(b.note, "accepted", message)

    async def assert_bearer_only(
        self,
        b: Instance,
        backend: SiteBackend,
        token: str,
        bearer: str,
        reason: str,
        message: str = "",
    ) -> None:
        """
        B (requireBearer true) ignores C{token}: the request keeps its Bearer principal
        (groups C{admins}, claim C{email}), never an error because of the assertion.
        """
        message = message or reason
        before = len(backend.requests)
        response = await get(b, "/svc/x", token, bearer)
        self.assertEqual((response.status, response.body), (200, BODY_B), message)
        self.assertEqual(len(backend.requests), before + 1, message)
        self.assert_identity(
            backend.requests[-1],
            b"admins",
            {b"X-User-Email": b"alice@example.com", b"X-User-Team": None},
        )
        self.assertEqual(b.note, f"ignored: {reason}", message)


# -- 1. two gateways -----------------------------------------------------------------------


class HandOffTests(AssertionTestCase):
    async def check_hand_off(self, w: World, a: Instance, b: Instance) -> None:
        """
        A request to A with alice's Bearer token reaches B's backend as alice, through
        the proxy route and the api route, with the identity A asserted.
        """
        token = w.bearer()
        response = await get(a, "/to-b/x?q=1", bearer=token)
        self.assertEqual((response.status, response.body), (200, BODY_B))
        seen = w.rec_b.requests[-1]
        self.assertEqual(seen.uri, b"/to-b/x?q=1")
        self.assert_identity(
            seen,
            b"admins",
            {
                b"X-User-Email": b"alice@example.com",
                b"X-User-Name": b"Alice Example",
                b"X-User-Given-Name": b"Alice",
            },
        )
        self.assertIsNone(seen.header(b"Authorization"))
        self.assertEqual(b.note, "accepted")
        self.assertIsNone(a.note)

        response = await get(a, "/agg/7", bearer=token)
        self.assertEqual(response.status, 200)
        self.assertEqual(
            response.json(), {"b": {"from": "b"}, "direct": {"from": "a"}, "bare": {"from": "a"}}
        )
        via_api = [r for r in w.rec_b.requests if r.uri == b"/svc/agg/7"]
        self.assertEqual(len(via_api), 1)
        self.assert_identity(
            via_api[0],
            b"admins",
            {
                b"X-User-Email": b"alice@example.com",
                b"X-User-Name": b"Alice Example",
                b"X-User-Given-Name": b"Alice",
            },
        )
        self.assertEqual(b.note, "accepted")
        # The other two backends of the fan-out: only the forwardIdentity one gets an
        # assertion, a fresh one.
        direct = next(r for r in w.rec_a.requests if r.uri == b"/direct/7")
        bare = next(r for r in w.rec_a.requests if r.uri == b"/bare/7")
        self.assertEqual(len(headers_named(direct, HEADER.encode())), 1)
        self.assertEqual(headers_named(bare, HEADER.encode()), [])
        _, claims = decode(headers_named(direct, HEADER.encode())[0])
        self.assertEqual((claims["iss"], claims["sub"]), ("gw-a", "alice"))

        # Without a Bearer token A refuses; B is never called.
        before = len(w.rec_b.requests)
        for path in ("/to-b/x", "/agg/7"):
            response = await get(a, path)
            self.assertEqual((response.status, response.body), UNAUTHORIZED, path)
        self.assertEqual(len(w.rec_b.requests), before)

    async def test_without_require_bearer_the_assertion_alone_authenticates(self) -> None:
        w = await world(self)
        # B has no IdP at all: only the assertion can say who the caller is.
        b = await w.gateway_b(require_bearer=False)
        a = await w.gateway_a(b)
        await self.check_hand_off(w, a, b)
        # B refuses the same request without an assertion.
        response = await get(a, "/token-only/x", bearer=w.bearer())
        self.assertEqual((response.status, response.body), UNAUTHORIZED)
        self.assertEqual(challenges(response), ["Bearer"])

    async def test_with_require_bearer_the_assertion_enriches_the_bearer_principal(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=True)
        a = await w.gateway_a(b, forward_token=True)
        await self.check_hand_off(w, a, b)
        # The Bearer token alone: B's own claims (email only), no name or given_name;
        # so those came from A's assertion above.
        response = await get(a, "/token-only/x", bearer=w.bearer())
        self.assertEqual((response.status, response.body), (200, BODY_B))
        self.assert_identity(
            w.rec_b.requests[-1],
            b"admins",
            {
                b"X-User-Email": b"alice@example.com",
                b"X-User-Name": None,
                b"X-User-Given-Name": None,
            },
        )
        self.assertIsNone(b.note)

    async def test_require_bearer_without_the_token_forwarded(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=True)
        a = await w.gateway_a(b, forward_token=False)
        for path in ("/to-b/x", "/agg/1"):
            response = await get(a, path, bearer=w.bearer())
            self.assertEqual(b.note, "ignored: not accompanied by a verified Bearer token", path)
            if path == "/to-b/x":
                # B's 401 relayed by A's proxy.
                self.assertEqual((response.status, response.body), UNAUTHORIZED)
            else:
                # A required api backend that failed.
                self.assertEqual((response.status, response.body), (502, b"bad gateway\n"))
        self.assertEqual(w.rec_b.requests, [])

    async def test_every_request_carries_a_fresh_assertion(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=False)
        a = await w.gateway_a(b)
        token = w.bearer()
        for _ in range(3):
            response = await get(a, "/to-b/x", bearer=token)
            self.assertEqual(response.status, 200)
            self.assertEqual(b.note, "accepted")
            response = await get(a, "/agg/1", bearer=token)
            self.assertEqual(response.status, 200)
            self.assertEqual(b.note, "accepted")
        self.assertEqual(len(w.rec_b.requests), 6)

    async def test_custom_header_end_to_end(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=False, accept_extra="  header: X-Hop-Identity\n")
        a = await w.gateway_a(b, issue_extra=", header: X-Hop-Identity")
        response = await get(a, "/to-b/x", bearer=w.bearer())
        self.assertEqual((response.status, response.body), (200, BODY_B))
        self.assertEqual(b.note, "accepted")
        seen = w.rec_b.requests[-1]
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")
        self.assertEqual(headers_named(seen, b"X-Hop-Identity"), [])
        # B reads the assertion only from its accept.header; the default name is still
        # never forwarded.
        token = w.assertion()
        response = await get(b, "/svc/x", token)
        self.assertEqual((response.status, response.body), UNAUTHORIZED)
        self.assertIsNone(b.note)
        response = await get(b, "/svc/x", headers={"X-Hop-Identity": token})
        self.assertEqual((response.status, response.body), (200, BODY_B))
        response = await get(b, "/pub/x", headers={"X-Gw-Identity": w.assertion()})
        self.assertEqual(headers_named(w.rec_b.requests[-1], b"X-Gw-Identity"), [])
        self.assertIsNone(w.rec_b.requests[-1].header(b"X-User-Id"))


# -- 2. the token --------------------------------------------------------------------------


class TokenShapeTests(AssertionTestCase):
    async def minted(self, w: World, a: Instance, path: str = "/rec/x") -> bytes:
        response = await get(a, path, bearer=w.bearer())
        self.assertEqual((response.status, response.body), (200, BODY_A))
        values = headers_named(w.rec_a.requests[-1], HEADER.encode())
        self.assertEqual(len(values), 1)
        return values[0]

    async def test_exact_shape_and_signature(self) -> None:
        w = await world(self)
        a = await w.gateway_a()
        before = a.now()
        first = await self.minted(w, a)
        second = await self.minted(w, a)
        after = a.now()
        public = VerifyKey(Ed25519Key(w.seed("a-1")).verify_key.encode())
        jtis = []
        for token in (first, second):
            head, payload, signature = token.split(b".")
            self.assertEqual(json.loads(unb64url(head)), {"alg": "EdDSA", "kid": "a-1"})
            # Unpadded base64url, as JWS wants.
            for part in (head, payload, signature):
                self.assertNotIn(b"=", part)
                self.assertEqual(b64url(unb64url(part)).encode(), part)
            claims = json.loads(unb64url(payload))
            self.assertEqual(
                sorted(claims), ["claims", "exp", "groups", "iat", "iss", "jti", "sub"]
            )
            self.assertEqual((claims["iss"], claims["sub"]), ("gw-a", "alice"))
            self.assertIsInstance(claims["iat"], int)
            self.assertTrue(before <= claims["iat"] <= after, (before, claims["iat"], after))
            self.assertEqual(claims["exp"], claims["iat"] + 45)
            self.assertEqual(claims["groups"], ["admins"])
            self.assertEqual(claims["claims"], PASSPORT)
            self.assertIsInstance(claims["jti"], str)
            self.assertGreaterEqual(len(unb64url(claims["jti"])), 16)
            jtis.append(claims["jti"])
            # The signature: Ed25519 over the signing input, by the configured seed.
            raw = unb64url(signature)
            self.assertEqual(len(raw), 64)
            public.verify(head + b"." + payload, raw)
            with self.assertRaises(BadSignatureError):
                public.verify(head + b"." + payload + b"x", raw)
            other = Ed25519Key.generate().verify_key
            with self.assertRaises(BadSignatureError):
                other.verify(head + b"." + payload, raw)
        self.assertNotEqual(jtis[0], jtis[1])
        self.assertNotEqual(first, second)

    async def test_defaults_ttl_60s_and_header(self) -> None:
        w = await world(self)
        a = await w.gateway_a(issue_extra="")
        _, claims = decode(await self.minted(w, a))
        self.assertEqual(claims["exp"] - claims["iat"], 60)
        self.assertNotIn("aud", claims)

    async def test_iat_is_the_gateways_clock(self) -> None:
        w = await world(self)
        a = await w.gateway_a()
        a.clock.advance(1000)
        before = a.now()
        response = await get(a, "/rec/x", bearer=w.bearer(now=before))
        self.assertEqual(response.status, 200)
        _, claims = decode(headers_named(w.rec_a.requests[-1], HEADER.encode())[0])
        self.assertTrue(before <= claims["iat"] <= a.now())
        self.assertEqual(claims["exp"], claims["iat"] + 45)

    async def test_audience(self) -> None:
        w = await world(self)
        a = await w.gateway_a(issue_extra=", ttl: 10s, audience: gw-b")
        header, claims = decode(await self.minted(w, a))
        self.assertEqual(header, {"alg": "EdDSA", "kid": "a-1"})
        self.assertEqual(
            sorted(claims), ["aud", "claims", "exp", "groups", "iat", "iss", "jti", "sub"]
        )
        self.assertEqual(claims["aud"], "gw-b")
        self.assertEqual(claims["exp"] - claims["iat"], 10)

    async def test_custom_header(self) -> None:
        w = await world(self)
        a = await w.gateway_a(issue_extra=", header: X-Hop-Identity")
        response = await get(
            a,
            "/rec/x",
            "client-sent",
            bearer=w.bearer(),
            headers={"X-Hop-Identity": "client-sent too"},
        )
        self.assertEqual(response.status, 200)
        seen = w.rec_a.requests[-1]
        self.assertEqual(headers_named(seen, b"X-Gw-Identity"), [])
        hop = headers_named(seen, b"X-Hop-Identity")
        self.assertEqual(len(hop), 1)
        self.assertEqual(decode(hop[0])[1]["sub"], "alice")

    async def test_no_principal_no_assertion(self) -> None:
        w = await world(self)
        a = await w.gateway_a()
        response = await get(a, "/pub/x")
        self.assertEqual((response.status, response.body), (200, BODY_A))
        self.assertEqual(headers_named(w.rec_a.requests[-1], HEADER.encode()), [])
        self.assertIsNone(w.rec_a.requests[-1].header(b"X-User-Id"))
        # The same public route with a principal: an assertion.
        await self.minted(w, a, "/pub/x")

    async def test_claims_with_special_characters_survive_the_hop(self) -> None:
        w = await world(self)
        w.idp.user["name"] = 'Ålice, "the" Example'
        w.idp.user["groups"] = [
            "cn=admins,ou=groups,dc=example,dc=com",
            "cn=ops,ou=groups,dc=example,dc=com",
        ]
        b = await w.gateway_b(require_bearer=False)
        a = await w.gateway_a(b)
        _, claims = decode(await self.minted(w, a))
        self.assertEqual(claims["claims"]["name"], 'Ålice, "the" Example')
        self.assertEqual(claims["groups"], ["admins", "ops"])
        response = await get(a, "/to-b/x", bearer=w.bearer())
        self.assertEqual(response.status, 200)
        seen = w.rec_b.requests[-1]
        self.assertEqual(seen.header(b"X-User-Groups"), b"admins,ops")
        self.assertEqual(seen.header(b"X-User-Name"), b'%C3%85lice%2C "the" Example')


# -- 3. what B refuses -----------------------------------------------------------------------


class Refusals(AssertionTestCase):
    """
    Each bad assertion is sent to B1 (requireBearer false, no IdP) alone, and to B2
    (requireBearer true) with alice's valid Bearer token.
    """

    async def setup_world(self, b1_extra: str = "", b2_extra: str = "") -> None:
        self.w = await world(self)
        self.b1 = await self.w.gateway_b(require_bearer=False, accept_extra=b1_extra)
        self.b2 = await self.w.gateway_b(require_bearer=True, accept_extra=b2_extra)

    async def ignored(self, token: str, reason: str, message: str = "") -> None:
        w = self.w
        await self.assert_alone_ignored(self.b1, w.rec_b, token, reason, message)
        await self.assert_bearer_only(self.b2, w.rec_b, token, w.bearer(), reason, message)

    async def accepted(self, mint: Callable[[], str], message: str = "") -> None:
        w = self.w
        await self.assert_alone_accepted(self.b1, w.rec_b, mint(), message)
        await self.assert_enriched(self.b2, w.rec_b, mint(), w.bearer(), message)

    async def test_a_good_assertion_is_accepted(self) -> None:
        await self.setup_world()
        await self.accepted(self.w.assertion)
        # Signed by the second configured key.
        await self.accepted(lambda: self.w.assertion(kid="a-2"))
        # The enriched principal is the request's: the Bearer token, cached by B2, still
        # says only what it says on a request without an assertion.
        w, bearer = self.w, self.w.bearer()
        await self.assert_enriched(self.b2, w.rec_b, w.assertion(), bearer)
        response = await get(self.b2, "/svc/x", bearer=bearer)
        self.assertEqual(response.status, 200)
        self.assert_identity(w.rec_b.requests[-1], b"admins", {b"X-User-Team": None})

    async def test_wrong_key(self) -> None:
        await self.setup_world()
        w = self.w
        for kid in ("a-1", "a-2"):
            await self.ignored(w.assertion(kid=kid, key=Ed25519Key.generate()), "bad signature")
        # Another configured key's signature under this kid.
        await self.ignored(w.assertion(kid="a-1", key=w.keys["a-2"]), "bad signature")
        # A key B does not accept at all (the middle hop's) under A's kid.
        await self.ignored(w.assertion(kid="a-1", key=w.keys["b-1"]), "bad signature")

    async def test_unknown_kid(self) -> None:
        await self.setup_world()
        w = self.w
        await self.ignored(w.assertion(kid="a-9", key=w.keys["a-1"]), "unknown kid")
        await self.ignored(w.assertion(kid="b-1"), "unknown kid")
        await self.ignored(w.assertion(kid="A-1", key=w.keys["a-1"]), "unknown kid")
        await self.ignored(w.assertion(kid=None, key=w.keys["a-1"]), "unknown kid")
        for kid in (1, ["a-1"], None, ""):
            token = w.assertion(header={"alg": "EdDSA", "kid": kid}, key=w.keys["a-1"])
            await self.ignored(token, "unknown kid", repr(kid))

    async def test_wrong_issuer(self) -> None:
        await self.setup_world()
        w = self.w
        for iss in ("gw-b", "GW-A", "gw-a ", "", ["gw-a"], 1, None):
            await self.ignored(w.assertion(w.claims(iss=iss)), "wrong issuer", repr(iss))

    async def test_expiry_and_the_30s_leeway(self) -> None:
        await self.setup_world()
        w = self.w
        now = int(reactor.seconds())
        for exp in (now - 31, now - 40, now - 3600):
            await self.ignored(
                w.assertion(w.claims(iat=now - 100, exp=exp)), "expired", f"exp {exp - now}"
            )
        # Within the leeway: accepted.
        await self.accepted(lambda: w.assertion(w.claims(iat=now - 100, exp=now - 28)))
        await self.accepted(lambda: w.assertion(w.claims(iat=now - 100, exp=now + 1)))
        for bad_exp in ("soon", str(now + 60), None, True):
            await self.ignored(
                w.assertion(w.claims(exp=bad_exp)),
                "exp or iat missing or not a number",
                repr(bad_exp),
            )

    async def test_issued_in_the_future(self) -> None:
        await self.setup_world()
        w = self.w
        now = int(reactor.seconds())
        for iat in (now + 32, now + 600):
            await self.ignored(
                w.assertion(w.claims(iat=iat, exp=iat + 60)),
                "issued in the future",
                f"iat {iat - now}",
            )
        await self.accepted(lambda: w.assertion(w.claims(iat=now + 28, exp=now + 88)))
        for bad_iat in (None, "now", False):
            await self.ignored(
                w.assertion(w.claims(iat=bad_iat)),
                "exp or iat missing or not a number",
                repr(bad_iat),
            )

    async def test_expiry_by_the_accepting_gateways_clock(self) -> None:
        """
        A's own assertions (ttl 45 s), sent to B with B's clock moved on.
        """
        await self.setup_world()
        w = self.w
        a = await w.gateway_a()

        async def minted() -> str:
            await get(a, "/rec/x", bearer=w.bearer())
            return headers_named(w.rec_a.requests[-1], HEADER.encode())[0].decode()

        b1 = self.b1
        # exp = iat + 45; refused once B's clock is past exp + 30.
        b1.clock.offset = 45 + 31
        token = await minted()
        response = await get(b1, "/svc/x", token)
        self.assertEqual((response.status, b1.note), (401, "ignored: expired"))
        b1.clock.offset = 45 + 28
        token = await minted()
        response = await get(b1, "/svc/x", token)
        self.assertEqual((response.status, b1.note), (200, "accepted"))
        # A's clock ahead of B's: beyond the leeway refused, within it accepted.
        b1.clock.offset = 0
        a.clock.offset = 33
        token = await minted()
        response = await get(b1, "/svc/x", token)
        self.assertEqual((response.status, b1.note), (401, "ignored: issued in the future"))
        a.clock.offset = 28
        token = await minted()
        response = await get(b1, "/svc/x", token)
        self.assertEqual((response.status, b1.note), (200, "accepted"))

    async def test_tampered_payload(self) -> None:
        await self.setup_world()
        w = self.w
        good = w.assertion()
        head, payload, signature = good.split(".")
        for change in (
            {"sub": "mallory"},
            {"groups": ["asserted", "admins"]},
            {"exp": json.loads(unb64url(payload))["exp"] + 3600},
            {"claims": {"email": "mallory@example.com", "team": "blue"}},
        ):
            claims = {**json.loads(unb64url(payload)), **change}
            forged = b64url(json.dumps(claims, separators=(",", ":")).encode())
            await self.ignored(f"{head}.{forged}.{signature}", "bad signature", repr(change))
        # The same claims, encoded otherwise (spaces): the signature covers the bytes.
        spaced = b64url(json.dumps(json.loads(unb64url(payload))).encode())
        await self.ignored(f"{head}.{spaced}.{signature}", "bad signature")
        # The signature itself spoiled.
        raw = bytearray(unb64url(signature))
        raw[0] ^= 1
        await self.ignored(f"{head}.{payload}.{b64url(bytes(raw))}", "bad signature")
        await self.ignored(f"{head}.{payload}.{b64url(bytes(raw[:63]))}", "malformed signature")
        await self.ignored(f"{head}.{payload}.", "malformed signature")

    async def test_tampered_header(self) -> None:
        await self.setup_world()
        w = self.w
        good = w.assertion()
        _, payload, signature = good.split(".")
        for header in (
            {"alg": "EdDSA", "kid": "a-1", "typ": "JWT"},
            {"kid": "a-1", "alg": "EdDSA"},
            # The other accepted key's kid over a-1's signature.
            {"alg": "EdDSA", "kid": "a-2"},
        ):
            head = b64url(json.dumps(header, separators=(",", ":")).encode())
            await self.ignored(f"{head}.{payload}.{signature}", "bad signature", repr(header))
        # A critical extension is never understood.
        token = w.assertion(header={"alg": "EdDSA", "kid": "a-1", "crit": ["b64"], "b64": False})
        await self.ignored(token, "crit header")

    async def test_alg_other_than_eddsa(self) -> None:
        await self.setup_world()
        w = self.w
        claims = w.claims()
        signed = w.assertion(claims)
        real_signature = signed.split(".")[2]
        public = w.public("a-1")
        rsa = SigningKey.generate("a-1", "RS256")
        attempts: list[tuple[str, dict[str, Any], Callable[[bytes], bytes]]] = []
        for alg in ("none", "None", "NONE"):
            attempts.append((alg, {"alg": alg, "kid": "a-1"}, lambda _: b""))
            attempts.append((alg, {"alg": alg}, lambda _: b""))
        for what, secret in (
            ("raw public key", public),
            ("base64 public key", b64(public).encode()),
            ("base64url public key", b64url(public).encode()),
        ):
            attempts.append((f"HS256 {what}", {"alg": "HS256", "kid": "a-1"}, hmac_signer(secret)))
        attempts.append(("RS256", {"alg": "RS256", "kid": "a-1"}, rsa.signature))
        # The right signature under another name of the algorithm.
        for alg in ("Ed25519", "eddsa", "EDDSA", "EdDSA ", "ES256"):
            attempts.append((alg, {"alg": alg, "kid": "a-1"}, ed25519_signer(w.keys["a-1"])))
        attempts.append(("no alg", {"kid": "a-1"}, ed25519_signer(w.keys["a-1"])))
        for what, header, sign in attempts:
            token = compact_jws(header, claims, sign)
            await self.ignored(token, "alg is not EdDSA", what)
        # alg none with the real signature of an EdDSA token over the same claims.
        head = b64url(json.dumps({"alg": "none", "kid": "a-1"}).encode())
        payload = signed.split(".")[1]
        await self.ignored(f"{head}.{payload}.{real_signature}", "alg is not EdDSA")

    async def test_malformed(self) -> None:
        await self.setup_world()
        w = self.w
        head, payload, signature = w.assertion().split(".")
        for token, reason in (
            ("abc", "not a compact JWS"),
            (f"{head}.{payload}", "not a compact JWS"),
            (f"{head}.{payload}.{signature}.x", "not a compact JWS"),
            (f"{head}=.{payload}.{signature}", "malformed header"),
            (f"!{head}.{payload}.{signature}", "malformed header"),
            (f"{b64url(b'[1]')}.{payload}.{signature}", "malformed header"),
            (f"{b64url(b'not json')}.{payload}.{signature}", "malformed header"),
            # (Past 16 KiB the server refuses the header section itself: 431.)
            ("x" * 12000, "not a compact JWS"),
        ):
            await self.ignored(token, reason, token[:60])
        # Properly signed, but not claims a gateway can use.
        for change, reason in (
            ({"sub": None}, "no subject"),
            ({"sub": ""}, "no subject"),
            ({"sub": 7}, "no subject"),
            ({"jti": None}, "no token id"),
            ({"jti": ""}, "no token id"),
            ({"jti": "x" * 257}, "no token id"),
            ({"groups": "admins"}, "groups is not a list of strings"),
            ({"groups": [1]}, "groups is not a list of strings"),
            ({"claims": ["a"]}, "claims is not an object of claim values"),
            ({"claims": {"x": {"y": 1}}}, "claims is not an object of claim values"),
        ):
            await self.ignored(w.assertion(w.claims(**change)), reason, repr(change))
        await self.ignored(w.assertion({"x": 1}), "wrong issuer")
        # Claims that are JSON but not an object, properly signed.
        head_ok = b64url(json.dumps({"alg": "EdDSA", "kid": "a-1"}).encode())
        body = b64url(b"[1,2]")
        signing_input = f"{head_ok}.{body}".encode()
        sig = b64url(w.keys["a-1"].sign(signing_input).signature)
        await self.ignored(f"{head_ok}.{body}.{sig}", "malformed claims")

    async def test_two_assertion_headers(self) -> None:
        await self.setup_world()
        w = self.w
        for pair in (
            (w.assertion(), w.assertion()),
            (w.assertion(),) * 2,
            (w.assertion(), "garbage"),
        ):
            status, _, body = await raw_get(
                self.b1.port, "/svc/x", [(HEADER, value) for value in pair]
            )
            self.assertEqual((status, body), UNAUTHORIZED)
            self.assertEqual(self.b1.note, "ignored: more than one assertion header")
            status, _, body = await raw_get(
                self.b2.port,
                "/svc/x",
                [(HEADER, value) for value in pair] + [("Authorization", f"Bearer {w.bearer()}")],
            )
            self.assertEqual((status, body), (200, BODY_B))
            self.assertEqual(self.b2.note, "ignored: more than one assertion header")
            self.assert_identity(w.rec_b.requests[-1], b"admins", {b"X-User-Team": None})
        # One of them alone is fine.
        status, _, _ = await raw_get(self.b1.port, "/svc/x", [(HEADER, w.assertion())])
        self.assertEqual((status, self.b1.note), (200, "accepted"))

    async def test_replayed_token_id(self) -> None:
        await self.setup_world()
        w = self.w
        b1, b2 = self.b1, self.b2
        token = w.assertion()
        await self.assert_alone_accepted(b1, w.rec_b, token)
        await self.assert_alone_ignored(b1, w.rec_b, token, "replayed token id")
        # Another token with the same jti, otherwise different (signed again).
        claims = decode(token)[1]
        again = w.assertion({**claims, "iat": claims["iat"] - 1})
        await self.assert_alone_ignored(b1, w.rec_b, again, "replayed token id")
        # Each gateway remembers what it accepted (B2 had not seen it).
        bearer = w.bearer()
        await self.assert_enriched(b2, w.rec_b, token, bearer)
        await self.assert_bearer_only(b2, w.rec_b, token, bearer, "replayed token id")
        # Refused again and again; a fresh token id is fine.
        await self.assert_alone_ignored(b1, w.rec_b, token, "replayed token id")
        await self.assert_alone_accepted(b1, w.rec_b, w.assertion())

    async def test_replay_of_a_gateway_minted_assertion(self) -> None:
        await self.setup_world()
        w = self.w
        a = await w.gateway_a()
        await get(a, "/rec/x", bearer=w.bearer())
        minted = headers_named(w.rec_a.requests[-1], HEADER.encode())[0].decode()
        response = await get(self.b1, "/svc/x", minted)
        self.assertEqual((response.status, self.b1.note), (200, "accepted"))
        self.assertEqual(w.rec_b.requests[-1].header(b"X-User-Given-Name"), b"Alice")
        response = await get(self.b1, "/svc/x", minted)
        self.assertEqual(
            (response.status, response.body, self.b1.note),
            (*UNAUTHORIZED, "ignored: replayed token id"),
        )
        # Past its expiry (and the leeway) the id is forgotten; the token is expired.
        self.b1.clock.offset = 45 + 31
        response = await get(self.b1, "/svc/x", minted)
        self.assertEqual((response.status, self.b1.note), (401, "ignored: expired"))

    async def test_subject_mismatch_with_the_bearer_token(self) -> None:
        await self.setup_world()
        w = self.w
        for subject in ("bob", "Alice", "alice "):
            token = w.assertion(w.claims(sub=subject))
            await self.assert_bearer_only(
                self.b2, w.rec_b, token, w.bearer(), "subject differs from the token's", subject
            )
        # B1 has no Bearer to compare with: bob's assertion alone authenticates bob.
        response = await get(self.b1, "/svc/x", w.assertion(w.claims(sub="bob")))
        self.assertEqual(response.status, 200)
        self.assertEqual(w.rec_b.requests[-1].header(b"X-User-Id"), b"bob")

    async def test_unaccompanied_assertion_under_require_bearer(self) -> None:
        await self.setup_world()
        w = self.w
        b2 = self.b2
        before = len(w.rec_b.requests)
        response = await get(b2, "/svc/x", w.assertion())
        self.assertEqual((response.status, response.body), UNAUTHORIZED)
        self.assertEqual(challenges(response), ["Bearer"])
        self.assertEqual(b2.note, "ignored: not accompanied by a verified Bearer token")
        # A rejected Bearer token does not accompany it either.
        rogue = w.idp.mint_access_token(
            {"aud": CLIENT_ID}, key=SigningKey.generate("rsa-1", "RS256"), user_claims=True
        )
        response = await get(b2, "/svc/x", w.assertion(), bearer=rogue)
        self.assertEqual((response.status, response.body), UNAUTHORIZED)
        self.assertEqual(challenges(response), ['Bearer error="invalid_token"'])
        self.assertEqual(b2.note, "ignored: not accompanied by a verified Bearer token")
        self.assertEqual(b2.log[-1]["auth"], "Bearer rejected: bad signature")
        self.assertEqual(len(w.rec_b.requests), before)
        # On a public route: anonymous.
        response = await get(b2, "/pub/x", w.assertion())
        self.assertEqual(response.status, 200)
        self.assertIsNone(w.rec_b.requests[-1].header(b"X-User-Id"))
        self.assertEqual(b2.note, "ignored: not accompanied by a verified Bearer token")

    async def test_audience(self) -> None:
        await self.setup_world(b1_extra="  audience: gw-b\n", b2_extra="  audience: gw-b\n")
        w = self.w
        for aud in ("gw-c", "GW-B", "gw-b ", "", ["gw-c"], [], 7):
            await self.ignored(w.assertion(w.claims(aud=aud)), "wrong audience", repr(aud))
        await self.ignored(w.assertion(), "wrong audience", "missing")
        await self.accepted(lambda: w.assertion(w.claims(aud="gw-b")))
        await self.accepted(lambda: w.assertion(w.claims(aud=["gw-c", "gw-b"])))

    async def test_audience_from_gateway_a(self) -> None:
        await self.setup_world(b1_extra="  audience: gw-b\n")
        w = self.w
        for_b = await w.gateway_a(self.b1, issue_extra=", audience: gw-b")
        response = await get(for_b, "/to-b/x", bearer=w.bearer())
        self.assertEqual((response.status, self.b1.note), (200, "accepted"))
        for_c = await w.gateway_a(self.b1, issue_extra=", audience: gw-c")
        response = await get(for_c, "/to-b/x", bearer=w.bearer())
        self.assertEqual((response.status, self.b1.note), (401, "ignored: wrong audience"))
        unbound = await w.gateway_a(self.b1)
        response = await get(unbound, "/to-b/x", bearer=w.bearer())
        self.assertEqual((response.status, self.b1.note), (401, "ignored: wrong audience"))
        # Without accept.audience, a token bound to some recipient is not for this one
        # (RFC 7519 4.1.3); one without aud is.
        response = await get(self.b2, "/svc/x", w.assertion(w.claims(aud="gw-c")), w.bearer())
        self.assertEqual(
            (response.status, self.b2.note),
            (200, "ignored: bound to an audience, and none is accepted here"),
        )
        response = await get(self.b2, "/svc/x", w.assertion(w.claims()), w.bearer())
        self.assertEqual((response.status, self.b2.note), (200, "accepted"))


class StrippingTests(AssertionTestCase):
    async def test_a_strips_a_client_assertion_and_sends_its_own(self) -> None:
        w = await world(self)
        a = await w.gateway_a()
        # A well-signed one, with A's own key even: still the client's, still dropped.
        forged = w.assertion(w.claims(sub="mallory", groups=["root"]))
        response = await get(a, "/rec/x", forged, bearer=w.bearer())
        self.assertEqual(response.status, 200)
        values = headers_named(w.rec_a.requests[-1], HEADER.encode())
        self.assertEqual(len(values), 1)
        self.assertNotEqual(values[0], forged.encode())
        _, claims = decode(values[0])
        self.assertEqual((claims["sub"], claims["groups"]), ("alice", ["admins"]))
        # Lower case, or twice: the same.
        status, _, _ = await raw_get(
            a.port,
            "/rec/x",
            [
                ("x-gw-identity", forged),
                ("X-GW-IDENTITY", forged),
                ("Authorization", f"Bearer {w.bearer()}"),
            ],
        )
        self.assertEqual(status, 200)
        values = headers_named(w.rec_a.requests[-1], HEADER.encode())
        self.assertEqual(len(values), 1)
        self.assertEqual(decode(values[0])[1]["sub"], "alice")

    async def test_a_client_assertion_never_reaches_b_through_a(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=False)
        a = await w.gateway_a(b)
        # Signed with A's very key: what a leaked one would look like.
        forged = w.assertion(w.claims(sub="mallory", groups=["root"]))
        response = await get(a, "/to-b/x", forged, bearer=w.bearer())
        self.assertEqual((response.status, b.note), (200, "accepted"))
        self.assert_identity(w.rec_b.requests[-1], b"admins", {b"X-User-Given-Name": b"Alice"})
        # A route without forwardIdentity: had A passed the client's on, B would take
        # the caller for mallory.
        before = len(w.rec_b.requests)
        response = await get(a, "/token-only/x", forged, bearer=w.bearer())
        self.assertEqual((response.status, response.body), UNAUTHORIZED)
        self.assertIsNone(b.note)
        self.assertEqual(len(w.rec_b.requests), before)
        response = await get(a, "/agg/3", forged, bearer=w.bearer())
        self.assertEqual(response.status, 200)
        self.assertEqual(w.rec_b.requests[-1].header(b"X-User-Id"), b"alice")

    async def test_never_forwarded_without_forward_identity(self) -> None:
        w = await world(self)
        a = await w.gateway_a()
        forged = w.assertion()
        response = await get(a, "/plain/x", forged, bearer=w.bearer())
        self.assertEqual(response.status, 200)
        self.assertEqual(headers_named(w.rec_a.requests[-1], HEADER.encode()), [])
        # Anonymous on a forwardIdentity route: no principal, nothing forwarded.
        response = await get(a, "/pub/x", forged)
        self.assertEqual(response.status, 200)
        self.assertEqual(headers_named(w.rec_a.requests[-1], HEADER.encode()), [])
        # The api fan-out: only the gateway's own, only to the forwardIdentity backend.
        response = await get(a, "/agg/2", forged, bearer=w.bearer())
        self.assertEqual(response.status, 200)
        bare = next(r for r in w.rec_a.requests if r.uri == b"/bare/2")
        direct = next(r for r in w.rec_a.requests if r.uri == b"/direct/2")
        self.assertEqual(headers_named(bare, HEADER.encode()), [])
        self.assertNotEqual(headers_named(direct, HEADER.encode()), [forged.encode()])
        self.assertEqual(len(headers_named(direct, HEADER.encode())), 1)

    async def test_stripped_by_a_gateway_without_assertions(self) -> None:
        w = await world(self)
        port = serve_yaml(
            self,
            f"""\
kind: Gateway
metadata: {{name: plain}}
spec:
  listen: "127.0.0.1:0"
{route("all", "/", proxy(w.rec_a.port), auth="public")}""",
        )
        response = await Browser().get(
            f"http://127.0.0.1:{port}/x", headers={HEADER: w.assertion()}
        )
        self.assertEqual(response.status, 200)
        self.assertEqual(headers_named(w.rec_a.requests[-1], HEADER.encode()), [])

    async def test_b_never_forwards_the_assertion_it_read(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=False)
        for path in ("/svc/x", "/pub/x"):
            response = await get(b, path, w.assertion())
            self.assertEqual(response.status, 200)
            self.assertEqual(headers_named(w.rec_b.requests[-1], HEADER.encode()), [])
            self.assertEqual(b.note, "accepted")
        # Client-sent X-User-* never pass either: the identity is the assertion's.
        response = await get(
            b, "/svc/x", w.assertion(), headers={"X-User-Id": "root", "X-User-Groups": "root"}
        )
        self.assertEqual(response.status, 200)
        self.assert_identity(w.rec_b.requests[-1], b"asserted", {b"X-User-Team": b"blue"})


# -- 4. configuration ------------------------------------------------------------------------

PREFIX = 'document 1, Gateway "gw": spec.identity.assertion'
SEED = bytes(range(32))


def assertion_config(block: str, routes: str = "") -> str:
    return (
        'kind: Gateway\nmetadata: {name: gw}\nspec:\n  listen: "127.0.0.1:0"\n'
        "  identity:\n    assertion:\n" + textwrap.indent(textwrap.dedent(block), "      ") + routes
    )


class ConfigTests(SynchronousTestCase):
    def problems(self, block: str, routes: str = "") -> list[str]:
        return problems_of(self.mktemp(), assertion_config(block, routes), gateway=False)

    def issue_problems(self, fields: str) -> list[str]:
        return self.problems(f"issue: {{{fields}}}\n")

    def accept_problems(self, keys: str, fields: str = "issuer: gw-a") -> list[str]:
        return self.problems(f"accept:\n  {fields}\n  keys: {keys}\n")

    def test_issue_fields_missing(self) -> None:
        self.assertEqual(
            self.issue_problems("ttl: 30s"),
            [
                f"{PREFIX}.issue.name: required field is missing",
                f"{PREFIX}.issue.keyId: required field is missing",
                f"{PREFIX}.issue.key: required field is missing",
            ],
        )
        key = b64(SEED)
        self.assertEqual(
            self.issue_problems(f'name: "", keyId: "", key: "{key}"'),
            [
                f"{PREFIX}.issue.name: must not be empty",
                f"{PREFIX}.issue.keyId: must not be empty",
            ],
        )

    def test_empty_keys_are_config_errors(self) -> None:
        """
        An empty C{issue.key} or C{accept.keys[].publicKey} is no key: a config error
        naming the field (the gateway would otherwise fail at build, in PyNaCl).
        """
        issue = self.issue_problems('name: a, keyId: k, key: ""')
        self.assertEqual(len(issue), 1, issue)
        self.assertIn(
            issue[0],
            (
                f"{PREFIX}.issue.key: must not be empty",
                f"{PREFIX}.issue.key: the Ed25519 seed must decode to exactly 32 bytes, got 0",
            ),
        )
        accept = self.accept_problems('[{keyId: k, publicKey: ""}]')
        self.assertEqual(len(accept), 1, accept)
        self.assertIn(
            accept[0],
            (
                f"{PREFIX}.accept.keys[0].publicKey: must not be empty",
                f"{PREFIX}.accept.keys[0].publicKey: the Ed25519 public key must decode to "
                "exactly 32 bytes, got 0",
            ),
        )

    def test_issue_key_length(self) -> None:
        for size in (1, 16, 31, 33, 64):
            problems = self.issue_problems(f'name: a, keyId: k, key: "{b64(bytes(size))}"')
            self.assertEqual(
                problems,
                [
                    f"{PREFIX}.issue.key: the Ed25519 seed must decode to exactly 32 bytes, "
                    f"got {size}"
                ],
            )

    def test_issue_key_alphabet(self) -> None:
        standard = b64(SEED)
        for text in (
            "not base64 at all!",
            standard[:-2] + "*=",
            standard[:10] + " " + standard[10:],
            "é" * 43,
            standard + "==",
            standard[:-3],  # an impossible length
        ):
            problems = self.issue_problems(f"name: a, keyId: k, key: {json.dumps(text)}")
            self.assertEqual(
                problems,
                [
                    f"{PREFIX}.issue.key: the Ed25519 seed is not valid base64 "
                    "(standard or raw URL-safe)"
                ],
                text,
            )

    def test_issue_key_mixing_both_alphabets(self) -> None:
        # Neither standard base64 (it has "-" and "_") nor URL-safe (it has "+" and "/").
        seed = b"\xfb\xff\xbf" * 10 + b"\xfb\xff"
        standard = b64(seed)
        self.assertIn("+", standard)
        self.assertIn("/", standard)
        mixed = standard.replace("+", "-", 1)
        problems = self.issue_problems(f'name: a, keyId: k, key: "{mixed}"')
        self.assertEqual(
            problems,
            [
                f"{PREFIX}.issue.key: the Ed25519 seed is not valid base64 "
                "(standard or raw URL-safe)"
            ],
        )

    def test_issue_key_encodings_accepted(self) -> None:
        seed = b"\xfb\xff\xbf" * 10 + b"\xfb\xff"
        standard = b64(seed)
        urlsafe = base64.urlsafe_b64encode(seed).decode()
        self.assertIn("+", standard)
        self.assertIn("-", urlsafe)
        for text in (standard, standard.rstrip("="), urlsafe.rstrip("="), urlsafe):
            config = load_text(
                self.mktemp(),
                assertion_config(f'issue: {{name: a, keyId: k, key: "{text}"}}\n'),
                gateway=False,
            )
            assertion = config.gateway.identity.assertion
            assert assertion is not None and assertion.issue is not None
            self.assertEqual(assertion.issue.seed, seed, text)
            self.assertEqual(
                (assertion.issue.ttl, assertion.issue.header, assertion.issue.audience),
                (60.0, "X-Gw-Identity", None),
            )
            self.assertIsNone(assertion.accept)

    def test_issue_ttl(self) -> None:
        key = b64(SEED)
        for ttl, message in (
            ("0s", 'must be greater than 0, got "0s"'),
            ("0", 'must be greater than 0, got "0"'),
            ("-5s", 'must be greater than 0, got "-5s"'),
        ):
            self.assertEqual(
                self.issue_problems(f'name: a, keyId: k, key: "{key}", ttl: "{ttl}"'),
                [f"{PREFIX}.issue.ttl: {message}"],
                ttl,
            )
        problems = self.issue_problems(f'name: a, keyId: k, key: "{key}", ttl: soon')
        self.assertEqual(len(problems), 1)
        self.assertTrue(problems[0].startswith(f"{PREFIX}.issue.ttl: "), problems)

    def test_headers_invalid(self) -> None:
        key = b64(SEED)
        for header in ("X Gw", "X-Gw:", "", "X-Gw-Identitä"):
            self.assertEqual(
                self.issue_problems(f'name: a, keyId: k, key: "{key}", header: "{header}"'),
                [f'{PREFIX}.issue.header: "{header}" is not a valid HTTP header name'],
                header,
            )
            self.assertEqual(
                self.accept_problems(
                    f'[{{keyId: a, publicKey: "{key}"}}]', f'issuer: a\n  header: "{header}"'
                ),
                [f'{PREFIX}.accept.header: "{header}" is not a valid HTTP header name'],
                header,
            )

    def test_issue_audience_empty(self) -> None:
        key = b64(SEED)
        self.assertEqual(
            self.issue_problems(f'name: a, keyId: k, key: "{key}", audience: ""'),
            [f"{PREFIX}.issue.audience: must not be empty"],
        )
        self.assertEqual(
            self.problems(
                f'accept: {{issuer: a, audience: "", keys: [{{keyId: a, publicKey: "{key}"}}]}}\n'
            ),
            [f"{PREFIX}.accept.audience: must not be empty"],
        )

    def test_accept_issuer_missing(self) -> None:
        key = b64(SEED)
        self.assertEqual(
            self.problems(f'accept: {{keys: [{{keyId: a, publicKey: "{key}"}}]}}\n'),
            [f"{PREFIX}.accept.issuer: required field is missing"],
        )
        self.assertEqual(
            self.problems(f'accept: {{issuer: "", keys: [{{keyId: a, publicKey: "{key}"}}]}}\n'),
            [f"{PREFIX}.accept.issuer: must not be empty"],
        )

    def test_accept_keys_missing_or_empty(self) -> None:
        self.assertEqual(
            self.problems("accept: {issuer: a}\n"),
            [f"{PREFIX}.accept.keys: required field is missing"],
        )
        self.assertEqual(
            self.problems("accept: {issuer: a, keys: []}\n"),
            [f"{PREFIX}.accept.keys: must list at least one entry"],
        )

    def test_accept_key_fields(self) -> None:
        for size in (16, 31, 33, 64):
            self.assertEqual(
                self.accept_problems(f'[{{keyId: a, publicKey: "{b64(bytes(size))}"}}]'),
                [
                    f"{PREFIX}.accept.keys[0].publicKey: the Ed25519 public key must decode "
                    f"to exactly 32 bytes, got {size}"
                ],
            )
        self.assertEqual(
            self.accept_problems('[{keyId: a, publicKey: "%%%"}]'),
            [
                f"{PREFIX}.accept.keys[0].publicKey: the Ed25519 public key is not valid "
                "base64 (standard or raw URL-safe)"
            ],
        )
        self.assertEqual(
            self.accept_problems("[{}]"),
            [
                f"{PREFIX}.accept.keys[0].keyId: required field is missing",
                f"{PREFIX}.accept.keys[0].publicKey: required field is missing",
            ],
        )

    def test_accept_duplicate_key_id(self) -> None:
        one, two = b64(SEED), b64(bytes(32))
        self.assertEqual(
            self.accept_problems(
                f'[{{keyId: a, publicKey: "{one}"}}, {{keyId: b, publicKey: "{two}"}}, '
                f'{{keyId: a, publicKey: "{two}"}}]'
            ),
            [f'{PREFIX}.accept.keys[2].keyId: "a" is listed twice'],
        )

    def test_accept_defaults(self) -> None:
        key = b64url(SEED)
        config = load_text(
            self.mktemp(),
            assertion_config(f'accept: {{issuer: a, keys: [{{keyId: k, publicKey: "{key}"}}]}}\n'),
            gateway=False,
        )
        assertion = config.gateway.identity.assertion
        assert assertion is not None and assertion.accept is not None
        accept = assertion.accept
        self.assertEqual(
            (accept.issuer, accept.header, accept.require_bearer, accept.audience),
            ("a", "X-Gw-Identity", True, None),
        )
        self.assertEqual([(k.key_id, k.public_key) for k in accept.keys], [("k", SEED)])
        self.assertIsNone(assertion.issue)

    def test_neither_issue_nor_accept(self) -> None:
        for block in ("{}\n", "\n      issue: null\n"):
            problems = problems_of(
                self.mktemp(),
                'kind: Gateway\nmetadata: {name: gw}\nspec:\n  listen: "127.0.0.1:0"\n'
                f"  identity:\n    assertion: {block}",
                gateway=False,
            )
            self.assertEqual(problems, [f"{PREFIX}: configure issue, accept, or both"], block)

    def test_unknown_fields(self) -> None:
        key = b64(SEED)
        self.assertEqual(
            self.problems(
                f'issue: {{name: a, keyId: k, key: "{key}", tll: 5s}}\n'
                f'accept: {{issuer: a, keys: [{{keyId: k, publicKey: "{key}", kid: x}}], '
                "requireBearr: false}\n"
                "issuer: x\n"
            ),
            [
                f'{PREFIX}.issue.tll: unknown field; did you mean "ttl"?',
                f"{PREFIX}.accept.keys[0].kid: unknown field",
                f'{PREFIX}.accept.requireBearr: unknown field; did you mean "requireBearer"?',
                f'{PREFIX}.issuer: unknown field; did you mean "issue"?',
            ],
        )

    def test_require_bearer_must_be_a_boolean(self) -> None:
        key = b64(SEED)
        self.assertEqual(
            self.problems(
                f'accept: {{issuer: a, requireBearer: "no", '
                f'keys: [{{keyId: k, publicKey: "{key}"}}]}}\n'
            ),
            [
                f"{PREFIX}.accept.requireBearer: expected a boolean (true or false), got a string",
            ],
        )

    def test_forward_identity_without_issue(self) -> None:
        key = b64(SEED)
        routes = route(
            "p",
            "/p/",
            '{type: reverse-proxy, upstream: "http://127.0.0.1:1", forwardIdentity: true}',
        ) + route(
            "q",
            "/q/",
            '{type: api, backends: [{group: a, upstream: "http://127.0.0.1:1", path: /a}, '
            '{group: b, upstream: "http://127.0.0.1:1", path: /b, forwardIdentity: true}]}',
        )
        expected = [
            'document 2, Route "p": spec.handler.forwardIdentity: needs '
            "identity.assertion.issue in the Gateway to mint assertions",
            'document 3, Route "q": spec.handler.backends[1].forwardIdentity: needs '
            "identity.assertion.issue in the Gateway to mint assertions",
        ]
        # No assertion block at all; and one that only accepts.
        no_block = problems_of(
            self.mktemp(),
            'kind: Gateway\nmetadata: {name: gw}\nspec:\n  listen: "127.0.0.1:0"\n' + routes,
            gateway=False,
        )
        self.assertEqual(no_block, expected)
        accept_only = self.problems(
            f"accept: {{issuer: a, requireBearer: false,\n"
            f'  keys: [{{keyId: k, publicKey: "{key}"}}]}}\n',
            routes,
        )
        self.assertEqual(accept_only, expected)
        # With an issue block: fine.
        load_text(
            self.mktemp(),
            assertion_config(f'issue: {{name: a, keyId: k, key: "{key}"}}\n', routes),
            gateway=False,
        )


# -- 5. a middle hop -----------------------------------------------------------------------


class MiddleHopTests(AssertionTestCase):
    async def hops(self, require_bearer: bool) -> tuple[World, Instance, Instance, Instance]:
        """
        A -> B -> C: B accepts A's assertions and issues its own (C{gw-b}, key C{b-1});
        C accepts B's. A's C{/to-b/} reaches B's C{/to-b/} (forwardIdentity to C); B's
        C{/rec/} shows what B mints.
        """
        w = await world(self)
        c = await w.serve(
            w.config(
                "c",
                w.accept("gw-b", ("b-1",), require_bearer),
                route("svc", "/", proxy(w.rec_c.port)),
                idp=require_bearer,
                claims="[email]",
            )
        )
        b = await w.gateway_b(
            require_bearer,
            issue=w.issue("gw-b", "b-1"),
            routes=route(
                "to-c",
                "/to-b/",
                proxy(c.port, forwardIdentity=True, forwardAccessToken=require_bearer),
            )
            + route("rec", "/rec/", proxy(w.rec_b.port, forwardIdentity=True)),
        )
        a = await w.gateway_a(b, forward_token=require_bearer)
        return w, a, b, c

    async def check(self, w: World, a: Instance, b: Instance, c: Instance) -> None:
        response = await get(a, "/to-b/x", bearer=w.bearer())
        self.assertEqual((response.status, response.body), (200, BODY_C))
        self.assertEqual((b.note, c.note), ("accepted", "accepted"))
        seen = w.rec_c.requests[-1]
        self.assert_identity(
            seen,
            b"admins",
            {
                b"X-User-Email": b"alice@example.com",
                b"X-User-Name": b"Alice Example",
                b"X-User-Given-Name": b"Alice",
            },
        )
        # What B mints: its own issuer and key, A's identity.
        response = await get(b, "/rec/x", w.assertion(w.claims(groups=["ops"])), w.bearer())
        self.assertEqual(response.status, 200)
        minted = headers_named(w.rec_b.requests[-1], HEADER.encode())
        self.assertEqual(len(minted), 1)
        header, claims = decode(minted[0])
        self.assertEqual(header, {"alg": "EdDSA", "kid": "b-1"})
        self.assertEqual(
            (claims["iss"], claims["sub"], claims["groups"]), ("gw-b", "alice", ["ops"])
        )
        head, payload, signature = minted[0].split(b".")
        VerifyKey(w.public("b-1")).verify(head + b"." + payload, unb64url(signature))
        # A's assertion sent straight to C: not C's issuer's key.
        await get(a, "/rec/x", bearer=w.bearer())
        from_a = headers_named(w.rec_a.requests[-1], HEADER.encode())[0]
        before = len(w.rec_c.requests)
        if c.gateway.idp is None:
            response = await get(c, "/x", from_a)
            self.assertEqual((response.status, response.body), UNAUTHORIZED)
            self.assertEqual(len(w.rec_c.requests), before)
        else:
            # With a Bearer token: only the token's principal (C's own claims).
            response = await get(c, "/x", from_a, w.bearer())
            self.assertEqual((response.status, response.body), (200, BODY_C))
            self.assert_identity(
                w.rec_c.requests[-1],
                b"admins",
                {b"X-User-Email": b"alice@example.com", b"X-User-Given-Name": None},
            )
        self.assertEqual(c.note, "ignored: unknown kid")

    async def test_without_require_bearer(self) -> None:
        w, a, b, c = await self.hops(require_bearer=False)
        await self.check(w, a, b, c)

    async def test_with_require_bearer_and_the_token_forwarded(self) -> None:
        w, a, b, c = await self.hops(require_bearer=True)
        await self.check(w, a, b, c)
        self.assertIsNone(w.rec_c.requests[-1].header(b"Authorization"))
