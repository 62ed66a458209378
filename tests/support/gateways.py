"""
A whole gateway on a real socket, for tests that speak raw HTTP to it: built from a
configuration written to disk, with a reverse-proxy route to a test backend and a health
route, its connection timers on a test clock.
"""

from __future__ import annotations

import textwrap
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from edgegw.assembly.assemble import Gateway, build_gateway
from edgegw.config.parse import load_config
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import RawConnection, RawRequest
from tests.support.configs import GATEWAY, write_tree
from tests.support.processes import connections_closed, listen_local, port_of

reactor: Any = _reactor

OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def answer_ok(request: RawRequest, connection: RawConnection) -> None:
    """
    A L{RawBackend<tests.support.backends.RawBackend>} responder (with C{on_head}) that
    answers each request once, on its head, with C{200 ok}.
    """
    if request.index in connection.answered:
        return
    connection.answered.add(request.index)
    connection.write(OK_RESPONSE)


def start_gateway(
    test: TestCase,
    upstream: str,
    gateway_spec: str = "",
    proxy_spec: str = "",
    clock: Any = None,
    client: UpstreamClient | None = None,
    routes: str = "",
) -> tuple[Gateway, int]:
    """
    Build and listen (on 127.0.0.1) a gateway with C{GET /healthz} (health) and C{/}
    (reverse-proxy to C{upstream}).

    @param gateway_spec: YAML lines added to the Gateway's spec (not indented).
    @param proxy_spec: YAML lines added to the proxy handler (not indented).
    @param clock: The gateway's reactor for everything but its upstream client
        (connection timers, route timeouts); a new L{Clock} by default.
    @param client: The upstream client; by default one on the real reactor, bounded as
        the configuration says (as the gateway builds its own).
    @param routes: More YAML documents (each starting with C{---}).
    @return: The gateway and its port.
    """
    gateway = GATEWAY + textwrap.indent(textwrap.dedent(gateway_spec), "  ")
    handler = textwrap.indent(textwrap.dedent(proxy_spec), "    ")
    root = write_tree(
        test.mktemp(),
        {
            "a.yaml": gateway
            + "---\nkind: Route\nmetadata: {name: health}\n"
            + "spec: {match: GET /healthz, handler: {type: health}}\n"
            + "---\nkind: Route\nmetadata: {name: p}\nspec:\n"
            + '  match: "/"\n  handler:\n    type: reverse-proxy\n'
            + f'    upstream: "{upstream}"\n'
            + handler
            + routes
        },
    )
    config = load_config(root, {})
    limits = config.gateway.limits
    client = client or UpstreamClient(
        reactor,
        max_connections_per_upstream=limits.max_connections_per_upstream,
        queue_timeout=limits.upstream_queue_timeout,
    )
    built = build_gateway(config, clock or Clock(), client)
    listening = listen_local(built.site)
    test.addCleanup(connections_closed)
    test.addCleanup(listening.stopListening)
    test.addCleanup(built.upstream_client.close)
    return built, port_of(listening)


def serve_yaml(test: TestCase, text: str) -> int:
    """
    Write C{text} (whole YAML documents) as a configuration, build the gateway with an
    upstream client on the real reactor, listen on 127.0.0.1, and return the port; all
    of it is undone when the test ends.
    """
    root = write_tree(test.mktemp(), {"a.yaml": text})
    client = UpstreamClient(reactor)
    built = build_gateway(load_config(root, {}), reactor, client)
    listening = listen_local(built.site)
    test.addCleanup(listening.stopListening)
    test.addCleanup(client.close)
    return port_of(listening)
