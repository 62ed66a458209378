"""
What the static terminal sends of an open file: its strong entity tag (L{EntityTags}:
a content hash up to L{ETAG_HASH_LIMIT} bytes, the same on every host), and its bytes,
read at once up to L{SMALL_FILE_LIMIT} or streamed by a L{FileProducer} beyond it (see
L{edgegw.handlers.static} for the rules).
"""

from __future__ import annotations

import hashlib
import os
from typing import Final, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPullProducer
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from zope.interface import implementer

__all__ = [
    "ETAG_HASH_LIMIT",
    "SMALL_FILE_LIMIT",
    "EntityTags",
    "FileProducer",
    "Response",
    "read_span",
    "read_unchanged",
    "truncated",
]

SMALL_FILE_LIMIT: Final = 64 * 1024
"""Bodies up to this many bytes are sent with one read; larger ones are streamed."""

ETAG_HASH_LIMIT: Final = SMALL_FILE_LIMIT
"""Files up to this many bytes get an C{ETag} from their content's hash."""

_ETAG_CACHE_SIZE: Final = 4096

_CHUNK_SIZE: Final = 64 * 1024

# The namespace of the one module this package was: the log lines stay as they were.
_log = Logger(namespace="edgegw.handlers.static")


class Response(Protocol):
    """
    The part of L{Request<twisted.web.server.Request>} the static terminal uses, typed
    (Twisted leaves these untyped).
    """

    @property
    def method(self) -> bytes:
        """The request method."""

    @property
    def path(self) -> bytes:
        """The raw request path, without the query."""

    @property
    def requestHeaders(self) -> Headers:
        """The request's headers."""

    def setResponseCode(self, code: int) -> None:
        """Set the status code."""

    def setHeader(self, name: bytes, value: bytes) -> None:
        """Set one response header."""

    def write(self, data: bytes) -> None:
        """Write body bytes (the headers first, on the first call)."""

    def notifyFinish(self) -> Deferred[None]:
        """Fire when the response is finished, or fail when the connection is lost."""

    def finish(self) -> None:
        """Complete the response."""

    def registerProducer(self, producer: object, streaming: bool) -> None:
        """Attach a producer that writes the body."""

    def unregisterProducer(self) -> None:
        """Detach the producer."""

    def loseConnection(self) -> None:
        """Close the connection once what was written is sent."""


class EntityTags:
    """
    The strong entity tags of the files one handler serves, content hashes cached by
    what identifies one version of a file here.
    """

    def __init__(self) -> None:
        self._etags: dict[tuple[int, int, int, int, int], bytes] = {}

    def tag(self, fd: int, info: os.stat_result) -> bytes:
        """
        The file's strong entity tag: size and content hash up to L{ETAG_HASH_LIMIT}
        bytes, else size and modification time.

        @param fd: The open file.
        @param info: Its status.
        """
        size = info.st_size
        if size > ETAG_HASH_LIMIT:
            return b'"%x-%x"' % (size, info.st_mtime_ns)
        key = (info.st_dev, info.st_ino, size, info.st_mtime_ns, info.st_ctime_ns)
        etags = self._etags
        etag = etags.get(key)
        if etag is None:
            etag = _content_etag(fd, info)
            if etag is None:
                # Changing while it was read: this answer's tag cannot be cached.
                return b'"%x-%x"' % (size, info.st_mtime_ns)
            if len(etags) >= _ETAG_CACHE_SIZE:
                etags.clear()
            etags[key] = etag
        return etag


def _content_etag(fd: int, info: os.stat_result) -> bytes | None:
    """
    C{"size-hash"} for the open file, or L{None} when it changed while being read.
    """
    data = read_unchanged(fd, info)
    if data is None:
        return None
    digest = hashlib.blake2b(data, digest_size=16).hexdigest().encode("ascii")
    return b'"%x-%s"' % (info.st_size, digest)


def read_unchanged(fd: int, info: os.stat_result) -> bytes | None:
    """
    The whole open file, or L{None} when it is not the version C{info} describes any
    more (it changed while it was read, or could not be read).
    """
    size = info.st_size
    try:
        data = read_span(fd, 0, size)
        after = os.fstat(fd)
    except OSError:
        return None
    if len(data) != size or (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (
        size,
        info.st_mtime_ns,
        info.st_ctime_ns,
    ):
        return None
    return data


def read_span(fd: int, offset: int, length: int) -> bytes:
    """
    Read C{length} bytes at C{offset}, fewer only if the file ends first.

    @param fd: The open file.
    @param offset: Where to start.
    @param length: How many bytes to read.
    @return: The bytes read.
    """
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def truncated(request: Response, name: str) -> None:
    """
    Give up on a body that cannot be completed: the file shrank or failed to read.

    @param request: The request whose response is cut short.
    @param name: The file name, for the log.
    """
    _log.warn("static file {name} shrank or failed while being sent", name=name)
    request.loseConnection()


@implementer(IPullProducer)
class FileProducer:
    """
    Stream one span of an open file into a request, one chunk per pull.

    The producer owns the descriptor and closes it on every way out: the last chunk, a
    short read, the transport stopping it (client gone), or cancellation of L{done}.

    @ivar done: Fires with L{None} when the response is finished; cancelling it
        detaches the producer and closes the file. When the client goes away it is left
        to whoever serves the request to cancel it (the route runner, or the terminal's
        own C{render}, both on the request's finish notification), so that the work
        ends as a cancellation, with the request already marked disconnected; should
        nobody cancel it, it fires once the request's connection is gone.
    """

    def __init__(self, request: Response, fd: int, offset: int, length: int, name: str) -> None:
        """
        @param request: The request to write to; its headers are already set.
        @param fd: The open file, now owned by the producer.
        @param offset: The first byte to send.
        @param length: How many bytes to send (more than zero).
        @param name: The file name, for the log.
        """
        self._request = request
        self._fd = fd
        self._offset = offset
        self._remaining = length
        self._name = name
        self.done: Deferred[None] = Deferred(self._cancel)

    def resumeProducing(self) -> None:
        """
        Write the next chunk; after the last one, finish the response.
        """
        if self._fd < 0:
            return
        try:
            chunk = os.pread(self._fd, min(_CHUNK_SIZE, self._remaining), self._offset)
        except OSError:
            _log.failure("reading static file {name}", name=self._name)
            chunk = b""
        request = self._request
        if not chunk:
            self._close()
            request.unregisterProducer()
            truncated(request, self._name)
            self.done.callback(None)
            return
        self._offset += len(chunk)
        self._remaining -= len(chunk)
        if self._remaining > 0:
            request.write(chunk)
            return
        self._close()
        request.unregisterProducer()
        request.write(chunk)
        request.finish()
        self.done.callback(None)

    def stopProducing(self) -> None:
        """
        The consumer is gone (the client disconnected): close the file.

        The transport stops its producer before the request hears that the connection
        is lost: finishing L{done} here would end the response as if it were complete.
        """
        if self._fd < 0:
            return
        self._close()
        self._request.notifyFinish().addBoth(self._gone)

    def _gone(self, result: object) -> None:
        if not self.done.called:
            self.done.callback(None)

    def _cancel(self, done: Deferred[None]) -> None:
        """
        L{done} was cancelled: stop pulling and close the file; the caller owns what is
        left of the response.

        @param done: L{done}, which then fails with C{CancelledError}.
        """
        if self._fd < 0:
            return
        self._close()
        if getattr(self._request, "channel", None) is not None:
            self._request.unregisterProducer()

    def _close(self) -> None:
        """
        Close the descriptor exactly once.
        """
        fd, self._fd = self._fd, -1
        os.close(fd)
