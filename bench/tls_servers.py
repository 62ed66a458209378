"""
The servers of the HTTPS benchmarks (C{tls} and C{pageload}): a certificate made on the
spot, and edgegw, nginx and Caddy terminating TLS in front of a backend or serving a
directory, each one serving process.

  - edgegw: C{Gateway.spec.tls} (ALPN C{h2}, C{http/1.1}), or a Twisted C{ssl:} endpoint
    string as C{listen} (HTTP/1.1 only: no ALPN), or plain TCP; one process.
  - nginx: C{listen ... ssl http2} (C{http2 on;} from nginx 1.25.1), C{worker_processes
    1}; the C{HTTP/1.1 only} variant leaves HTTP/2 out.
  - Caddy (Debian's): a Caddyfile with the certificate (C{tls CERT KEY}), protocols
    C{h1 h2} (no HTTP/3: nothing here carries UDP), run with C{GOMAXPROCS=1}, its admin
    endpoint off and its storage in the run's directory.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import re
import socket
import ssl
import subprocess
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench import gateway, nginx
from bench.processes import Process, StartupError, children, started
from bench.targets import Target, start_edgegw
from tests.support.certificates import make_certificate


@attrs.frozen
class Certificate:
    """
    A self-signed certificate and its key, as files.

    @ivar hostname: The name it is for (its subject alternative name).
    @ivar key: The PEM private key's path.
    @ivar cert: The PEM certificate's path.
    @ivar spki: The base64 SHA-256 of its public key (C{SubjectPublicKeyInfo}), what
        Chromium's C{--ignore-certificate-errors-spki-list} takes.
    """

    hostname: str
    key: Path
    cert: Path
    spki: str


def certificate(directory: Path, hostname: str) -> Certificate:
    """
    Make a self-signed certificate for C{hostname} in C{directory} (with the tests'
    L{make_certificate}).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    key, cert, pem = make_certificate(str(directory), hostname)
    public = x509.load_pem_x509_certificate(pem).public_key()
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    spki = base64.b64encode(hashlib.sha256(der).digest()).decode()
    return Certificate(hostname, Path(key), Path(cert), spki)


# nginx


def nginx_version(binary: str) -> tuple[int, ...]:
    """nginx's version (C{nginx -v} prints C{nginx version: nginx/1.22.1} on stderr)."""
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    found = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    return tuple(int(part) for part in found.groups()) if found else (0, 0, 0)


def _nginx_listen(binary: str, port: int, http2: bool) -> str:
    """
    The C{listen} line(s) for TLS on 127.0.0.1:C{port}: C{ssl http2} before nginx
    1.25.1, C{ssl} and C{http2 on;} from it (the parameter is deprecated there).
    """
    if not http2:
        return f"listen 127.0.0.1:{port} ssl backlog=4096;"
    if nginx_version(binary) >= (1, 25, 1):
        return f"listen 127.0.0.1:{port} ssl backlog=4096;\n        http2 on;"
    return f"listen 127.0.0.1:{port} ssl http2 backlog=4096;"


_NGINX_TLS = """\
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
"""

_NGINX_PROXY = """\
    upstream backend {{
        server 127.0.0.1:{backend_port};
        keepalive {keepalive};
        keepalive_requests 1000000000;
    }}
    server {{
        {listen}
        listen 127.0.0.1:{plain_port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""

_NGINX_STATIC = """\
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
{gzip}    server {{
        {listen}
        root {root};
        location / {{
            try_files $uri /index.html;
        }}
    }}
"""

_NGINX_GZIP = """\
    gzip on;
    gzip_vary on;
    gzip_comp_level 5;
    gzip_types text/css text/plain application/javascript text/javascript application/json
        image/svg+xml application/xml application/manifest+json;
"""

GZIP_TYPES = "text/css, text/plain, JavaScript, JSON, SVG, XML, web manifests"
"""What the compressing variants of nginx and Caddy compress (nginx's C{gzip_types};
Caddy's defaults)."""


def nginx_tls_proxy(
    stack: ExitStack,
    binary: str,
    prefix: Path,
    cert: Certificate,
    tls_port: int,
    plain_port: int,
    backend_port: int,
    keepalive: int = 64,
) -> Process:
    """
    Start nginx (one worker) proxying to the backend: TLS with HTTP/2 on C{tls_port},
    plain HTTP/1.1 on C{plain_port}; stopped when C{stack} closes.

    @raise StartupError: If it does not listen.
    """
    prefix.mkdir(parents=True)
    body = _NGINX_TLS.format(cert=cert.cert, key=cert.key) + _NGINX_PROXY.format(
        listen=_nginx_listen(binary, tls_port, True),
        plain_port=plain_port,
        backend_port=backend_port,
        keepalive=keepalive,
    )
    process = stack.enter_context(
        started(nginx.start(binary, "nginx", prefix, nginx.write(prefix, body)))
    )
    process.wait_for_port(tls_port)
    return process


def nginx_static(
    stack: ExitStack,
    binary: str,
    prefix: Path,
    cert: Certificate,
    port: int,
    root: Path,
    http2: bool = True,
    gzip: bool = False,
) -> Process:
    """
    Start nginx (one worker) serving C{root} over TLS on C{port}, every path that is not
    a file answered with C{index.html} (a single-page app's fallback); with HTTP/2
    unless not C{http2}, compressing with gzip when C{gzip}; stopped when C{stack}
    closes.

    @raise StartupError: If it does not listen.
    """
    prefix.mkdir(parents=True)
    body = _NGINX_TLS.format(cert=cert.cert, key=cert.key) + _NGINX_STATIC.format(
        listen=_nginx_listen(binary, port, http2),
        root=root,
        gzip=_NGINX_GZIP if gzip else "",
    )
    process = stack.enter_context(
        started(nginx.start(binary, f"nginx {prefix.name}", prefix, nginx.write(prefix, body)))
    )
    process.wait_for_port(port)
    return process


def nginx_worker(process: Process) -> list[int]:
    """The worker process of an nginx master started with C{worker_processes 1}."""
    workers = children(process.pid)
    if not workers:
        raise StartupError(f"{process.name} has no worker process")
    return workers


# Caddy

_CADDY_GLOBAL = """\
{{
	admin off
	auto_https off
	skip_install_trust
	storage file_system {storage}
	servers {{
		protocols h1 h2
	}}
}}
"""

_CADDY_PROXY = """\
https://:{tls_port} {{
	bind 127.0.0.1
	tls {cert} {key}
	reverse_proxy 127.0.0.1:{backend_port} {{
		transport http {{
			keepalive_idle_conns_per_host {keepalive}
		}}
	}}
}}
http://:{plain_port} {{
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:{backend_port} {{
		transport http {{
			keepalive_idle_conns_per_host {keepalive}
		}}
	}}
}}
"""

_CADDY_STATIC = """\
https://:{port} {{
	bind 127.0.0.1
	tls {cert} {key}
	root * {root}
{encode}	try_files {{path}} /index.html
	file_server
}}
"""


def start_caddy(stack: ExitStack, binary: str, directory: Path, name: str, body: str) -> Process:
    """
    Start Caddy with C{body} (site blocks) after the global options every benchmark's
    Caddy shares (admin endpoint off, no automatic HTTPS, storage in C{directory}),
    C{GOMAXPROCS=1}, its configuration and log in C{directory}; stopped when C{stack}
    closes. The caller waits for its ports.
    """
    directory.mkdir(parents=True)
    config = directory / "Caddyfile"
    config.write_text(_CADDY_GLOBAL.format(storage=directory / "data") + body)
    env = {
        **os.environ,
        # One OS thread running Go code at a time: one serving process's worth of CPU,
        # as fair to one edgegw process and one nginx worker as Go allows.
        "GOMAXPROCS": "1",
        "HOME": str(directory),
        "XDG_DATA_HOME": str(directory / "data"),
        "XDG_CONFIG_HOME": str(directory / "config"),
    }
    argv = [binary, "run", "--config", str(config), "--adapter", "caddyfile"]
    return stack.enter_context(started(Process(name, argv, directory / "caddy.log", env)))


def caddy_tls_proxy(
    stack: ExitStack,
    binary: str,
    directory: Path,
    cert: Certificate,
    tls_port: int,
    plain_port: int,
    backend_port: int,
    keepalive: int = 64,
) -> Process:
    """
    Start Caddy (C{GOMAXPROCS=1}) proxying to the backend: TLS with HTTP/2 on
    C{tls_port}, plain HTTP/1.1 on C{plain_port}, up to C{keepalive} idle upstream
    connections kept; stopped when C{stack} closes.

    @raise StartupError: If it does not listen.
    """
    body = _CADDY_PROXY.format(
        tls_port=tls_port,
        plain_port=plain_port,
        backend_port=backend_port,
        cert=cert.cert,
        key=cert.key,
        keepalive=keepalive,
    )
    process = start_caddy(stack, binary, directory, "caddy", body)
    process.wait_for_port(tls_port)
    process.wait_for_port(plain_port)
    return process


def caddy_static(
    stack: ExitStack,
    binary: str,
    directory: Path,
    cert: Certificate,
    port: int,
    root: Path,
    encode: bool = False,
) -> Process:
    """
    Start Caddy (C{GOMAXPROCS=1}) serving C{root} over TLS (HTTP/2) on C{port} with a
    single-page app's fallback (C{try_files {path} /index.html}), compressing with
    C{encode zstd gzip} (what newer Caddy's bare C{encode} means; this one, 2.6, needs
    the codings named) when C{encode}; stopped when C{stack} closes.

    @raise StartupError: If it does not listen.
    """
    body = _CADDY_STATIC.format(
        port=port,
        cert=cert.cert,
        key=cert.key,
        root=root,
        encode="\tencode zstd gzip\n" if encode else "",
    )
    process = start_caddy(stack, binary, directory, f"caddy {directory.name}", body)
    process.wait_for_port(port)
    return process


# edgegw


def edgegw_tls_fields(cert: Certificate, http2: bool = True) -> dict[str, Any]:
    """The C{Gateway.spec.tls} block for C{cert} (minimum TLS 1.2, HTTP/2 when C{http2})."""
    return {
        "tls": {
            "certificates": [{"certFile": str(cert.cert), "keyFile": str(cert.key)}],
            "minVersion": "1.2",
            "http2": http2,
        }
    }


def ssl_endpoint(port: int, cert: Certificate) -> str:
    """
    A Twisted C{ssl:} endpoint string on 127.0.0.1:C{port} with C{cert}: what C{listen}
    takes for HTTPS without C{spec.tls} (HTTP/1.1 only: no ALPN).
    """
    return f"ssl:{port}:interface=127.0.0.1:privateKey={cert.key}:certKey={cert.cert}"


def edgegw(
    stack: ExitStack,
    tmp: Path,
    label: str,
    target: Target,
    route: gateway.RouteConfig,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """
    Start edgegw (one process) with C{route} on C{target.port}, C{fields} added to its
    Gateway's spec (C{tls}, or C{listen} as an endpoint string); C{target.unavailable}
    says why when C{edgegw check} refuses the configuration or edgegw does not start.
    """
    resources = [gateway.gateway_fields(fields)] if fields else []
    start_edgegw(stack, tmp, label, target, [route], resources)


# Checks


def client_context(alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    """A client TLS context that trusts anything (the certificates are made here)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(list(alpn))
    return context


def negotiated(port: int, server_name: str | None = None) -> str:
    """
    The protocol the server on 127.0.0.1:C{port} picks when a client offers C{h2} and
    C{http/1.1} with ALPN: C{h2}, C{http/1.1}, or C{none} when it takes no part in ALPN
    (HTTP/1.1 then).

    @raise OSError: When the handshake fails.
    """
    context = client_context(("h2", "http/1.1"))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        return tls.selected_alpn_protocol() or "none"


def expect_https(port: int, path: str, status: int, body: bytes | None) -> str | None:
    """
    C{GET path} over HTTPS (HTTP/1.1) from 127.0.0.1:C{port} once.

    @return: L{None} if it answered C{status} (with exactly C{body}, unless L{None}),
        else what was wrong.
    """
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=10, context=client_context()
    )
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        got = response.read()
    except (OSError, http.client.HTTPException) as e:
        return f"GET {path} over HTTPS failed: {e}"
    finally:
        with contextlib.suppress(OSError):
            connection.close()
    if response.status != status or (body is not None and got != body):
        return f"GET {path} over HTTPS answered {response.status} with {len(got)} bytes"
    return None
