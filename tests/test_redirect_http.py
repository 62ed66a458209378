"""
C{Gateway.spec.redirectHTTP}: the plain-HTTP listener that answers every request with a
308 to HTTPS, and serves ACME HTTP-01 challenges from a webroot; over real sockets.
"""

from __future__ import annotations

import io
import os
import socket

from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.check import check
from edgegw.config.addresses import listen_port
from edgegw.config.errors import ConfigError
from edgegw.config.model import RedirectHttpSpec
from edgegw.config.parse import load_config
from edgegw.edge.https_redirect import read_challenge
from edgegw.service import GatewayService, build_service
from tests.support.certificates import CertificateAuthority
from tests.support.configs import write_tree
from tests.support.processes import port_of, raw_exchange
from tests.support.rawclient import connect
from tests.support.tls_client import get_request, handshake

HEALTH = "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /, handler: {type: health}}\n"
TOKEN = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"


def gateway(cert: str, key: str, redirect: str | None, listen: str = "127.0.0.1:0") -> str:
    """
    A Gateway with C{tls} (one certificate) and the C{redirectHTTP} block C{redirect}
    (flow mapping text; L{None}: none).
    """
    text = (
        "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
        f'  listen: "{listen}"\n'
        f'  tls:\n    certificates: [{{certFile: "{cert}", keyFile: "{key}"}}]\n'
    )
    if redirect is not None:
        text += f"  redirectHTTP: {redirect}\n"
    return text + HEALTH


def head_of(response: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """
    The status, the fields (lowercase names) and the body of one raw response.
    """
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), fields, body


class ConfigTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.key, self.cert, _ = CertificateAuthority().issue(self.directory, ["localhost"])

    def write(self, text: str) -> str:
        path = os.path.join(self.directory, "gateway.yaml")
        with open(path, "w") as stream:
            stream.write(text)
        return path

    def problems(self, text: str) -> list[str]:
        path = self.write(text)
        with self.assertRaises(ConfigError) as raised:
            load_config(path, {})
        prefix = f'{path}, document 1, Gateway "gw": '
        return [str(p).removeprefix(prefix) for p in raised.exception.problems]

    def test_valid(self) -> None:
        os.makedirs(os.path.join(self.directory, "acme"))
        config = load_config(
            self.write(
                gateway(
                    self.cert,
                    self.key,
                    '{listen: "127.0.0.1:8080", acmeWebroot: acme, httpsPort: 8443}',
                )
            ),
            {},
        )
        self.assertEqual(
            config.gateway.redirect_http,
            RedirectHttpSpec("127.0.0.1:8080", os.path.join(self.directory, "acme"), 8443),
        )
        minimal = load_config(self.write(gateway(self.cert, self.key, '{listen: ":80"}')), {})
        self.assertEqual(minimal.gateway.redirect_http, RedirectHttpSpec(":80"))

    def test_requires_tls(self) -> None:
        text = (
            "apiVersion: v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n"
            '  listen: "127.0.0.1:0"\n  redirectHTTP: {listen: ":80"}\n' + HEALTH
        )
        self.assertEqual(
            self.problems(text),
            ["spec.redirectHTTP: requires tls (the HTTPS listener it redirects to)"],
        )

    def test_errors(self) -> None:
        missing = os.path.join(self.directory, "nowhere")
        self.assertEqual(
            self.problems(
                gateway(
                    self.cert,
                    self.key,
                    '{listen: "8080", acmeWebroot: nowhere, httpsPort: 70000, port: 1}',
                )
            ),
            [
                'spec.redirectHTTP.listen: invalid listen address "8080": use ":8080", '
                '"127.0.0.1:8080", "[::1]:8080" or a Twisted endpoint such as "tcp:8080" or '
                '"ssl:8443:..."',
                f"spec.redirectHTTP.acmeWebroot: {missing} is not a directory",
                "spec.redirectHTTP.httpsPort: must be at most 65535, got 70000",
                'spec.redirectHTTP.port: unknown field; did you mean "httpsPort"?',
            ],
        )
        self.assertEqual(
            self.problems(gateway(self.cert, self.key, "{listen: 'ssl:80:privateKey=k.pem'}")),
            [
                "spec.redirectHTTP.listen: the redirect listener speaks plain HTTP: not an ssl: "
                "endpoint"
            ],
        )
        self.assertEqual(
            self.problems(gateway(self.cert, self.key, '{listen: ":8443"}', listen=":8443")),
            ["spec.redirectHTTP.listen: is listen's address too (:8443)"],
        )
        self.assertEqual(
            self.problems(gateway(self.cert, self.key, "{}")),
            ["spec.redirectHTTP.listen: required field is missing"],
        )

    def test_check(self) -> None:
        path = self.write(gateway(self.cert, self.key, '{listen: "127.0.0.1:8081"}'))
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(check(path, out, err), 0, err.getvalue())
        self.assertIn(
            " with TLS 1.2+ for localhost (h2, http/1.1); redirecting plain HTTP on "
            "127.0.0.1:8081 to https\n",
            out.getvalue(),
        )

    def test_listen_port(self) -> None:
        cases = {
            ":443": 443,
            "127.0.0.1:8443": 8443,
            "[::1]:443": 443,
            "tcp:8443:interface=127.0.0.1": 8443,
            "tcp6:port=8443": 8443,
            "127.0.0.1:0": None,
            "systemd:domain=INET:index=0": None,
            "unix:/run/edgegw.sock": None,
        }
        self.assertEqual({listen: listen_port(listen) for listen in cases}, cases)


class ChallengeTests(SynchronousTestCase):
    """
    What of the webroot L{read_challenge} reads: challenge files only.
    """

    def setUp(self) -> None:
        self.webroot = os.path.abspath(self.mktemp())
        self.challenges = os.path.join(self.webroot, ".well-known", "acme-challenge")
        os.makedirs(self.challenges)
        with open(os.path.join(self.challenges, TOKEN), "w") as stream:
            stream.write(TOKEN + ".thumbprint")
        self.outside = os.path.join(os.path.dirname(self.webroot), "secret")
        with open(self.outside, "w") as stream:
            stream.write("secret")

    def test_token(self) -> None:
        self.assertEqual(
            read_challenge(self.webroot, TOKEN.encode()), f"{TOKEN}.thumbprint".encode()
        )
        self.assertIsNone(read_challenge(self.webroot, b"missing"))
        for bad in (b"", b"..", b"../../secret", b"a.b", b"%2e%2e", b"a/b", b"a\x00"):
            self.assertIsNone(read_challenge(self.webroot, bad), bad)

    def test_no_symlink(self) -> None:
        os.symlink(self.outside, os.path.join(self.challenges, "linked"))
        self.assertIsNone(read_challenge(self.webroot, b"linked"))
        # A directory on the way that is a link out of the webroot.
        other = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(other, ".well-known"))
        os.symlink(
            os.path.join(os.path.dirname(self.outside)),
            os.path.join(other, ".well-known", "acme-challenge"),
        )
        self.assertIsNone(read_challenge(other, b"secret"))

    def test_not_a_file(self) -> None:
        os.mkfifo(os.path.join(self.challenges, "fifo"))
        os.makedirs(os.path.join(self.challenges, "directory"))
        with open(os.path.join(self.challenges, "large"), "wb") as stream:
            stream.write(b"x" * 5000)
        for name in (b"fifo", b"directory", b"large"):
            self.assertIsNone(read_challenge(self.webroot, name), name)


class ListenerTests(TestCase):
    """
    The redirect listener beside the TLS one.
    """

    def setUp(self) -> None:
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.ca = CertificateAuthority()
        self.key, self.cert, _ = self.ca.issue(self.directory, ["localhost"])
        self.webroot = os.path.join(self.directory, "acme")
        challenges = os.path.join(self.webroot, ".well-known", "acme-challenge")
        os.makedirs(challenges)
        with open(os.path.join(challenges, TOKEN), "w") as stream:
            stream.write(TOKEN + ".thumbprint")
        with open(os.path.join(self.webroot, "index.html"), "w") as stream:
            stream.write("not served")

    def serve(self, redirect: str) -> tuple[GatewayService, int, int]:
        """
        Serve TLS and the redirect; return the service, the TLS port and the redirect's.
        """
        root = write_tree(
            os.path.join(self.directory, "config"),
            {"a.yaml": gateway(self.cert, self.key, redirect)},
        )
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        assert service.redirect_listener is not None
        return service, port_of(service), port_of(service.redirect_listener)

    async def exchange(self, port: int, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        return head_of(await raw_exchange(port, request))

    async def test_redirects(self) -> None:
        _, tls_port, port = self.serve('{listen: "127.0.0.1:0"}')
        cases = [
            # The port the request came to is dropped; the TLS listener's is named.
            (
                b"GET /a/b?x=1&y=%2F HTTP/1.1\r\nHost: Example.COM.:80\r\n",
                b"example.com",
                b"/a/b?x=1&y=%2F",
            ),
            (
                b"POST /form HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc",
                b"localhost",
                b"/form",
            ),
            (b"HEAD / HTTP/1.1\r\nHost: [::1]:80\r\n", b"[::1]", b"/"),
            (
                b"GET http://other.example:80/p?q HTTP/1.1\r\nHost: ignored\r\n",
                b"other.example",
                b"/p?q",
            ),
            (
                b"GET //evil.example/x HTTP/1.1\r\nHost: localhost\r\n",
                b"localhost",
                b"//evil.example/x",
            ),
        ]
        for request, host, target in cases:
            if not request.endswith(b"abc"):
                request += b"Connection: close\r\n\r\n"
            else:
                request = request.replace(b"\r\n\r\nabc", b"\r\nConnection: close\r\n\r\nabc")
            status, fields, body = await self.exchange(port, request)
            self.assertEqual(status, 308, request)
            self.assertEqual(fields[b"location"], b"https://%s:%d%s" % (host, tls_port, target))
            self.assertEqual(body, b"")
        # The ACME path is redirected like any other without a webroot.
        status, fields, _ = await self.exchange(
            port,
            get_request(f"/.well-known/acme-challenge/{TOKEN}", "a.example"),
        )
        self.assertEqual(status, 308)
        # The redirect target answers: the TLS listener.
        handshaken = await handshake(tls_port, request=get_request("/"))
        self.assertTrue(handshaken.response.startswith(b"HTTP/1.1 200 "))

    async def test_bad_hosts(self) -> None:
        _, _, port = self.serve('{listen: "127.0.0.1:0", httpsPort: 443}')
        for request in (
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a@b.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.example:99999\r\n\r\n",
            b"GET http://a@b.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n",
        ):
            status, _, _ = await self.exchange(port, request)
            self.assertEqual(status, 400, request)
        # httpsPort 443 is left out of the URL.
        status, fields, _ = await self.exchange(
            port, b"GET /x HTTP/1.1\r\nHost: a.example:8080\r\nConnection: close\r\n\r\n"
        )
        self.assertEqual((status, fields[b"location"]), (308, b"https://a.example/x"))

    async def test_acme_challenges(self) -> None:
        _, _, port = self.serve(f'{{listen: "127.0.0.1:0", acmeWebroot: "{self.webroot}"}}')
        challenge = f"/.well-known/acme-challenge/{TOKEN}"
        status, fields, body = await self.exchange(port, get_request(challenge, "a.example"))
        self.assertEqual((status, body), (200, f"{TOKEN}.thumbprint".encode()))
        self.assertEqual(fields[b"content-type"], b"text/plain; charset=utf-8")
        self.assertEqual(fields[b"cache-control"], b"no-store")
        status, fields, body = await self.exchange(
            port,
            f"HEAD {challenge} HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n".encode(),
        )
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(fields[b"content-length"], str(len(TOKEN) + 11).encode())
        for missing in (
            "/.well-known/acme-challenge/unknown",
            "/.well-known/acme-challenge/../../index.html",
            "/.well-known/acme-challenge/%2e%2e%2findex.html",
            "/.well-known/acme-challenge/",
            "/.well-known/acme-challenge/a/b",
        ):
            status, _, _ = await self.exchange(port, get_request(missing, "a.example"))
            self.assertEqual(status, 404, missing)
        # Nothing else of the webroot is served, and other methods are redirected.
        for request in (
            b"GET /index.html HTTP/1.1\r\n",
            f"POST {challenge} HTTP/1.1\r\n".encode(),
        ):
            status, _, _ = await self.exchange(
                port, request + b"Host: a.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            self.assertEqual(status, 308, request)

    async def test_reload_and_stop(self) -> None:
        """
        A reload switches the redirect's Site (a new webroot, port) on the same socket;
        one that moves the redirect listener is refused; a stop closes idle connections
        and both listeners.
        """
        service, tls_port, port = self.serve('{listen: "127.0.0.1:0"}')
        request = get_request(f"/.well-known/acme-challenge/{TOKEN}", "a.example")
        self.assertEqual((await self.exchange(port, request))[0], 308)
        root = os.path.join(self.directory, "config")
        write_tree(
            root,
            {
                "a.yaml": gateway(
                    self.cert,
                    self.key,
                    f'{{listen: "127.0.0.1:{port}", acmeWebroot: "{self.webroot}", '
                    "httpsPort: 443}",
                )
            },
        )
        # Another address (127.0.0.1:0 written as the bound port) needs a restart.
        self.assertFalse(await service.reload())
        write_tree(
            root,
            {
                "a.yaml": gateway(
                    self.cert,
                    self.key,
                    f'{{listen: "127.0.0.1:0", acmeWebroot: "{self.webroot}", httpsPort: 443}}',
                )
            },
        )
        self.assertTrue(await service.reload())
        self.assertEqual(port_of(service.redirect_listener), port)
        self.assertEqual((await self.exchange(port, request))[0], 200)
        _, fields, _ = await self.exchange(port, get_request("/x", "a.example"))
        self.assertEqual(fields[b"location"], b"https://a.example/x")
        # Across the reload the old Site drained: its idle keep-alive connections are
        # closed; the stop drains the new one's likewise.
        await service.retired()
        idle = await connect(port)
        idle.send(b"GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n")
        await idle.until(b"308")
        await service.stopService()
        await idle.closed
        for closed in (port, tls_port):
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", closed), timeout=5).close()
