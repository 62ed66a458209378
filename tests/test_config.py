"""
Tests for configuration loading and validation (L{edgegw.config}).
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from edgegw.config.errors import ConfigError, Problems
from edgegw.config.load import interpolate, read_sources
from edgegw.config.model import (
    ApiHandlerSpec,
    HealthHandlerSpec,
    ProxyHandlerSpec,
    StaticHandlerSpec,
)
from edgegw.config.parse import load_config
from tests.support.configs import GATEWAY, load_text, problems_of, write_tree

HEALTH = """\
apiVersion: v1
kind: Route
metadata: {name: %s}
spec:
  match: "%s"
  handler: {type: health}
"""


class InterpolationTests(SynchronousTestCase):
    def run_interpolate(self, text: str, environ: dict[str, str]) -> tuple[str, list[str]]:
        problems: list[str] = []
        return interpolate(text, environ, problems), problems

    def test_required_and_default(self) -> None:
        self.assertEqual(self.run_interpolate("a${X}b", {"X": "1"}), ("a1b", []))
        self.assertEqual(self.run_interpolate("${X:-dflt}", {}), ("dflt", []))
        self.assertEqual(self.run_interpolate("${X:-dflt}", {"X": "v"}), ("v", []))

    def test_set_but_empty_stays_empty(self) -> None:
        self.assertEqual(self.run_interpolate("[${X:-dflt}]", {"X": ""}), ("[]", []))

    def test_unset_required(self) -> None:
        self.assertEqual(
            self.run_interpolate("${NOPE}", {})[1], ["environment variable NOPE is not set"]
        )

    def test_escape_and_errors(self) -> None:
        self.assertEqual(self.run_interpolate("$${X}", {"X": "1"}), ("${X}", []))
        self.assertEqual(self.run_interpolate("${1X}", {})[1], ["invalid variable reference ${1X}"])
        self.assertEqual(
            self.run_interpolate("${X", {})[1], ["unterminated variable reference in '${X'"]
        )
        self.assertEqual(self.run_interpolate("no vars $HOME", {}), ("no vars $HOME", []))

    def test_default_may_contain_colon(self) -> None:
        self.assertEqual(self.run_interpolate("${L:-127.0.0.1:80}", {}), ("127.0.0.1:80", []))


class LoadingModelTests(SynchronousTestCase):
    def test_directory_lexical_order_and_multi_document(self) -> None:
        root = write_tree(
            self.mktemp(),
            {
                "b.yml": HEALTH % ("second", "/b") + "---\n" + HEALTH % ("third", "/c"),
                "a.yaml": GATEWAY + "---\n" + HEALTH % ("first", "/a"),
                "c.txt": "not: yaml: at all: [",
                ".hidden.yaml": "kind: Nonsense",
            },
        )
        config = load_config(root, {})
        self.assertEqual([r.name for r in config.routes], ["first", "second", "third"])
        self.assertEqual([os.path.basename(f) for f in config.files], ["a.yaml", "b.yml"])

    def test_interpolation_everywhere(self) -> None:
        config = load_text(
            self.mktemp(),
            """\
            kind: Route
            metadata: {name: r}
            spec:
              match: "GET ${PREFIX:-/x}/{id}"
              handler: {type: reverse-proxy, upstream: "${UP}", timeout: "${T:-5s}"}
            """,
            {"UP": "http://127.0.0.1:9000", "PREFIX": "/api"},
        )
        route = config.routes[0]
        self.assertEqual(route.match, "GET /api/{id}")
        assert isinstance(route.handler, ProxyHandlerSpec)
        self.assertEqual(route.handler.upstream, "http://127.0.0.1:9000")
        self.assertEqual(route.handler.timeout, 5.0)

    def test_interpolated_numbers_and_booleans(self) -> None:
        root = self.mktemp()
        write_tree(
            root,
            {
                "g.yaml": """\
                kind: Gateway
                metadata: {name: g}
                spec:
                  security:
                    headers:
                      hsts: {maxAge: "${AGE}", preload: "${PRELOAD}"}
                """
            },
        )
        config = load_config(root, {"AGE": "60", "PRELOAD": "true"})
        self.assertEqual(config.gateway.security.headers.hsts.max_age, 60)
        self.assertTrue(config.gateway.security.headers.hsts.preload)

    def test_literal_string_in_integer_field(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                """\
                kind: Gateway
                metadata: {name: g}
                spec: {security: {headers: {hsts: {maxAge: "60"}}}}
                """,
                gateway=False,
            ),
            [
                'document 1, Gateway "g": spec.security.headers.hsts.maxAge: '
                "expected an integer, got a string"
            ],
        )

    def test_api_version_any_value(self) -> None:
        config = load_text(
            self.mktemp(), (HEALTH % ("h", "/h")).replace("apiVersion: v1", "apiVersion: x/v9")
        )
        self.assertEqual(len(config.routes), 1)

    def test_defaults(self) -> None:
        config = load_text(self.mktemp(), HEALTH % ("h", "/h"))
        gateway = config.gateway
        self.assertEqual(gateway.trusted_proxies, ())
        self.assertTrue(gateway.security.csrf.enabled)
        headers = gateway.security.headers
        self.assertEqual(
            (headers.frame_options, headers.content_type_options, headers.referrer_policy),
            ("DENY", "nosniff", "strict-origin-when-cross-origin"),
        )
        self.assertEqual(
            (headers.hsts.enabled, headers.hsts.max_age, headers.hsts.include_subdomains),
            (True, 31536000, True),
        )
        self.assertFalse(headers.hsts.preload)
        self.assertIsNone(headers.content_security_policy)
        self.assertIsNone(gateway.session)
        self.assertEqual(gateway.identity.claims, ("email", "name", "given_name", "family_name"))
        self.assertEqual(gateway.identity.subject_claim, "sub")
        self.assertEqual(gateway.identity.user_info, "auto")
        self.assertEqual(gateway.identity.groups.render, "cn")
        self.assertEqual(gateway.identity.groups.as_, "groups")
        self.assertEqual(gateway.auth.login_path, "/auth/login")
        self.assertEqual(gateway.auth.logout_path, "/auth/logout")
        self.assertEqual(gateway.drain_timeout, 30.0)
        self.assertIsInstance(config.routes[0].handler, HealthHandlerSpec)

    def test_default_listen(self) -> None:
        config = load_text(self.mktemp(), "kind: Gateway\nmetadata: {name: g}\n", gateway=False)
        self.assertEqual(config.gateway.listen, ":8080")

    def test_every_kind_parses(self) -> None:
        seed = "A" * 43  # 32 zero-ish bytes, raw URL-safe base64
        root = self.mktemp()
        os.makedirs(os.path.join(root, "www"))
        config = load_text(
            root,
            f"""\
            kind: Gateway
            metadata: {{name: full}}
            spec:
              listen: "[::1]:8443"
              trustedProxies: ["10.0.0.0/8", "192.0.2.1", "*"]
              plugins: ["example_plugin@v1"]
              security:
                csrf:
                  enabled: true
                  trustedOrigins: ["https://app.example.com"]
                  bypassPatterns: ["POST /webhooks/"]
                headers:
                  frameOptions: ""
                  contentSecurityPolicy: "default-src 'self'"
                  hsts: {{enabled: true, maxAge: 10, includeSubDomains: false, preload: true}}
              session:
                key: "0123456789abcdef0123456789abcdef"
                cookieName: sid
                ttl: 1h
                fingerprintHeaders: [User-Agent, Accept-Language]
                infoPath: /me
                postLogoutRedirect: /bye
              identity:
                claims: [email]
                groups: {{source: memberOf, match: [app-], render: dn, as: teams, strip: [cn=]}}
                userInfo: always
                subjectClaim: oid
                assertion:
                  issue: {{name: edge-a, keyId: k1, key: "{seed}", ttl: 30s, header: X-Id}}
                  accept:
                    issuer: edge-b
                    requireBearer: false
                    keys: [{{keyId: k2, publicKey: "{seed}"}}]
              auth: {{loginPath: /in, logoutPath: /out}}
              stateProvider:
                type: kvstore
                refreshSkew: 2m
                keyPrefix: "s:"
                config: {{address: "127.0.0.1:6379", db: 2, tls: true, timeout: 1s}}
              drainTimeout: 5s
            ---
            kind: IdP
            metadata: {{name: idp}}
            spec:
              type: oidc
              issuer: https://idp.example.com
              clientID: cid
              clientSecret: sec
              redirectURL: https://app.example.com/oauth/cb
              scopes: [openid]
              bearer: {{jwksURL: "https://idp.example.com/jwks", audienceClaim: client_id,
                        audience: api, signingAlgs: [RS256]}}
            ---
            kind: Telemetry
            metadata: {{name: t}}
            spec:
              service: {{name: edge}}
              otlp: {{endpoint: "http://127.0.0.1:4318", protocol: grpc}}
              accessLog: {{level: warn}}
            ---
            kind: RouteGroup
            metadata: {{name: grp}}
            spec:
              type: service
              selector:
                matchLabels: {{tier: api}}
                matchExpressions: [{{key: env, operator: In, values: [prod]}}]
              access: {{auth: public}}
            ---
            kind: Policy
            metadata: {{name: admins}}
            spec:
              require: {{groups: [admin], claims: {{dept: [eng, ops], country: NL}}}}
              rego: {{path: policies/authz.rego}}
            ---
            kind: RequestPlugin
            metadata: {{name: rp}}
            spec: {{selector: {{matchLabels: {{tier: api}}}}, config: {{anything: [1, 2]}}}}
            ---
            kind: ResponsePlugin
            metadata: {{name: resp}}
            spec: {{plugin: rewriter, config: {{}}}}
            ---
            kind: StateProvider
            metadata: {{name: sp}}
            spec: {{type: custom, config: {{x: 1}}}}
            ---
            kind: Route
            metadata: {{name: api, labels: {{tier: api, env: prod}}}}
            spec:
              match: "GET /api/users/{{id}}"
              handler:
                type: api
                timeout: 2s
                backends:
                  - {{group: user, upstream: "http://127.0.0.1:1", path: "/users/{{id}}"}}
                  - {{group: orders, upstream: "http://127.0.0.1:2", path: /o, method: POST,
                      required: false, forwardQuery: true, forwardAccessToken: true,
                      forwardIdentity: true}}
              access:
                authorize: [admins]
                projection:
                  session: {{claims: {{email: X-Mail}}, groups: {{header: X-Teams}}}}
                  request: {{reserved: true}}
                onDeny: {{redirect: /denied}}
            ---
            kind: Route
            metadata: {{name: www}}
            spec:
              match: /
              type: app
              handler: {{type: static, dir: www, index: main.html, spaFallback: false,
                         stripPrefix: /app, cacheControl: "max-age=60"}}
            """,
            gateway=False,
        )
        gateway = config.gateway
        self.assertEqual(gateway.listen, "[::1]:8443")
        self.assertEqual(gateway.security.headers.frame_options, "")
        assert gateway.session is not None
        self.assertEqual(gateway.session.ttl, 3600.0)
        self.assertEqual(gateway.session.key, b"0123456789abcdef0123456789abcdef")
        assertion = gateway.identity.assertion
        assert assertion is not None and assertion.issue and assertion.accept
        self.assertEqual(assertion.issue.seed, bytes(32))
        self.assertEqual(assertion.issue.ttl, 30.0)
        self.assertFalse(assertion.accept.require_bearer)
        assert gateway.state_provider is not None and gateway.state_provider.kvstore
        self.assertEqual(gateway.state_provider.kvstore.db, 2)
        self.assertEqual(gateway.state_provider.refresh_skew, 120.0)
        self.assertEqual(gateway.drain_timeout, 5.0)
        assert config.idp is not None
        self.assertEqual(config.idp.callback_path, "/oauth/cb")
        self.assertEqual(config.idp.bearer.signing_algs, ("RS256",))
        assert config.telemetry is not None
        self.assertEqual(config.telemetry.otlp_protocol, "grpc")
        self.assertEqual(config.telemetry.access_log_level, "warn")
        policy = config.policies["admins"]
        assert policy.require is not None and policy.rego is not None
        self.assertEqual(policy.require.claims, {"dept": ("eng", "ops"), "country": ("NL",)})
        self.assertEqual(
            policy.rego.path, os.path.join(os.path.abspath(root), "policies/authz.rego")
        )
        self.assertEqual(config.request_plugins[0].plugin, "rp")
        self.assertEqual(config.response_plugins[0].plugin, "rewriter")
        self.assertEqual(config.state_providers["sp"].type, "custom")
        api = config.routes[0].handler
        assert isinstance(api, ApiHandlerSpec)
        self.assertEqual([b.group for b in api.backends], ["user", "orders"])
        self.assertFalse(api.backends[1].required)
        self.assertEqual(config.routes[0].access.on_deny_redirect, "/denied")
        static = config.routes[1].handler
        assert isinstance(static, StaticHandlerSpec)
        self.assertEqual(static.dir, os.path.join(os.path.abspath(root), "www"))
        self.assertEqual(static.strip_prefix, "/app")


class ConfigErrorTests(SynchronousTestCase):
    """
    Each error names document, resource and field; all are reported together.
    """

    def assertProblems(self, text: str, expected: list[str], **kw: object) -> None:
        self.assertEqual(problems_of(self.mktemp(), text, **kw), expected)  # type: ignore[arg-type]

    def test_unknown_field_did_you_mean(self) -> None:
        self.assertProblems(
            """\
            kind: Route
            metadata: {name: api}
            spec:
              match: /api/
              handler: {type: reverse-proxy, upstrem: "http://x"}
            """,
            [
                'document 2, Route "api": spec.handler.upstream: required field is missing',
                'document 2, Route "api": spec.handler.upstrem: unknown field; '
                'did you mean "upstream"?',
            ],
        )

    def test_unknown_top_level_field(self) -> None:
        self.assertProblems(
            "kind: Route\nmetadata: {name: r}\nspce: {}\n",
            [
                'document 2, Route "r": spce: unknown field; did you mean "spec"?',
                'document 2, Route "r": spec.match: required field is missing',
                'document 2, Route "r": spec.handler: required field is missing',
            ],
        )

    def test_unset_variable(self) -> None:
        self.assertProblems(
            HEALTH % ("h", "${ROUTE}"),
            [
                'document 2, Route "h": spec.match: environment variable ROUTE is not set',
            ],
        )

    def test_missing_required_fields_all_reported(self) -> None:
        self.assertProblems(
            """\
            kind: Route
            metadata: {name: r}
            spec:
              handler: {type: static}
            """,
            [
                'document 2, Route "r": spec.match: required field is missing',
                'document 2, Route "r": spec.handler.dir: required field is missing',
            ],
        )

    def test_wrong_types(self) -> None:
        self.assertProblems(
            """\
            kind: Route
            metadata: {name: r}
            spec:
              match: [a]
              handler: {type: static, dir: ".", spaFallback: "yes", cacheControl: 5}
            """,
            [
                'document 2, Route "r": spec.match: expected a string, got a list',
                'document 2, Route "r": spec.handler.cacheControl: expected a string, '
                "got an integer",
                'document 2, Route "r": spec.handler.spaFallback: expected a boolean '
                "(true or false), got a string",
            ],
        )

    def test_bad_duration(self) -> None:
        self.assertProblems(
            """\
            kind: Route
            metadata: {name: r}
            spec:
              match: /x/
              handler: {type: reverse-proxy, upstream: "http://127.0.0.1:1", timeout: 30}
            ---
            kind: Route
            metadata: {name: s}
            spec:
              match: /y/
              handler: {type: reverse-proxy, upstream: "http://127.0.0.1:1", timeout: "3 s"}
            ---
            kind: Route
            metadata: {name: t}
            spec:
              match: /z/
              handler: {type: reverse-proxy, upstream: "http://127.0.0.1:1", timeout: "0s"}
            """,
            [
                'document 2, Route "r": spec.handler.timeout: expected a duration string '
                'such as "30s" or "1h30m", got an integer',
                "document 3, Route \"s\": spec.handler.timeout: invalid duration '3 s'; use a "
                'number with a unit, such as "500ms", "30s", "1h30m"',
                'document 4, Route "t": spec.handler.timeout: must be greater than 0, got "0s"',
            ],
        )

    def test_session_key_length(self) -> None:
        self.assertProblems(
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              session: {key: short}
            """,
            [
                'document 1, Gateway "g": spec.session.key: must be exactly 32 bytes '
                "(AES-256-GCM key), got 5",
                'document 1, Gateway "g": spec.session: a session needs an IdP resource to '
                "log users in (declare kind: IdP)",
            ],
            gateway=False,
        )

    def test_on_deny_redirect_rules(self) -> None:
        bad = ["//evil.example", "/\\evil", "https://evil.example/", "relative", "/x?u=http://e"]
        docs = "---\n".join(
            f"""\
kind: Route
metadata: {{name: r{i}}}
spec:
  match: /p{i}
  handler: {{type: health}}
  access: {{onDeny: {{redirect: "{target}"}}}}
"""
            for i, target in enumerate(bad)
        )
        problems = problems_of(self.mktemp(), docs.replace("\\", "\\\\"))
        self.assertEqual(len(problems), len(bad))
        for i, (problem, target) in enumerate(zip(problems, bad, strict=True)):
            self.assertEqual(
                problem,
                f'document {i + 2}, Route "r{i}": spec.access.onDeny.redirect: "{target}" is '
                'not a same-origin path: it must start with "/", must not start with "//" or '
                '"/\\" and must not contain "://"',
            )

    def test_on_deny_redirect_characters_browsers_rewrite(self) -> None:
        """
        Browsers drop tabs and newlines, trim spaces and read "\\" as "/": a redirect
        target with them could leave the origin ("/\\t/evil.example/" is //evil.example/).
        """
        bad = {
            "/\\t/evil.example/": "U+0009 is not allowed in a redirect target",
            "/\\n/evil.example/": "U+000A",
            "/ /evil.example/": "a space",
            "/\\u00a0/evil.example/": "U+00A0",
            "/\\x7f/x": "U+007F",
            "/\\\\/evil.example/": "is not a same-origin path",
            "/a\\\\b": '"\\" is not allowed',
            "/caf\u00e9": '"\u00e9" (U+00E9)',
            "/\\u2028x": "U+2028",
        }
        docs = "---\n".join(
            f"""\
kind: Route
metadata: {{name: r{i}}}
spec:
  match: /p{i}
  handler: {{type: health}}
  access: {{onDeny: {{redirect: "{target}"}}}}
"""
            for i, target in enumerate(bad)
        )
        problems = problems_of(self.mktemp(), docs)
        self.assertEqual(len(problems), len(bad), problems)
        for i, (problem, char) in enumerate(zip(problems, bad.values(), strict=True)):
            self.assertTrue(
                problem.startswith(
                    f'document {i + 2}, Route "r{i}": spec.access.onDeny.redirect: '
                ),
                problem,
            )
            self.assertIn(char, problem)
        self.assertEqual(
            problems[0],
            'document 2, Route "r0": spec.access.onDeny.redirect: "/\\t/evil.example/": U+0009 '
            "is not allowed in a redirect target (browsers drop or rewrite control characters, "
            'whitespace, "\\" and non-ASCII characters); percent-encode it ("%09")',
        )
        self.assertEqual(problems[7][-10:], '("%C3%A9")')

    def test_every_local_redirect_target_shares_the_check(self) -> None:
        self.assertProblems(
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              auth: {loginPath: "/in\\tx", logoutPath: "//out"}
            """,
            [
                'document 1, Gateway "g": spec.auth.loginPath: "/in\\tx": U+0009 is not allowed '
                "in a redirect target (browsers drop or rewrite control characters, whitespace, "
                '"\\" and non-ASCII characters); percent-encode it ("%09")',
                'document 1, Gateway "g": spec.auth.logoutPath: "//out" is not a same-origin '
                'path: it must start with "/", must not start with "//" or "/\\" and must not '
                'contain "://"',
            ],
            gateway=False,
        )

    def test_encoded_slashes(self) -> None:
        self.assertEqual(load_text(self.mktemp(), "").gateway.security.encoded_slashes, "reject")
        for mode in ("reject", "decode", "keep"):
            config = load_text(
                self.mktemp(),
                f"kind: Gateway\nmetadata: {{name: g}}\nspec:\n"
                f"  security: {{encodedSlashes: {mode}}}\n",
                gateway=False,
            )
            self.assertEqual(config.gateway.security.encoded_slashes, mode)
        self.assertProblems(
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              security: {encodedSlashes: decoded}
            """,
            [
                'document 1, Gateway "g": spec.security.encodedSlashes: "decoded" is not one '
                'of "reject", "decode", "keep"; did you mean "decode"?'
            ],
            gateway=False,
        )

    def test_policy_errors(self) -> None:
        self.assertProblems(
            """\
            kind: Policy
            metadata: {name: nothing}
            spec: {}
            ---
            kind: Policy
            metadata: {name: empty-require}
            spec: {require: {}}
            ---
            kind: Policy
            metadata: {name: empty-claims}
            spec: {require: {claims: {dept: []}}}
            ---
            kind: Policy
            metadata: {name: empty-groups}
            spec: {require: {groups: []}}
            """,
            [
                'document 2, Policy "nothing": spec: a Policy needs require, rego, or both',
                'document 3, Policy "empty-require": spec.require: a require block needs '
                "groups, claims, or both",
                'document 4, Policy "empty-claims": spec.require.claims.dept: empty list: '
                "list at least one value",
                'document 5, Policy "empty-groups": spec.require.groups: empty list: '
                "list at least one group",
            ],
        )

    def test_duplicate_match(self) -> None:
        problems = problems_of(
            self.mktemp(), HEALTH % ("a", "GET /x") + "---\n" + HEALTH % ("b", "GET /x")
        )
        self.assertEqual(len(problems), 1)
        self.assertTrue(
            problems[0].startswith(
                'document 3, Route "b": spec.match: pattern "GET /x" conflicts with pattern '
                '"GET /x"'
            ),
            problems[0],
        )

    def test_conflicting_match(self) -> None:
        problems = problems_of(
            self.mktemp(), HEALTH % ("a", "GET /{x}") + "---\n" + HEALTH % ("b", "/a")
        )
        self.assertEqual(len(problems), 1)
        self.assertIn("matches more methods than GET /{x}", problems[0])

    def test_invalid_pattern(self) -> None:
        self.assertProblems(
            HEALTH % ("a", "/{a...}/x"),
            [
                'document 2, Route "a": spec.match: parsing "/{a...}/x": at offset 1: '
                "{...} wildcard not at end"
            ],
        )

    def test_unknown_handler_type(self) -> None:
        self.assertProblems(
            "kind: Route\nmetadata: {name: r}\nspec: {match: /, handler: {type: statik}}\n",
            [
                'document 2, Route "r": spec.handler.type: unknown handler type "statik"; '
                'did you mean "static"? (expected one of api, health, reverse-proxy, static)'
            ],
        )

    def test_duplicate_api_group_and_placeholders(self) -> None:
        self.assertProblems(
            """\
            kind: Route
            metadata: {name: r}
            spec:
              match: GET /u/{id}
              handler:
                type: api
                backends:
                  - {group: a, upstream: "http://127.0.0.1:1", path: "/x/{id}"}
                  - {group: a, upstream: "http://127.0.0.1:1", path: "/y/{other}"}
            """,
            [
                'document 2, Route "r": spec.handler.backends[1].group: duplicate group "a": '
                "groups must be unique",
                'document 2, Route "r": spec.handler.backends[1].path: placeholder "{other}" '
                "is not a wildcard of the route match 'GET /u/{id}' (wildcards: id)",
            ],
        )

    def test_api_needs_backends(self) -> None:
        self.assertProblems(
            "kind: Route\nmetadata: {name: r}\nspec: {match: /, handler: {type: api, "
            "backends: []}}\n",
            ['document 2, Route "r": spec.handler.backends: must list at least one entry'],
        )

    def test_cardinality(self) -> None:
        self.assertEqual(
            problems_of(self.mktemp(), HEALTH % ("h", "/h"), gateway=False),
            ["no Gateway resource: exactly one is required"],
        )
        root = self.mktemp()
        problems = problems_of(
            root,
            GATEWAY.replace("gw", "second")
            + "---\nkind: Telemetry\nmetadata: {name: a}\nspec: {service: {name: a}}\n"
            + "---\nkind: Telemetry\nmetadata: {name: b}\nspec: {service: {name: b}}\n"
            + "---\nkind: IdP\nmetadata: {name: a}\nspec: {type: oidc, issuer: 'https://i', "
            + "clientID: c, verificationOnly: true}\n"
            + "---\nkind: IdP\nmetadata: {name: b}\nspec: {type: oidc, issuer: 'https://i', "
            + "clientID: c, verificationOnly: true}\n",
        )
        first = os.path.join(root, "config.yaml")
        self.assertEqual(
            problems,
            [
                f'document 2, Gateway "second": a second Gateway resource: exactly one is '
                f'allowed (the first is {first}, document 1, Gateway "gw")',
                f'document 6, IdP "b": a second IdP resource: at most one is allowed '
                f'(the first is {first}, document 5, IdP "a")',
                f'document 4, Telemetry "b": a second Telemetry resource: at most one is '
                f'allowed (the first is {first}, document 3, Telemetry "a")',
            ],
        )

    def test_unknown_kind_and_envelope(self) -> None:
        self.assertProblems(
            """\
            kind: Rout
            metadata: {name: r}
            ---
            metadata: {name: nokind}
            ---
            kind: Route
            spec: {}
            ---
            - just a list
            """,
            [
                'document 2, Rout "r": kind: unknown kind "Rout"; did you mean "Route"? '
                "(expected one of Gateway, IdP, Telemetry, Route, RouteGroup, Policy, "
                "RequestPlugin, ResponsePlugin, StateProvider)",
                "document 3: kind: required field is missing",
                "document 4, Route: metadata: required field is missing",
                "document 4, Route: spec.match: required field is missing",
                "document 4, Route: spec.handler: required field is missing",
                "document 5: expected a resource mapping, got a list",
            ],
        )

    def test_yaml_errors(self) -> None:
        """
        A file that does not parse is reported with its line; the missing Gateway is not,
        since it may be in that file.
        """
        root = write_tree(self.mktemp(), {"a.yaml": "kind: [unclosed\n", "b.yaml": "a: 1\na: 2\n"})
        e = self.assertRaises(ConfigError, load_config, root, {})
        messages = [str(p) for p in e.problems]
        self.assertEqual(len(messages), 2)
        self.assertTrue(messages[0].startswith(os.path.join(root, "a.yaml") + ": invalid YAML"))
        self.assertEqual(
            messages[1],
            f"{os.path.join(root, 'b.yaml')}: invalid YAML: duplicate key 'a' (line 2, column 1)",
        )

    def test_unreadable_file_skips_reference_checks(self) -> None:
        """
        With a file that does not parse, references to resources (a Policy) are not
        checked either: the resource may be in that file.
        """
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY + "---\n" + (HEALTH % ("h", "/h")).rstrip() + "\n"
                "  access: {authorize: [admins]}\n",
                "b.yaml": "kind: Policy\nmetadata: {name: admins\n",
            },
        )
        e = self.assertRaises(ConfigError, load_config, root, {})
        self.assertEqual(len(e.problems), 1)
        self.assertTrue(str(e.problems[0]).startswith(os.path.join(root, "b.yaml") + ": invalid"))

    def test_missing_source(self) -> None:
        """
        A missing source is a read failure like a file that does not parse: it is the
        only problem reported (no "no Gateway resource" on top of it).
        """
        e = self.assertRaises(ConfigError, load_config, "/nonexistent/edgegw", {})
        self.assertEqual(
            e.render(),
            "configuration has 1 error:\n  /nonexistent/edgegw: no such file or directory",
        )

    def test_empty_directory(self) -> None:
        root = self.mktemp()
        os.makedirs(root)
        e = self.assertRaises(ConfigError, load_config, root, {})
        self.assertEqual(
            [str(p) for p in e.problems], [f"{root}: no .yaml or .yml files in this directory"]
        )

    def test_gateway_field_validation(self) -> None:
        self.assertProblems(
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              listen: "localhost"
              trustedProxies: ["10.0.0.0/33", "not-an-ip"]
              security:
                csrf: {trustedOrigins: ["https://example.com/"], bypassPatterns: ["/{a...}/x"]}
              identity: {groups: {render: full}, userInfo: sometimes}
              stateProvider: {type: kvstore, config: {address: "nohost"}}
            """,
            [
                'document 1, Gateway "g": spec.listen: invalid listen address "localhost": '
                'use ":8080", "127.0.0.1:8080", "[::1]:8080" or a Twisted endpoint such as '
                '"tcp:8080" or "ssl:8443:..."',
                'document 1, Gateway "g": spec.trustedProxies[0]: "10.0.0.0/33" is not an IP '
                'address, a CIDR such as "10.0.0.0/8", or "*"',
                'document 1, Gateway "g": spec.trustedProxies[1]: "not-an-ip" is not an IP '
                'address, a CIDR such as "10.0.0.0/8", or "*"',
                'document 1, Gateway "g": spec.security.csrf.trustedOrigins[0]: invalid origin '
                '"https://example.com/": path, query, and fragment are not allowed',
                'document 1, Gateway "g": spec.security.csrf.bypassPatterns[0]: parsing '
                '"/{a...}/x": at offset 1: {...} wildcard not at end',
                'document 1, Gateway "g": spec.identity.groups.render: "full" is not one of '
                '"cn", "dn"',
                'document 1, Gateway "g": spec.identity.userInfo: "sometimes" is not one of '
                '"auto", "always", "never"',
                'document 1, Gateway "g": spec.stateProvider.config.address: "nohost" is not '
                "host:port",
            ],
            gateway=False,
        )

    def test_assertion_keys(self) -> None:
        self.assertProblems(
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              identity:
                assertion:
                  issue: {name: a, keyId: k, key: "c2hvcnQ=", ttl: 0s}
                  accept: {issuer: b, keys: []}
            """,
            [
                'document 1, Gateway "g": spec.identity.assertion.issue.key: the Ed25519 seed '
                "must decode to exactly 32 bytes, got 5",
                'document 1, Gateway "g": spec.identity.assertion.issue.ttl: must be greater '
                'than 0, got "0s"',
                'document 1, Gateway "g": spec.identity.assertion.accept.keys: must list at '
                "least one entry",
            ],
            gateway=False,
        )

    def test_verification_only_idp(self) -> None:
        self.assertProblems(
            """\
            kind: IdP
            metadata: {name: i}
            spec:
              type: oidc
              verificationOnly: true
              issuer: https://idp.example.com
              clientID: c
              clientSecret: s
              redirectURL: https://app.example.com/cb
            """,
            [
                'document 2, IdP "i": spec.clientSecret: not allowed with verificationOnly: true',
                'document 2, IdP "i": spec.redirectURL: not allowed with verificationOnly: true',
            ],
        )

    def test_unknown_policy_reference(self) -> None:
        self.assertProblems(
            (HEALTH % ("h", "/h")).rstrip()
            + "\n  access: {authorize: [admns]}\n"
            + "---\nkind: Policy\nmetadata: {name: admins}\nspec: {require: {groups: [a]}}\n",
            [
                'document 2, Route "h": spec.access.authorize[0]: no Policy named "admns"; '
                'did you mean "admins"?'
            ],
        )

    def test_selector_expressions(self) -> None:
        self.assertProblems(
            """\
            kind: RouteGroup
            metadata: {name: g}
            spec:
              selector:
                matchExpressions:
                  - {key: a, operator: In}
                  - {key: b, operator: Exists, values: [x]}
                  - {key: c, operator: Equals, values: [x]}
            """,
            [
                'document 2, RouteGroup "g": spec.selector.matchExpressions[0].values: In '
                "needs at least one value",
                'document 2, RouteGroup "g": spec.selector.matchExpressions[1].values: Exists '
                "takes no values",
                'document 2, RouteGroup "g": spec.selector.matchExpressions[2].operator: '
                '"Equals" is not one of "In", "NotIn", "Exists", "DoesNotExist"',
            ],
        )

    def test_static_dir_must_exist(self) -> None:
        root = self.mktemp()
        problems = problems_of(
            root,
            "kind: Route\nmetadata: {name: r}\n"
            "spec: {match: /, handler: {type: static, dir: nope}}\n",
        )
        self.assertEqual(
            problems,
            [
                f'document 2, Route "r": spec.handler.dir: "nope" is not a directory '
                f"(resolved to {os.path.join(os.path.abspath(root), 'nope')})"
            ],
        )

    def test_duplicate_names(self) -> None:
        problems = problems_of(self.mktemp(), HEALTH % ("h", "/a") + "---\n" + HEALTH % ("h", "/b"))
        self.assertEqual(len(problems), 1)
        self.assertIn('document 3, Route "h": metadata.name: duplicate Route name "h"', problems[0])

    def test_upstream_url(self) -> None:
        self.assertProblems(
            "kind: Route\nmetadata: {name: r}\nspec: {match: /, handler: {type: reverse-proxy, "
            "upstream: 'ftp://x'}}\n",
            [
                'document 2, Route "r": spec.handler.upstream: "ftp://x" is not a valid URL: '
                "expected http:// or https:// followed by a host"
            ],
        )


ROUTE = """\
kind: Route
metadata: {name: r}
spec:
  match: /
  handler: {type: health}
"""


class YamlTests(SynchronousTestCase):
    """
    Every YAML mistake is a problem with its file and line, never a crash.
    """

    def yaml_problems(self, files: dict[str, str]) -> list[str]:
        """
        The problems of a directory of C{files}, file paths made relative to it.
        """
        root = write_tree(self.mktemp(), files)
        e = self.assertRaises(ConfigError, load_config, root, {})
        return [str(p).removeprefix(root + os.sep) for p in e.problems]

    def test_non_scalar_keys(self) -> None:
        self.assertEqual(
            self.yaml_problems(
                {
                    "a.yaml": "spec: {? [a] : 1}\n",
                    "b.yaml": "spec:\n  {[1]: 2}\n",
                    "c.yaml": "? !!set {a} : 1\n",
                    "d.yaml": "spec: !!set {? {a: 1}}\n",
                }
            ),
            [
                "a.yaml: invalid YAML: mapping keys must be scalars (line 1, column 10)",
                "b.yaml: invalid YAML: mapping keys must be scalars (line 2, column 4)",
                "c.yaml: invalid YAML: mapping keys must be scalars (line 1, column 3)",
                "d.yaml: invalid YAML: mapping keys must be scalars (line 1, column 16)",
            ],
        )

    def test_values_their_tag_cannot_hold(self) -> None:
        self.assertEqual(
            self.yaml_problems(
                {
                    "a.yaml": "since: 2024-02-30\n",
                    "b.yaml": "flag: !!bool maybe\n",
                    "c.yaml": "n: !!int ten\n",
                }
            ),
            [
                'a.yaml: invalid YAML: "2024-02-30" is not a valid !!timestamp value (day is '
                "out of range for month); quote it to make it a string (line 1, column 8)",
                'b.yaml: invalid YAML: "maybe" is not a valid !!bool value; quote it to make it '
                "a string (line 1, column 7)",
                'c.yaml: invalid YAML: "ten" is not a valid !!int value (invalid literal for '
                "int() with base 10: 'ten'); quote it to make it a string (line 1, column 4)",
            ],
        )

    def test_recursive_alias(self) -> None:
        self.assertEqual(
            self.yaml_problems(
                {"a.yaml": "&a [*a]\n", "b.yaml": "x: &m {y: *m}\n", "c.yaml": "x: &m {<<: *m}\n"}
            ),
            [
                "a.yaml: invalid YAML: recursive alias: a node cannot contain itself "
                "(line 1, column 1)",
                "b.yaml: invalid YAML: recursive alias: a node cannot contain itself "
                "(line 1, column 4)",
                "c.yaml: invalid YAML: recursive alias: a node cannot contain itself "
                "(line 1, column 4)",
            ],
        )

    def test_nested_too_deeply(self) -> None:
        depth = 5000
        self.assertEqual(
            self.yaml_problems(
                {
                    "a.yaml": "x: " + "[" * depth + "]" * depth + "\n",
                    "b.yaml": "{a: " * depth + "}" * depth,
                }
            ),
            ["a.yaml: invalid YAML: nested too deeply", "b.yaml: invalid YAML: nested too deeply"],
        )

    def test_alias_bomb(self) -> None:
        """
        Ten levels of ten aliases would expand to 10**10 nodes: the document is refused
        after walking a bounded number of them (shared nodes are walked once).
        """
        lines = ["kind: Route", "metadata: {name: bomb}", "spec:", "  x0: &x0 [a, b, c, d, e]"]
        for level in range(1, 11):
            lines.append(f"  x{level}: &x{level} [{', '.join([f'*x{level - 1}'] * 10)}]")
        problems = problems_of(self.mktemp(), "\n".join(lines) + "\n")
        self.assertEqual(
            problems,
            [
                'document 2, Route "bomb": invalid YAML: too many nodes (more than 200000 once '
                "aliases are expanded: an alias bomb?)"
            ],
        )

    def test_aliases_stay_shared(self) -> None:
        """
        Below the limit, aliases load, interpolated once and still shared.
        """
        problems = Problems()
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": """\
                kind: RequestPlugin
                metadata: {name: p}
                spec:
                  config:
                    common: &c {url: "${URL}", tags: [a, b]}
                    again: *c
                    levels: [&l1 [*c, *c], &l2 [*l1, *l1], [*l2, *l2]]
                """
            },
        )
        sources = read_sources(root, {"URL": "http://x"}, problems)
        self.assertFalse(problems)
        self.assertTrue(sources.complete)
        config = sources.documents[0].body["spec"]["config"]
        self.assertEqual(config["common"], {"url": "http://x", "tags": ["a", "b"]})
        self.assertIs(config["again"], config["common"])
        self.assertIs(config["levels"][2][1], config["levels"][1])
        self.assertIs(config["levels"][1][0][0], config["common"])

    def test_merge_keys(self) -> None:
        """
        C{<<} merges keep their YAML meaning (own keys win, then earlier merges) and are
        not duplicate keys; repeated merges do not blow up.
        """
        lines = [
            "kind: RequestPlugin",
            "metadata: {name: p}",
            "spec:",
            "  config:",
            "    a: &a {x: 1, y: 1}",
            "    b: &b {x: 2, y: 2, z: 2}",
            "    c: {<<: [*a, *b], y: 3}",
            "    m0: &m0 {k: v}",
        ]
        for level in range(1, 12):
            merges = ", ".join([f"*m{level - 1}"] * 10)
            lines.append(f"    m{level}: &m{level} {{<<: [{merges}], k{level}: v}}")
        config = load_text(self.mktemp(), "\n".join(lines) + "\n")
        plugin_config = config.request_plugins[0].config
        self.assertEqual(plugin_config["c"], {"x": 1, "y": 3, "z": 2})
        self.assertEqual(len(plugin_config["m11"]), 12)


class HeaderValueTests(SynchronousTestCase):
    """
    Configured header values must be sendable: visible ASCII, spaces and tabs.
    """

    def test_invalid_values(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: Gateway
            metadata: {name: g}
            spec:
              security:
                headers:
                  frameOptions: "DENY\\r\\nX-Evil: 1"
                  contentTypeOptions: "nosniff\\0"
                  referrerPolicy: "no-référrer"
                  contentSecurityPolicy: "default-src 'self' €"
            ---
            kind: Route
            metadata: {name: r}
            spec:
              match: /
              handler: {type: static, dir: ., cacheControl: "max-age=60\\x7f"}
            ---
            kind: Telemetry
            metadata: {name: t}
            spec:
              service: {name: s}
              otlp:
                endpoint: "http://127.0.0.1:4318"
                headers: {Authorization: "Bearer ä", X-Ok: "a\\tb c"}
            """,
            gateway=False,
        )
        self.assertEqual(
            problems,
            [
                'document 1, Gateway "g": spec.security.headers.frameOptions: "DENY\\r\\nX-Evil: '
                '1" is not a valid HTTP header value: U+000D is not allowed; use printable ASCII',
                'document 1, Gateway "g": spec.security.headers.contentTypeOptions: '
                '"nosniff\\x00" is not a valid HTTP header value: U+0000 is not allowed; use '
                "printable ASCII",
                'document 1, Gateway "g": spec.security.headers.referrerPolicy: "no-référrer" '
                'is not a valid HTTP header value: "é" (U+00E9) is not allowed; use printable '
                "ASCII",
                'document 1, Gateway "g": spec.security.headers.contentSecurityPolicy: '
                '"default-src \'self\' €" is not a valid HTTP header value: "€" (U+20AC) is '
                "not allowed; use printable ASCII",
                'document 2, Route "r": spec.handler.cacheControl: "max-age=60\\x7f" is not a '
                "valid HTTP header value: U+007F is not allowed; use printable ASCII",
                'document 3, Telemetry "t": spec.otlp.headers.Authorization: "Bearer ä" is not '
                'a valid HTTP header value: "ä" (U+00E4) is not allowed; use printable ASCII',
            ],
        )


class BearerCacheTtlTests(SynchronousTestCase):
    def test_cache_ttl(self) -> None:
        def idp(ttl: str) -> str:
            return f"""\
            kind: IdP
            metadata: {{name: i}}
            spec:
              type: oidc
              verificationOnly: true
              issuer: "https://idp.example"
              clientID: c
              bearer: {{cacheTTL: "{ttl}"}}
            """

        for text, seconds in (("0s", 0.0), ("90s", 90.0)):
            loaded = load_text(self.mktemp(), idp(text)).idp
            assert loaded is not None
            self.assertEqual(loaded.bearer.cache_ttl, seconds)
        self.assertEqual(
            problems_of(self.mktemp(), idp("-1s")),
            ['document 2, IdP "i": spec.bearer.cacheTTL: must not be negative, got "-1s"'],
        )


class UrlTests(SynchronousTestCase):
    """
    Upstream, IdP and OTLP URLs are checked strictly at load, so that nothing fails when
    the gateway is built.
    """

    def url_problems(self, *urls: str) -> list[str]:
        """
        The problems of one reverse-proxy route per URL, less the route prefix.
        """
        docs = "---\n".join(
            f"kind: Route\nmetadata: {{name: r{i}}}\n"
            f"spec: {{match: /r{i}/, handler: {{type: reverse-proxy, upstream: '{url}'}}}}\n"
            for i, url in enumerate(urls)
        )
        problems = problems_of(self.mktemp(), docs)
        prefixes = [f'document {i + 2}, Route "r{i}": spec.handler.upstream: ' for i in range(9)]
        return [next((p.removeprefix(x) for x in prefixes if p.startswith(x)), p) for p in problems]

    def test_valid(self) -> None:
        config = load_text(
            self.mktemp(),
            "---\n".join(
                f"kind: Route\nmetadata: {{name: r{i}}}\n"
                f"spec: {{match: /r{i}/, handler: {{type: reverse-proxy, upstream: '{url}'}}}}\n"
                for i, url in enumerate(
                    [
                        "http://127.0.0.1:8080",
                        "https://[::1]:8443/v1/",
                        "http://api.internal./a%20b/~x;p=1,2:@!$&()*+",
                        "HTTPS://xn--bcher-kva.example",
                        "http://a-b.c1",
                        "http://my_api:8080/",
                    ]
                )
            ),
        )
        self.assertEqual(len(config.routes), 6)

    def test_non_ascii_path(self) -> None:
        self.assertEqual(
            self.url_problems("http://127.0.0.1:9/ä"),
            [
                '"http://127.0.0.1:9/ä" is not a valid URL: "ä" (U+00E4) is not allowed in the '
                'path; percent-encode it ("%C3%A4")'
            ],
        )

    def test_space_and_other_characters(self) -> None:
        self.assertEqual(
            self.url_problems("http://127.0.0.1/a b", "http://h/a|b", "http://h/\t"),
            [
                '"http://127.0.0.1/a b" is not a valid URL: a space is not allowed in the path; '
                'percent-encode it ("%20")',
                '"http://h/a|b" is not a valid URL: "|" is not allowed in the path; '
                'percent-encode it ("%7C")',
                '"http://h/\\t" is not a valid URL: U+0009 is not allowed in the path; '
                'percent-encode it ("%09")',
            ],
        )

    def test_bad_percent_escape(self) -> None:
        self.assertEqual(
            self.url_problems("http://h/%zz", "http://h/a%2"),
            [
                '"http://h/%zz" is not a valid URL: "%zz" is not a valid percent-escape (use '
                '"%" and two hex digits; "%25" for "%" itself)',
                '"http://h/a%2" is not a valid URL: "%2" is not a valid percent-escape (use '
                '"%" and two hex digits; "%25" for "%" itself)',
            ],
        )

    def test_internationalized_host(self) -> None:
        self.assertEqual(
            self.url_problems("http://bücher.example/"),
            [
                '"http://bücher.example/" is not a valid URL: the host "bücher.example" is not '
                'ASCII: write internationalized names in punycode ("xn--bcher-kva.example")'
            ],
        )

    def test_invalid_host_names(self) -> None:
        rule = (
            "is not a valid host name: use letters, digits, hyphens, underscores and dots "
            '(labels of 1 to 63 characters, not starting or ending with "-"), or an IP address'
        )
        self.assertEqual(
            self.url_problems(
                "http://-a.example/",
                "http://a..b/",
                f"http://{'a' * 64}.example/",
                "http://h%41/",
            ),
            [
                f'"http://-a.example/" is not a valid URL: "-a.example" {rule}',
                f'"http://a..b/" is not a valid URL: "a..b" {rule}',
                f'"http://{"a" * 64}.example/" is not a valid URL: "{"a" * 64}.example" {rule}',
                f'"http://h%41/" is not a valid URL: "h%41" {rule}',
            ],
        )

    def test_ip_literals(self) -> None:
        self.assertEqual(
            self.url_problems(
                "http://256.0.0.1/", "http://::1/", "http://[::1", "http://[::g]/", "http://[::1]x/"
            ),
            [
                '"http://256.0.0.1/" is not a valid URL: "256.0.0.1" is not a valid IPv4 address',
                '"http://::1/" is not a valid URL: an IPv6 address must be written in brackets, '
                'such as "[::1]"',
                '"http://[::1" is not a valid URL: "[::1" has no closing "]"',
                '"http://[::g]/" is not a valid URL: "::g" is not a valid IPv6 address',
                '"http://[::1]x/" is not a valid URL: unexpected "x" after the IPv6 address',
            ],
        )

    def test_credentials(self) -> None:
        self.assertEqual(
            self.url_problems("http://u:secret@host/", "http://u@host/"),
            [
                '"http://***@host/" is not a valid URL: credentials in the URL are not allowed',
                '"http://***@host/" is not a valid URL: credentials in the URL are not allowed',
            ],
        )

    def test_ports(self) -> None:
        self.assertEqual(
            self.url_problems("http://h:0/", "http://h:65536/", "http://h:http/", "http://:80/"),
            [
                '"http://h:0/" is not a valid URL: the port must be between 1 and 65535, got 0',
                '"http://h:65536/" is not a valid URL: the port must be between 1 and 65535, '
                "got 65536",
                '"http://h:http/" is not a valid URL: the port "http" is not a number',
                '"http://:80/" is not a valid URL: expected http:// or https:// followed by a host',
            ],
        )

    def test_query_and_fragment(self) -> None:
        self.assertEqual(
            self.url_problems("http://h/?", "http://h/#top"),
            [
                '"http://h/?": a query or fragment is not allowed here',
                '"http://h/#top": a query or fragment is not allowed here',
            ],
        )

    def test_every_url_field(self) -> None:
        problems = problems_of(
            self.mktemp(),
            """\
            kind: IdP
            metadata: {name: i}
            spec:
              type: oidc
              issuer: "https://idp.exämple"
              clientID: c
              redirectURL: "https://app/cb x"
              bearer: {jwksURL: "https://u:p@idp/jwks"}
            ---
            kind: Telemetry
            metadata: {name: t}
            spec:
              service: {name: s}
              otlp: {endpoint: "http://collector:0"}
            ---
            kind: Route
            metadata: {name: a}
            spec:
              match: /a/
              handler:
                type: api
                backends: [{group: g, upstream: "http://127.0.0.1/ä", path: /x}]
            """,
        )
        self.assertEqual(
            problems,
            [
                'document 2, IdP "i": spec.issuer: "https://idp.exämple" is not a valid URL: the '
                'host "idp.exämple" is not ASCII: write internationalized names in punycode '
                '("idp.xn--exmple-cua")',
                'document 2, IdP "i": spec.redirectURL: "https://app/cb x" is not a valid URL: '
                'a space is not allowed in the path; percent-encode it ("%20")',
                'document 2, IdP "i": spec.bearer.jwksURL: "https://***@idp/jwks" is not a '
                "valid URL: credentials in the URL are not allowed",
                'document 3, Telemetry "t": spec.otlp.endpoint: "http://collector:0" is not a '
                "valid URL: the port must be between 1 and 65535, got 0",
                'document 4, Route "a": spec.handler.backends[0].upstream: "http://127.0.0.1/ä" '
                'is not a valid URL: "ä" (U+00E4) is not allowed in the path; percent-encode it '
                '("%C3%A4")',
                'document 2, IdP "i": spec: an IdP used for browser login needs a session block '
                "in the Gateway (spec.session with a 32-byte key); an instance that only "
                "verifies Bearer tokens sets verificationOnly: true",
            ],
        )


class AccessLogOutputTests(SynchronousTestCase):
    """
    C{Gateway.spec.accessLog.output} must be a file the gateway can append to.
    """

    def output_problems(self, root: str, output: str) -> list[str]:
        return problems_of(
            root,
            f"kind: Gateway\nmetadata: {{name: g}}\nspec: {{accessLog: {{output: '{output}'}}}}\n",
            gateway=False,
        )

    def test_directory(self) -> None:
        root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(root, "logs"))
        self.assertEqual(
            self.output_problems(root, "logs"),
            [
                f'document 1, Gateway "g": spec.accessLog.output: {os.path.join(root, "logs")} '
                "is a directory"
            ],
        )

    def test_directory_is_a_file(self) -> None:
        root = os.path.abspath(self.mktemp())
        write_tree(root, {"file": ""})
        output = os.path.join(root, "file", "access.log")
        self.assertEqual(
            self.output_problems(root, "file/access.log"),
            [
                f'document 1, Gateway "g": spec.accessLog.output: the directory of {output} '
                "is not a directory"
            ],
        )

    def test_directory_not_writable(self) -> None:
        # /proc/self exists on every Linux host this runs on; nothing can be created in it.
        self.assertEqual(
            self.output_problems(self.mktemp(), "/proc/self/nope"),
            [
                'document 1, Gateway "g": spec.accessLog.output: /proc/self/nope cannot be '
                "written: cannot create files in /proc/self"
            ],
        )

    def test_file_not_writable(self) -> None:
        root = os.path.abspath(self.mktemp())
        write_tree(root, {"access.log": ""})
        output = os.path.join(root, "access.log")
        os.chmod(output, 0o444)
        if os.access(output, os.W_OK):
            # Running as root: make os.access answer as it would for anyone else.
            access = os.access
            self.patch(os, "access", lambda path, mode: path != output and access(path, mode))
        self.assertEqual(
            self.output_problems(root, "access.log"),
            [
                f'document 1, Gateway "g": spec.accessLog.output: {output} cannot be written: '
                "permission denied"
            ],
        )


class StripPrefixTests(SynchronousTestCase):
    """
    C{stripPrefix} is stored percent-encoded, as the request paths it is matched against.
    """

    def test_encoded(self) -> None:
        root = self.mktemp()
        os.makedirs(os.path.join(root, "www"))
        config = load_text(
            root,
            """\
            kind: Route
            metadata: {name: s}
            spec: {match: /ä/, handler: {type: static, dir: www, stripPrefix: /ä}}
            ---
            kind: Route
            metadata: {name: p}
            spec:
              match: /p/
              handler:
                type: reverse-proxy
                upstream: "http://127.0.0.1:1"
                stripPrefix: "/a b/%41/%zz/x;y=1,z:@!$&'()*+~"
            """,
        )
        static, proxy = (route.handler for route in config.routes)
        assert isinstance(static, StaticHandlerSpec) and isinstance(proxy, ProxyHandlerSpec)
        self.assertEqual(static.strip_prefix, "/%C3%A4")
        self.assertEqual(proxy.strip_prefix, "/a%20b/%41/%25zz/x;y=1,z:@!$&'()*+~")

    def test_must_start_with_slash(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                "kind: Route\nmetadata: {name: p}\nspec: {match: /p/, handler: {type: "
                "reverse-proxy, upstream: 'http://127.0.0.1:1', stripPrefix: ä}}\n",
            ),
            ['document 2, Route "p": spec.handler.stripPrefix: "ä" must start with "/"'],
        )


class ForwardIdentityTests(SynchronousTestCase):
    def test_needs_an_issuing_assertion(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                """\
                kind: Route
                metadata: {name: p}
                spec:
                  match: /p/
                  handler: {type: reverse-proxy, upstream: "http://127.0.0.1:1",
                            forwardIdentity: true}
                ---
                kind: Route
                metadata: {name: a}
                spec:
                  match: /a
                  handler:
                    type: api
                    backends:
                      - {group: x, upstream: "http://127.0.0.1:1", path: /x,
                         forwardIdentity: true}
                """,
            ),
            [
                'document 2, Route "p": spec.handler.forwardIdentity: needs '
                "identity.assertion.issue in the Gateway to mint assertions",
                'document 3, Route "a": spec.handler.backends[0].forwardIdentity: needs '
                "identity.assertion.issue in the Gateway to mint assertions",
            ],
        )


class NotTextTests(SynchronousTestCase):
    """
    Issue 10, point 7: a string that is not valid Unicode text (a lone surrogate, from a
    C{\\ud800} escape or an environment variable that is not UTF-8) is a located load
    error, wherever it is; nothing downstream ever prints or encodes it.
    """

    def test_lone_surrogates_refused_where_they_are(self) -> None:
        self.assertEqual(
            problems_of(
                self.mktemp(),
                """\
                kind: Route
                metadata: {name: r, labels: {"team\\udc00": x}}
                spec:
                  match: "/\\ud800x"
                  handler: {type: proxy, upstream: "http://a.test/${BAD}"}
                """,
                environ={"BAD": "caf\udce9"},
            )[:3],
            [
                'document 2, Route "r": metadata.labels.team\\udc00: "team\\udc00" is not '
                "valid Unicode text: U+DC00 is a lone surrogate, which no UTF-8 text can hold",
                'document 2, Route "r": spec.match: "/\\ud800x" is not valid Unicode text: '
                "U+D800 is a lone surrogate, which no UTF-8 text can hold",
                'document 2, Route "r": spec.handler.upstream: "http://a.test/caf\\udce9" is '
                "not valid Unicode text: U+DCE9 is a lone surrogate, which no UTF-8 text can "
                "hold",
            ],
        )

    def test_characters_beyond_the_basic_plane(self) -> None:
        # YAML escapes them as \U0001F600 (or they are written as they are); YAML has no
        # surrogate pairs, so "\ud83d\ude00" is two lone surrogates (PyYAML reads it so).
        config = load_text(
            self.mktemp(),
            """\
            kind: Route
            metadata: {name: r}
            spec: {match: "/\\U0001F600/\U0001f600", handler: {type: health}}
            """,
        )
        self.assertEqual(config.routes[0].match, "/\U0001f600/\U0001f600")
        [problem] = problems_of(
            self.mktemp(),
            """\
            kind: Route
            metadata: {name: r}
            spec: {match: "/\\ud83d\\ude00", handler: {type: health}}
            """,
        )
        self.assertIn("U+D83D is a lone surrogate", problem)
