"""
Tests for the gateway-wide layers (forwarded, security) and the mux over HTTP.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any, cast

from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request

from edgegw.assembly.assemble import build_gateway
from edgegw.assembly.edge_site import edge_site
from edgegw.config.model import (
    CsrfSpec,
    GatewaySpec,
    HstsSpec,
    SecurityHeadersSpec,
    SecuritySpec,
)
from edgegw.edge.forwarded import ForwardedFilter
from edgegw.edge.security import security_headers
from tests.support.configs import load_text
from tests.support.memory import MemoryClient

# The six forwarding headers, written out here rather than taken from the code's own
# list: a name dropped from that list must fail these tests.
SIX_FORWARDING_HEADERS = {
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-forwarded-port",
    b"x-real-ip",
    b"forwarded",
}
FORWARDED = {
    "X-Forwarded-For": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Port": "443",
    "X-Real-Ip": "203.0.113.9",
    "Forwarded": "for=203.0.113.9",
}


class Recorder:
    """
    A dispatcher that records what reached it and answers 200.
    """

    def __init__(self) -> None:
        self.seen: list[dict[bytes, Sequence[bytes]]] = []

    def dispatch(self, request: Request, method: str, host: str, path: str, query: str) -> Any:
        self.seen.append({k.lower(): v for k, v in request.requestHeaders.getAllRawHeaders()})
        return b"ok"


class ForwardedTests(SynchronousTestCase):
    def forwarded_seen(self, trusted: tuple[str, ...], peer: str) -> set[bytes]:
        recorder = Recorder()
        site = edge_site(GatewaySpec(trusted_proxies=trusted), recorder, Clock())
        MemoryClient(site, peer=peer).request("GET", "/", FORWARDED)
        return {name for name in SIX_FORWARDING_HEADERS if name in recorder.seen[0]}

    def test_untrusted_by_default(self) -> None:
        self.assertEqual(self.forwarded_seen((), "10.1.2.3"), set())

    def test_each_removed_alone_in_any_case(self) -> None:
        """
        From an untrusted peer each forwarding header goes, sent alone and in any case,
        and nothing else does.
        """
        for name, value in FORWARDED.items():
            for spelling in (name, name.lower(), name.upper()):
                recorder = Recorder()
                site = edge_site(GatewaySpec(), recorder, Clock())
                MemoryClient(site, peer="10.1.2.3").request(
                    "GET", "/", {spelling: value, "X-Other": "kept"}
                )
                seen = recorder.seen[0]
                self.assertNotIn(name.lower().encode("ascii"), seen)
                self.assertEqual(seen[b"x-other"], [b"kept"])

    def test_long_hosts_are_not_remembered(self) -> None:
        """
        The edge remembers the hosts it has checked, but not hosts longer than any
        real one: thousands of kilobyte hosts must not stay in memory.
        """
        recorder = Recorder()
        site = edge_site(GatewaySpec(), recorder, Clock())
        long_host = "a" * 400 + ".example"
        MemoryClient(site).request("GET", "/", host=long_host)
        MemoryClient(site).request("GET", "/", host="short.example")
        self.assertEqual(len(recorder.seen), 2)
        hosts = site.resource._hosts
        self.assertEqual(list(hosts), [b"short.example"])

    def test_trusted_cidr_and_ip(self) -> None:
        self.assertEqual(self.forwarded_seen(("10.0.0.0/8",), "10.1.2.3"), SIX_FORWARDING_HEADERS)
        self.assertEqual(self.forwarded_seen(("192.0.2.7",), "192.0.2.7"), SIX_FORWARDING_HEADERS)
        self.assertEqual(self.forwarded_seen(("192.0.2.7",), "192.0.2.8"), set())
        self.assertEqual(self.forwarded_seen(("10.0.0.0/8",), "11.0.0.1"), set())

    def test_trust_everyone(self) -> None:
        self.assertEqual(self.forwarded_seen(("*",), "198.51.100.1"), SIX_FORWARDING_HEADERS)

    def test_ipv4_mapped_and_v6(self) -> None:
        filter = ForwardedFilter(["127.0.0.0/8", "2001:db8::/32"])
        self.assertTrue(filter.is_trusted("::ffff:127.0.0.1"))
        self.assertTrue(filter.is_trusted("2001:db8::1"))
        self.assertFalse(filter.is_trusted("2001:db9::1"))
        self.assertFalse(filter.is_trusted("not an address"))


class SecurityHeaderTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        self.assertEqual(
            security_headers(SecuritySpec()),
            (
                (b"Server", b"edgegw"),
                (b"X-Frame-Options", b"DENY"),
                (b"X-Content-Type-Options", b"nosniff"),
                (b"Referrer-Policy", b"strict-origin-when-cross-origin"),
                (b"Strict-Transport-Security", b"max-age=31536000; includeSubDomains"),
            ),
        )

    def test_empty_omits_and_csp_when_set(self) -> None:
        spec = SecuritySpec(
            headers=SecurityHeadersSpec(
                frame_options="",
                content_type_options="",
                referrer_policy="no-referrer",
                hsts=HstsSpec(max_age=60, include_subdomains=False, preload=True),
                content_security_policy="default-src 'self'",
            )
        )
        self.assertEqual(
            security_headers(spec),
            (
                (b"Server", b"edgegw"),
                (b"Referrer-Policy", b"no-referrer"),
                (b"Content-Security-Policy", b"default-src 'self'"),
                (b"Strict-Transport-Security", b"max-age=60; preload"),
            ),
        )

    def test_hsts_disabled(self) -> None:
        spec = SecuritySpec(headers=SecurityHeadersSpec(hsts=HstsSpec(enabled=False)))
        self.assertNotIn(b"Strict-Transport-Security", dict(security_headers(spec)))


def gateway_client(test: SynchronousTestCase, text: str) -> MemoryClient:
    config = load_text(test.mktemp(), text)
    return MemoryClient(build_gateway(config, Clock()).site)


ROUTES = """\
kind: Route
metadata: {name: health}
spec: {match: GET /healthz, handler: {type: health}}
---
kind: Route
metadata: {name: post}
spec: {match: "POST /things/{id}", handler: {type: health}}
---
kind: Route
metadata: {name: put}
spec: {match: "PUT /things/{id}", handler: {type: health}}
---
kind: Route
metadata: {name: docs}
spec: {match: /docs/, handler: {type: health}}
"""


class GatewayHttpTests(SynchronousTestCase):
    def test_health(self) -> None:
        response = gateway_client(self, ROUTES).request("GET", "/healthz")
        self.assertEqual(response.status, 200)
        self.assertEqual(response.body, b'{"status":"ok"}')
        self.assertEqual(response.header("Content-Type"), "application/json")

    def test_head_served_by_get(self) -> None:
        client = gateway_client(self, ROUTES)
        client.transport.clear()
        client.send(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = client.transport.value()
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n"), raw)

    def test_security_headers_on_every_response(self) -> None:
        client = gateway_client(self, ROUTES)
        for target in ("/healthz", "/missing", "/docs", "/things/1"):
            response = client.request("GET", target)
            self.assertEqual(response.header("X-Frame-Options"), "DENY", target)
            self.assertEqual(response.header("X-Content-Type-Options"), "nosniff", target)

    def test_404_405_301(self) -> None:
        client = gateway_client(self, ROUTES)
        missing = client.request("GET", "/nope")
        self.assertEqual((missing.status, missing.body), (404, b"not found\n"))
        wrong = client.request("GET", "/things/1")
        self.assertEqual((wrong.status, wrong.header("Allow")), (405, "POST, PUT"))
        moved = client.request("GET", "/docs?page=2")
        self.assertEqual((moved.status, moved.header("Location")), (301, "/docs/?page=2"))
        unclean = client.request("GET", "/a/../healthz")
        self.assertEqual((unclean.status, unclean.header("Location")), (301, "/healthz"))

    def test_target_without_path_is_bad_request(self) -> None:
        self.assertEqual(gateway_client(self, ROUTES).request("GET", "healthz").status, 400)

    def test_malformed_escape_is_bad_request(self) -> None:
        for target in ("/docs/%zz", "/docs/%", "/docs/%4"):
            client = gateway_client(self, ROUTES)
            response = client.request("GET", target)
            self.assertEqual((response.status, response.body), (400, b"bad request\n"), target)
            # Nothing after a request the edge refused is read on that connection.
            self.assertEqual(response.header("Connection"), "close")
        self.assertEqual(gateway_client(self, ROUTES).request("GET", "/docs/%41").status, 200)

    def test_percent_encoded_utf8_matches_pattern(self) -> None:
        config = ROUTES + (
            "---\nkind: Route\nmetadata: {name: u}\n"
            "spec: {match: GET /caf\u00e9, handler: {type: health}}\n"
        )
        raw = gateway_client(self, config).request("GET", "/caf\u00e9".encode().decode("latin-1"))
        encoded = gateway_client(self, config).request("GET", "/caf%C3%A9")
        # Raw non-ASCII is not a valid request-target (RFC 9112): Twisted refuses it.
        self.assertEqual((raw.status, encoded.status), (400, 200))

    def test_edge_answers_are_access_logged(self) -> None:
        events: list[dict[str, Any]] = []
        observer = cast(ILogObserver, events.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        client = gateway_client(self, ROUTES)
        client.request("GET", "/nope")
        client.request("POST", "/things/1", {"Sec-Fetch-Site": "cross-site"})
        records = [e["access"] for e in events if e.get("log_namespace") == "edgegw.access"]
        self.assertEqual(
            [(r["method"], r["path"], r["status"], r["route"]) for r in records],
            [("GET", "/nope", 404, None), ("POST", "/things/1", 403, None)],
        )

    def test_absolute_form_target(self) -> None:
        response = gateway_client(self, ROUTES).request("GET", "http://gateway.test/healthz")
        self.assertEqual(response.status, 200)

    def test_csrf_cross_origin_post_denied(self) -> None:
        client = gateway_client(self, ROUTES)
        denied = client.request("POST", "/things/1", {"Sec-Fetch-Site": "cross-site"})
        self.assertEqual(denied.status, 403)
        self.assertEqual(denied.body, b"cross-origin request detected from Sec-Fetch-Site header\n")
        self.assertEqual(denied.header("X-Frame-Options"), "DENY")
        same = client.request("POST", "/things/1", {"Sec-Fetch-Site": "same-origin"})
        self.assertEqual(same.status, 200)
        plain = client.request("POST", "/things/1")
        self.assertEqual(plain.status, 200)
        origin = client.request("POST", "/things/1", {"Origin": "https://evil.example"})
        self.assertEqual(origin.status, 403)
        matching = client.request("POST", "/things/1", {"Origin": "https://gateway.test"})
        self.assertEqual(matching.status, 200)

    def test_csrf_trusted_origin_and_bypass(self) -> None:
        gateway = """\
        kind: Gateway
        metadata: {name: g}
        spec:
          security:
            csrf:
              trustedOrigins: ["https://app.example.com"]
              bypassPatterns: ["POST /things/{id}"]
        ---
        """
        config = load_text(self.mktemp(), textwrap.dedent(gateway) + ROUTES, gateway=False)
        client = MemoryClient(build_gateway(config, Clock()).site)
        headers = {"Sec-Fetch-Site": "same-site", "Origin": "https://app.example.com"}
        self.assertEqual(client.request("PUT", "/things/1", headers).status, 200)
        hostile = {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}
        self.assertEqual(client.request("PUT", "/things/1", hostile).status, 403)
        self.assertEqual(client.request("POST", "/things/1", hostile).status, 200)

    def test_csrf_disabled(self) -> None:
        config = load_text(self.mktemp(), ROUTES, gateway=True)
        spec = config.gateway
        import attrs

        config = attrs.evolve(
            config,
            gateway=attrs.evolve(spec, security=SecuritySpec(csrf=CsrfSpec(enabled=False))),
        )
        client = MemoryClient(build_gateway(config, Clock()).site)
        hostile = {"Sec-Fetch-Site": "cross-site"}
        self.assertEqual(client.request("POST", "/things/1", hostile).status, 200)


class ResponseHeadTests(SynchronousTestCase):
    def test_fixed_headers_once_each(self) -> None:
        client = gateway_client(self, ROUTES)
        for target in ("/healthz", "/nope", "/docs"):
            response = client.request("GET", target)
            for name in ("Date", "Server", "X-Frame-Options", "Strict-Transport-Security"):
                self.assertEqual(len(response.all(name)), 1, (target, name))
            self.assertEqual(response.header("Server"), "edgegw")

    def test_date_line_cached_per_second(self) -> None:
        from edgegw.server.response_head import date_line

        first = date_line()
        self.assertTrue(first.startswith(b"Date: ") and first.endswith(b" GMT\r\n"), first)
        self.assertIn(date_line()[:6], (b"Date: ",))


class RequestTargetTests(SynchronousTestCase):
    def test_host_missing_or_repeated_is_bad_request(self) -> None:
        client = gateway_client(self, ROUTES)
        missing = client.request("GET", "/healthz", host=None)
        self.assertEqual(missing.status, 400)
        repeated = gateway_client(self, ROUTES).request("GET", "/healthz", [("Host", "b.test")])
        self.assertEqual(repeated.status, 400)

    def test_http10_without_host_is_fine(self) -> None:
        client = gateway_client(self, ROUTES)
        client.transport.clear()
        client.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        self.assertTrue(client.transport.value().startswith(b"HTTP/1.0 200 "))

    def test_encoded_dot_segments_and_backslashes(self) -> None:
        client = gateway_client(self, ROUTES)
        for target in ("/docs/%2e%2e/healthz", "/docs/.%2E/x", "/docs/%2e", "/docs%5cx"):
            self.assertEqual(
                gateway_client(self, ROUTES).request("GET", target).status, 400, target
            )
        # encodedSlashes: reject by default (tests/test_differentials.py has the modes).
        self.assertEqual(client.request("GET", "/docs/a.%2e.b").status, 200)
        self.assertEqual(client.request("GET", "/docs/a%2Fb").status, 400)

    def test_absolute_form_host_replaces_host_header(self) -> None:
        response = gateway_client(self, ROUTES).request(
            "GET", "http://gateway.test/healthz", host="ignored.test"
        )
        self.assertEqual(response.status, 200)
        bad = gateway_client(self, ROUTES).request("GET", "ftp://gateway.test/healthz")
        self.assertEqual(bad.status, 400)
