"""
Tests for L{edgegw.durations}.
"""

from twisted.trial.unittest import SynchronousTestCase

from edgegw.durations import format_duration, parse_duration


class ParseDurationTests(SynchronousTestCase):
    def test_go_forms(self) -> None:
        cases = {
            "500ms": 0.5,
            "60s": 60.0,
            "1h30m": 5400.0,
            "1.5h": 5400.0,
            "0": 0.0,
            "2h45m30.5s": 9930.5,
            "100us": 1e-4,
            "100µs": 1e-4,
            "10ns": 1e-8,
            "+5s": 5.0,
            "-5s": -5.0,
            ".5s": 0.5,
        }
        for text, seconds in cases.items():
            self.assertAlmostEqual(parse_duration(text), seconds, msg=text)

    def test_invalid(self) -> None:
        for text in ["", "5", "1.5", "s", "5x", "1h-2m", "1 h", "abc", "1hh", "-", "5S"]:
            self.assertRaises(ValueError, parse_duration, text)

    def test_missing_unit_message(self) -> None:
        e = self.assertRaises(ValueError, parse_duration, "30")
        self.assertEqual(str(e), "missing unit in duration '30'")

    def test_format(self) -> None:
        self.assertEqual(format_duration(5400), "1h30m")
        self.assertEqual(format_duration(0.25), "250ms")
        self.assertEqual(format_duration(60), "1m")
        self.assertEqual(format_duration(0), "0s")
