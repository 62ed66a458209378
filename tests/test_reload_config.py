"""
C{Gateway.spec.reload} (issue 35, point 2): C{warmupTimeout}, how long a reloaded
configuration waits to be warm, read like the other durations, with located errors, by
the daemon and by C{edgegw check} alike.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.config.model import DEFAULT_WARMUP_TIMEOUT
from tests.support.configs import GATEWAY, load_text, problems_of, write_tree
from tests.support.daemons import DAEMON_ENV
from tests.support.processes import venv_bin

ROUTE = "kind: Route\nmetadata: {name: h}\nspec: {match: /healthz, handler: {type: health}}\n"


def with_reload(block: str) -> str:
    """
    A Gateway document whose spec has C{block} (one line, indented by two), then a route.
    """
    return GATEWAY + block + "---\n" + ROUTE


class WarmupTimeoutTests(SynchronousTestCase):
    def warmup(self, block: str) -> float:
        config = load_text(self.mktemp(), with_reload(block), gateway=False)
        return config.gateway.reload.warmup_timeout

    def problems(self, block: str) -> list[str]:
        return problems_of(self.mktemp(), with_reload(block), gateway=False)

    def test_default_is_ten_seconds(self) -> None:
        self.assertEqual(DEFAULT_WARMUP_TIMEOUT, 10.0)
        self.assertEqual(self.warmup(""), 10.0)
        self.assertEqual(self.warmup("  reload: {}\n"), 10.0)

    def test_a_duration(self) -> None:
        self.assertEqual(self.warmup("  reload: {warmupTimeout: 250ms}\n"), 0.25)
        self.assertEqual(self.warmup("  reload: {warmupTimeout: 1m30s}\n"), 90.0)
        # 0s: a reload serves at once, warm or not.
        self.assertEqual(self.warmup('  reload: {warmupTimeout: "0s"}\n'), 0.0)

    def test_bad_values_are_located(self) -> None:
        where = 'document 1, Gateway "gw": spec.reload.warmupTimeout: '
        self.assertEqual(
            self.problems("  reload: {warmupTimeout: 10}\n"),
            [where + 'expected a duration string such as "30s" or "1h30m", got an integer'],
        )
        self.assertEqual(
            self.problems("  reload: {warmupTimeout: ten}\n"),
            [
                where + "invalid duration 'ten'; use a number with a unit, such as "
                '"500ms", "30s", "1h30m"'
            ],
        )
        self.assertEqual(
            self.problems("  reload: {warmupTimeout: -1s}\n"),
            [where + 'must not be negative, got "-1s"'],
        )

    def test_unknown_keys_are_refused(self) -> None:
        self.assertEqual(
            self.problems("  reload: {warmupTimeot: 1s}\n"),
            [
                'document 1, Gateway "gw": spec.reload.warmupTimeot: unknown field; '
                'did you mean "warmupTimeout"?'
            ],
        )

    def test_not_a_mapping(self) -> None:
        [problem] = self.problems("  reload: 5s\n")
        self.assertTrue(problem.startswith('document 1, Gateway "gw": spec.reload: '), problem)


class CheckReadsItTests(TestCase):
    timeout = 60

    @inlineCallbacks
    def test_check_reports_a_bad_warmup_timeout(self) -> Any:
        root = write_tree(
            self.mktemp(), {"a.yaml": with_reload("  reload: {warmupTimeout: soon}\n")}
        )
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", root], env=DAEMON_ENV
        )
        text = (out + err).decode()
        self.assertEqual(code, 1, text)
        self.assertIn(
            f'{os.path.join(root, "a.yaml")}, document 1, Gateway "gw": '
            "spec.reload.warmupTimeout: invalid duration 'soon'",
            text,
        )
        self.assertNotIn("Traceback", text)
        write_tree(root, {"a.yaml": with_reload("  reload: {warmupTimeout: 3s}\n")})
        out, err, code = yield getProcessOutputAndValue(
            venv_bin("edgegw"), ["check", root], env=DAEMON_ENV
        )
        self.assertEqual(code, 0, (out + err).decode())
