"""
The headers identity assertions use: a claim never takes over the subject or groups
header, whether it comes from the IdP or from an assertion (such claim names are refused
at load); C{issue.header} and C{accept.header} must be names that can work (no C{_}: the
edge drops underscored request headers) and that no HTTP mechanism, credential or
identity header of the gateway already uses.
"""

from __future__ import annotations

import base64
import textwrap

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.errors import ConfigError
from tests.support.configs import load_text, problems_of
from tests.test_assertion import AssertionTestCase, get, world

SEED = base64.b64encode(bytes(range(32))).decode()


def accepted(test: SynchronousTestCase, block: str) -> bool:
    text = (
        'kind: Gateway\nmetadata: {name: gw}\nspec:\n  listen: "127.0.0.1:0"\n'
        "  identity:\n    assertion:\n" + textwrap.indent(textwrap.dedent(block), "      ")
    )
    try:
        load_text(test.mktemp(), text, gateway=False)
    except ConfigError:
        return False
    return True


class ClaimCollision(AssertionTestCase):
    async def test_asserted_claim_id_cannot_replace_the_subject_header(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=True)
        # Signed by A's key: what A mints when its passport holds a claim named "id"
        # (identity.claims: [..., id] at A, a common IdP claim).
        token = w.assertion(w.claims(claims={"id": "mallory", "email": "a@x"}))
        response = await get(b, "/svc/x", token, w.bearer())
        self.assertEqual(response.status, 200)
        self.assertEqual(b.note, "accepted")
        seen = w.rec_b.requests[-1]
        # B matched the assertion's subject against alice's Bearer token ...
        # ... yet its backend is told the caller is mallory.
        self.assertEqual(seen.header(b"X-User-Id"), b"alice")

    async def test_asserted_claim_groups_cannot_replace_the_groups_header(self) -> None:
        w = await world(self)
        b = await w.gateway_b(require_bearer=False)
        token = w.assertion(w.claims(groups=["users"], claims={"groups": "root"}))
        response = await get(b, "/svc/x", token)
        self.assertEqual(response.status, 200)
        self.assertEqual(w.rec_b.requests[-1].header(b"X-User-Groups"), b"users")


class ClaimCollisionConfig(SynchronousTestCase):
    def test_a_claim_named_like_the_subject_or_groups_header_is_refused(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              identity:
                claims: [email, id, Groups]
            """,
            gateway=False,
        )
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(
            problems[0].startswith('document 1, Gateway "g": spec.identity.claims[1]: "id"')
        )
        self.assertTrue(
            problems[1].startswith('document 1, Gateway "g": spec.identity.claims[2]: "Groups"')
        )


class HeaderNames(SynchronousTestCase):
    def test_unusable_issue_headers_are_refused(self) -> None:
        bad = [
            name
            for name in (
                "X_Gw_Identity",
                "Host",
                "Content-Length",
                "Transfer-Encoding",
                "Connection",
                "Authorization",
                "Cookie",
                "X-User-Id",
                "X-Forwarded-For",
            )
            if accepted(self, f'issue: {{name: a, keyId: k, key: "{SEED}", header: {name}}}\n')
        ]
        self.assertEqual(bad, [])

    def test_unusable_accept_headers_are_refused(self) -> None:
        bad = [
            name
            for name in ("X_Gw_Identity", "Authorization", "Cookie", "X-User-Id", "Host")
            if accepted(
                self,
                f"accept: {{issuer: a, header: {name}, "
                f'keys: [{{keyId: k, publicKey: "{SEED}"}}]}}\n',
            )
        ]
        self.assertEqual(bad, [])
