"""
Tests for L{edgegw.edge.csrf}: every row of the CrossOriginProtection conformance table in
C{tests/fixtures/csrf/cases.json}, plus properties the table does not pin down.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.origins import TrustedOriginError, validate_trusted_origin
from edgegw.edge.csrf import ORIGIN_MISMATCH, SEC_FETCH_SITE_CROSS, CrossOriginProtection
from edgegw.routing.mux import ConflictError
from edgegw.routing.pattern import PatternError

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "csrf", "cases.json")

DenyHandler = Callable[[str], tuple[int, str]]


def load() -> Any:
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


def default_deny(reason: str) -> tuple[int, str]:
    """
    The response the gateway sends for a refusal: 403 with the reason as the body.
    """
    return 403, reason + "\n"


def custom_deny(reason: str) -> tuple[int, str]:
    """
    The custom deny handler of Go's SetDenyHandler test.
    """
    return 418, "custom error"


def serve(
    protection: CrossOriginProtection, request: dict[str, Any], deny: DenyHandler
) -> tuple[str | None, int, str | None]:
    """
    Run one fixture request through the check: the reason, the status and the body (L{None}
    when the protected handler runs).
    """
    headers = request["headers"]
    reason = protection.check(
        request["method"],
        request["host"],
        request["path"],
        headers.get("Sec-Fetch-Site"),
        headers.get("Origin"),
    )
    if reason is None:
        return None, 200, None
    status, body = deny(reason)
    return reason, status, body


def case_errors(
    protection: CrossOriginProtection, case: dict[str, Any], deny: DenyHandler
) -> list[str]:
    reason, status, body = serve(protection, case["request"], deny)
    expected = case["expected"]
    errors = []
    if (reason is None) != expected["allowed"]:
        errors.append(f"allowed={reason is None}, reason={reason!r}")
    if status != expected["status"]:
        errors.append(f"status {status} != {expected['status']}")
    if reason is not None and reason != expected.get("reason"):
        errors.append(f"reason {reason!r} != {expected.get('reason')!r}")
    if body != expected.get("body"):
        errors.append(f"body {body!r} != {expected.get('body')!r}")
    return errors


class ConformanceTests(SynchronousTestCase):
    """
    Every scenario and row of C{cases.json}.
    """

    def setUp(self) -> None:
        self.data = load()
        self.failures: list[str] = []
        self.checked = 0

    def record(self, case_id: str, errors: list[str]) -> None:
        self.checked += 1
        self.failures.extend(f"{case_id}: {error}" for error in errors)

    def finish(self, expected_count: int) -> None:
        if self.failures:
            self.fail(f"{len(self.failures)} failure(s):\n" + "\n".join(self.failures))
        self.assertEqual(self.checked, expected_count, "number of cases checked")

    def scenario(self, scenario_id: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [s for s in self.data["scenarios"] if s["id"] == scenario_id]
        self.assertEqual(len(found), 1, scenario_id)
        return found[0]

    def protection(self, scenario: dict[str, Any]) -> CrossOriginProtection:
        return CrossOriginProtection(scenario["trusted_origins"], scenario["bypass_patterns"])

    def test_every_scenario_is_covered(self) -> None:
        self.assertEqual(
            sorted(s["id"] for s in self.data["scenarios"]),
            sorted(
                [
                    "sec_fetch_site",
                    "trusted_origin",
                    "bypass_pattern",
                    "server",
                    "deny_handler",
                    "late_bypass",
                ]
            ),
        )
        total = sum(len(s["cases"]) for s in self.data["scenarios"])
        self.assertEqual(total, 45)

    def test_table_scenarios(self) -> None:
        count = 0
        for scenario_id in ("sec_fetch_site", "trusted_origin", "bypass_pattern", "server"):
            scenario = self.scenario(scenario_id)
            self.assertEqual(scenario["deny_handler"], "default", scenario_id)
            protection = self.protection(scenario)
            for case in scenario["cases"]:
                self.record(case["id"], case_errors(protection, case, default_deny))
                count += 1
        self.finish(count)
        self.assertEqual(count, 39)

    def test_deny_handler_steps(self) -> None:
        """
        One protection object; the custom deny handler is set before step 2 and removed
        before step 4, as in Go's test. L{CrossOriginProtection.check} never involves the
        deny handler: the caller picks the response.
        """
        scenario = self.scenario("deny_handler")
        protection = self.protection(scenario)
        handlers = {1: default_deny, 2: custom_deny, 3: custom_deny, 4: default_deny}
        cases = scenario["cases"]
        self.assertEqual(len(cases), len(handlers))
        for step, case in enumerate(cases, 1):
            self.record(case["id"], case_errors(protection, case, handlers[step]))
        self.finish(4)

    def test_late_bypass_steps(self) -> None:
        """
        Configuration added between step 1 and step 2 applies to step 2. What is added is
        read from the scenario's note.
        """
        scenario = self.scenario("late_bypass")
        note = " ".join(scenario["notes"])
        origins = re.findall(r'AddTrustedOrigin\("([^"]*)"\)', note)
        patterns = re.findall(r'AddInsecureBypassPattern\("([^"]*)"\)', note)
        self.assertEqual((origins, patterns), (["https://concurrent.example"], ["/foo/"]))
        protection = self.protection(scenario)
        first, second = scenario["cases"]
        self.record(first["id"], case_errors(protection, first, default_deny))
        for origin in origins:
            protection.add_trusted_origin(origin)
        for pattern in patterns:
            protection.add_bypass_pattern(pattern)
        self.record(second["id"], case_errors(protection, second, default_deny))
        self.finish(2)

    def test_trusted_origin_validation(self) -> None:
        rows = self.data["trusted_origin_validation"]
        for row in rows:
            origin = row["origin"]
            for how in ("validate", "add", "constructor"):
                try:
                    if how == "validate":
                        validate_trusted_origin(origin)
                    elif how == "add":
                        CrossOriginProtection().add_trusted_origin(origin)
                    else:
                        CrossOriginProtection(trusted_origins=[origin])
                except TrustedOriginError as e:
                    errors = []
                    if row["valid"]:
                        errors.append(f"{how}: unexpected error {e}")
                    elif str(e) != row["go_error"]:
                        errors.append(f"{how}: message {str(e)!r} != {row['go_error']!r}")
                    if e.origin != origin:
                        errors.append(f"{how}: origin attribute {e.origin!r}")
                    self.record(row["id"], errors)
                else:
                    self.record(row["id"], [] if row["valid"] else [f"{how}: no error"])
        self.finish(3 * 12)
        self.assertEqual(len(rows), 12)


class CheckTests(SynchronousTestCase):
    """
    Behaviour beyond the table.
    """

    def test_empty_headers_are_absent(self) -> None:
        protection = CrossOriginProtection()
        for site in (None, ""):
            for origin in (None, ""):
                self.assertIsNone(protection.check("POST", "h", "/", site, origin))
        self.assertEqual(protection.check("POST", "h", "/", "", "https://evil"), ORIGIN_MISMATCH)

    def test_safe_methods_only(self) -> None:
        protection = CrossOriginProtection()
        for method in ("GET", "HEAD", "OPTIONS"):
            self.assertIsNone(protection.check(method, "h", "/", "cross-site", "https://evil"))
        for method in ("POST", "PUT", "PATCH", "DELETE", "get", "CONNECT", "TRACE"):
            self.assertEqual(
                protection.check(method, "h", "/", "cross-site", None), SEC_FETCH_SITE_CROSS
            )

    def test_sec_fetch_site_values(self) -> None:
        protection = CrossOriginProtection()
        for site in ("same-origin", "none"):
            self.assertIsNone(protection.check("POST", "h", "/", site, "https://evil"))
        for site in ("Same-Origin", "same-site", "cross-site", "junk"):
            self.assertEqual(
                protection.check("POST", "h", "/", site, "https://h"), SEC_FETCH_SITE_CROSS
            )

    def test_origin_host_comparison(self) -> None:
        """
        The host of the Origin (as Go's url.Parse finds it) must equal the Host header,
        port included; the scheme is ignored.
        """
        protection = CrossOriginProtection()
        allowed = [
            ("example.com", "https://example.com"),
            ("example.com", "http://example.com"),
            ("example.com:8443", "https://example.com:8443"),
            ("example.com", "https://user@example.com"),
            ("example.com", "HTTPS://example.com"),
            ("[::1]:8080", "http://[::1]:8080"),
            ("caf\u00e9.example", "https://caf%C3%A9.example"),
            ("example.com", "//example.com"),
            ("example.com", "https://example.com/path?q"),
        ]
        denied = [
            ("example.com", "https://example.com:443"),
            ("example.com:443", "https://example.com"),
            ("Example.com", "https://example.com"),
            ("example.com", "null"),
            ("", "null"),
            ("", "https://"),
            ("example.com", "https://exa mple.com"),
            ("example.com", "https://example.com:8080:80"),
            ("example.com", "https://evil.example#https://example.com"),
            ("example.com", "https://example.com@evil.example"),
        ]
        for host, origin in allowed:
            self.assertIsNone(protection.check("POST", host, "/", None, origin), origin)
        for host, origin in denied:
            self.assertEqual(
                protection.check("POST", host, "/", None, origin), ORIGIN_MISMATCH, origin
            )

    def test_trusted_origin_is_exact_string(self) -> None:
        protection = CrossOriginProtection(trusted_origins=["https://app.example"])
        self.assertIsNone(protection.check("POST", "h", "/", "cross-site", "https://app.example"))
        for origin in ("https://app.example:443", "HTTPS://app.example", "http://app.example"):
            self.assertEqual(
                protection.check("POST", "h", "/", "cross-site", origin), SEC_FETCH_SITE_CROSS
            )
        self.assertEqual(protection.trusted_origins, frozenset({"https://app.example"}))

    def test_bypass_uses_mux_precedence_and_hosts(self) -> None:
        protection = CrossOriginProtection(
            bypass_patterns=["POST /hooks/", "api.example/open/{id}", "GET /read/"]
        )
        ok = [
            ("POST", "h", "/hooks/github"),
            ("POST", "h", "/hooks/"),
            ("PUT", "api.example:8443", "/open/1"),
        ]
        refused = [
            ("PUT", "h", "/hooks/github"),
            ("POST", "h", "/hooks"),
            ("POST", "h", "/hooks//x"),
            ("POST", "h", "/x/../hooks/x"),
            ("PUT", "other.example", "/open/1"),
            ("POST", "h", "/read/x"),
        ]
        for method, host, path in ok:
            self.assertIsNone(protection.check(method, host, path, "cross-site", None), path)
        for method, host, path in refused:
            self.assertEqual(
                protection.check(method, host, path, "cross-site", None),
                SEC_FETCH_SITE_CROSS,
                (method, host, path),
            )
        self.assertEqual(
            [p.text for p in protection.bypass_patterns],
            ["POST /hooks/", "api.example/open/{id}", "GET /read/"],
        )

    def test_invalid_configuration(self) -> None:
        self.assertRaises(PatternError, CrossOriginProtection, (), ["/{x"])
        self.assertRaises(ConflictError, CrossOriginProtection, (), ["/a/", "/a/{rest...}"])
        self.assertRaises(TrustedOriginError, CrossOriginProtection, ["https://a/"])

    def test_trusted_origin_errors(self) -> None:
        cases = {
            "https://a:b": 'invalid origin "https://a:b": parse "https://a:b": '
            'invalid port ":b" after host',
            "https://[::1": 'invalid origin "https://[::1": parse "https://[::1": '
            "missing ']' in host",
            "https://[1.2.3.4]": 'invalid origin "https://[1.2.3.4]": parse "https://[1.2.3.4]": '
            "invalid IP-literal",
            "https://a%2Fb": 'invalid origin "https://a%2Fb": parse "https://a%2Fb": '
            'invalid URL escape "%2F"',
            "https://a\nb": 'invalid origin "https://a\\nb": parse "https://a\\nb": '
            "net/url: invalid control character in URL",
            ":foo": 'invalid origin ":foo": parse ":foo": missing protocol scheme',
            "https://a#%zz": 'invalid origin "https://a#%zz": parse "https://a#%zz": '
            'invalid URL escape "%zz"',
            "https:opaque": 'invalid origin "https:opaque": host is required',
            "https://a b@c": 'invalid origin "https://a b@c": parse "https://a b@c": '
            "net/url: invalid userinfo",
        }
        for origin, message in cases.items():
            with self.assertRaises(TrustedOriginError, msg=origin) as raised:
                validate_trusted_origin(origin)
            self.assertEqual(str(raised.exception), message)
        for origin in ("https://[::1]:8443", "https://u:p@a", "x-app://a", "https://caf\u00e9"):
            validate_trusted_origin(origin)
