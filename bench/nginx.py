"""
The two nginx instances: the static backend and the reverse proxy in front of it.

Each runs from its own prefix directory (C{nginx -p DIR -c DIR/nginx.conf -e
DIR/error.log -g 'daemon off;'}) with its pid file, logs and temp paths inside it, and
with C{worker_processes 1} so that each is one serving process, like one edgegw process.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from bench.processes import Process, started

_COMMON = """\
worker_processes 1;
{user}pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/client_body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    # Keep wrk's connections open for the whole run (the default closes every 1000).
    keepalive_timeout 65s;
    keepalive_requests 1000000000;
{body}
}}
"""

_BACKEND = """\
    types {{
        application/json json;
        application/octet-stream bin;
    }}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {www};
        location / {{
        }}
    }}
"""

_PROXY = """\
    upstream backend {{
        server 127.0.0.1:{backend_port};
        keepalive {keepalive};
        keepalive_requests 1000000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""


def write(prefix: Path, body: str) -> Path:
    """
    Write C{prefix/nginx.conf}: one worker, no access log, temp paths and pid file under
    C{prefix}, keep-alive for a whole run, and C{body} inside its C{http} block.
    """
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    # As root, nginx would otherwise switch its worker to "nobody", which cannot read the
    # private temp directory this benchmark runs in.
    user = "user root;\n" if os.geteuid() == 0 else ""
    config = prefix / "nginx.conf"
    config.write_text(_COMMON.format(user=user, prefix=prefix, body=body))
    return config


def backend_config(prefix: Path, port: int, www: Path) -> Path:
    """
    Write the static backend's configuration: C{www} served on 127.0.0.1:C{port} with
    keepalive and sendfile.
    """
    return write(prefix, _BACKEND.format(port=port, www=www))


def proxy_config(prefix: Path, port: int, backend_port: int, keepalive: int) -> Path:
    """
    Write the reverse proxy's configuration: 127.0.0.1:C{port} forwarding everything to
    the backend over HTTP/1.1 with C{keepalive} idle upstream connections cached.
    """
    return write(prefix, _PROXY.format(port=port, backend_port=backend_port, keepalive=keepalive))


def start(nginx: str, name: str, prefix: Path, config: Path) -> Process:
    """
    Start nginx in the foreground from C{prefix} (its master and one worker).
    """
    argv = [
        nginx,
        "-p",
        str(prefix),
        "-c",
        str(config),
        "-e",
        str(prefix / "error.log"),
        "-g",
        "daemon off;",
    ]
    return Process(name, argv, prefix / "stdout.log")


def start_backend(stack: ExitStack, nginx: str, tmp: Path, www: Path, port: int) -> Process:
    """
    Start the static backend serving C{www} on 127.0.0.1:C{port} (its prefix
    C{tmp/nginx-backend}; stopped when C{stack} closes) and wait until it listens.

    @raise StartupError: If it does not start.
    """
    prefix = tmp / "nginx-backend"
    prefix.mkdir()
    config = backend_config(prefix, port, www)
    process = stack.enter_context(started(start(nginx, "nginx backend", prefix, config)))
    process.wait_for_port(port)
    return process
