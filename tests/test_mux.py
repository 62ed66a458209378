"""
Tests for L{edgegw.routing.mux}: every row of the Go ServeMux conformance tables in
C{tests/fixtures/gomux}, plus properties the tables do not pin down.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from edgegw.routing.goquote import go_quote
from edgegw.routing.hosts import normalise_host
from edgegw.routing.mux import (
    ConflictError,
    Matched,
    MethodNotAllowed,
    Mux,
    NotFound,
    Redirect,
    RouteResult,
)
from edgegw.routing.paths import (
    clean_path,
    has_dot_segment,
    path_segments,
    split_request_target,
    vet_path,
)
from edgegw.routing.pattern import (
    Pattern,
    PatternError,
    Segment,
    common_path,
    compare_methods,
    compare_paths,
    compare_patterns,
    conflicts,
    difference_path,
    parse_pattern,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "gomux")

INVERSE = {
    "equivalent": "equivalent",
    "disjoint": "disjoint",
    "overlaps": "overlaps",
    "more_specific": "more_general",
    "more_general": "more_specific",
}


def load(name: str) -> Any:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def segment_json(seg: Segment) -> dict[str, str]:
    """
    A segment in the fixtures' notation.
    """
    if seg.kind == "literal":
        return {"kind": "literal", "value": seg.value}
    if seg.kind == "dollar":
        return {"kind": "dollar"}
    return {"kind": seg.kind, "name": seg.value}


def describe(result: RouteResult[str]) -> str:
    if isinstance(result, Matched):
        return f"match {result.pattern.text!r} {result.params!r}"
    if isinstance(result, Redirect):
        return f"redirect {result.location!r}"
    if isinstance(result, MethodNotAllowed):
        return f"405 allow={result.allow!r}"
    return "404"


def route(mux: Mux[str], method: str, host: str, target: str) -> RouteResult[str]:
    authority, path, query = split_request_target(method, target)
    return mux.route(method, host, path, query, target_host=authority)


def outcome_errors(result: RouteResult[str], want: dict[str, Any]) -> list[str]:
    """
    How C{result} differs from a fixture's C{want}/C{after_redirect}; empty when it agrees.
    """
    kind = want["result"]
    got = describe(result)
    if kind == "match":
        if not isinstance(result, Matched):
            return [f"want match {want['pattern']!r}, got {got}"]
        errors = []
        if result.pattern.text != want["pattern"] or result.target != want["pattern"]:
            errors.append(f"want pattern {want['pattern']!r}, got {got}")
        expected: dict[str, str] = want["path_values"]
        for name, value in expected.items():
            if name in result.params:
                if result.params[name] != value:
                    errors.append(f"{name}: want {value!r}, got {result.params[name]!r}")
            elif value != "" or name in result.pattern.wildcard_names:
                errors.append(f"{name}: missing from {result.params!r}")
        extra = set(result.params) - set(expected)
        if extra:
            errors.append(f"unexpected params {sorted(extra)}")
        return errors
    if kind == "redirect":
        if not isinstance(result, Redirect) or result.location != want["location"]:
            return [f"want redirect {want['location']!r}, got {got}"]
        if want["status"] != 301:
            return [f"fixture status {want['status']} is not 301"]
        return []
    if kind == "not_found":
        return [] if isinstance(result, NotFound) else [f"want 404, got {got}"]
    if kind == "method_not_allowed":
        if not isinstance(result, MethodNotAllowed) or result.allow != want["allow"]:
            return [f"want 405 allow={want['allow']!r}, got {got}"]
        return []
    return [f"unknown result kind {kind!r}"]


class FailureList:
    """
    Collects failures by case id so that one test reports every failing row at once.
    """

    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test
        self.failures: list[str] = []
        self.checked = 0

    def check(self, case_id: str, errors: list[str]) -> None:
        self.checked += 1
        self.failures.extend(f"{case_id}: {error}" for error in errors)

    def expect(self, case_id: str, ok: bool, message: str) -> None:
        self.check(case_id, [] if ok else [message])

    def done(self, expected_count: int) -> None:
        if self.failures:
            self.test.fail(f"{len(self.failures)} failure(s):\n" + "\n".join(self.failures))
        self.test.assertEqual(self.checked, expected_count, "number of cases checked")


class PatternTableTests(SynchronousTestCase):
    """
    C{patterns.json}: parsing and registration errors.
    """

    def test_valid(self) -> None:
        rows = load("patterns.json")["valid"]
        failures = FailureList(self)
        for row in rows:
            case = f"valid {row['pattern']!r}"
            try:
                parsed = parse_pattern(row["pattern"])
            except PatternError as e:
                failures.check(case, [f"unexpected error {e}"])
                continue
            got = {
                "method": parsed.method,
                "host": parsed.host,
                "segments": [segment_json(s) for s in parsed.segments],
            }
            want = {k: row[k] for k in ("method", "host", "segments")}
            failures.expect(case, got == want and parsed.text == row["pattern"], f"got {got}")
        failures.done(20)

    def test_invalid(self) -> None:
        rows = load("patterns.json")["invalid"]
        failures = FailureList(self)
        for row in rows:
            case = f"invalid {row['pattern']!r}"
            for how in ("parse", "register"):
                try:
                    if how == "parse":
                        parse_pattern(row["pattern"])
                    else:
                        Mux[str]().register(row["pattern"], "x")
                except PatternError as e:
                    errors = []
                    if str(e) != row["go_error"]:
                        errors.append(f"{how}: message {str(e)!r} != {row['go_error']!r}")
                    if row["error_contains"] not in str(e) and row["offset"] is not None:
                        errors.append(f"{how}: {row['error_contains']!r} not in message")
                    if e.offset != row["offset"]:
                        errors.append(f"{how}: offset {e.offset} != {row['offset']}")
                    if e.pattern != row["pattern"]:
                        errors.append(f"{how}: pattern attribute {e.pattern!r}")
                    failures.check(case, errors)
                else:
                    failures.check(case, [f"{how}: no error"])
        failures.done(2 * 21)

    def test_registration_errors(self) -> None:
        """
        Go's nil-handler rows have no counterpart: a L{Mux} target is any value, L{None}
        included (the CSRF bypass mux registers L{None}). They are the only rows left out.
        """
        rows = load("patterns.json")["registration_errors"]
        failures = FailureList(self)
        left_out = [row for row in rows if row["handler"] != "valid handler"]
        self.assertEqual(
            [(row["handler"], row["go_error"]) for row in left_out],
            [("nil", "http: nil handler"), ("HandlerFunc(nil)", "http: nil handler")],
        )
        for row in rows:
            if row in left_out:
                continue
            mux = Mux[str]()
            for pattern in row["already_registered"]:
                mux.register(pattern, pattern)
            case = f"register {row['pattern']!r}"
            try:
                mux.register(row["pattern"], row["pattern"])
            except (PatternError, ConflictError) as e:
                failures.expect(case, str(e) == row["go_error"], f"message {str(e)!r}")
            else:
                failures.check(case, ["no error"])
            failures.expect(
                case,
                [p.text for p in mux.patterns()] == row["already_registered"],
                "a failed registration changed the mux",
            )
        failures.done(2 * 3)


class MatchingTableTests(SynchronousTestCase):
    """
    C{matching.json}: routing scenarios, path cleaning, segmentation and exact matches.
    """

    def test_scenarios(self) -> None:
        data = load("matching.json")
        failures = FailureList(self)
        for scenario in data["scenarios"]:
            mux = Mux[str]()
            for pattern in scenario["patterns"]:
                mux.register(pattern, pattern)
            for case in scenario["cases"]:
                request = case["request"]
                method, host = request["method"], request["host"]
                result = route(mux, method, host, request["target"])
                errors = outcome_errors(result, case["want"])
                after = case.get("after_redirect")
                if after is not None:
                    if isinstance(result, Redirect):
                        again = route(mux, method, host, result.location)
                        errors += [f"after redirect: {e}" for e in outcome_errors(again, after)]
                    else:
                        errors.append("after_redirect given but no redirect")
                failures.check(case["id"], errors)
        self.assertEqual(data["case_count"], 153)
        failures.done(data["case_count"])

    def test_clean_path(self) -> None:
        rows = load("matching.json")["clean_path"]
        failures = FailureList(self)
        for row in rows:
            got = clean_path(row["in"])
            failures.expect(f"clean {row['in']!r}", got == row["want"], f"got {got!r}")
        failures.done(6)

    def test_clean_path_empty_mux(self) -> None:
        rows = [row for row in load("matching.json")["clean_path"] if "empty_mux_response" in row]
        failures = FailureList(self)
        for row in rows:
            result = route(Mux[str](), "GET", "", row["in"])
            failures.check(
                f"empty mux {row['in']!r}", outcome_errors(result, row["empty_mux_response"])
            )
        failures.done(4)

    def test_path_segments(self) -> None:
        rows = load("matching.json")["path_segments"]
        failures = FailureList(self)
        for row in rows:
            segments, trailing = path_segments(row["path"])
            got = list(segments) + (["/"] if trailing else [])
            failures.expect(f"segments {row['path']!r}", got == row["segments"], f"got {got}")
        failures.done(5)

    def test_exact_match(self) -> None:
        rows = load("matching.json")["exact_match"]
        failures = FailureList(self)
        for row in rows:
            exact = False
            if row["pattern"]:
                found = parse_pattern(row["pattern"]).match_path(row["path"])
                exact = found is not None and found[1]
            case = f"exact {row['pattern']!r} {row['path']!r}"
            failures.expect(case, exact == row["exact"], f"got {exact}")
        failures.done(8)


class ConflictTableTests(SynchronousTestCase):
    """
    C{conflicts.json}: relationships, conflicts on registration and their messages.
    """

    def setUp(self) -> None:
        self.data = load("conflicts.json")

    def test_method_relationships(self) -> None:
        failures = FailureList(self)
        for row in self.data["method_relationships"]:
            p1, p2 = parse_pattern(row["p1"]), parse_pattern(row["p2"])
            case = f"methods {row['p1']!r} {row['p2']!r}"
            got = (compare_methods(p1, p2), compare_methods(p2, p1))
            want = (row["relationship"], INVERSE[row["relationship"]])
            failures.expect(case, got == want, f"got {got}")
        failures.done(8)

    def test_path_relationships(self) -> None:
        failures = FailureList(self)
        for row in self.data["path_relationships"]:
            p1, p2 = parse_pattern(row["p1"]), parse_pattern(row["p2"])
            case = f"paths {row['p1']!r} {row['p2']!r}"
            errors = []
            got = (compare_paths(p1, p2), compare_paths(p2, p1))
            if got != (row["relationship"], INVERSE[row["relationship"]]):
                errors.append(f"relationship {got}")
            if compare_patterns(p1, p2) != row["relationship"]:
                errors.append("method-less patterns compare differently from their paths")
            for first, second in ((row["p1"], row["p2"]), (row["p2"], row["p1"])):
                mux = Mux[str]()
                mux.register(first, first)
                try:
                    mux.register(second, second)
                    conflicted = False
                except ConflictError:
                    conflicted = True
                if conflicted != row["conflict_on_registration"]:
                    errors.append(f"registering {first!r} then {second!r}: conflict={conflicted}")
            failures.check(case, errors)
        failures.done(106)

    def test_conflicts(self) -> None:
        failures = FailureList(self)
        for row in self.data["conflicts"]:
            case = f"conflict {row['p1']!r} then {row['p2']!r}"
            mux = Mux[str]()
            mux.register(row["p1"], row["p1"])
            try:
                mux.register(row["p2"], row["p2"])
            except ConflictError as e:
                errors = []
                if not row["conflict"]:
                    errors.append(f"unexpected conflict: {e}")
                elif str(e) != row["go_error"]:
                    errors.append(f"message {str(e)!r} != {row['go_error']!r}")
                if row.get("error_contains", "") not in str(e):
                    errors.append(f"{row['error_contains']!r} not in message")
                if e.pattern.text != row["p2"] or e.existing.text != row["p1"]:
                    errors.append("wrong pattern attributes")
                failures.check(case, errors)
            else:
                failures.expect(case, not row["conflict"], "no conflict")
        failures.done(22)

    def test_conflict_messages(self) -> None:
        failures = FailureList(self)
        for row in self.data["conflict_messages"]:
            case = f"message {row['new_pattern']!r} vs {row['registered_pattern']!r}"
            mux = Mux[str]()
            mux.register(row["registered_pattern"], "old")
            try:
                mux.register(row["new_pattern"], "new")
            except ConflictError as e:
                failures.expect(
                    case,
                    str(e) == row["go_error"] and row["message_contains"] in str(e),
                    f"message {str(e)!r}",
                )
            else:
                failures.check(case, ["no conflict"])
        failures.done(6)

    def test_common_paths(self) -> None:
        failures = FailureList(self)
        for row in self.data["common_paths"]:
            p1, p2 = parse_pattern(row["p1"]), parse_pattern(row["p2"])
            got = common_path(p1, p2)
            errors = [] if got == row["path_matched_by_both"] else [f"got {got!r}"]
            if p1.match_path(got) is None or p2.match_path(got) is None:
                errors.append(f"{got!r} is not matched by both")
            failures.check(f"common {row['p1']!r} {row['p2']!r}", errors)
        failures.done(10)

    def test_difference_paths(self) -> None:
        failures = FailureList(self)
        for row in self.data["difference_paths"]:
            p1, p2 = parse_pattern(row["p1"]), parse_pattern(row["p2"])
            got = difference_path(p1, p2)
            errors = [] if got == row["path_matched_by_p1_not_p2"] else [f"got {got!r}"]
            if p1.match_path(got) is None or p2.match_path(got) is not None:
                errors.append(f"{got!r} is not matched by p1 only")
            failures.check(f"difference {row['p1']!r} {row['p2']!r}", errors)
        failures.done(25)


class RoutingTests(SynchronousTestCase):
    """
    Behaviour beyond the tables: escapes, hosts, redirects, CONNECT and the API itself.
    """

    def mux(self, *patterns: str) -> Mux[str]:
        mux = Mux[str]()
        for pattern in patterns:
            mux.register(pattern, pattern)
        return mux

    def assertMatch(
        self, result: RouteResult[str], pattern: str, params: dict[str, str] | None = None
    ) -> None:
        self.assertIsInstance(result, Matched, describe(result))
        assert isinstance(result, Matched)
        self.assertEqual(result.pattern.text, pattern)
        self.assertEqual(result.params, params or {})

    def test_encoded_slash_stays_in_segment(self) -> None:
        """
        C{%2F} is part of a segment's value: it neither splits the segment nor stands for
        a trailing slash.
        """
        mux = self.mux("/a/{x}", "/a/{$}", "/b/%2F", "/c/{rest...}")
        self.assertMatch(mux.route("GET", "", "/a/x%2Fy"), "/a/{x}", {"x": "x/y"})
        self.assertMatch(mux.route("GET", "", "/a/%2F"), "/a/{x}", {"x": "/"})
        self.assertMatch(mux.route("GET", "", "/a/"), "/a/{$}")
        self.assertMatch(mux.route("GET", "", "/b/%2f"), "/b/%2F")
        self.assertIsInstance(mux.route("GET", "", "/b/"), NotFound)
        self.assertMatch(mux.route("GET", "", "/c/d%2Fe/f"), "/c/{rest...}", {"rest": "d/e/f"})

    def test_invalid_escape_segment_as_written(self) -> None:
        """
        A segment with an invalid escape is matched as written, all of it.
        """
        mux = self.mux("/%61%zz", "/{x}/{rest...}")
        self.assertMatch(mux.route("GET", "", "/%61%zz"), "/%61%zz")
        self.assertEqual(parse_pattern("/%61%zz").segments, (Segment("literal", "%61%zz"),))
        self.assertMatch(
            mux.route("GET", "", "/%zz/%61/%"), "/{x}/{rest...}", {"x": "%zz", "rest": "%61/%"}
        )

    def test_utf8(self) -> None:
        """
        Raw UTF-8 (decoded with surrogateescape) and percent-encoded UTF-8 match the same
        literal; undecodable bytes never raise.
        """
        mux = self.mux("/café/{x}")
        raw = "/café/%FF".encode().decode("utf-8", "surrogateescape")
        result = mux.route("GET", "", raw)
        self.assertMatch(result, "/café/{x}", {"x": "\udcff"})
        self.assertMatch(mux.route("GET", "", "/caf%C3%A9/%c3"), "/café/{x}", {"x": "\udcc3"})
        raw_bytes = "/caf\udcc3%A9/x"
        self.assertMatch(mux.route("GET", "", raw_bytes), "/café/{x}", {"x": "x"})

    def test_dot_segments_are_values(self) -> None:
        """
        Encoded dots survive cleaning, so wildcard values can be C{..}: callers must not
        treat wildcard values as safe file names.
        """
        mux = self.mux("/files/{name}")
        self.assertMatch(mux.route("GET", "", "/files/%2e%2e"), "/files/{name}", {"name": ".."})
        self.assertEqual(mux.route("GET", "", "/files/.."), Redirect("/"))

    def test_location_escaping(self) -> None:
        """
        A cleaning redirect keeps the client's escapes (no double escaping) and encodes
        what may not appear in a Location.
        """
        mux = self.mux("/")
        cases = {
            "/a/../%61b": "/%61b",
            "/x//my%20doc": "/x/my%20doc",
            '/x//a"b{c}': "/x/a%22b%7Bc%7D",
            "/x//caf\u00e9": "/x/caf%C3%A9",
            "/x//\udcff": "/x/%FF",
            "/x//%zz": "/x/%25zz",
            "/x//%41%zz/%41": "/x/%2541%25zz/%41",
        }
        for target, location in cases.items():
            self.assertEqual(mux.route("GET", "", target), Redirect(location), target)
            again = mux.route("GET", "", location)
            self.assertIsInstance(again, Matched, location)
        self.assertEqual(
            mux.route("GET", "", "//a", "q=a b#c\u00e9"), Redirect("/a?q=a%20b%23c%C3%A9")
        )
        self.assertEqual(mux.route("GET", "", "//a", "x=%41&y=/?"), Redirect("/a?x=%41&y=/?"))

    def test_redirected_segments_route_the_same(self) -> None:
        """
        The Location of a cleaning redirect routes to the same segments as the cleaned
        path, even with invalid escapes.
        """
        mux = self.mux("/{a}/{b}", "/{a}/{b}/{c}")
        for target in ("/x//%41%zz/%41", "/x//{%zz", "/./%ZZ%/%25"):
            cleaned = mux.lookup("GET", "", clean_path(target))
            result = mux.route("GET", "", target)
            assert isinstance(result, Redirect), target
            followed = mux.route("GET", "", result.location)
            assert isinstance(followed, Matched) and cleaned is not None, target
            self.assertEqual(followed.params, cleaned.params, target)

    def test_host_port_stripping(self) -> None:
        mux = self.mux("example.com/", "::1/", "[::1]/", "/")
        cases = {
            "example.com:8080": "example.com/",
            "example.com:": "example.com/",
            "example.com:x": "example.com/",
            "[::1]:80": "::1/",
            "[::1]": "[::1]/",
            "::1": "::1/",
            "EXAMPLE.COM": "example.com/",
            "example.com.": "example.com/",
            "Example.Com.:8080": "example.com/",
            "example.com..": "/",
            "example.com:1:2": "/",
            "[::1]x:80": "/",
        }
        for host, pattern in cases.items():
            self.assertMatch(mux.route("GET", host, "/"), pattern)

    def test_host_patterns_are_case_insensitive(self) -> None:
        """
        RFC 9110 section 4.2.3: a host pattern matches every spelling of its host (Go
        compares bytes), so a policy on C{admin.example/} covers C{ADMIN.example.:80}.
        """
        mux = self.mux("Admin.Example./", "/")
        for host in ("admin.example", "ADMIN.EXAMPLE", "admin.example.", "Admin.example.:80"):
            self.assertMatch(mux.route("GET", host, "/x"), "Admin.Example./")
        self.assertMatch(mux.route("GET", "other.example", "/x"), "/")
        self.assertRaises(ConflictError, mux.register, "admin.example/", "second")
        self.assertRaises(ConflictError, mux.register, "ADMIN.EXAMPLE./", "second")
        self.assertTrue(conflicts(parse_pattern("a.example/x"), parse_pattern("A.Example./x")))
        self.assertFalse(conflicts(parse_pattern("a.example/x"), parse_pattern("b.example/x")))

    def test_connect(self) -> None:
        """
        CONNECT paths are not cleaned, the host keeps its port, and the trailing-slash
        redirect looks at the target's own authority only.
        """
        mux = self.mux("example.com:443/{$}", "CONNECT /tunnel/", "example.com/")
        self.assertIsInstance(mux.route("CONNECT", "example.com:443", "/x"), NotFound)
        self.assertMatch(mux.route("CONNECT", "example.com:443", "/"), "example.com:443/{$}")
        self.assertEqual(
            mux.route("CONNECT", "example.com:443", "", target_host="example.com:443"),
            Redirect("/"),
        )
        self.assertIsInstance(mux.route("CONNECT", "example.com:443", ""), NotFound)
        self.assertEqual(mux.route("CONNECT", "h", "/tunnel", "a=1"), Redirect("/tunnel/?a=1"))
        self.assertIsInstance(mux.route("CONNECT", "h", "/x/../tunnel"), NotFound)
        self.assertMatch(mux.route("CONNECT", "h", "/tunnel/../x"), "CONNECT /tunnel/")
        unclean = self.mux("CONNECT /x/../t/")
        self.assertEqual(unclean.route("CONNECT", "h", "/x/../t"), Redirect("/t/"))
        self.assertMatch(unclean.route("CONNECT", "h", "/x/../t/"), "CONNECT /x/../t/")
        self.assertIsInstance(mux.route("CONNECT", "h", "relative"), NotFound)
        self.assertEqual(
            split_request_target("CONNECT", "example.com:443"), ("example.com:443", "", "")
        )

    def test_split_request_target(self) -> None:
        cases = {
            ("GET", "/a?b?c"): ("", "/a", "b?c"),
            ("GET", "//a"): ("", "//a", ""),
            ("GET", "http://h:1/p/q?x"): ("h:1", "/p/q", "x"),
            ("GET", "http://h?x/y"): ("h", "", "x/y"),
            ("GET", "test/?x"): ("", "test/", "x"),
            ("GET", "*"): ("", "*", ""),
            ("GET", "urn:x?q"): ("", "", "q"),
            ("CONNECT", "h:443"): ("h:443", "", ""),
        }
        for (method, target), want in cases.items():
            self.assertEqual(split_request_target(method, target), want, target)

    def test_slash_redirect_prefers_exact(self) -> None:
        """
        A match through a multi wildcard with a non-empty remainder is not exact, so the
        trailing-slash form wins when it matches exactly.
        """
        mux = self.mux("/", "/x/")
        self.assertEqual(mux.route("GET", "", "/x", "q"), Redirect("/x/?q"))
        self.assertFalse(mux.matches_directly("GET", "", "/x"))
        self.assertTrue(mux.matches_directly("GET", "", "/x/"))
        self.assertTrue(mux.matches_directly("GET", "", "/y"))
        self.assertFalse(mux.matches_directly("GET", "", "/y/../x/"))

    def test_allow_from_host_and_hostless(self) -> None:
        mux = self.mux("PUT h/a", "POST /a", "GET /a/")
        self.assertEqual(mux.route("DELETE", "h:1", "/a"), MethodNotAllowed("GET, HEAD, POST, PUT"))
        self.assertEqual(mux.route("DELETE", "", "/a"), MethodNotAllowed("GET, HEAD, POST"))
        self.assertEqual(mux.route("GET", "", "/a"), Redirect("/a/"))

    def test_head(self) -> None:
        mux = self.mux("GET h/x", "HEAD /x", "/y", "GET /y/{z}")
        self.assertMatch(mux.route("HEAD", "h", "/x"), "GET h/x")
        self.assertMatch(mux.route("HEAD", "o", "/x"), "HEAD /x")
        self.assertEqual(mux.route("GET", "o", "/x"), MethodNotAllowed("HEAD"))
        self.assertMatch(mux.route("HEAD", "o", "/y/1"), "GET /y/{z}", {"z": "1"})

    def test_patterns_order_and_failed_registration(self) -> None:
        mux = self.mux("/b", "GET /a", "h/c")
        self.assertRaises(ConflictError, mux.register, "/%62", "x")
        self.assertRaises(PatternError, mux.register, "/{", "x")
        self.assertEqual([p.text for p in mux.patterns()], ["/b", "GET /a", "h/c"])
        self.assertIsInstance(mux.route("GET", "", "/b"), Matched)

    def test_conflict_describes_first_registered(self) -> None:
        mux = self.mux("/a/{x}", "/b/{x}")
        with self.assertRaises(ConflictError) as raised:
            mux.register("/{y}/b", "new")
        self.assertEqual(raised.exception.existing, parse_pattern("/a/{x}"))
        self.assertIsInstance(raised.exception.pattern, Pattern)

    def test_host_patterns_never_conflict_with_hostless(self) -> None:
        self.mux("/a", "GET h/{x}")
        self.mux("h/a", "/a")
        self.assertRaises(ConflictError, self.mux, "/a", "GET /{x}")

    def test_empty_segments_and_wildcards(self) -> None:
        """
        A wildcard matches only a non-empty segment, so C{//} literals (CONNECT only) are
        separate from wildcards.
        """
        mux = self.mux("CONNECT /{x}/a", "CONNECT //a")
        self.assertMatch(mux.route("CONNECT", "", "//a"), "CONNECT //a")
        self.assertMatch(mux.route("CONNECT", "", "/b/a"), "CONNECT /{x}/a", {"x": "b"})
        only_wildcard = self.mux("CONNECT /{x}/a", "CONNECT /{y...}")
        self.assertMatch(only_wildcard.route("CONNECT", "", "//a"), "CONNECT /{y...}", {"y": "/a"})
        self.assertIsNone(parse_pattern("/{x}").match_path("//"))
        wildcard, empty = parse_pattern("/{x}/a"), parse_pattern("//a")
        self.assertEqual(compare_paths(wildcard, empty), "disjoint")
        self.assertEqual(compare_paths(empty, wildcard), "disjoint")
        self.assertEqual(compare_paths(wildcard, parse_pattern("/%2F/a")), "more_general")

    def test_deep_paths(self) -> None:
        """
        Lookups recurse only as deep as the routing tree, not the request path.
        """
        mux = self.mux("/{a}/{b}/", "/x/y/{rest...}")
        path = "/a" * 100_000
        self.assertMatch(mux.route("GET", "", path), "/{a}/{b}/", {"a": "a", "b": "a"})
        self.assertMatch(mux.route("GET", "", "/x/y" + path), "/x/y/{rest...}", {"rest": path[1:]})

    def test_go_quote(self) -> None:
        cases = {
            "GET\t  /": '"GET\\t  /"',
            'a"b\\c': '"a\\"b\\\\c"',
            "\x00\x7f": '"\\x00\\x7f"',
            "caf\u00e9": '"caf\u00e9"',
            "\u200b": '"\\u200b"',
            "\U000e0001": '"\\U000e0001"',
            "\udcff": '"\\xff"',
        }
        for text, quoted in cases.items():
            self.assertEqual(go_quote(text), quoted)

    def test_pattern_error_byte_offsets(self) -> None:
        with self.assertRaises(PatternError) as raised:
            parse_pattern("/é/{x}/{x}")
        self.assertEqual(raised.exception.offset, 8)
        self.assertEqual(
            str(raised.exception), 'parsing "/é/{x}/{x}": at offset 8: duplicate wildcard name "x"'
        )


class VetPathTests(SynchronousTestCase):
    """
    What the edge does with escapes before the mux sees a path (C{encodedSlashes}).
    """

    def test_modes(self) -> None:
        cases = {
            # path: (reject, decode, keep); None is 400
            "/a/b": ("/a/b", "/a/b", "/a/b"),
            "/a%41/%20": ("/aA/%20", "/aA/%20", "/aA/%20"),
            "/%61pi/%7euser%5F%2D%2e": ("/api/~user_-.", "/api/~user_-.", "/api/~user_-."),
            "/admin%2Fusers": (None, "/admin/users", "/admin%2Fusers"),
            "/admin%2fusers": (None, "/admin/users", "/admin%2fusers"),
            "/a%2F%2Fb": (None, "/a//b", "/a%2F%2Fb"),
            "/a/%252F": ("/a/%252F", "/a/%252F", "/a/%252F"),
            "/a.%2e.b/..%41/%2e%2e%2e": ("/a...b/..A/...", "/a...b/..A/...", "/a...b/..A/..."),
            "/a/../b": ("/a/../b", "/a/../b", "/a/../b"),
        }
        for path, expected in cases.items():
            got = tuple(vet_path(path, mode) for mode in ("reject", "decode", "keep"))
            self.assertEqual(got, expected, path)

    def test_dot_segments_in_disguise_refused_in_every_mode(self) -> None:
        for path in (
            "/%2e",
            "/x/%2E%2e/y",
            "/x/.%2e",
            "/x/%2e./",
            "/x/..%2Fy",
            "/x/%2e%2e%2fy",
            "/x/a%2F..",
            "/x/a%2F.%2Fb",
            "/x%5cy",
            "/x%5Cy",
            "/x\\y",
            "/x/%zz",
            "/x/%4",
        ):
            for mode in ("reject", "decode", "keep"):
                self.assertIsNone(vet_path(path, mode), (path, mode))

    def test_has_dot_segment(self) -> None:
        for value in (".", "..", "../a", "a/..", "a/./b", "..\\a", "a\\."):
            self.assertTrue(has_dot_segment(value), value)
        for value in ("", "a", "...", ".a", "a..", "a/b", "a.b/c..d"):
            self.assertFalse(has_dot_segment(value), value)


class NormaliseHostTests(SynchronousTestCase):
    def test_normal_forms(self) -> None:
        cases = {
            b"": b"",
            b"example.com": b"example.com",
            b"Example.COM.": b"example.com",
            b"example.com.:80": b"example.com:80",
            b"example.com:": b"example.com",
            b"127.0.0.1:8080": b"127.0.0.1:8080",
            b"[::1]": b"[::1]",
            b"[FE80::A]:443": b"[fe80::a]:443",
            b"my_service:80": b"my_service:80",
            b"example.com:0080": b"example.com:80",
            b":80": b":80",
        }
        for value, normal in cases.items():
            self.assertEqual(normalise_host(value), normal, value)

    def test_invalid(self) -> None:
        for value in (
            b"a b",
            b"a@b/c?d",
            b"a@b",
            b"a/b",
            b"a\\b",
            b"a\tb",
            b"a:b",
            b"a:80:80",
            b"a..b",
            b".",
            b"::1",
            b"[::1",
            b"[::1]x",
            b"[::1]:x",
            b"[zz]",
            b"[fe80::1%25eth0]",
            # Sub-delims and IPvFuture: RFC 3986 allows them, no DNS name has them, and
            # "x,admin.example" is admin.example to a backend that splits on commas.
            b"admin.example,x",
            b"x;admin.example",
            b"a&b",
            b"a!b",
            b"a=b",
            b"[v1.Fe:x]",
            # Ports: 1 to 65535, at most five digits.
            b"a:0",
            b"a:65536",
            b"a:000080",
            b"a]",
            b"h\xc3\xa9",
            b"a%zz",
            b"a%4",
            b"a%41",
            b"%61dmin.example",
        ):
            self.assertIsNone(normalise_host(value), value)


class DifferentialTests(SynchronousTestCase):
    """
    The routing tree against a brute-force search over the registered patterns.
    """

    def test_tree_agrees_with_brute_force(self) -> None:
        rng = random.Random(20250101)
        pieces = ["a", "b", "{w}", "%61"]
        tails = ["", "/", "/{$}", "/{rest...}"]
        methods = ["", "", "GET", "HEAD", "POST"]
        hosts = ["", "", "h"]
        checked = 0
        for _ in range(150):
            mux = Mux[str]()
            for _ in range(rng.randrange(1, 25)):
                parts = [rng.choice(pieces) for _ in range(rng.randrange(0, 4))]
                names = iter(f"w{i}" for i in range(10))
                path = "/" + "/".join(p if p != "{w}" else "{" + next(names) + "}" for p in parts)
                path = (path.rstrip("/") + rng.choice(tails)) or "/"
                if path.startswith("//"):
                    path = path[1:]
                method = rng.choice(methods)
                text = f"{method} {rng.choice(hosts)}{path}".strip()
                with contextlib.suppress(ConflictError):
                    mux.register(text, text)
            registered = mux.patterns()
            for _ in range(60):
                path = "/" + "/".join(
                    rng.choice(["a", "b", "c", "%61"]) for _ in range(rng.randrange(0, 5))
                )
                if rng.random() < 0.4 and path != "/":
                    path += "/"
                method = rng.choice(["GET", "HEAD", "POST", "PUT"])
                host = rng.choice(["h", "other"])
                want = self.brute_force(registered, method, host, path)
                got = mux.lookup(method, host, path)
                context = f"{method} {host}{path} over {[p.text for p in registered]}"
                if want is None:
                    self.assertIsNone(got, context)
                else:
                    assert got is not None, context
                    self.assertEqual(got.pattern, want[0], context)
                    self.assertEqual(got.params, want[1], context)
                checked += 1
        self.assertEqual(checked, 150 * 60)

    @staticmethod
    def brute_force(
        patterns: list[Pattern], method: str, host: str, path: str
    ) -> tuple[Pattern, dict[str, str]] | None:
        """
        The unique most specific pattern matching the request, host patterns first.
        """
        for host_choice in (host, ""):
            candidates = []
            for p in patterns:
                if p.host != host_choice:
                    continue
                if p.method not in ("", method) and not (p.method == "GET" and method == "HEAD"):
                    continue
                found = p.match_path(path)
                if found is not None:
                    candidates.append((p, found[0]))
            best = [
                c
                for c in candidates
                if all(
                    compare_patterns(c[0], o[0]) == "more_specific"
                    for o in candidates
                    if o[0] is not c[0]
                )
            ]
            if candidates:
                assert len(best) == 1, f"no unique winner among {[c[0].text for c in candidates]}"
                return best[0]
        return None


class LookupCostTests(SynchronousTestCase):
    """
    Lookup walks the routing tree by path segment: the work does not grow with the number
    of routes (counted in tree nodes visited, not timed).
    """

    def nodes_visited(self, routes: int) -> int:
        import edgegw.routing.mux as mux_module

        mux: Mux[int] = Mux()
        for index in range(routes):
            mux.register(f"GET /svc{index}/items/{{id}}", index)
        mux.register("GET /target/items/{id}", -1)
        calls = 0
        original = mux_module._match

        def counting(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return original(*args)

        self.patch(mux_module, "_match", counting)
        result = mux.route("GET", "h", "/target/items/7")
        assert isinstance(result, Matched)
        self.assertEqual((result.target, result.params), (-1, {"id": "7"}))
        return calls

    def test_same_work_for_10_and_10000_routes(self) -> None:
        self.assertEqual(self.nodes_visited(10), self.nodes_visited(10_000))


class _Everything:
    """A set holding every depth: the slash-redirect look-up is never skipped."""

    def __contains__(self, item: object) -> bool:
        return True

    def add(self, item: object) -> None:
        pass


class ShortcutTests(SynchronousTestCase):
    """
    The mux's shortcuts (the slash-redirect look-up only at depths where a pattern can
    match a slash path exactly; request hosts' keys remembered) decide as the full
    look-up does.
    """

    PATTERNS = [
        "/",
        "/a",
        "/a/",
        "/a/b",
        "/a/b/",
        "/a/{x}",
        "/a/{x}/",
        "/a/{x}/c",
        "/b/{$}",
        "/b/{y...}",
        "/c/{z}/{$}",
        "GET /d/",
        "POST /d/e",
        "example.com/a/",
        "example.com/f/{w}/",
        "/g/{v...}",
    ]
    PATHS = [
        "/",
        "/a",
        "/a/",
        "/a/b",
        "/a/b/",
        "/a/q",
        "/a/q/",
        "/a/q/c",
        "/a/q/c/",
        "/b",
        "/b/",
        "/b/x",
        "/b/x/",
        "/c/1",
        "/c/1/",
        "/c",
        "/d",
        "/d/e",
        "/d/e/",
        "/f/1",
        "/f/1/",
        "/g",
        "/g/",
        "/g/1/2",
        "/h",
        "/a//b",
        "/a/./b",
        "/a/%2F",
    ]
    HOSTS = ["", "example.com", "EXAMPLE.com:8080", "example.com.", "other:1", "[::1]:80"]

    def test_same_as_the_full_look_up(self) -> None:
        rng = random.Random(19)
        for _ in range(300):
            fast: Mux[int] = Mux()
            full: Mux[int] = Mux()
            full._slash_depths = _Everything()  # type: ignore[assignment]
            for index, pattern in enumerate(rng.sample(self.PATTERNS, rng.randrange(1, 8))):
                with contextlib.suppress(ConflictError):
                    fast.register(pattern, index)
                    full.register(pattern, index)
            for _ in range(30):
                method = rng.choice(["GET", "HEAD", "POST"])
                host = rng.choice(self.HOSTS)
                path = rng.choice(self.PATHS)
                self.assertEqual(
                    fast.route(method, host, path, "q=1"),
                    full.route(method, host, path, "q=1"),
                    (fast.patterns(), method, host, path),
                )


class HostMemoryTests(SynchronousTestCase):
    def test_long_hosts_are_routed_not_remembered(self) -> None:
        """
        A request host longer than any real one is routed as any other, but the mux
        does not keep it (thousands of 16 KB hosts would otherwise stay in memory).
        """
        mux: Mux[int] = Mux()
        mux.register("example.com/a", 1)
        mux.register("/a", 2)
        long_host = "x" * 16_000 + ".example"
        result = mux.route("GET", long_host + ":8080", "/a")
        assert isinstance(result, Matched)
        self.assertEqual(result.target, 2)
        self.assertNotIn(long_host + ":8080", mux._host_keys)
        result = mux.route("GET", "EXAMPLE.com:8080", "/a")
        assert isinstance(result, Matched)
        self.assertEqual(result.target, 1)
        self.assertEqual(mux._host_keys, {"EXAMPLE.com:8080": "example.com"})
