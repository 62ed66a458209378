"""
Parser differentials (issue 10) over real sockets: wherever the gateway and a backend
could read one request differently, the gateway refuses it or forwards the reading it
routed and authorized.

Each test runs a gateway in front of a recording backend, with a Policy on C{/admin/} and
on the host C{admin.example}, a public catch-all, and a CSRF bypass pattern
C{POST /webhooks/}, and checks the exact status the client gets and what the backend
received (path, C{Host}, C{X-Forwarded-Host}), or that it received nothing.
"""

from __future__ import annotations

from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase

from tests.support.backends import RecordedRequest, SiteBackend
from tests.support.configs import GATEWAY
from tests.support.gateways import serve_yaml
from tests.support.rawclient import connect, response_complete

ROUTES = """\
---
kind: Policy
metadata: {name: admins}
spec: {require: {groups: [admin]}}
---
kind: Route
metadata: {name: admin}
spec:
  match: /admin/
  handler: {type: reverse-proxy, upstream: "UP", preserveHost: true}
  access: {auth: public, authorize: [admins]}
---
kind: Route
metadata: {name: admin-host}
spec:
  match: admin.example/
  handler: {type: reverse-proxy, upstream: "UP", preserveHost: true}
  access: {auth: public, authorize: [admins]}
---
kind: Route
metadata: {name: public}
spec:
  match: /
  handler: {type: reverse-proxy, upstream: "UP", preserveHost: true}
  access: {auth: public}
"""

CROSS_SITE = "Sec-Fetch-Site: cross-site\r\nOrigin: https://evil.example\r\n"


class DifferentialTestCase(TestCase):
    """
    A recording backend and, per test, gateways in front of it.
    """

    def setUp(self) -> None:
        self.backend = SiteBackend().start()
        self.addCleanup(lambda: ensureDeferred(self.backend.stop()))

    def gateway(self, encoded_slashes: str | None = None) -> int:
        """
        Start a gateway (C{encodedSlashes} as given, or left to its default); its port.
        """
        security = "  security:\n    csrf: {bypassPatterns: [POST /webhooks/]}\n"
        if encoded_slashes is not None:
            security += f"    encodedSlashes: {encoded_slashes}\n"
        upstream = f"http://127.0.0.1:{self.backend.port}"
        return serve_yaml(
            self,
            GATEWAY + security + ROUTES.replace("UP", upstream),
        )

    async def status(
        self,
        port: int,
        target: str,
        method: str = "GET",
        host: str = "gateway.test",
        headers: str = "",
    ) -> int:
        """
        Send one raw request on a fresh connection; the status of the answer.
        """
        client = await connect(port)
        body = "Content-Length: 0\r\n" if method.upper() == "POST" else ""
        client.send(
            f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{headers}{body}"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        data = await client.until(response_complete)
        await client.close()
        return int(data.split(b" ", 2)[1])

    def received(self) -> list[RecordedRequest]:
        """
        What the backend received so far; forgotten afterwards.
        """
        seen, self.backend.requests = self.backend.requests, []
        return seen

    async def assertRefused(self, port: int, target: str, status: int = 400, **kw: str) -> None:
        """
        C{target} gets C{status} and nothing reaches the backend.
        """
        self.assertEqual(await self.status(port, target, **kw), status, target)
        self.assertEqual([seen.uri for seen in self.received()], [], target)

    async def assertForwarded(self, port: int, target: str, uri: bytes, **kw: str) -> None:
        """
        C{target} gets 200 and the backend receives exactly C{uri}.
        """
        self.assertEqual(await self.status(port, target, **kw), 200, target)
        self.assertEqual([seen.uri for seen in self.received()], [uri], target)


# Dot segments in disguise: 400 whatever encodedSlashes says.
DOTS = (
    "/p/..%2Fadmin/users",
    "/p/..%2fadmin/users",
    "/p/%2e%2e%2fadmin/users",
    "/p/%2E%2E%2Fadmin/users",
    "/p/.%2e%2Fadmin/users",
    "/admin%2F..%2Fpublic",
    "/p/%2e/admin",
    "/p/x%2F.%2F..%2Fadmin",
    "/p/%2e%2e/admin/users",
)


class EncodedSlashTests(DifferentialTestCase):
    """
    Point 1: C{security.encodedSlashes}, and dot segments hidden behind escapes.
    """

    async def test_reject_is_the_default(self) -> None:
        port = self.gateway()
        for target in ("/admin%2Fusers", "/admin%2fusers", "/public/a%2Fb", *DOTS):
            await self.assertRefused(port, target)
        # An escaped unreserved character is the character (RFC 3986 section 6.2.2.2).
        await self.assertForwarded(port, "/public/a%41b%20c", b"/public/aAb%20c")
        await self.assertRefused(port, "/admin/users", 403)
        await self.assertRefused(port, "/%61dmin/users", 403)

    async def test_reject(self) -> None:
        port = self.gateway("reject")
        for target in ("/admin%2Fusers", "/public/a%2Fb?x=%2F", *DOTS):
            await self.assertRefused(port, target)
        await self.assertForwarded(port, "/public/x?a=%2F", b"/public/x?a=%2F")

    async def test_decode_routes_authorizes_and_forwards_the_decoded_path(self) -> None:
        port = self.gateway("decode")
        for target in ("/admin%2Fusers", "/admin%2fusers", "/admin%2F%75sers"):
            await self.assertRefused(port, target, 403)
        for target in DOTS:
            await self.assertRefused(port, target)
        await self.assertForwarded(port, "/public/a%2Fb?q=%2F", b"/public/a/b?q=%2F")
        await self.assertForwarded(port, "/public/%252F", b"/public/%252F")
        # Decoded into "//": the mux's clean-path redirect, never the backend.
        self.assertEqual(await self.status(port, "/public%2F%2Fx"), 301)
        self.assertEqual(self.received(), [])

    async def test_keep_is_go_semantics_with_its_documented_risk(self) -> None:
        port = self.gateway("keep")
        # One segment "admin/users" to the mux: the catch-all, not the policy's route.
        await self.assertForwarded(port, "/admin%2Fusers", b"/admin%2Fusers")
        await self.assertForwarded(port, "/public/a%2Fb", b"/public/a%2Fb")
        for target in DOTS:
            await self.assertRefused(port, target)

    async def test_csrf_bypass_pattern_reads_the_routed_path(self) -> None:
        for mode in ("reject", "decode", "keep"):
            port = self.gateway(mode)
            for target in ("/webhooks/..%2Ftransfer", "/webhooks/%2e%2e%2ftransfer"):
                await self.assertRefused(port, target, method="POST", headers=CROSS_SITE)
            await self.assertForwarded(
                port, "/webhooks/hook", b"/webhooks/hook", method="POST", headers=CROSS_SITE
            )
            await self.assertRefused(port, "/transfer", 403, method="POST", headers=CROSS_SITE)
        # An encoded slash is read as the routes read it: decoded, the bypass pattern
        # covers what the backend gets; kept, one segment that the pattern does not cover.
        decode, keep = self.gateway("decode"), self.gateway("keep")
        await self.assertForwarded(
            decode, "/webhooks%2Fhook", b"/webhooks/hook", method="POST", headers=CROSS_SITE
        )
        await self.assertRefused(keep, "/webhooks%2Fhook", 403, method="POST", headers=CROSS_SITE)


class MethodCaseTests(DifferentialTestCase):
    """
    Point 2: a standard method in any other case is 400, not a method no route names.
    """

    async def test_non_canonical_standard_methods_refused(self) -> None:
        port = self.gateway()
        for method in ("get", "Get", "gET", "head", "post", "Put", "patch", "delete", "options"):
            await self.assertRefused(port, "/admin/users", method=method)
            await self.assertRefused(port, "/public/x", method=method)
        for method in ("trace", "Connect"):
            await self.assertRefused(port, "/public/x", method=method)
        await self.assertRefused(port, "/admin/users", 403)
        await self.assertForwarded(port, "/public/x", b"/public/x")

    async def test_other_methods_are_case_sensitive_tokens(self) -> None:
        port = self.gateway()
        await self.assertForwarded(port, "/public/x", b"/public/x", method="purge")
        await self.assertForwarded(port, "/public/x", b"/public/x", method="PURGE")


class HostTests(DifferentialTestCase):
    """
    Point 3: host patterns match every spelling of their host, Host is validated, and
    the backend gets the normalised value.
    """

    async def test_spellings_of_a_policy_host_cannot_skip_it(self) -> None:
        port = self.gateway()
        for host in (
            "admin.example",
            "ADMIN.example",
            "Admin.Example",
            "admin.example.",
            "admin.example:80",
            "admin.example.:80",
            "ADMIN.EXAMPLE.:8080",
            "admin.example:",
        ):
            await self.assertRefused(port, "/panel", 403, host=host)
        for target in (
            "http://ADMIN.example/panel",
            "http://admin.example./panel",
            "https://Admin.Example.:443/panel",
        ):
            await self.assertRefused(port, target, 403, host="gateway.test")

    async def test_invalid_host_syntax_refused(self) -> None:
        port = self.gateway()
        for host in (
            "a b",
            "a@b/c?d",
            "a@b",
            "a/b",
            "a?b",
            "a#b",
            "a\tb",
            "gateway.test:8x",
            "gateway.test:80:80",
            "gateway..test",
            ".",
            "::1",
            "[::1",
            "[::1]x",
            "[not-ipv6]",
            "[fe80::1%eth0]",
            "h\u00e9.test",
            "a%zzb",
            "%61dmin.example",
        ):
            await self.assertRefused(port, "/public/x", host=host)
        for target in ("http://a%zz/x", "http://x:y/x", "http://[::1/x"):
            await self.assertRefused(port, target)

    async def test_backend_gets_the_normalised_host(self) -> None:
        port = self.gateway()
        cases = {
            "gateway.test": b"gateway.test",
            "Gateway.TEST": b"gateway.test",
            "gateway.test.": b"gateway.test",
            "Gateway.Test.:8080": b"gateway.test:8080",
            "gateway.test:": b"gateway.test",
            "[::1]:8080": b"[::1]:8080",
            "[FE80::1]": b"[fe80::1]",
            "192.0.2.1:80": b"192.0.2.1:80",
        }
        for sent, normal in cases.items():
            self.assertEqual(await self.status(port, "/public/x", host=sent), 200, sent)
            [seen] = self.received()
            self.assertEqual(seen.uri, b"/public/x", sent)
            self.assertEqual(seen.header(b"host"), normal, sent)
            self.assertEqual(seen.header(b"x-forwarded-host"), normal, sent)
        await self.assertForwarded(port, "http://Public.Example./x?y", b"/x?y")
        await self.status(port, "http://Public.Example.:81/x")
        [seen] = self.received()
        self.assertEqual(seen.header(b"host"), b"public.example:81")
        self.assertEqual(seen.header(b"x-forwarded-host"), b"public.example:81")


class AmbiguousSpellingTests(DifferentialTestCase):
    """
    Spellings that a backend reads as a path or host the policy covers (path
    parameters, fragments and invisible bytes, host sub-delimiters) are refused, and the
    refused request's connection is closed.
    """

    async def test_path_parameters_refused(self) -> None:
        # Tomcat and Jetty drop ";params" per segment and read "..;" as "..".
        port = self.gateway()
        for target in ("/admin;x/users", "/public/..;/admin/users", "/p;/x", "/;"):
            await self.assertRefused(port, target)
        await self.assertRefused(port, "/webhooks/..;/transfer", method="POST", headers=CROSS_SITE)
        # Encoded, it is data in a segment for every backend.
        await self.assertForwarded(port, "/p/a%3Bb", b"/p/a%3Bb")

    async def test_fragment_and_invisible_bytes_refused(self) -> None:
        port = self.gateway()
        for target in (
            "/secret#x",
            "/admin#/users",
            "/p?x#y",
            "/secret\xa0",
            "/secret\x85",
            "/admin\x7f/users",
            "/p?q=\xa0",
            "/secret%00.html",
        ):
            await self.assertRefused(port, target)

    async def test_host_sub_delims_refused(self) -> None:
        port = self.gateway()
        for host in ("admin.example,x", "x,admin.example", "x;admin.example", "a&b", ""):
            await self.assertRefused(port, "/panel", host=host)
        await self.assertRefused(port, "http://x,admin.example/panel", host="gw.test")
        # A port is 1 to 65535: its leading zeros are dropped from what is forwarded.
        await self.assertForwarded(port, "/p", b"/p", host="Gateway.Test:0080")
        self.assertEqual(await self.status(port, "/p", host="gateway.test:0"), 400)

    async def test_refused_request_closes_its_connection(self) -> None:
        port = self.gateway()
        client = await connect(port)
        # A refused request, then one the gateway would serve, on one connection.
        client.send(
            b"GET /secret#x HTTP/1.1\r\nHost: gateway.test\r\n\r\n"
            b"GET /admin/users HTTP/1.1\r\nHost: gateway.test\r\n\r\n"
        )
        data = await client.until(response_complete)
        await client.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 400 "), data)
        self.assertIn(b"\r\nConnection: close\r\n", data)
        self.assertEqual(data.count(b"HTTP/1.1 "), 1)
        self.assertEqual(self.received(), [])


class TrustedForwardedHostTests(DifferentialTestCase):
    """
    X-Forwarded-Host from a trusted proxy reaches the backend only as one valid host in
    its normal form.
    """

    async def test_forwarded_host_normalised_or_dropped(self) -> None:
        upstream = f"http://127.0.0.1:{self.backend.port}"
        port = serve_yaml(
            self,
            GATEWAY
            + '  trustedProxies: ["127.0.0.1"]\n'
            + ROUTES.replace("UP", upstream).replace("preserveHost: true", ""),
        )
        for given, forwarded in (
            ("ADMIN.example.", b"admin.example"),
            ("a b", b"gateway.test"),
            ("x,admin.example", b"gateway.test"),
        ):
            status = await self.status(port, "/p", headers=f"X-Forwarded-Host: {given}\r\n")
            self.assertEqual(status, 200, given)
            [seen] = self.received()
            self.assertEqual(seen.header(b"x-forwarded-host"), forwarded, given)


class StripPrefixSpellingTests(DifferentialTestCase):
    async def test_escaped_prefix_is_stripped_like_the_plain_one(self) -> None:
        upstream = f"http://127.0.0.1:{self.backend.port}/svc"
        port = serve_yaml(
            self,
            GATEWAY + "---\nkind: Route\nmetadata: {name: api}\nspec:\n"
            "  match: /api/\n  access: {auth: public}\n"
            f'  handler: {{type: reverse-proxy, upstream: "{upstream}", stripPrefix: /api}}\n',
        )
        # "/%61pi/users" matches /api/ (the mux decodes): it must not reach the backend
        # unstripped, as /svc/%61pi/users, which it would read as /svc/api/users.
        await self.assertForwarded(port, "/%61pi/users", b"/svc/users")
        await self.assertForwarded(port, "/api/users", b"/svc/users")
