"""
No request lost under load (issue 35, point 1), with real gateway processes:

  - across 50 SIGHUPs, valid and invalid configurations mixed, while one client opens a
    new connection for every request and another sends every request on one keep-alive
    connection, both at a steady rate: no failed request, no connection error, no 5xx;
  - across restarts of a socket-activated gateway (the test holds the listening socket
    as systemd's C{edgegw.socket} does, and starts the next process on it as the unit
    does: after the old one has exited, and also while it still drains): the requests
    queue in the socket, none is refused or lost. An idle keep-alive connection is
    closed by the stopping process: the keep-alive client then sends its request again
    on a new connection, as RFC 9112 section 9.3.1 lets a client do (and browsers do).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.backends import SiteBackend
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import DAEMON_ENV, sleep, spawn_socket_activated, spawn_twistd
from tests.support.processes import kill, listening_socket
from tests.support.steady_load import LoadResult, SteadyClient

reactor: Any = _reactor

RELOADS = 50


def route(name: str, match: str, handler: str) -> str:
    """
    A public Route document.
    """
    spec = f"{{access: {{auth: public}}, match: '{match}', handler: {handler}}}"
    return f"---\nkind: Route\nmetadata: {{name: {name}}}\nspec: {spec}\n"


class NoRequestLostTests(TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.backend = SiteBackend(lambda request: b"from the backend").start()
        self.addCleanup(lambda: Deferred.fromCoroutine(self.backend.stop()))
        self.root = os.path.abspath(self.mktemp())
        proxy = f"{{type: reverse-proxy, upstream: 'http://127.0.0.1:{self.backend.port}'}}"
        self.routes = route("api", "/api/", proxy) + route("health", "/healthz", "{type: health}")

    def configure(self, version: int, gateway: str = GATEWAY) -> None:
        """
        Write configuration C{version} (its own extra route), without a broken file.
        """
        write_tree(
            self.root,
            {
                "00-gateway.yaml": gateway,
                "10-routes.yaml": self.routes
                + route(f"v{version}", f"/v{version}", "{type: health}"),
            },
        )
        broken = os.path.join(self.root, "20-broken.yaml")
        if os.path.exists(broken):
            os.remove(broken)

    def break_it(self) -> None:
        """
        Add a file the configuration refuses (a reload keeps the running one).
        """
        with open(os.path.join(self.root, "20-broken.yaml"), "w") as stream:
            stream.write(route("broken", "/broken", "{type: no-such-handler}"))

    def assertNothingLost(self, result: LoadResult, what: str) -> None:
        self.assertEqual(result.failures, [], what)
        self.assertEqual(result.server_errors, 0, f"{what}: {dict(result.statuses)}")
        self.assertEqual(set(result.statuses), {200}, f"{what}: {dict(result.statuses)}")
        # The load ran through the reloads (a count, not a timing: well under the rate).
        self.assertGreater(result.requests, 100, what)

    async def test_fifty_reloads_under_load(self) -> None:
        self.configure(0)
        protocol, process = spawn_twistd(self.root, env=DAEMON_ENV)
        self.addCleanup(lambda: protocol.ended)
        self.addCleanup(kill, process)
        port = await protocol.listening
        clients = [
            SteadyClient(port, "/api/x", "close", rate=40).start(),
            SteadyClient(port, "/api/y", "keep-alive", rate=40).start(),
            SteadyClient(port, "/healthz", "keep-alive", rate=40).start(),
        ]
        try:
            await sleep(0.5)
            for number in range(1, RELOADS + 1):
                if number % 3 == 0:
                    self.break_it()
                else:
                    self.configure(number)
                os.kill(process.pid, signal.SIGHUP)
                await sleep(0.25)
            self.configure(RELOADS + 1)
            await sleep(1.0)
        finally:
            results = await deferToThread(lambda: [client.stop() for client in clients])
        output = protocol.output.decode(errors="replace")
        self.assertGreater(output.count("configuration reloaded from"), 10, output[-2000:])
        self.assertGreater(output.count("reload refused"), 5, output[-2000:])
        for client, result in zip(clients, results, strict=True):
            self.assertNothingLost(result, f"{client.mode} {client.path}")

    async def test_restarts_with_socket_activation(self) -> None:
        """
        The listening socket stays in the test (as in systemd) while gateway processes
        come and go on it: three restarts the unit's way (the next starts once the last
        has exited) and one where the next starts while the last still drains.
        """
        gateway = GATEWAY.replace('"127.0.0.1:0"', '"systemd:domain=INET:index=0"')
        self.configure(0, gateway)
        listener = listening_socket()
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]

        async def start() -> Any:
            protocol, process = spawn_socket_activated(listener, self.root, "edgegw")
            self.addCleanup(lambda: protocol.ended)
            self.addCleanup(kill, process)
            await protocol.listening
            return protocol, process

        running = await start()
        clients = [
            SteadyClient(port, "/api/x", "close", rate=40).start(),
            SteadyClient(port, "/api/y", "keep-alive", rate=40, retry=True).start(),
        ]
        try:
            await sleep(0.5)
            for overlap in (False, False, False, True):
                protocol, process = running
                process.signalProcess("TERM")
                if overlap:
                    running = await start()
                    await protocol.ended
                else:
                    await protocol.ended
                    running = await start()
                await sleep(0.5)
        finally:
            results = await deferToThread(lambda: [client.stop() for client in clients])
        for client, result in zip(clients, results, strict=True):
            self.assertNothingLost(result, f"{client.mode} {client.path}")
