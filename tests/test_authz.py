"""
Authorization: RouteGroup selectors and merging, require rules, Rego policies, the authz
stage and onDeny redirects.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.authz import rego as rego_module
from edgegw.authz.policy import REMEMBERED_DECISIONS, CompiledPolicy, RoutePolicies
from edgegw.authz.rego import RegoLoadError, RegoPolicy
from edgegw.authz.require import RequireRule
from edgegw.config.effective import effective_routes
from edgegw.config.errors import ConfigError
from edgegw.config.model import LabelExpression, RequireSpec, Selector
from edgegw.identity.principal import Principal
from edgegw.terminal.exchange import Exchange
from tests.support.configs import load_text, write_tree
from tests.support.log_capture import capture_log
from tests.support.memory import MemoryClient


def rego_file(test: SynchronousTestCase, source: str, name: str = "authz.rego") -> str:
    directory = os.path.abspath(test.mktemp())
    os.makedirs(directory)
    path = os.path.join(directory, name)
    with open(path, "w") as stream:
        stream.write(textwrap.dedent(source))
    return path


DELETE_NEEDS_ADMIN = """\
package gw.authz

import rego.v1

deny contains "only admins may delete" if {
    input.request.method == "DELETE"
    not "admin" in input.groups
}

deny contains "no access to /private" if startswith(input.request.path, "/private")
"""


class SelectorTests(SynchronousTestCase):
    def test_operators(self) -> None:
        labels = {"tier": "api", "env": "prod"}
        cases = [
            (LabelExpression("tier", "In", ("api", "web")), True),
            (LabelExpression("tier", "In", ("web",)), False),
            (LabelExpression("tier", "NotIn", ("web",)), True),
            (LabelExpression("tier", "NotIn", ("api",)), False),
            (LabelExpression("missing", "NotIn", ("x",)), True),
            (LabelExpression("env", "Exists"), True),
            (LabelExpression("missing", "Exists"), False),
            (LabelExpression("missing", "DoesNotExist"), True),
            (LabelExpression("env", "DoesNotExist"), False),
        ]
        for expression, expected in cases:
            self.assertEqual(expression.matches(labels), expected, expression)

    def test_match_labels_and_expressions_together(self) -> None:
        selector = Selector({"tier": "api"}, (LabelExpression("env", "In", ("prod",)),))
        self.assertTrue(selector.matches({"tier": "api", "env": "prod"}))
        self.assertFalse(selector.matches({"tier": "api", "env": "dev"}))
        self.assertFalse(selector.matches({"env": "prod"}))

    def test_empty_selector_matches_everything(self) -> None:
        self.assertTrue(Selector().matches({}))
        self.assertTrue(Selector().matches({"any": "thing"}))


GROUPS = """\
kind: Policy
metadata: {name: p1}
spec: {require: {groups: [a]}}
---
kind: Policy
metadata: {name: p2}
spec: {require: {groups: [b]}}
---
kind: Policy
metadata: {name: p3}
spec: {require: {groups: [c]}}
---
kind: RouteGroup
metadata: {name: everything}
spec:
  access:
    auth: required
    authorize: [p1, p2]
    onDeny: {redirect: /first}
    projection: {session: {groups: {header: X-Early}}}
---
kind: RouteGroup
metadata: {name: apis}
spec:
  type: service
  selector: {matchLabels: {tier: api}}
  access:
    onDeny: {redirect: /second}
    authorize: [p2, p3]
---
kind: Route
metadata: {name: mine, labels: {tier: api}}
spec:
  match: /api/
  handler: {type: health}
  access:
    authorize: [p3, p1]
    projection: {session: {claims: {email: X-Mail}}}
---
kind: Route
metadata: {name: own-type, labels: {tier: api}}
spec:
  match: /typed/
  type: app
  handler: {type: health}
  access: {auth: public}
---
kind: Route
metadata: {name: plain}
spec:
  match: /plain/
  handler: {type: health}
"""


class MergeTests(SynchronousTestCase):
    def routes(self) -> dict[str, Any]:
        config = load_text(self.mktemp(), GROUPS)
        return {route.spec.name: route for route in effective_routes(config)}

    def test_route_wins_later_groups_win_authorize_unioned(self) -> None:
        mine = self.routes()["mine"]
        self.assertEqual(mine.groups, ("everything", "apis"))
        self.assertEqual(mine.type, "service")
        self.assertEqual(mine.auth, "required")
        self.assertEqual(mine.access.authorize, ("p3", "p1", "p2"))
        self.assertEqual(mine.access.on_deny_redirect, "/second")
        self.assertEqual(mine.access.projection.groups_header, "X-Early")
        self.assertEqual(mine.access.projection.claims, {"email": "X-Mail"})

    def test_route_type_and_auth_beat_groups(self) -> None:
        typed = self.routes()["own-type"]
        self.assertEqual((typed.type, typed.auth), ("app", "public"))

    def test_only_matching_groups(self) -> None:
        plain = self.routes()["plain"]
        self.assertEqual(plain.groups, ("everything",))
        self.assertEqual(plain.type, "app")
        self.assertEqual(plain.access.authorize, ("p1", "p2"))
        self.assertEqual(plain.access.on_deny_redirect, "/first")


def exchange_for(
    principal: Principal | None, method: bytes = b"GET", path: bytes = b"/"
) -> Exchange:
    from twisted.web.test.requesthelper import DummyRequest

    request = DummyRequest(path.split(b"/")[1:])
    request.method = method
    request.path = path  # type: ignore[attr-defined]
    exchange = Exchange(request, None, {}, 0.0)  # type: ignore[arg-type]
    exchange.principal = principal
    return exchange


class RequireTests(SynchronousTestCase):
    def test_groups_any_of(self) -> None:
        rule = RequireRule(RequireSpec(groups=("admin", "ops")))
        self.assertIsNone(rule.check(Principal("u", groups=("dev", "ops"))))
        self.assertEqual(rule.check(Principal("u", groups=("dev",))), "not in any required group")
        self.assertEqual(rule.check(None), "no authenticated principal")

    def test_claims_all_of_any_within(self) -> None:
        rule = RequireRule(RequireSpec(claims={"dept": ("eng", "ops"), "country": ("NL",)}))
        self.assertIsNone(rule.check(Principal("u", {"dept": "ops", "country": "NL"})))
        self.assertIsNotNone(rule.check(Principal("u", {"dept": "ops", "country": "BE"})))
        self.assertIsNotNone(rule.check(Principal("u", {"dept": "ops"})))
        self.assertIsNotNone(rule.check(Principal("u", {"dept": "sales", "country": "NL"})))

    def test_list_valued_claim_matches_any_element(self) -> None:
        rule = RequireRule(RequireSpec(claims={"roles": ("editor",)}))
        self.assertIsNone(rule.check(Principal("u", {"roles": ["viewer", "editor"]})))
        self.assertIsNotNone(rule.check(Principal("u", {"roles": ["viewer"]})))
        self.assertIsNotNone(rule.check(Principal("u", {"roles": []})))

    def test_groups_and_claims_both_needed(self) -> None:
        rule = RequireRule(RequireSpec(groups=("admin",), claims={"mfa": ("true",)}))
        self.assertIsNone(rule.check(Principal("u", {"mfa": True}, ("admin",))))
        self.assertIsNotNone(rule.check(Principal("u", {"mfa": False}, ("admin",))))


class RegoTests(SynchronousTestCase):
    def test_request_attributes_and_groups(self) -> None:
        policy = RegoPolicy(rego_file(self, DELETE_NEEDS_ADMIN))
        routes = RoutePolicies([CompiledPolicy("p", None, policy)], "/x", "x", {"tier": "a"})

        def verdict(principal: Principal | None, method: bytes, path: bytes) -> str | None:
            return routes.first_denial(exchange_for(principal, method, path))

        self.assertIsNone(verdict(None, b"GET", b"/x"))
        self.assertEqual(verdict(None, b"DELETE", b"/x"), "policy p: only admins may delete")
        self.assertIsNone(verdict(Principal("u", groups=("admin",)), b"DELETE", b"/x"))
        self.assertEqual(verdict(None, b"GET", b"/private/a"), "policy p: no access to /private")

    def test_input_document(self) -> None:
        routes = RoutePolicies([], "GET /items/{id}", "items", {"tier": "api"})
        anonymous = routes.input_document(exchange_for(None, b"GET", b"/items/1"))
        self.assertEqual(
            anonymous,
            {
                "subject": "",
                "groups": [],
                "claims": {},
                "request": {
                    "method": "GET",
                    "path": "/items/1",
                    "route": "GET /items/{id}",
                    "route_name": "items",
                    "labels": {"tier": "api"},
                },
            },
        )
        principal = Principal("u1", {"email": "e@x"}, ("g",), access_token="secret")
        document = routes.input_document(exchange_for(principal))
        self.assertEqual(
            (document["subject"], document["groups"], document["claims"]),
            ("u1", ["g"], {"email": "e@x"}),
        )
        self.assertNotIn("secret", repr(document))

    def test_fails_closed_on_runtime_error_and_non_set(self) -> None:
        policy = RegoPolicy(
            rego_file(
                self,
                """\
                package gw.authz
                import rego.v1
                default deny := set()
                deny := 5 if input.request.path == "/weird"
                deny := {"x"} if {
                    startswith(input.request.path, "/n/")
                    to_number(trim_prefix(input.request.path, "/n/")) > 1
                }
                """,
            )
        )
        base = RoutePolicies([], "/", "r", {}).input_document
        weird = policy.evaluate(base(exchange_for(None, b"GET", b"/weird")))
        self.assertEqual(weird, ["deny is not a set of strings"])
        error = policy.evaluate(base(exchange_for(None, b"GET", b"/n/abc")))
        self.assertIsNotNone(error)
        assert error is not None
        self.assertTrue(error[0].startswith("evaluation error"), error)
        self.assertIsNone(policy.evaluate(base(exchange_for(None, b"GET", b"/ok"))))

    def test_directory_of_files(self) -> None:
        directory = os.path.dirname(rego_file(self, DELETE_NEEDS_ADMIN, "a.rego"))
        with open(os.path.join(directory, "b.rego"), "w") as stream:
            stream.write(
                'package gw.authz\nimport rego.v1\ndeny contains "b" if input.subject == "bad"\n'
            )
        policy = RegoPolicy(directory)
        document = RoutePolicies([], "/", "r", {}).input_document(exchange_for(Principal("bad")))
        self.assertEqual(policy.evaluate(document), ["b"])

    def test_load_errors_name_the_file(self) -> None:
        missing = os.path.join(os.path.abspath(self.mktemp()), "nope.rego")
        cases = {
            "package gw.authz\ndeny contains x if {": "this is unclosed",
            "package other\nimport rego.v1\ndeny contains 1 if true\n": (
                "the package must be gw.authz"
            ),
            "package gw.authz\nallow := true\n": "no deny rule in package gw.authz",
            "package gw.authz\ndeny := input.request.method\n": "deny must be a set of strings",
        }
        for source, message in cases.items():
            path = rego_file(self, source)
            e = self.assertRaises(RegoLoadError, RegoPolicy, path)
            self.assertIn(message, str(e), source)
            self.assertTrue(str(e).startswith(path), str(e))
        e = self.assertRaises(RegoLoadError, RegoPolicy, missing)
        self.assertEqual(str(e), f"{missing}: no such file or directory")


ROUTES = """\
kind: Policy
metadata: {name: no-delete}
spec: {rego: {path: policies/authz.rego}}
---
kind: Policy
metadata: {name: admins}
spec: {require: {groups: [admin]}}
---
kind: Route
metadata: {name: app}
spec:
  match: /app/
  handler: {type: health}
  access: {authorize: [no-delete], onDeny: {redirect: /denied}}
---
kind: Route
metadata: {name: service}
spec:
  match: /svc/
  type: service
  handler: {type: health}
  access: {auth: public, authorize: [no-delete], onDeny: {redirect: /denied}}
---
kind: Route
metadata: {name: admin-only}
spec:
  match: /admin/
  handler: {type: health}
  access: {authorize: [admins]}
---
kind: Route
metadata: {name: open}
spec: {match: /open/, handler: {type: health}}
"""


class GatewayAuthzTests(SynchronousTestCase):
    def client(self) -> MemoryClient:
        root = os.path.abspath(self.mktemp())
        write_tree(root, {"policies/authz.rego": DELETE_NEEDS_ADMIN})
        config = load_text(root, ROUTES)
        return MemoryClient(build_gateway(config, Clock()).site)

    def test_policies_on_request_attributes_without_any_idp(self) -> None:
        client = self.client()
        self.assertEqual(client.request("GET", "/svc/x").status, 200)
        denied = client.request("DELETE", "/svc/x")
        self.assertEqual((denied.status, denied.body), (403, b"forbidden\n"))

    def test_on_deny_redirect_on_app_routes_only(self) -> None:
        client = self.client()
        app = client.request("DELETE", "/app/x")
        self.assertEqual((app.status, app.header("Location")), (302, "/denied"))
        service = client.request("DELETE", "/svc/x")
        self.assertEqual((service.status, service.header("Location")), (403, None))

    def test_require_without_identity_denies(self) -> None:
        self.assertEqual(self.client().request("GET", "/admin/x").status, 403)

    def test_routes_without_policies_unaffected(self) -> None:
        self.assertEqual(self.client().request("DELETE", "/open/x").status, 200)

    def test_reason_goes_to_the_log_not_the_client(self) -> None:
        events = capture_log(self)
        response = self.client().request("DELETE", "/svc/x")
        self.assertNotIn(b"admin", response.body)
        self.assertNotIn(b"no-delete", response.body)
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        self.assertEqual(records[-1]["authz_denied"], "policy no-delete: only admins may delete")

    def test_denial_stops_before_the_terminal(self) -> None:
        from edgegw.chain.authz import authz

        reached: list[str] = []

        async def terminal(exchange: Exchange) -> None:
            reached.append("terminal")

        routes = RoutePolicies(
            [CompiledPolicy("admins", RequireRule(RequireSpec(groups=("admin",))), None)],
            "/",
            "r",
            {},
        )
        from tests.test_pipeline import Harness

        response = Harness(self, terminal, stages=[authz(routes, None)]).client.request("GET", "/")
        self.assertEqual(response.status, 403)
        self.assertEqual(reached, [])

    def test_broken_rego_stops_startup_with_the_file_named(self) -> None:
        root = os.path.abspath(self.mktemp())
        write_tree(root, {"policies/authz.rego": "package gw.authz\ndeny contains x if {"})
        config = load_text(root, ROUTES)
        e = self.assertRaises(ConfigError, build_gateway, config, Clock())
        self.assertEqual(len(e.problems), 1)
        problem = str(e.problems[0])
        self.assertIn('Policy "no-delete": spec.rego.path: ', problem)
        self.assertIn(os.path.join(root, "policies", "authz.rego"), problem)


class RememberedDecisionTests(SynchronousTestCase):
    """
    A route whose policies decide on the input alone remembers each decision for the
    same principal, method and path; an impure policy is evaluated every time.
    """

    def counted(self, source: str) -> tuple[RoutePolicies, list[object]]:
        policy = RegoPolicy(rego_file(self, source))
        calls: list[object] = []
        evaluate = policy.evaluate

        def counting(document: Any) -> list[str] | None:
            calls.append(document)
            return evaluate(document)

        self.patch(policy, "evaluate", counting)
        routes = RoutePolicies([CompiledPolicy("p", None, policy)], "/x", "x", {})
        return routes, calls

    def test_same_input_evaluated_once(self) -> None:
        routes, calls = self.counted(DELETE_NEEDS_ADMIN)
        alice = Principal("alice", groups=("dev",))
        for _ in range(3):
            self.assertIsNone(routes.first_denial(exchange_for(alice, b"GET", b"/x")))
            denied = routes.first_denial(exchange_for(alice, b"DELETE", b"/x"))
            self.assertEqual(denied, "policy p: only admins may delete")
            self.assertIsNone(routes.first_denial(exchange_for(None, b"GET", b"/x")))
        self.assertEqual(len(calls), 3)
        # Another principal (even with the same subject: another session, other groups),
        # another path: decided afresh.
        admin = Principal("alice", groups=("admin",))
        self.assertIsNone(routes.first_denial(exchange_for(admin, b"DELETE", b"/x")))
        self.assertEqual(
            routes.first_denial(exchange_for(alice, b"GET", b"/private/a")),
            "policy p: no access to /private",
        )
        self.assertEqual(len(calls), 5)

    def test_bounded_whatever_the_paths(self) -> None:
        routes, calls = self.counted(DELETE_NEEDS_ADMIN)
        for n in range(REMEMBERED_DECISIONS + 10):
            routes.first_denial(exchange_for(None, b"GET", b"/x/%d" % n))
        self.assertLessEqual(len(routes._decisions), REMEMBERED_DECISIONS)
        self.assertEqual(len(calls), REMEMBERED_DECISIONS + 10)

    def test_expired_long_and_failed_decisions_are_not_reused(self) -> None:
        from edgegw.authz import policy as module

        routes, calls = self.counted(DELETE_NEEDS_ADMIN)
        now = [1000.0]
        self.patch(module, "monotonic", lambda: now[0])
        routes.first_denial(exchange_for(None, b"GET", b"/x"))
        routes.first_denial(exchange_for(None, b"GET", b"/x"))
        self.assertEqual(len(calls), 1)
        now[0] += module.DECISION_TTL + 1
        routes.first_denial(exchange_for(None, b"GET", b"/x"))
        self.assertEqual(len(calls), 2)
        long_path = b"/" + b"a" * module.LONGEST_REMEMBERED_PATH
        for _ in range(2):
            routes.first_denial(exchange_for(None, b"GET", long_path))
        self.assertEqual(len(calls), 4)
        # An evaluation error (the library failing) is not remembered.
        self.patch(routes.policies[0].rego, "_query", lambda document: rego_module._ERROR)
        for _ in range(2):
            self.assertEqual(
                routes.first_denial(exchange_for(None, b"GET", b"/y")),
                "policy p: evaluation error",
            )
        self.assertEqual(len(calls), 6)

    def test_impure_policies_evaluated_every_time(self) -> None:
        for impure in (
            'deny contains "late" if time . now_ns() > 0',
            'deny contains "late" if {\n  x := time\n    .now_ns()\n  x > 0\n}',
            'deny contains "late" if time.now_ns() > 0',
            'deny contains "odd" if rand.intn("x", 2) == 1',
            'deny contains "x" if http.send({"method": "GET", "url": "http://127.0.0.1:9"})',
        ):
            routes, calls = self.counted(DELETE_NEEDS_ADMIN + impure + "\n")
            self.assertFalse(routes.deterministic)
            for _ in range(2):
                routes.first_denial(exchange_for(None, b"GET", b"/x"))
            self.assertEqual(len(calls), 2, impure)


class RegoNativeFailureTests(SynchronousTestCase):
    def test_any_exception_from_the_library_denies(self) -> None:
        policy = RegoPolicy(rego_file(self, DELETE_NEEDS_ADMIN))

        class Broken:
            def __getattr__(self, name: str) -> Any:
                def fail(*args: Any) -> Any:
                    raise ValueError("Expecting value: line 1 column 2 (char 1)")

                return fail

        policy.interpreter = Broken()
        document = RoutePolicies([], "/", "r", {}).input_document(exchange_for(None))
        self.assertEqual(policy.evaluate(document), ["evaluation error"])


class RegoPathAndRuleFormTests(SynchronousTestCase):
    """
    A policy sees the path the routes match (an encoded spelling cannot hide from a
    path rule), and a complete C{deny} rule with a condition loads.
    """

    def test_encoded_path_cannot_hide_from_a_path_rule(self) -> None:
        root = os.path.abspath(self.mktemp())
        write_tree(
            root,
            {
                "policies/authz.rego": DELETE_NEEDS_ADMIN,
            },
        )
        config = load_text(
            root,
            """\
            kind: Policy
            metadata: {name: p}
            spec: {rego: {path: policies/authz.rego}}
            ---
            kind: RouteGroup
            metadata: {name: all}
            spec: {access: {authorize: [p]}}
            ---
            kind: Route
            metadata: {name: private}
            spec: {match: "/private/{x}", handler: {type: health}}
            ---
            kind: Route
            metadata: {name: rest}
            spec: {match: /, handler: {type: health}}
            """,
        )
        client = MemoryClient(build_gateway(config, Clock()).site)
        for target in ("/private/a", "/%70rivate/a", "/%70%72ivate/x"):
            self.assertEqual(client.request("GET", target).status, 403, target)
        self.assertEqual(client.request("GET", "/public").status, 200)

    def test_complete_deny_rule_with_a_condition_loads(self) -> None:
        policy = RegoPolicy(
            rego_file(
                self,
                """\
                package gw.authz
                import rego.v1
                deny := {"blocked user"} if input.subject == "bob"
                """,
            )
        )
        document = RoutePolicies([], "/", "r", {}).input_document
        self.assertEqual(
            policy.evaluate(document(exchange_for(Principal("bob")))), ["blocked user"]
        )
        self.assertIsNone(policy.evaluate(document(exchange_for(Principal("ann")))))


class RouteTableTests(SynchronousTestCase):
    def test_effective_access_is_shown(self) -> None:
        from edgegw.check import route_table

        config = load_text(self.mktemp(), GROUPS)
        gateway = build_gateway(config, Clock())
        rows = {line.split()[0]: line.split() for line in route_table(gateway.routes).splitlines()}
        self.assertEqual(
            rows["PATTERN"],
            [
                "PATTERN",
                "NAME",
                "TYPE",
                "AUTH",
                "GROUPS",
                "POLICIES",
                "ON-DENY",
                "REQUEST-PLUGINS",
                "RESPONSE-PLUGINS",
                "HANDLER",
            ],
        )
        self.assertEqual(
            rows["/api/"][:7],
            ["/api/", "mine", "service", "required", "everything,apis", "p3,p1,p2", "-"],
        )
        self.assertEqual(
            rows["/plain/"][:7],
            ["/plain/", "plain", "app", "required", "everything", "p1,p2", "/first"],
        )
        self.assertEqual(
            rows["/typed/"][:7],
            ["/typed/", "own-type", "app", "public", "everything,apis", "p1,p2,p3", "/second"],
        )
