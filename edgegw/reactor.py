"""
The daemon's reactor: Twisted's epoll reactor without the legacy log context around
each I/O event.

For every readable or writable socket, Twisted's reactors call the protocol through
C{twisted.python.log.callWithLogger}, which asks the transport for its log prefix,
copies the legacy log context into a new dictionary and runs the call inside it, so
that old-style C{log.msg} calls made from it carry C{system=<prefix>}. edgegw logs
through C{twisted.logger}, which never reads that context, and a proxied request is
four I/O events or more (the client's request, the upstream write and read, the
response): the wrapper was ~9 % of a proxied request's samples (C{python -m bench
profile proxy}); without it (and with the request-head timer of
L{edgegw.server.channel} no longer moved sooner) a proxied request costs 7 % less CPU,
12 % less for 64 KiB responses (C{python -m bench proxy --before}, same run).
L{EdgeReactor} calls the event handler directly;
a failure in it is still logged and the connection dropped, as Twisted's
C{_doReadOrWrite} does itself.

It also writes differently. Twisted's transports buffer a C{write()} and register the
socket for EPOLLOUT; the bytes go out when the next poll says it is writable, and
the registration is dropped again: two C{epoll_ctl} calls and one more event for every
response and every upstream request. L{EdgeReactor} notes the writers of an iteration
and writes each one out once at its end (the writes of one iteration still leave
together); only a socket that cannot take everything is registered, as before. A
proxied request costs 9 % less CPU (11 % for 64 KiB; C{python -m bench proxy --before},
same run), and its upstream request leaves one reactor iteration sooner.

A writer whose message is complete can also be written out at once
(L{flush_now}, C{EdgeReactor.flushWriter}): a small proxied response as soon as it is
written, before its request is finished, its access-log line and the chain's
bookkeeping, and a bodiless request to a pooled upstream connection as soon as it is
sent. Nothing more is written (one send per message either way), but the bytes leave
before the rest of the event's work: -20 to -30 µs of latency at one connection, and
-14 µs p50 more with the response out before its C{finish} (C{python -m bench proxy
--connections 1 --before}). Only while handling an event that came alone from its
poll: under load (several events a poll) writing each message at once cost +27 % CPU
per request at 50 connections (the same bench), and the writes of the iteration leave
together at its end as before. It never writes ahead of bytes written earlier in the
iteration, and calls nothing back (no C{connectionLost}, no producer): what would is
left to the end of the iteration.

C{twistd edgegw} installs it when no reactor was chosen (C{twistd --reactor=NAME
edgegw} keeps NAME), on Linux only (epoll); C{--reactor=edgegw} names it (a
C{twisted.plugins} reactor plugin), which C{make test} gives trial for the newest
dependencies.
"""

from __future__ import annotations

import errno
import select
import sys
from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper
from zope.interface import Interface, implementer

__all__ = ["IEagerSends", "eager_sends", "flush_now", "install", "install_if_unchosen"]

_log = Logger(namespace="edgegw.reactor")

_POLLOUT = select.EPOLLOUT if hasattr(select, "EPOLLOUT") else 4


class IEagerSends(Interface):
    """
    What the daemon's reactor offers the HTTP/1.1 protocols (the server channel, the
    upstream connection) for sending a complete message at once.
    """

    def flushWriter(writer: Any) -> None:
        """
        Write out what C{writer} was given in this iteration now, where the rule of the
        module docstring allows.
        """

    def holdFlushes() -> None:
        """
        Leave the writers asked for meanwhile to the end of the iteration, until
        L{releaseFlushes}.
        """

    def releaseFlushes() -> None:
        """
        End one L{holdFlushes}.
        """


_edge_reactor: type | None = None


def _reactor_class() -> Any:
    global _edge_reactor
    if _edge_reactor is not None:
        return _edge_reactor
    from twisted.internet.epollreactor import EPollReactor

    @implementer(IEagerSends)
    class EdgeReactor(EPollReactor):
        """
        An L{EPollReactor} that dispatches I/O events without the legacy log context,
        and writes what was written during an iteration at the end of it.
        """

        def __init__(self) -> None:
            # Writers asked for (addWriter) since the last flush, in order; a dict as
            # an ordered set.
            self._due: dict[Any, None] = {}
            self._flushing: set[Any] | None = None
            # flushWriter does nothing while held (holdFlushes), nor unless the event
            # being handled came alone from its poll.
            self._held = 0
            self._alone = False
            super().__init__()

        def addWriter(self, writer: Any) -> None:
            # A transport's write() (or loseConnection) asks to be told when the socket
            # can take bytes. It almost always can: rather than registering for
            # EPOLLOUT and writing on the next poll (two epoll_ctl calls and an event
            # per write), the writes of this iteration are flushed at its end; only a
            # socket that cannot take them all is registered.
            if writer.fileno() not in self._writes:
                self._due[writer] = None

        def removeWriter(self, writer: Any) -> None:
            self._due.pop(writer, None)
            flushing = self._flushing
            if flushing is not None:
                flushing.discard(writer)
            super().removeWriter(writer)

        def removeAll(self) -> list[Any]:
            due = list(self._due)
            self._due.clear()
            removed: list[Any] = super().removeAll()
            return removed + [writer for writer in due if writer not in removed]

        def getWriters(self) -> list[Any]:
            writers: list[Any] = super().getWriters()
            return writers + [writer for writer in self._due if writer not in writers]

        def _flush(self) -> None:
            """
            Write out every transport written to since the last flush, once each: a
            writer that still has bytes after its write (a full socket, or more
            written meanwhile) waits for EPOLLOUT as Twisted's reactor would make it.
            """
            due = self._due
            if not due:
                return
            writers = list(due)
            due.clear()
            # Those that stop writing while flushed (all sent) leave this set.
            self._flushing = flushing = set(writers)
            try:
                for writer in writers:
                    if writer in flushing:
                        self._write_out(writer)
            finally:
                self._flushing = None
                # Whatever could not write everything, or wrote again meanwhile, waits
                # for EPOLLOUT: nothing taken out of _due is dropped.
                flushing.update(due)
                due.clear()
                for writer in flushing:
                    if writer.fileno() != -1:
                        EPollReactor.addWriter(self, writer)

        def _write_out(self, writer: Any) -> None:
            """
            Have C{writer} write what it holds, as the event loop does on EPOLLOUT.
            """
            try:
                self._doReadOrWrite(writer, writer.fileno(), _POLLOUT)
            except KeyboardInterrupt:
                raise
            except BaseException:
                # A protocol's connectionLost raising (after a failed or final write):
                # logged as the event loop does, the other writers still go out.
                _log.failure("error flushing writes for {writer!r}", writer=writer)

        def flushWriter(self, writer: Any) -> None:
            """
            Write out what C{writer} was given in this iteration now rather than at its
            end: for a response that is complete, whose bytes should not wait for the
            rest of the event's work (finishing the request, its access-log line, its
            bookkeeping). Nothing else is flushed, and a writer that cannot take
            everything waits for EPOLLOUT as in L{_flush}. Nothing is flushed while
            L{holdFlushes} holds, nor unless the event being handled came alone from its
            poll (see the module docstring).

            An eager write never goes ahead of bytes written before it in this
            iteration (a response, ahead of the upstream request of a request pipelined
            behind it): a writer asked for earlier that still holds bytes keeps it
            waiting (one that only closes, an upstream connection not reused, does not).

            Nothing is called back from here, so that it can run in the middle of a
            protocol's own code (a response's bytes out before its C{finish}): a write
            that fails, or whose completion would call a producer or close the
            connection, is left to the end of the iteration, which handles it as the
            event loop does (C{connectionLost}, C{resumeProducing}); after a failed
            one, nothing more is written at once in this iteration.
            """
            if (
                not self._alone
                or self._held
                or self._flushing is not None
                or not self._nothing_ahead(writer)
                or not isinstance(writer, FileDescriptor)
                # Not yet connected (a client's doWrite connects), or closing.
                or not writer.connected
                or writer.disconnecting
                or getattr(writer, "_writeDisconnecting", True)
                or (
                    writer.producer is not None
                    and (writer.producerPaused or not writer.streamingProducer)
                )
            ):
                return
            # FileDescriptor.doWrite: with those excluded, it only sends, and stops
            # writing (removeWriter: no longer due) once everything is out. What fails
            # is tried again, and handled, at the end of the iteration.
            try:
                failed = writer.doWrite() is not None
            except Exception:
                failed = True
            if failed:
                # The connection is going: nothing else leaves before the end of the
                # iteration has handled it (what it cancels must stay unsent).
                self._alone = False

        def _nothing_ahead(self, writer: Any) -> bool:
            """
            Whether C{writer} is due and no writer asked for before it in this
            iteration still holds bytes to send.
            """
            for ahead in self._due:
                if ahead is writer:
                    return True
                if (
                    not isinstance(ahead, FileDescriptor)
                    or len(ahead.dataBuffer) > ahead.offset
                    or getattr(ahead, "_tempDataLen", True)
                ):
                    return False
            return False

        def holdFlushes(self) -> None:
            """
            Leave the writers asked for meanwhile to the end of the iteration, until
            L{releaseFlushes}: a response's C{finish} may start a pipelined request whose
            upstream request must not leave before that response (whose write could find
            the client gone, and cancel it unsent).
            """
            self._held += 1

        def releaseFlushes(self) -> None:
            """
            End one L{holdFlushes}.
            """
            self._held -= 1

        def doPoll(self, timeout: float | None) -> None:
            # What timed calls and threads' callbacks wrote (runUntilCurrent) first.
            if self._due:
                self._flush()
                # Flushing may have resumed a producer that goes on through a timed call
                # (a Cooperator task: static files, TLS): the main loop's timeout was
                # computed before that, and polling that long would stall it.
                due = self.timeout()
                if due is not None and (timeout is None or due < timeout):
                    timeout = due
            try:
                events = self._poller.poll(
                    -1 if timeout is None else timeout, len(self._selectables)
                )
            except OSError as err:
                if err.errno == errno.EINTR:
                    return
                raise
            selectables = self._selectables
            handle = self._doReadOrWrite
            # flushWriter writes at once only for an event that came alone: under load
            # (several events a poll) the writes of the iteration leave together at its
            # end, which costs less CPU per request (+27 % at 50 connections otherwise).
            self._alone = len(events) == 1
            try:
                for fd, event in events:
                    selectable = selectables.get(fd)
                    if selectable is None:
                        continue
                    try:
                        handle(selectable, fd, event)
                    except KeyboardInterrupt:
                        raise
                    except BaseException:
                        # _doReadOrWrite catches what the protocol raises; this is a bug
                        # in the reactor's own bookkeeping: logged, and the loop goes on.
                        _log.failure(
                            "error dispatching an I/O event for {selectable!r}",
                            selectable=selectable,
                        )
            finally:
                self._alone = False
            self._flush()

        doIteration = doPoll

    _edge_reactor = EdgeReactor
    return EdgeReactor


def eager_sends(transport: Any) -> IEagerSends | None:
    """
    The daemon's reactor under C{transport}, which can send its bytes at once; L{None}
    on another reactor, or for a transport it does not write directly (TLS).
    """
    if isinstance(transport, ProtocolWrapper):
        # A TLS protocol would answer with its socket's reactor, through the attribute
        # forwarding of Twisted's protocol wrappers: its bytes are not the socket's
        # until it has encrypted them.
        return None
    reactor = getattr(transport, "reactor", None)
    return reactor if IEagerSends.providedBy(reactor) else None


def flush_now(transport: Any) -> None:
    """
    Have C{transport}'s bytes of this iteration written now, when it runs on the
    daemon's reactor (L{EdgeReactor.flushWriter}); elsewhere, at the reactor's own pace.
    """
    sends = eager_sends(transport)
    if sends is not None:
        sends.flushWriter(transport)


def install() -> None:
    """
    Install the L{EdgeReactor} as the global reactor (C{twistd --reactor=edgegw},
    C{trial --reactor=edgegw}).
    """
    from twisted.internet.main import installReactor

    installReactor(_reactor_class()())


def install_if_unchosen() -> bool:
    """
    Install the L{EdgeReactor} as the global reactor, unless one is installed already
    (chosen with C{twistd --reactor}, or imported) or the platform has no epoll.

    @return: Whether it was installed.
    """
    if "twisted.internet.reactor" in sys.modules or not sys.platform.startswith("linux"):
        return False
    install()
    return True
