"""
Tests for L{edgegw.reactor}: I/O events dispatched without the legacy log context, and
a failing protocol handled as Twisted's own reactors handle it.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.internet.interfaces import IPullProducer, IPushProducer
from twisted.python import context, log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

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


class _ReactorTestCase(SynchronousTestCase):
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

    def closing_writer(self) -> tuple[Any, socket.socket, socket.socket, _Writer]:
        """
        A writer that wrote its last words and asked to close.
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.startReading()
        writer.write(b"last words")
        writer.loseConnection()
        return reactor, ours, theirs, writer


class EdgeReactorTests(_ReactorTestCase):
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


class _Writer(_Reader):
    """
    A socket's writing side, as Twisted's TCP transports write (FileDescriptor's
    buffering over a non-blocking socket).
    """

    def __init__(self, sock: socket.socket, reactor: Any) -> None:
        super().__init__(sock, reactor, fail=False)
        sock.setblocking(False)
        self.connected = 1

    def writeSomeData(self, data: bytes) -> int:
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as e:
            return e  # type: ignore[return-value]  # as Twisted's TCP transport does


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    received = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return received
        if not chunk:
            return received
        received += chunk


def _pump(reactor: Any, theirs: socket.socket, received: bytes, size: int) -> bytes:
    """
    Poll and read until C{size} bytes have arrived (or give up after many polls).
    """
    for _ in range(10_000):
        received += _drain(theirs)
        if len(received) == size:
            break
        reactor.doPoll(0)
    return received


class WriteFlushTests(_ReactorTestCase):
    def test_writes_of_an_iteration_go_out_at_its_end(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.write(b"head ")
        writer.write(b"body")
        # Not registered for EPOLLOUT: due at the end of the iteration.
        self.assertEqual(reactor._writes, set())
        reactor.doPoll(0)
        self.assertEqual(_drain(theirs), b"head body")
        self.assertEqual(reactor.getWriters(), [])
        self.assertEqual(reactor._writes, set())

    def test_what_the_socket_cannot_take_waits_for_epollout(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer = _Writer(ours, reactor)
        payload = bytes(range(256)) * 4096  # 1 MiB: more than the socket buffers
        writer.write(payload)
        reactor.doPoll(0)
        # Registered, as Twisted's reactor registers every writer.
        self.assertEqual(reactor.getWriters(), [writer])
        self.assertEqual(reactor._writes, {ours.fileno()})
        self.assertEqual(_pump(reactor, theirs, b"", len(payload)), payload)
        reactor.doPoll(0)
        self.assertEqual(reactor.getWriters(), [])

    def test_lose_connection_after_a_write(self) -> None:
        reactor, ours, theirs, writer = self.closing_writer()
        reactor.doPoll(0)
        self.assertEqual(_drain(theirs), b"last words")
        self.assertEqual(len(writer.lost), 1)
        ours.close()

    def test_a_failed_write_drops_the_connection(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.startReading()
        theirs.close()
        writer.write(b"x" * 100_000)
        for _ in range(5):
            reactor.doPoll(0)
        self.assertEqual(len(writer.lost), 1)
        self.assertNotIn(writer, reactor.getWriters())
        ours.close()

    def test_a_failing_connection_lost_does_not_strand_the_other_writers(self) -> None:
        """
        A protocol whose connectionLost raises while its last write is flushed is
        logged; the other writes of the iteration still go out.
        """

        class BadLost(_Writer):
            def connectionLost(self, reason: Failure) -> None:
                super().connectionLost(reason)
                raise RuntimeError("bug in connectionLost")

        reactor = self.reactor()
        bad_ours, bad_theirs = self.pair()
        good_ours, good_theirs = self.pair()
        bad = BadLost(bad_ours, reactor)
        good = _Writer(good_ours, reactor)
        bad.write(b"bye")
        bad.loseConnection()
        good.write(b"hello")
        reactor.doPoll(0)
        self.assertEqual(_drain(good_theirs), b"hello")
        self.assertEqual(_drain(bad_theirs), b"bye")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        bad_ours.close()

    def test_a_producer_resumed_by_the_flush_is_not_left_waiting(self) -> None:
        """
        A flush before polling that resumes a producer which goes on through a timed
        call (Twisted's Cooperator: static files, TLS) makes that poll return in time
        for it, whatever timeout the main loop had computed.
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)

        @implementer(IPullProducer)
        class Producer:
            def resumeProducing(self) -> None:
                reactor.callLater(0, lambda: None)

            def stopProducing(self) -> None:
                pass

        writer.registerProducer(Producer(), False)
        writer.write(b"chunk")
        asked: list[float] = []
        poller = reactor._poller

        class Recording:
            def poll(self, timeout: float, *args: Any) -> Any:
                asked.append(timeout)
                return poller.poll(0, *args)

            def __getattr__(self, name: str) -> Any:
                return getattr(poller, name)

        self.patch(reactor, "_poller", Recording())
        reactor.doPoll(30.0)
        self.assertEqual(_drain(theirs), b"chunk")
        self.assertEqual(asked, [0])


class FlushWriterTests(_ReactorTestCase):
    """
    L{EdgeReactor.flushWriter}: one writer's bytes out at once, the others at the end
    of the iteration as before.
    """

    def reactor(self) -> Any:
        reactor = super().reactor()
        # As while an event that came alone from its poll is handled.
        reactor._alone = True
        return reactor

    def test_at_once_only_for_an_event_alone(self) -> None:
        """
        Handling the one event of a poll, a flush happens at once; with other events in
        the same poll, the writes wait for the end of the iteration.
        """
        reactor = super().reactor()
        out_ours, out_theirs = self.pair()
        writer = _Writer(out_ours, reactor)
        seen: list[bytes] = []

        class Replying(_Reader):
            def doRead(self) -> None:
                self.read.append(self.sock.recv(100))
                writer.write(b"reply")
                reactor.flushWriter(writer)
                seen.append(_drain(out_theirs))

        first_ours, first_theirs = self.pair()
        second_ours, second_theirs = self.pair()
        first = Replying(first_ours, reactor, fail=False)
        second = Replying(second_ours, reactor, fail=False)
        reactor.addReader(first)
        reactor.addReader(second)
        first_theirs.send(b"a")
        reactor.doPoll(0)
        self.assertEqual(seen, [b"reply"])
        first_theirs.send(b"b")
        second_theirs.send(b"c")
        reactor.doPoll(0)
        # Both events in one poll: nothing out while they are handled, all at the end.
        self.assertEqual(seen, [b"reply", b"", b""])
        self.assertEqual(_drain(out_theirs), b"replyreply")
        # Outside any event (a timed call), the end of the iteration too.
        writer.write(b"timed")
        reactor.flushWriter(writer)
        self.assertEqual(_drain(out_theirs), b"")
        reactor.doPoll(0)
        self.assertEqual(_drain(out_theirs), b"timed")

    def test_one_writer_now_never_ahead_of_an_earlier_one(self) -> None:
        """
        One writer is written at once, the others at the end of the iteration; only
        the writer asked for first in the iteration, so that bytes written later to
        another socket (the upstream request of a pipelined request) never leave
        before those written earlier (the response ahead of it).
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        other_ours, other_theirs = self.pair()
        writer = _Writer(ours, reactor)
        other = _Writer(other_ours, reactor)
        writer.write(b"response")
        other.write(b"later")
        reactor.flushWriter(other)
        self.assertEqual((_drain(theirs), _drain(other_theirs)), (b"", b""))
        reactor.flushWriter(writer)
        self.assertEqual(_drain(theirs), b"response")
        self.assertEqual(_drain(other_theirs), b"")
        self.assertEqual(reactor.getWriters(), [other])
        reactor.doPoll(0)
        self.assertEqual(_drain(other_theirs), b"later")
        self.assertEqual(reactor.getWriters(), [])
        # Nothing due: nothing to do.
        reactor.flushWriter(writer)
        self.assertEqual(reactor.getWriters(), [])

    def test_what_the_socket_cannot_take_waits_for_epollout(self) -> None:
        reactor = self.reactor()
        ours, theirs = self.pair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer = _Writer(ours, reactor)
        payload = bytes(range(256)) * 4096
        writer.write(payload)
        reactor.flushWriter(writer)
        received = _drain(theirs)
        self.assertLess(len(received), len(payload))
        # Still due, then registered at the end of the iteration; meanwhile, its rest
        # holds back an eager write asked for after it.
        self.assertEqual(reactor.getWriters(), [writer])
        later_ours, later_theirs = self.pair()
        later = _Writer(later_ours, reactor)
        later.write(b"later")
        reactor.flushWriter(later)
        self.assertEqual(_drain(later_theirs), b"")
        reactor.doPoll(0)
        self.assertEqual(_drain(later_theirs), b"later")
        # Registered for EPOLLOUT, no longer due: not written at once either.
        self.assertNotIn(writer, reactor._due)
        tried: list[int] = []
        write = writer.doWrite

        def counted() -> Any:
            tried.append(1)
            return write()

        writer.doWrite = counted  # type: ignore[method-assign]
        reactor._alone = True
        reactor.flushWriter(writer)
        self.assertEqual(tried, [])
        del writer.doWrite
        self.assertEqual(_pump(reactor, theirs, received, len(payload)), payload)
        reactor.doPoll(0)
        self.assertEqual(reactor.getWriters(), [])
        later_ours.close()

    def test_a_close_after_the_write_waits_for_the_end_of_the_iteration(self) -> None:
        """
        A writer asked to close once its bytes are out is left to the end of the
        iteration, where that last write closes it: C{connectionLost} is never called
        from C{flushWriter}, which runs in the middle of a protocol's own code.
        """
        reactor, ours, theirs, writer = self.closing_writer()
        reactor.flushWriter(writer)
        self.assertEqual((_drain(theirs), writer.lost), (b"", []))
        reactor.doPoll(0)
        self.assertEqual(_drain(theirs), b"last words")
        self.assertEqual(len(writer.lost), 1)
        self.assertEqual(reactor.getWriters(), [])
        ours.close()

    def test_a_failed_write_is_handled_at_the_end_of_the_iteration(self) -> None:
        """
        A write that fails (the peer gone) calls nothing back from C{flushWriter}: the
        writer stays due, and the end of the iteration writes again and drops it as the
        event loop does.
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        theirs.close()
        writer.write(b"to nobody")
        reactor.flushWriter(writer)
        self.assertEqual(writer.lost, [])
        self.assertEqual(reactor.getWriters(), [writer])
        reactor.doPoll(0)
        self.assertEqual(len(writer.lost), 1)
        self.assertEqual(reactor.getWriters(), [])
        ours.close()  # no longer the reactor's

    def test_a_raising_write_is_handled_at_the_end_of_the_iteration(self) -> None:
        """
        A writer that raises is not a failure of C{flushWriter}'s caller: the end of
        the iteration writes again, logs what it raises and drops the writer.
        """
        reactor = self.reactor()
        ours, _ = self.pair()

        class Broken(_Writer):
            def writeSomeData(self, data: bytes) -> int:
                raise RuntimeError("transport bug")

        writer = Broken(ours, reactor)
        writer.write(b"anything")
        reactor.flushWriter(writer)
        self.assertEqual((writer.lost, reactor.getWriters()), ([], [writer]))
        reactor.doPoll(0)
        self.assertEqual(len(writer.lost), 1)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        ours.close()

    def test_producers_are_called_at_the_end_of_the_iteration(self) -> None:
        """
        A write whose completion would resume a producer (a paused streaming one, or a
        pull producer) is left to the end of the iteration: C{flushWriter} calls no
        producer back.
        """
        reactor = self.reactor()
        resumed: list[str] = []

        @implementer(IPushProducer)
        class Pushing:
            def resumeProducing(self) -> None:
                resumed.append("push")

            def pauseProducing(self) -> None:
                pass

            def stopProducing(self) -> None:
                pass

        @implementer(IPullProducer)
        class Pulling:
            def resumeProducing(self) -> None:
                resumed.append("pull")

            def stopProducing(self) -> None:
                pass

        push_ours, push_theirs = self.pair()
        pushed = _Writer(push_ours, reactor)
        pushed.bufferSize = 4  # this write pauses its producer
        pushed.registerProducer(Pushing(), True)
        pushed.write(b"over four bytes")
        self.assertTrue(pushed.producerPaused)
        pull_ours, pull_theirs = self.pair()
        pulled = _Writer(pull_ours, reactor)
        pulled.registerProducer(Pulling(), False)
        pulled.write(b"pulled")
        del resumed[:]  # registering a pull producer asks it at once
        reactor.flushWriter(pushed)
        reactor.flushWriter(pulled)
        self.assertEqual((_drain(push_theirs), _drain(pull_theirs), resumed), (b"", b"", []))
        reactor.doPoll(0)
        self.assertEqual(
            (_drain(push_theirs), _drain(pull_theirs), sorted(resumed)),
            (b"over four bytes", b"pulled", ["pull", "push"]),
        )
        push_ours.close()
        pull_ours.close()

    def test_a_half_close_or_a_connecting_writer_waits(self) -> None:
        """
        A writer whose write half is to close once its bytes are out, or that is not
        connected yet (a client's first write event connects it), is left to the end
        of the iteration.
        """
        reactor = self.reactor()
        half_ours, half_theirs = self.pair()
        half = _Writer(half_ours, reactor)
        half.write(b"then half-closed")
        half.loseWriteConnection()
        connecting_ours, connecting_theirs = self.pair()
        connecting = _Writer(connecting_ours, reactor)
        connecting.write(b"once connected")
        connecting.connected = 0
        reactor.flushWriter(half)
        del reactor._due[half]  # as if the connecting one were first
        reactor.flushWriter(connecting)
        reactor._due[half] = None
        self.assertEqual((_drain(half_theirs), _drain(connecting_theirs)), (b"", b""))
        reactor.doPoll(0)
        self.assertEqual(_drain(half_theirs), b"then half-closed")
        half_ours.close()
        connecting_ours.close()

    def test_nothing_more_at_once_after_a_failed_write(self) -> None:
        """
        Once a write at once has failed, nothing else is written at once in that
        iteration: the end of the iteration handles the failure (and cancels what it
        must) before anything written since leaves.
        """
        reactor = self.reactor()
        gone_ours, gone_theirs = self.pair()
        other_ours, other_theirs = self.pair()
        gone = _Writer(gone_ours, reactor)
        gone_theirs.close()
        gone.write(b"to nobody")
        reactor.flushWriter(gone)
        other = _Writer(other_ours, reactor)
        other.write(b"after")
        # gone is still due (first): written again at the end of the iteration.
        reactor._due.pop(gone)
        reactor.flushWriter(other)
        self.assertEqual(_drain(other_theirs), b"")
        reactor._due[gone] = None
        reactor.doPoll(0)
        self.assertEqual(len(gone.lost), 1)
        self.assertEqual(_drain(other_theirs), b"after")
        gone_ours.close()
        other_ours.close()

    def test_not_while_the_iteration_flushes(self) -> None:
        """
        Asked while the end-of-iteration flush runs (a protocol reacting to its own
        write), it leaves the writer to that flush.
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        other_ours, other_theirs = self.pair()
        other = _Writer(other_ours, reactor)

        class Eager(_Writer):
            def doWrite(self) -> Any:
                other.write(b"more")
                reactor.flushWriter(other)
                return super().doWrite()

        writer = Eager(ours, reactor)
        writer.write(b"first")
        reactor.doPoll(0)
        self.assertEqual(_drain(theirs), b"first")
        reactor.doPoll(0)
        self.assertEqual(_drain(other_theirs), b"more")
        self.assertEqual(reactor.getWriters(), [])

    def test_a_close_ahead_holds_nothing_back(self) -> None:
        """
        A writer asked for earlier that only closes (an upstream connection not reused,
        its bytes all sent) has nothing to overtake: the eager write goes out.
        """
        reactor = self.reactor()
        closing_ours, _ = self.pair()
        closing = _Writer(closing_ours, reactor)
        closing.startReading()
        closing.loseConnection()
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.write(b"response")
        self.assertEqual(reactor.getWriters(), [closing, writer])
        reactor.flushWriter(writer)
        self.assertEqual(_drain(theirs), b"response")
        reactor.doPoll(0)
        self.assertEqual(len(closing.lost), 1)
        ours.close()

    def test_only_file_descriptors(self) -> None:
        """
        A writer that is not a Twisted C{FileDescriptor} (whose C{doWrite} might do
        anything, and whose buffer cannot be read) is left to the end of the
        iteration, and holds back an eager write asked for after it.
        """
        reactor = self.reactor()
        plain_ours, _ = self.pair()
        done: list[str] = []

        class Plain:
            def fileno(self) -> int:
                return plain_ours.fileno()

            def doWrite(self) -> None:
                done.append("doWrite")
                reactor.removeWriter(self)

            def connectionLost(self, reason: Failure) -> None:
                pass

            def logPrefix(self) -> str:
                return "plain"

        plain = Plain()
        reactor.addWriter(plain)
        reactor.flushWriter(plain)
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.write(b"later")
        reactor.flushWriter(writer)
        self.assertEqual((_drain(theirs), done), (b"", []))
        reactor.doPoll(0)
        self.assertEqual((_drain(theirs), done), (b"later", ["doWrite"]))
        plain_ours.close()
        ours.close()


class AloneTests(_ReactorTestCase):
    def test_not_alone_after_an_interrupt(self) -> None:
        """
        A C{KeyboardInterrupt} out of an event (which Twisted's main loop swallows)
        leaves no event taken as alone for a later timed call.
        """
        reactor = self.reactor()
        ours, theirs = self.pair()
        reactor.addReader(_Reader(ours, reactor, fail=False))

        def interrupted(selectable: Any, fd: int, event: int) -> None:
            raise KeyboardInterrupt()

        self.patch(reactor, "_doReadOrWrite", interrupted)
        theirs.send(b"x")
        self.assertRaises(KeyboardInterrupt, reactor.doPoll, 0)
        self.assertFalse(reactor._alone)


class HoldFlushesTests(_ReactorTestCase):
    def test_held_writers_wait_for_the_end_of_the_iteration(self) -> None:
        reactor = self.reactor()
        reactor._alone = True  # as while an event that came alone is handled
        ours, theirs = self.pair()
        writer = _Writer(ours, reactor)
        writer.write(b"pipelined request")
        reactor.holdFlushes()
        reactor.flushWriter(writer)
        self.assertEqual(_drain(theirs), b"")
        reactor.releaseFlushes()
        self.assertEqual(reactor.getWriters(), [writer])
        reactor.doPoll(0)
        self.assertEqual(_drain(theirs), b"pipelined request")
        # Released: at once again.
        reactor._alone = True
        writer.write(b"next")
        reactor.flushWriter(writer)
        self.assertEqual(_drain(theirs), b"next")


class EagerSendsTests(_ReactorTestCase):
    """
    Which transports the reactor sends for at once.
    """

    def test_a_socket_on_the_daemons_reactor(self) -> None:
        from edgegw.reactor import eager_sends

        reactor = self.reactor()
        ours, _ = self.pair()
        writer = _Writer(ours, reactor)
        self.assertIs(eager_sends(writer), reactor)

    def test_not_a_tls_protocol_over_one(self) -> None:
        """
        A TLS protocol forwards unknown attributes to its socket, the reactor
        included; its bytes are not the socket's until encrypted: not sent eagerly.
        """
        from twisted.internet.protocol import Factory, Protocol
        from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

        from edgegw.reactor import eager_sends

        reactor = self.reactor()
        ours, _ = self.pair()
        writer = _Writer(ours, reactor)
        wrapper = ProtocolWrapper(WrappingFactory(Factory.forProtocol(Protocol)), Protocol())
        wrapper.makeConnection(writer)
        self.assertIs(wrapper.reactor, reactor)
        self.assertIsNone(eager_sends(wrapper))
