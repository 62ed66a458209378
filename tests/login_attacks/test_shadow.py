"""
Finding: a Route with a host pattern shadows every auth endpoint on that host (the mux
prefers host patterns, and _check_auth_paths only detects conflicts within one host), so
login, callback, logout and the session view go to the route's handler. Logout then
silently does not log out.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.login_attacks.world import rworld

ROUTES = """\
kind: Route
metadata: {name: site}
spec:
  match: "127.0.0.1/"
  type: app
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: app}
spec:
  match: "127.0.0.1/app/"
  type: app
  access: {auth: required}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
"""


class HostPatternShadowing(TestCase):
    async def test_auth_endpoints_win_over_host_routes(self) -> None:
        w = await rworld(self, ROUTES)
        # The reference: requests to the auth endpoints are handled directly.
        login = await w.browser.get(w.url("/auth/login?return_to=/app/x"))
        self.assertEqual(login.status, 302, "login endpoint shadowed by the host route")
        self.assertTrue((login.location or "").startswith(w.idp.issuer))

    async def test_logout_really_logs_out_with_host_routes(self) -> None:
        w = await rworld(self, ROUTES)
        # Log in by hand at the callback (the only way while the endpoints are shadowed
        # would be none at all); so just check logout: the POST must reach the gateway.
        before = len(w.backend.requests)
        out = await w.browser.post(w.url("/auth/logout"))
        self.assertEqual(len(w.backend.requests), before, "POST /auth/logout went to the backend")
        self.assertEqual(out.status, 302)


class MethodRouteShadowing(TestCase):
    def test_method_route_on_an_auth_path_is_a_config_error(self) -> None:
        from edgegw.config.errors import ConfigError
        from tests.support.configs import load_text
        from tests.test_login import KEY

        text = f"""\
            kind: Gateway
            metadata: {{name: g}}
            spec:
              listen: "127.0.0.1:0"
              session: {{key: "{KEY}"}}
            ---
            kind: IdP
            metadata: {{name: i}}
            spec: {{type: oidc, issuer: "https://idp.example", clientID: c, clientSecret: s}}
            ---
            kind: Route
            metadata: {{name: r}}
            spec: {{match: "POST /auth/logout", handler: {{type: health}}}}
            ---
            kind: Route
            metadata: {{name: h}}
            spec: {{match: "example.com/", handler: {{type: health}}}}
            """
        # "POST /auth/logout" can never be reached (the endpoint answers first): reported.
        # "example.com/" keeps every other path and is fine.
        with self.assertRaises(ConfigError) as caught:
            load_text(self.mktemp(), text, gateway=False)
        self.assertEqual(len(caught.exception.problems), 1)
        self.assertIn("/auth/logout", str(caught.exception.problems[0]))
