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
L{edgegw.server.request} no longer moved sooner) a proxied request costs 7 % less CPU,
12 % less for 64 KiB responses (C{python -m bench proxy --before}, same run).
L{EdgeReactor} calls the event handler directly;
a failure in it is still logged and the connection dropped, as Twisted's
C{_doReadOrWrite} does itself.

C{twistd edgegw} installs it when no reactor was chosen (C{twistd --reactor=NAME
edgegw} keeps NAME), on Linux only (epoll).
"""

from __future__ import annotations

import errno
import sys
from typing import Any

from twisted.logger import Logger

__all__ = ["install_if_unchosen"]

_log = Logger(namespace="edgegw.reactor")


def _reactor_class() -> Any:
    from twisted.internet.epollreactor import EPollReactor

    class EdgeReactor(EPollReactor):
        """
        An L{EPollReactor} that dispatches I/O events without the legacy log context.
        """

        def doPoll(self, timeout: float | None) -> None:
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
            for fd, event in events:
                selectable = selectables.get(fd)
                if selectable is None:
                    continue
                try:
                    handle(selectable, fd, event)
                except KeyboardInterrupt:
                    raise
                except BaseException:
                    # _doReadOrWrite catches what the protocol raises; this is a bug in
                    # the reactor's own bookkeeping: logged, and the loop goes on.
                    _log.failure(
                        "error dispatching an I/O event for {selectable!r}", selectable=selectable
                    )

        doIteration = doPoll

    return EdgeReactor


def install_if_unchosen() -> bool:
    """
    Install the L{EdgeReactor} as the global reactor, unless one is installed already
    (chosen with C{twistd --reactor}, or imported) or the platform has no epoll.

    @return: Whether it was installed.
    """
    if "twisted.internet.reactor" in sys.modules or not sys.platform.startswith("linux"):
        return False
    from twisted.internet.main import installReactor

    installReactor(_reactor_class()())
    return True
