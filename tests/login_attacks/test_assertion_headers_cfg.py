"""
Regression (review of issue 13): issue.header / accept.header must be names that can
work (no "_": the edge drops underscored request headers) and that no HTTP mechanism,
credential or identity header of the gateway already uses.
"""

from __future__ import annotations

import base64
import textwrap

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.errors import ConfigError
from tests.support.configs import load_text

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
