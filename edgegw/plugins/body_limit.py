"""
The C{body-limit} plugin (a RequestPlugin): refuse request bodies larger than
C{maxBytes} with 413 Payload Too Large.

Config::

    maxBytes: 1MiB   # bytes: an integer, or a number with kB, MB, GB, KiB, MiB or GiB

A body whose C{Content-Length} is over the limit is refused before anything is read or
forwarded. A chunked body is counted as it streams to the backend: the piece that would
cross the limit is never forwarded, the backend's request is aborted (it sees a broken
request, never a complete short one), and the client gets the 413 unless its response
has already started.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IConsumer
from twisted.python.failure import Failure
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from edgegw.plugins.interfaces import IRequestHook, IRequestPlugin, PluginConfigError
from edgegw.plugins.messages import PluginRequest, Reply

__all__ = ["BodyLimitPlugin", "BodyTooLargeError", "LimitedBody", "parse_size", "plugin"]

_SIZE: Final = re.compile(r"\s*(\d+)\s*(B|kB|KB|MB|GB|KiB|MiB|GiB)?\s*")
_UNITS: Final = {
    None: 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}
_TOO_LARGE: Final = "payload too large\n"


class BodyTooLargeError(Exception):
    """
    The request body grew past the limit while it streamed.
    """


def parse_size(value: object) -> int:
    """
    A size in bytes: a non-negative integer, or a string such as C{"512KiB"}.

    @raise ValueError: C{value} is neither.
    """
    if isinstance(value, bool):
        raise ValueError("must be a size in bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, str):
        found = _SIZE.fullmatch(value)
        if found is not None:
            return int(found.group(1)) * _UNITS[found.group(2)]
    raise ValueError(f"{value!r} is not a size (such as 1048576, 512KiB or 10MB)")


@implementer(IBodyProducer)
class LimitedBody:
    """
    A request body passed on only while it stays within C{limit} bytes.

    @ivar length: The wrapped body's length (L{UNKNOWN_LENGTH} for a chunked one).
    @ivar sent: Bytes passed on so far.
    """

    def __init__(self, body: IBodyProducer, limit: int, on_exceeded: Any) -> None:
        """
        @param on_exceeded: Called with no arguments when the limit is crossed.
        """
        self._body = body
        self._limit = limit
        self._on_exceeded = on_exceeded
        self.length = body.length
        self.sent = 0
        self._consumer: IConsumer | None = None
        self._done: Deferred[None] | None = None

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        """
        Pass the body on to C{consumer}; fail with L{BodyTooLargeError} at the limit.
        """
        self._consumer = consumer
        done: Deferred[None] = Deferred(lambda ignored: self._body.stopProducing())
        self._done = done
        self._body.startProducing(self).addCallbacks(self._finished, self._failed)
        return done

    def write(self, data: bytes) -> None:
        """
        Pass C{data} on (the wrapped body calls this), unless it crosses the limit.
        """
        consumer = self._consumer
        if consumer is None:
            return
        self.sent += len(data)
        if self.sent <= self._limit:
            consumer.write(data)
            return
        done = self._done
        self._consumer = None
        self._done = None
        self._body.stopProducing()
        # The refusal first: failing the body aborts the backend's request, and the
        # terminal would answer that with its own error.
        self._on_exceeded()
        if done is not None:
            done.errback(BodyTooLargeError(f"request body over {self._limit} bytes"))

    def _finished(self, result: None) -> None:
        done, self._done = self._done, None
        self._consumer = None
        if done is not None:
            done.callback(None)

    def _failed(self, reason: Failure) -> None:
        done, self._done = self._done, None
        self._consumer = None
        if done is not None:
            done.errback(reason)

    def pauseProducing(self) -> None:
        """Pause the wrapped body."""
        self._body.pauseProducing()

    def resumeProducing(self) -> None:
        """Resume the wrapped body."""
        self._body.resumeProducing()

    def stopProducing(self) -> None:
        """Stop the wrapped body; the L{Deferred} from L{startProducing} never fires."""
        self._consumer = None
        self._done = None
        self._body.stopProducing()


@implementer(IRequestHook)
class BodyLimit:
    """
    Refuses request bodies over C{limit} bytes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def on_request(self, request: PluginRequest) -> Reply | None:
        """
        Refuse a declared length over the limit; watch a chunked body as it streams.
        """
        body = request.body
        if body is None:
            return None
        length = body.length
        if length is not UNKNOWN_LENGTH:
            return Reply(413, _TOO_LARGE) if int(length) > self.limit else None

        def exceeded() -> None:
            request.respond(Reply(413, _TOO_LARGE))

        request.body = LimitedBody(body, self.limit, exceeded)
        return None


@implementer(IRequestPlugin)
class BodyLimitPlugin:
    """
    The C{body-limit} plugin, as registered (entry point
    C{body-limit = edgegw.plugins.body_limit:plugin}).
    """

    def request_hook(self, config: Mapping[str, Any]) -> BodyLimit:
        """
        The limit from C{config} (C{maxBytes}, required).
        """
        problems = [
            (str(key), "unknown field (expected: maxBytes)") for key in config if key != "maxBytes"
        ]
        if "maxBytes" not in config:
            problems.append(("maxBytes", "is required"))
        else:
            try:
                limit = parse_size(config["maxBytes"])
            except ValueError as e:
                problems.append(("maxBytes", str(e)))
        if problems:
            raise PluginConfigError.of(problems)
        return BodyLimit(limit)


plugin = BodyLimitPlugin()
