"""
Tests for C{python -m bench chain}'s worker: it drives the gateway it measures for real,
and refuses to report a figure for a gateway that does not answer. (No timings: only
that a figure comes back.)
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench import gateway
from bench.chain_worker import BODY, build, measure


class ChainWorkerTests(SynchronousTestCase):
    def config(self, match: str) -> Path:
        return gateway.write_config(
            Path(self.mktemp()).absolute(),
            8080,
            [gateway.reverse_proxy("proxy", match, "http://127.0.0.1:9")],
        )

    def test_a_proxied_request_answered(self) -> None:
        one = build(self.config("/"))
        for _ in range(3):
            answer = one()
            self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer[:200])
            self.assertTrue(answer.endswith(BODY))
        figure = measure(self.config("/"), 20, 1, profile=False)
        self.assertIsNotNone(figure)
        assert figure is not None
        self.assertGreater(figure, 0)

    def test_no_figure_for_a_gateway_that_does_not_answer(self) -> None:
        # The route does not match wrk's path: 404, not a proxied request.
        error = self.assertRaises(SystemExit, measure, self.config("/elsewhere/"), 20, 1, False)
        self.assertIn("404", str(error))
