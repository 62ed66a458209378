"""
An id_token is never a Bearer token (issue 36, point 2), end to end on real sockets
against the in-repo fake OpenID provider (tests/support/fake_idp.py): when the audience a
Bearer token must have is the login client (C{bearer.audience} unset, or set to the
clientID), a token signed by the IdP for that audience is taken only with positive
access-token evidence: a C{typ} header C{at+jwt}, or a C{scope}, C{scp} or
C{client_id} claim. An id_token without a nonce has none of them. With an API audience
of its own (C{bearer.audience}) what is accepted is unchanged.

And C{edgegw check} warns about a login IdP whose service routes rely on that default.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from edgegw.check import check
from tests.support.configs import write_tree
from tests.test_bearer import CLIENT_ID, BearerTestCase, BearerWorld, bearer_world

OTHER_CLIENT = "another-client"
"""A client ID that is not the gateway's."""

NO_EVIDENCE = ("scope", "client_id")
"""The claims of the fake IdP's access tokens that show them to be access tokens."""


def id_token_like(
    w: BearerWorld,
    claims: dict[str, Any] | None = None,
    typ: str | None = "JWT",
    drop: tuple[str, ...] = (),
) -> str:
    """
    A token signed by the IdP with what an id_token without a nonce has (C{iss},
    C{sub}, C{aud} the client, C{azp}, C{exp}, C{iat}, the user's claims; a C{typ}
    header C{JWT} unless told otherwise), with C{claims} added: no access-token
    evidence unless C{claims} or C{typ} bring some.
    """
    base: dict[str, Any] = {"azp": CLIENT_ID}
    base.update(claims or {})
    dropped = [name for name in (*NO_EVIDENCE, "jti", *drop) if name not in base]
    return w.token(base, drop=dropped, header={"typ": typ})


class DefaultAudience(BearerTestCase):
    """
    C{bearer.audience} unset: the audience required is the clientID.
    """

    async def test_an_id_token_without_nonce_is_refused(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        for typ in ("JWT", None, "jwt", "application/jwt"):
            await self.assert_rejected(w, id_token_like(w, typ=typ), message=f"typ {typ}")
        # Nor is it forwarded to a backend as an access token.
        await self.assert_rejected(w, id_token_like(w), "/fwd/x")

    async def test_each_kind_of_evidence_is_enough(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        for typ in ("at+jwt", "AT+JWT", "application/at+jwt", "Application/At+JWT"):
            await self.assert_accepted(w, id_token_like(w, typ=typ))
        for claims in (
            {"scope": "openid"},
            {"scope": "api read"},
            {"scp": "api"},
            {"scp": ["api", "read"]},
            {"client_id": CLIENT_ID},
            {"client_id": OTHER_CLIENT},
        ):
            await self.assert_accepted(w, id_token_like(w, claims))
        # The fake IdP's own access tokens (typ at+jwt, scope, client_id) and each of
        # them with only one of the three.
        await self.assert_accepted(w, w.token())
        await self.assert_accepted(w, w.token(drop=NO_EVIDENCE))
        await self.assert_accepted(w, w.token(drop=["scope"], header={"typ": "JWT"}))
        await self.assert_accepted(w, w.token(drop=["client_id"], header={"typ": None}))

    async def test_each_missing_evidence_is_refused(self) -> None:
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        # The fake IdP's access token with its evidence taken away, one way at a time.
        await self.assert_rejected(w, w.token(drop=NO_EVIDENCE, header={"typ": "JWT"}))
        await self.assert_rejected(w, w.token(drop=NO_EVIDENCE, header={"typ": None}))
        await self.assert_rejected(w, w.token(drop=NO_EVIDENCE, header={"typ": "application/jwt"}))

    async def test_hollow_evidence_is_no_evidence(self) -> None:
        """
        Attack: claims with the right names and nothing in them (or not of their
        type): an empty or blank C{scope}, an empty C{scope} or C{scp} list or one of
        empty strings, an empty or non-string C{client_id}; a C{typ} that only looks
        like C{at+jwt}. (A list of scopes in C{scope} is evidence: the review's
        tests/test_identity_review.py.)
        """
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        hollow: list[dict[str, Any]] = [
            {"scope": ""},
            {"scope": "   "},
            {"scope": []},
            {"scope": ["api", " "]},
            {"scope": None},
            {"scp": ""},
            {"scp": []},
            {"scp": [""]},
            {"scp": ["api", 1]},
            {"scp": {"api": True}},
            {"client_id": ""},
            {"client_id": " "},
            {"client_id": 7},
            {"client_id": [CLIENT_ID]},
            {"client_id": None},
        ]
        for claims in hollow:
            await self.assert_rejected(w, id_token_like(w, claims), message=repr(claims))
        for typ in ("at+jwt ", "at-jwt", "jwt+at"):
            await self.assert_rejected(w, id_token_like(w, typ=typ), message=typ)

    async def test_id_token_markers_win_over_evidence(self) -> None:
        """
        Attack: an id_token that also carries access-token evidence (an IdP adding
        C{scope} or C{client_id} to its id_tokens, or typing them C{at+jwt}) is still an
        id_token when it has a nonce or a hash of the code or access token.
        """
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        for marker in ({"at_hash": "x"}, {"nonce": "n"}, {"c_hash": "y"}):
            for evidence in ({"scope": "openid"}, {"client_id": CLIENT_ID}):
                claims = {**marker, **evidence}
                await self.assert_rejected(w, id_token_like(w, claims), message=repr(claims))
            await self.assert_rejected(
                w, id_token_like(w, marker, typ="at+jwt"), message=f"at+jwt {marker}"
            )

    async def test_an_audience_list_naming_the_client(self) -> None:
        """
        Attack: C{aud} a list with the client and another audience passes the audience
        check all the same: it needs the evidence too.
        """
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        for audience in ([CLIENT_ID, "api"], ["api", CLIENT_ID], [CLIENT_ID]):
            await self.assert_rejected(
                w, id_token_like(w, {"aud": audience}), message=str(audience)
            )
            await self.assert_accepted(w, id_token_like(w, {"aud": audience, "scope": "api"}))

    async def test_a_refused_token_is_not_cached(self) -> None:
        """
        The refusal is not remembered as a principal: the same token is refused each
        time, and a token with evidence of the same user is accepted meanwhile.
        """
        w = await bearer_world(self, identity_spec="    userInfo: never\n")
        token = id_token_like(w)
        for _ in range(2):
            await self.assert_rejected(w, token)
        await self.assert_accepted(w, w.token())
        await self.assert_rejected(w, token)

    async def test_explicit_client_id_audience_needs_evidence_too(self) -> None:
        """
        C{bearer.audience} set to the clientID itself is the login client's audience.
        """
        w = await bearer_world(
            self,
            idp_spec=f"  bearer: {{audience: {CLIENT_ID}}}\n",
            identity_spec="    userInfo: never\n",
        )
        await self.assert_rejected(w, id_token_like(w))
        await self.assert_accepted(w, id_token_like(w, {"scope": "api"}))


class ApiAudience(BearerTestCase):
    """
    C{bearer.audience} set to the API's own audience: unchanged (no evidence needed),
    the id_token markers still refused.
    """

    async def test_no_evidence_needed(self) -> None:
        w = await bearer_world(
            self, idp_spec="  bearer: {audience: api}\n", identity_spec="    userInfo: never\n"
        )
        for typ in ("JWT", None):
            await self.assert_accepted(w, id_token_like(w, {"aud": "api"}, typ=typ))
        await self.assert_accepted(w, id_token_like(w, {"aud": ["api", CLIENT_ID]}))
        await self.assert_accepted(w, w.token({"aud": "api"}))
        # The client's own id_tokens do not have the API's audience.
        await self.assert_rejected(w, id_token_like(w))

    async def test_id_token_markers_still_refused(self) -> None:
        w = await bearer_world(
            self, idp_spec="  bearer: {audience: api}\n", identity_spec="    userInfo: never\n"
        )
        for marker in ({"nonce": "n"}, {"at_hash": "x"}, {"typ": "ID"}):
            claims = {"aud": "api", "scope": "api", **marker}
            await self.assert_rejected(w, id_token_like(w, claims), message=repr(marker))
        await self.assert_rejected(w, id_token_like(w, {"aud": "api"}, typ="logout+jwt"))


# -- edgegw check ------------------------------------------------------------------------


GATEWAY_WITH_SESSION = """\
kind: Gateway
metadata: {name: gw}
spec:
  listen: "127.0.0.1:0"
  session: {key: "0123456789abcdef0123456789abcdef"}
"""

BACKEND = 'handler: {type: reverse-proxy, upstream: "http://127.0.0.1:9"}'


def route(name: str, kind: str, match: str) -> str:
    return f"""\
---
kind: Route
metadata: {{name: {name}}}
spec:
  match: {match}
  type: {kind}
  access: {{auth: required}}
  {BACKEND}
"""


def idp(extra: str = "", verification_only: bool = False) -> str:
    login = (
        "  verificationOnly: true\n"
        if verification_only
        else '  clientSecret: s\n  redirectURL: "https://gw.example/auth/callback"\n'
    )
    return f"""\
---
kind: IdP
metadata: {{name: corp}}
spec:
  type: oidc
  issuer: "https://idp.example"
  clientID: {CLIENT_ID}
{login}{extra}"""


class CheckWarning(SynchronousTestCase):
    """
    C{edgegw check} warns (on stderr, the configuration still valid) when a login IdP
    has service routes, where Bearer tokens are taken, and no C{bearer.audience}.
    """

    def run_check(self, text: str) -> tuple[int, str, str]:
        root = write_tree(self.mktemp(), {"a.yaml": textwrap.dedent(text)})
        out, err = io.StringIO(), io.StringIO()
        status = check(root, out, err)
        return status, out.getvalue(), err.getvalue()

    def test_login_idp_with_service_routes_and_no_audience(self) -> None:
        text = (
            GATEWAY_WITH_SESSION
            + idp()
            + route("api", "service", "/api/")
            + route("app", "app", "/app/")
            + route("svc2", "service", "/svc/")
        )
        status, out, err = self.run_check(text)
        self.assertEqual(status, 0, err)
        self.assertIn("is valid", out)
        self.assertNotIn("warning", out)
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        warning = lines[0]
        self.assertTrue(warning.startswith("edgegw: warning: "), warning)
        # File, resource and field, then what to do.
        self.assertIn("a.yaml", warning)
        self.assertIn("corp", warning)
        self.assertIn("spec.bearer.audience", warning)
        self.assertIn("(api, svc2)", warning)
        self.assertIn(f'"{CLIENT_ID}"', warning)
        self.assertIn("id_token", warning)

    def test_no_warning(self) -> None:
        service = route("api", "service", "/api/")
        for name, text in (
            ("explicit audience", GATEWAY_WITH_SESSION + idp("  bearer: {audience: api}\n")),
            (
                "explicit audience, the clientID itself",
                GATEWAY_WITH_SESSION + idp(f"  bearer: {{audience: {CLIENT_ID}}}\n"),
            ),
            ("app routes only", GATEWAY_WITH_SESSION + idp() + route("app", "app", "/app/")),
            (
                "verificationOnly (no login)",
                GATEWAY_WITH_SESSION.replace(
                    '  session: {key: "0123456789abcdef0123456789abcdef"}\n', ""
                )
                + idp(verification_only=True),
            ),
        ):
            text = text if "app routes" in name else text + service
            status, out, err = self.run_check(text)
            self.assertEqual((status, err), (0, ""), name)
            self.assertIn("is valid", out, name)
