"""
Tests for C{python -m bench chain}'s worker: it drives the gateway it measures for real,
and refuses to report a figure for a gateway that does not answer. (No timings: only
that a figure comes back.) The worker runs as C{bench chain} runs it, in a process of its
own: it builds a gateway on the real reactor and leaves its timers behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench import gateway
from bench.chain import WORKER
from tests.support.processes import REPO_ROOT


class ChainWorkerTests(SynchronousTestCase):
    def measure(self, match: str) -> subprocess.CompletedProcess[str]:
        config = gateway.write_config(
            Path(self.mktemp()).absolute(),
            8080,
            [gateway.reverse_proxy("proxy", match, "http://127.0.0.1:9")],
        )
        return subprocess.run(
            [sys.executable, "-P", str(WORKER), str(config), "20", "1"],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def test_a_figure_for_proxied_requests(self) -> None:
        done = self.measure("/")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertGreater(json.loads(done.stdout)["us_per_request"], 0)

    def test_no_figure_for_a_gateway_that_does_not_answer(self) -> None:
        # The route does not match wrk's path: 404, not a proxied request.
        done = self.measure("/elsewhere/")
        self.assertNotEqual(done.returncode, 0)
        self.assertEqual(done.stdout, "")
        self.assertIn("the gateway answered b'HTTP/1.1 404", done.stderr)
