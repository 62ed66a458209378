"""
Tests for L{edgegw.reactor}: I/O events dispatched without the legacy log context, and
a failing protocol handled as Twisted's own reactors handle it.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.python import context, log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from edgegw.reactor import _reactor_class


class _Reader(FileDescriptor):
    def __init__(self, sock: socket.socket, reactor: Any, fail: bool) -> None:
        super().__init__(reactor)
        self.sock = sock
        self.fail = fail
        self.read: list[bytes] = []
        self.systems: list[str] = []
        self.lost: list[Failure] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        self.systems.append(context.get(log.ILogContext)["system"])
        self.read.append(self.sock.recv(100))
        if self.fail:
            raise RuntimeError("protocol bug")

    def connectionLost(self, reason: Failure) -> None:
        self.lost.append(reason)


class EdgeReactorTests(SynchronousTestCase):
    def reactor(self) -> Any:
        reactor = _reactor_class()()

        def close() -> None:
            for selectable in reactor.removeAll():
                selectable.sock.close()
            reactor.waker.connectionLost(None)
            reactor._poller.close()

        self.addCleanup(close)
        return reactor

    def pair(self) -> tuple[socket.socket, socket.socket]:
        """
        A connected pair: the first is closed with the reactor, the second at the end.
        """
        a, b = socket.socketpair()
        self.addCleanup(b.close)
        return a, b

    def test_dispatches_without_the_log_context(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        reader = _Reader(ours, reactor, fail=False)
        reactor.addReader(reader)
        theirs.send(b"hello")
        reactor.doPoll(0)
        self.assertEqual(reader.read, [b"hello"])
        # No per-event context: what a legacy log.msg would say is the default.
        self.assertEqual(reader.systems, ["-"])

    def test_a_failing_protocol_is_logged_and_dropped(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        failing = _Reader(ours, reactor, fail=True)
        other_ours, other_theirs = self.pair()
        fine = _Reader(other_ours, reactor, fail=False)
        reactor.addReader(failing)
        reactor.addReader(fine)
        theirs.send(b"boom")
        other_theirs.send(b"ok")
        reactor.doPoll(0)
        # Dropped with the error, and the other event of the same poll still handled.
        self.assertEqual(len(failing.lost), 1)
        self.assertEqual(fine.read, [b"ok"])
        self.assertNotIn(failing, reactor.getReaders())
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        ours.close()  # no longer the reactor's
