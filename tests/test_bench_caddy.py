"""
Tests for Caddy as an anchor of C{python -m bench suite} (issue 39): the comparisons
with edgegw and issue 39's table are computed from the rows' samples as documented
(medians of same-round figures), and C{--only} chooses rows by key. (No timings: the
samples are made up.)
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench import caddy, suite
from bench.__main__ import parser
from bench.targets import Target


def _rounds(*figures: tuple[float, float]) -> list[dict[str, float]]:
    """One sample per round from (CPU µs/req, p50 seconds)."""
    return [{"rps": 1000.0, "p50": p50, "p99": p50, "cpu_us": cpu} for cpu, p50 in figures]


SAMPLES = {
    "direct-small": {1: _rounds((10, 0.000050), (10, 0.000060), (10, 0.000070))},
    "nginx-small": {50: _rounds((15, 0.001), (15, 0.001), (15, 0.001))},
    "caddy-small": {
        50: _rounds((50, 0.002), (40, 0.002), (60, 0.002)),
        1: _rounds((60, 0.000100), (60, 0.000160), (60, 0.000120)),
    },
    "proxy-small": {
        50: _rounds((45, 0.004), (48, 0.004), (30, 0.004)),
        1: _rounds((140, 0.000150), (140, 0.000200), (140, 0.000190)),
    },
    "caddy-64k": {50: _rounds((60, 0.003), (60, 0.003), (60, 0.003))},
    "proxy-64k": {50: _rounds((120, 0.006), (150, 0.006), (90, 0.006))},
    "static": {50: _rounds((70, 0.003))},
}


class ComparisonTests(SynchronousTestCase):
    def test_cpu_ratios_are_medians_of_same_round_ratios(self) -> None:
        small, large, static, latency = caddy.comparisons(SAMPLES, 50)
        # Rounds: 45/50, 48/40, 30/60: median 0.9 (the medians' ratio would be 45/50).
        self.assertAlmostEqual(small.ratio or 0, 0.9)
        self.assertEqual((small.edgegw, small.caddy), (45, 50))
        self.assertEqual(small.verdict, "OK")
        self.assertAlmostEqual(large.ratio or 0, 2.0)
        self.assertEqual(large.verdict, "MISSED")
        # No caddy-static samples: nothing to compare.
        self.assertIsNone(static.ratio)
        self.assertEqual(static.verdict, "-")
        self.assertIn("not measured", static.text())
        # Added p50 over direct at c1: edgegw 100, 140, 120 µs; Caddy 50, 100, 50 µs.
        self.assertAlmostEqual(latency.edgegw or 0, 0.000120)
        self.assertAlmostEqual(latency.caddy or 0, 0.000050)
        self.assertAlmostEqual(latency.ratio or 0, 2.4)
        self.assertEqual(latency.verdict, "MISSED")

    def test_at_the_line_is_met(self) -> None:
        same = {
            "proxy-small": {50: _rounds((50, 0.001))},
            "caddy-small": {50: _rounds((50, 0.001))},
        }
        self.assertEqual(caddy.comparisons(same, 50)[0].verdict, "OK")

    def test_issue_table(self) -> None:
        table = caddy.issue_table(SAMPLES, 50)
        self.assertEqual(table[0], ("small JSON, µs CPU/request", "15.0", "50.0", "45.0", "-"))
        self.assertEqual(table[2][2:4], ("+0.050 ms", "+0.120 ms"))
        self.assertEqual(table[3], ("static file, µs CPU/request", "-", "-", "70.0", "-"))
        report = caddy.report(SAMPLES, 50)
        self.assertIn("edgegw beside Caddy", report)
        self.assertIn("0.90x (target at most 1.00x): OK", report)


class OnlyTests(SynchronousTestCase):
    def rows(self) -> list[suite.Row]:
        keys = ["direct-small", "caddy-small", "proxy-small", "caddy-static", "session"]
        return [suite.Row(key, key, Target(key, key, key), "/") for key in keys]

    def test_patterns_choose_rows_in_round_order(self) -> None:
        chosen = suite.select(self.rows(), ["proxy-*", "caddy-*"])
        self.assertEqual(
            [row.key for row in chosen], ["caddy-small", "proxy-small", "caddy-static"]
        )

    def test_no_patterns_keep_every_row(self) -> None:
        self.assertEqual(len(suite.select(self.rows(), [])), 5)

    def test_a_pattern_matching_nothing_is_refused(self) -> None:
        with self.assertRaises(ValueError) as caught:
            suite.select(self.rows(), ["caddy-*", "nginx-*"])
        self.assertIn("--only nginx-* matches no row", str(caught.exception))

    def test_option(self) -> None:
        args = parser().parse_args(["suite", "--only", "caddy-*, proxy-small"])
        self.assertEqual(args.only, ("caddy-*", "proxy-small"))
        self.assertEqual(parser().parse_args(["suite"]).only, ())


class ConfigurationTests(SynchronousTestCase):
    def test_caddyfiles(self) -> None:
        """
        The proxy's idle upstream pool is sized like nginx's; the static site serves the
        directory it is given; neither logs requests.
        """
        proxy = caddy._PROXY.format(port=1, backend_port=2, keepalive=64)
        self.assertIn("reverse_proxy 127.0.0.1:2", proxy)
        self.assertIn("keepalive_idle_conns_per_host 64", proxy)
        static = caddy._STATIC.format(port=1, root=Path("/www"))
        self.assertIn("root * /www", static)
        self.assertIn("file_server", static)
        self.assertNotIn("log", proxy + static)
