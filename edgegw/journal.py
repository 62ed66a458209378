"""
The daemon's own log as JSON lines on standard output, for journald:
C{twistd --logger=edgegw.journal.observer edgegw ...} (what the systemd unit runs).

Each event becomes one line: C{time} (ISO 8601, UTC), C{level}, C{namespace},
C{message}, and C{traceback} for a failure; an access-log event (C{accessLog.output:
log}) carries its fields under C{access} (its message is then just method, path and
status). When standard output is journald's stream
(systemd sets C{JOURNAL_STREAM}), each line starts with its syslog priority (C{<3>}
error ... C{<7>} debug), which journald takes as the entry's priority and removes, so
that C{journalctl -p warning} works.

Lines go through a L{LineWriter} (the access log's kind): written in batches, never blocking the
reactor. When journald falls behind and the pipe is full, up to 4 MiB waits and further
lines are dropped, counted in one warning every 10 s, rather than stalling requests.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from twisted.logger import ILogObserver, LogLevel, formatEvent
from twisted.python.threadable import isInIOThread
from zope.interface import implementer

from edgegw.line_writer import LineWriter

__all__ = ["JsonLinesObserver", "observer"]

_PRIORITY = {
    LogLevel.critical: b"<2>",
    LogLevel.error: b"<3>",
    LogLevel.warn: b"<4>",
    LogLevel.info: b"<6>",
    LogLevel.debug: b"<7>",
}


@implementer(ILogObserver)
class JsonLinesObserver:
    """
    Writes each log event as one JSON line to C{writer}.

    @ivar priorities: Prefix each line with its syslog priority (for journald).
    """

    def __init__(
        self,
        writer: LineWriter,
        priorities: bool = False,
        reactor: Any = None,
    ) -> None:
        """
        @param reactor: The reactor the writer flushes on: before it runs (a failure to
            listen exits before it ever does) each line is flushed at once, and a line
            logged from another thread is handed to it.
        """
        self.writer = writer
        self.priorities = priorities
        self.reactor = reactor

    def __call__(self, event: dict[str, Any]) -> None:
        level = event.get("log_level", LogLevel.info)
        record: dict[str, Any] = {
            "time": datetime.fromtimestamp(event.get("log_time", 0.0), UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": getattr(level, "name", str(level)),
            "namespace": event.get("log_namespace", ""),
            "message": formatEvent(event),
        }
        failure = event.get("log_failure")
        if failure is not None:
            record["traceback"] = failure.getTraceback()
        access = event.get("access")
        if isinstance(access, dict):
            # The fields once, structured (the formatted message is the same JSON).
            record["message"] = (
                f"{access.get('method')} {access.get('path')} {access.get('status')}"
            )
            record["access"] = access
        line = json.dumps(record, ensure_ascii=False, default=str).encode("utf-8", "replace")
        if self.priorities:
            line = _PRIORITY.get(level, b"<6>") + line
        reactor = self.reactor
        if reactor is None:
            self.writer.write(line)
        elif not reactor.running:
            # Startup (one thread): a failure to listen exits before the reactor runs.
            self.writer.write(line)
            self.writer.flush()
        elif not isInIOThread():
            # The OTLP exporter's thread logs too; the writer is the reactor's alone.
            reactor.callFromThread(self.writer.write, line)
        else:
            self.writer.write(line)


def observer() -> JsonLinesObserver:
    """
    The observer for C{twistd --logger=edgegw.journal.observer}: JSON lines on
    standard output, flushed when the reactor shuts down.
    """
    from twisted.internet import reactor

    writer = LineWriter(reactor, "-")
    reactor.addSystemEventTrigger("after", "shutdown", writer.close)
    return JsonLinesObserver(writer, priorities="JOURNAL_STREAM" in os.environ, reactor=reactor)
