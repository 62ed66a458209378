"""
Worker processes (systemd/edgegw@.service): several gateways on one machine sharing one
listening socket that systemd passes each of them, as systemd does (LISTEN_FDS,
LISTEN_PID, the socket at descriptor 3), with the packaged configuration's listen value.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from edgegw.server.listen import SharedSocketEndpoint
from tests.support.configs import write_tree
from tests.support.daemons import JOURNAL_LOGGER, TwistdOutput, sleep, spawn_socket_activated
from tests.support.processes import REPO_ROOT, http_get, kill, listening_socket

reactor: Any = _reactor
PACKAGED = str(REPO_ROOT / "etc" / "edgegw-package")


def worker(test: TestCase, listener: socket.socket, config: str) -> TwistdOutput:
    """
    One gateway process given C{listener} as systemd gives it a socket.
    """
    protocol, process = spawn_socket_activated(listener, config, "edgegw", JOURNAL_LOGGER)
    test.addCleanup(lambda: protocol.ended)
    test.addCleanup(kill, process)
    return protocol


class WorkerTests(TestCase):
    """
    Two workers, one socket.
    """

    timeout = 60

    def packaged_setup(self) -> tuple[socket.socket, int, str]:
        """
        A shared listening socket (closed when the test ends), its port, and a copy of
        the packaged configuration.
        """
        listener = listening_socket()
        self.addCleanup(listener.close)
        config = write_tree(
            self.mktemp(),
            {name: _read(os.path.join(PACKAGED, name)) for name in os.listdir(PACKAGED)},
        )
        return listener, listener.getsockname()[1], config

    async def test_two_workers_share_one_socket(self) -> None:
        listener, port, config = self.packaged_setup()
        workers = [worker(self, listener, config) for _ in range(2)]
        for each in workers:
            await each.listening
        answered = 0
        for _ in range(200):
            # A new connection each time: the kernel hands it to either process.
            response = await http_get(f"http://127.0.0.1:{port}/healthz")
            self.assertEqual(response.code, 200)
            await response.content()
            answered += 1
        self.assertEqual(answered, 200)
        # The access-log lines come in batches (every 100 ms): wait for all of them.
        for _ in range(100):
            served = [_served(each.output) for each in workers]
            if sum(served) == 200:
                break
            await sleep(0.05)
        # Both processes answered some of the requests, on the one socket.
        self.assertTrue(all(count > 0 for count in served), served)
        self.assertEqual(sum(served), 200)

    async def test_a_restart_refuses_no_connection(self) -> None:
        """
        The listening socket outlives the process (systemd's edgegw.socket holds it): a
        connection made while no process serves it waits in the backlog, and the next
        process answers it.
        """
        listener, port, config = self.packaged_setup()
        first = worker(self, listener, config)
        await first.listening
        assert first.transport is not None
        first.transport.signalProcess("TERM")
        await first.ended
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.addCleanup(client.close)
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        second = worker(self, listener, config)
        await second.listening
        self.assertTrue(client.recv(65536).startswith(b"HTTP/1.1 200 "))

    async def test_one_connection_per_wake_up(self) -> None:
        """
        A port on an inherited socket accepts one pending connection each time it is
        told the socket is readable, however many are pending and however Twisted
        scales its accept batch (it takes up to 100 at once, and more as long as there
        are).
        """
        listener = listening_socket()
        self.addCleanup(listener.close)
        built: list[Protocol] = []

        class Counting(Factory):
            def buildProtocol(self, addr: Any) -> Protocol:
                built.append(Protocol())
                return built[-1]

        endpoint = SharedSocketEndpoint(reactor, os.dup(listener.fileno()), socket.AF_INET)
        port: Any = await endpoint.listen(Counting())
        self.addCleanup(port.stopListening)
        port.stopReading()  # the test says when it is readable
        clients = [socket.create_connection(listener.getsockname()) for _ in range(5)]
        for client in clients:
            self.addCleanup(client.close)
        port.numberAccepts = 100
        for count in range(1, 4):
            port.doRead()
            self.assertEqual(len(built), count)
        for protocol in built:
            protocol.transport.abortConnection()  # type: ignore[union-attr]

    async def test_a_burst_of_connections_is_spread(self) -> None:
        """
        Connections that are all pending when the workers wake (a load generator's, or
        a restart's backlog) go to both, not all to the one that woke first.
        """
        listener, port, config = self.packaged_setup()
        workers = [worker(self, listener, config) for _ in range(2)]
        for each in workers:
            await each.listening
        # Both asleep while the kernel completes 80 handshakes into the backlog, each
        # with its request already sent: a worker that takes one connection per
        # wake-up answers it before it takes the next, and the other worker takes its
        # share meanwhile (taking all the pending ones at once, the first awake would
        # leave the other none, however the two are scheduled).
        pids = [each.transport.pid for each in workers if each.transport is not None]
        # On one core, as on a busy machine: whichever worker runs first takes them
        # all unless it takes one per wake-up (without that, 80 and 0 in most runs; a
        # time slice ending mid-burst can still split it, so the accept itself is
        # checked by test_one_connection_per_wake_up).
        core = min(os.sched_getaffinity(0))
        for pid in pids:
            os.sched_setaffinity(pid, {core})
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        clients = []
        try:
            for _ in range(80):
                client = socket.create_connection(("127.0.0.1", port))
                self.addCleanup(client.close)
                clients.append(client)
                client.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        for client in clients:
            client.settimeout(10)
            self.assertTrue(client.recv(65536).startswith(b"HTTP/1.1 200 "))
        for _ in range(100):
            served = [_served(each.output) for each in workers]
            if sum(served) == 80:
                break
            await sleep(0.05)
        self.assertEqual(sum(served), 80)
        # Scheduling decides how even the shares are (two workers may share a core
        # with the tests around them): what matters is that neither is left out.
        self.assertGreaterEqual(min(served), 16, served)


def _served(output: bytes) -> int:
    """
    How many 200s a worker's JSON log shows.
    """
    records = [json.loads(line) for line in output.splitlines() if line.startswith(b"{")]
    return sum(1 for record in records if record.get("access", {}).get("status") == 200)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as stream:
        return stream.read()
