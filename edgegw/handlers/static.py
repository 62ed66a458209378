"""
The C{static} terminal: a file server for single-page applications.

Lookup
======

The lookup path is the raw (percent-encoded) request path, less C{stripPrefix} when the
path starts with it (a plain byte-prefix match, as Go's C{http.StripPrefix}; stripping
the whole path leaves C{/}). Each segment is percent-decoded once as UTF-8. A segment
that starts with C{.} (C{.}, C{..}, C{.env}, C{%2e%2e}, C{%2Eenv}), decodes to invalid
UTF-8, or contains C{/}, C{\\} or NUL after decoding is rejected with 404 before the
filesystem is touched, and never falls back to the index. Symbolic links are followed
only while the real path stays inside the real root; the root itself is resolved once,
at load, so re-pointing a symlinked root (an atomic deploy) takes effect on reload.

A directory (C{/}, C{/docs}, C{/docs/}) serves its own index file, without a redirect.
A path with a trailing slash must name a directory. Anything else that is not a regular
file is a miss: with C{spaFallback} and a last segment without C{.} the root index is
served (200), otherwise 404.

Responses
=========

Only C{GET} and C{HEAD} are answered (405 with C{Allow: GET, HEAD} otherwise). Every file
named like the index (served directly, as a directory index or as the fallback) carries
C{Cache-Control: no-cache}; other files carry C{cacheControl} when configured. Files
carry a strong C{ETag}, C{Last-Modified} and C{Accept-Ranges: bytes}. The C{ETag} is the
same on every host that serves the same file (nothing local such as the inode is in it):
size and a BLAKE2b hash of the content for files up to L{ETAG_HASH_LIMIT} bytes (hashed
once per file version and process; a deployment that gives the copies different
modification times still revalidates), size and modification time for larger ones.

Preconditions follow RFC 9110 section 13.2.2: C{If-Match} and C{If-Unmodified-Since}
(412), then C{If-None-Match} (weak comparison, C{*}) or else C{If-Modified-Since} (304).
A single byte range (C{a-b}, C{a-}, C{-n}) is answered with 206, an unsatisfiable one
with 416 and C{Content-Range: bytes */size}; a syntactically invalid C{Range} is ignored.
A request for several ranges is answered with the whole file (200), which RFC 9110
permits, rather than a C{multipart/byteranges} body. C{If-Range} (entity tag, strong
comparison, or the exact C{Last-Modified} date) that does not match also gives the whole
file. C{HEAD} gets exactly the headers C{GET} would get, ranges included.

Files up to L{SMALL_FILE_LIMIT} bytes are read and written at once; larger bodies are
streamed by a pull producer, so memory stays bounded whatever the file size. If a file
shrinks while it is being sent, the connection is closed after the bytes that exist so
that the client sees a truncated transfer instead of a short body it would trust.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import mimetypes
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol
from urllib.parse import unquote_to_bytes

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPullProducer
from twisted.logger import Logger
from twisted.web.http import datetimeToString, stringToDatetime
from twisted.web.http_headers import Headers
from twisted.web.server import Request
from zope.interface import implementer

from edgegw.chain.terminal import TerminalResource
from edgegw.config.model import StaticHandlerSpec

__all__ = ["ETAG_HASH_LIMIT", "SMALL_FILE_LIMIT", "StaticHandler"]

SMALL_FILE_LIMIT: Final = 64 * 1024
"""Bodies up to this many bytes are sent with one read; larger ones are streamed."""

ETAG_HASH_LIMIT: Final = SMALL_FILE_LIMIT
"""Files up to this many bytes get an C{ETag} from their content's hash."""

_ETAG_CACHE_SIZE: Final = 4096

_CHUNK_SIZE: Final = 64 * 1024

_log = Logger()

_http_date: Callable[[float], bytes] = datetimeToString
_parse_http_date: Callable[[bytes], float] = stringToDatetime

# The path is resolved already; O_NOFOLLOW turns a link swapped in since into a miss, and
# O_NONBLOCK keeps a FIFO planted in the tree from blocking the reactor.
_OPEN_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_BINARY", 0)
)

_TEXT_PLAIN: Final = b"text/plain; charset=utf-8"
_OCTET_STREAM: Final = b"application/octet-stream"
_NO_CACHE: Final = b"no-cache"
_BYTES: Final = b"bytes"
_ALLOW: Final = b"GET, HEAD"

_NOT_FOUND: Final = b"not found"
_METHOD_NOT_ALLOWED: Final = b"method not allowed"
_PRECONDITION_FAILED: Final = b"precondition failed"
_RANGE_NOT_SATISFIABLE: Final = b"range not satisfiable"

# Larger than any file size, so an absurdly long position needs no big-integer parsing.
_HUGE: Final = 1 << 63

_WEB_TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".cjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".webmanifest": "application/manifest+json",
    ".svg": "image/svg+xml",
    ".wasm": "application/wasm",
    ".ico": "image/x-icon",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".avif": "image/avif",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".otf": "font/otf",
    ".pdf": "application/pdf",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mp3": "audio/mpeg",
    ".gz": "application/gzip",
    ".zip": "application/zip",
}


@functools.cache
def _content_types() -> Mapping[str, bytes]:
    """
    The extension table: Python's built-in C{mimetypes} defaults (never the host's
    C{mime.types}, so every machine answers alike), overridden by the web types above.

    @return: Lower-case extensions with their dot, mapped to C{Content-Type} values.
    """
    table: dict[str, bytes] = {}
    for extension, content_type in mimetypes.MimeTypes().types_map[True].items():
        if content_type.startswith("text/"):
            # Browsers read text without a charset as windows-1252; web assets are UTF-8.
            content_type += "; charset=utf-8"
        table[extension.lower()] = content_type.encode("ascii")
    for extension, content_type in _WEB_TYPES.items():
        table[extension] = content_type.encode("ascii")
    return table


_Target = tuple[int, os.stat_result, str]
"""An open file: descriptor, status, and the name its headers are chosen by."""


class _Response(Protocol):
    """
    The part of L{Request} this module uses, typed (Twisted leaves these untyped).
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


class _Range(enum.Enum):
    """The outcomes of a C{Range} header other than one satisfiable span."""

    IGNORE = enum.auto()
    UNSATISFIABLE = enum.auto()


class StaticHandler(TerminalResource):
    """
    Serve the files under one directory, with the single-page-app index fallback.

    Everything that depends only on the configuration (the real root, the index path,
    header values, the content-type table) is computed here, once per load.
    """

    def __init__(self, spec: StaticHandlerSpec) -> None:
        """
        @param spec: The route's C{static} handler block.
        """
        super().__init__()
        self._spec = spec
        self._root = os.path.realpath(spec.dir)
        # Paths are built as f"{base}/{name}", so "/" as the root becomes "".
        self._root_base = self._root.rstrip("/")
        # A prefix test on normalised real paths is commonpath() without its cost.
        self._root_prefix = self._root_base + "/"
        self._index = spec.index
        self._index_parts = tuple(part for part in spec.index.split("/") if part not in ("", "."))
        if not self._index_parts or ".." in self._index_parts:
            raise ValueError(f"static index {spec.index!r} must name a file inside dir")
        self._index_name = self._index_parts[-1]
        self._spa_fallback = spec.spa_fallback
        self._strip_prefix = spec.strip_prefix.encode("utf-8") if spec.strip_prefix else None
        self._cache_control = (
            spec.cache_control.encode("latin-1") if spec.cache_control is not None else None
        )
        self._types = _content_types()
        # Content-hash entity tags, keyed by what identifies one version of a file here.
        self._etags: dict[tuple[int, int, int, int, int], bytes] = {}
        if not os.path.isdir(self._root):
            _log.warn("static directory {dir} does not exist (yet)", dir=spec.dir)

    def describe(self) -> str:
        """
        One line for the route table.

        @return: For example C{static /srv/app (index index.html, spa fallback)}.
        """
        parts = [f"index {self._index}"]
        if self._spa_fallback:
            parts.append("spa fallback")
        if self._spec.strip_prefix:
            parts.append(f"strip {self._spec.strip_prefix}")
        if self._spec.cache_control is not None:
            parts.append(f'cache-control "{self._spec.cache_control}"')
        return f"static {self._spec.dir} ({', '.join(parts)})"

    async def respond(self, request: Request) -> None:
        """
        Write the whole response to C{request}.

        Returns once C{request.finish()} has been called or the client went away. When the
        running coroutine is cancelled during a streamed body, the file is closed, the
        producer is detached, and L{CancelledError<twisted.internet.defer.CancelledError>}
        propagates with the response unfinished.

        @param request: The request to answer.
        """
        response: _Response = request
        method = response.method
        if method != b"GET" and method != b"HEAD":
            response.setHeader(b"Allow", _ALLOW)
            _answer(response, 405, _METHOD_NOT_ALLOWED)
            return

        path = response.path
        if self._strip_prefix is not None and path.startswith(self._strip_prefix):
            path = path[len(self._strip_prefix) :]
        names = _decode_segments(path)
        if names is None:
            _answer(response, 404, _NOT_FOUND)
            return

        target = self._open_target(names, path.endswith(b"/"))
        if target is None and names and self._spa_fallback and "." not in names[-1]:
            target = self._open_index(self._root_base)
        if target is None:
            _answer(response, 404, _NOT_FOUND)
            return

        fd, info, name = target
        producer: _FileProducer | None = None
        try:
            producer = self._respond(response, fd, info, name)
        finally:
            if producer is None:
                os.close(fd)
        if producer is not None:
            await producer.done

    def _open_target(self, names: list[str], want_directory: bool) -> _Target | None:
        """
        Open the regular file that the decoded segments name, or the index of the
        directory they name.

        @param names: Decoded, already vetted path segments.
        @param want_directory: The path ended with C{/}, so a plain file does not match.
        @return: The open file, or L{None} on a miss.
        """
        if not names:
            return self._open_index(self._root_base)
        real = self._resolve(self._root_base, names)
        if real is None:
            return None
        found = _open_real(real)
        if found is None:
            return None
        fd, info = found
        if stat.S_ISREG(info.st_mode) and not want_directory:
            return fd, info, names[-1]
        os.close(fd)
        if not stat.S_ISDIR(info.st_mode):
            return None
        return self._open_index(real)

    def _open_index(self, directory: str) -> _Target | None:
        """
        Open the index file of a directory inside the root.

        @param directory: The directory's real path (C{""} for C{/}).
        @return: The open index, or L{None} when it is missing or not a regular file.
        """
        real = self._resolve(directory, self._index_parts)
        if real is None:
            return None
        found = _open_real(real)
        if found is None:
            return None
        fd, info = found
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return fd, info, self._index_name

    def _resolve(self, directory: str, names: Sequence[str]) -> str | None:
        """
        The real path of C{names} under C{directory}, if it stays inside the root.

        Only the components below C{directory} are examined (it is real already), and
        the full C{realpath} runs only once a symbolic link turns up, which is what makes
        this cheaper than resolving the whole path on every request.

        @param directory: A real path inside the root (C{""} for C{/}).
        @param names: Plain names: no separators, never C{.} or C{..}.
        @return: The real path, or L{None} when a component is missing or a link leads
            outside the root.
        """
        path = directory
        for position, name in enumerate(names):
            path = f"{path}/{name}"
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None
            if stat.S_ISLNK(mode):
                real = os.path.realpath(os.path.join(path, *names[position + 1 :]))
                if real == self._root or real.startswith(self._root_prefix):
                    return real
                return None
        return path

    def _etag(self, fd: int, info: os.stat_result) -> bytes:
        """
        The file's strong entity tag: size and content hash up to L{ETAG_HASH_LIMIT}
        bytes, else size and modification time.
        """
        size = info.st_size
        if size > ETAG_HASH_LIMIT:
            return b'"%x-%x"' % (size, info.st_mtime_ns)
        key = (info.st_dev, info.st_ino, size, info.st_mtime_ns, info.st_ctime_ns)
        etag = self._etags.get(key)
        if etag is None:
            etag = _content_etag(fd, info)
            if etag is None:
                # Changing while it was read: this answer's tag cannot be cached.
                return b'"%x-%x"' % (size, info.st_mtime_ns)
            if len(self._etags) >= _ETAG_CACHE_SIZE:
                self._etags.clear()
            self._etags[key] = etag
        return etag

    def _respond(
        self, request: _Response, fd: int, info: os.stat_result, name: str
    ) -> _FileProducer | None:
        """
        Answer with the open file: preconditions, range, headers and body.

        @param request: The request to answer.
        @param fd: The open file; the caller closes it unless a producer is returned.
        @param info: The file's status.
        @param name: The file name that picks the content type and the caching rule.
        @return: The producer now streaming the body and owning C{fd}, if one was needed.
        """
        size = info.st_size
        modified = info.st_mtime_ns // 1_000_000_000
        etag = self._etag(fd, info)
        headers = request.requestHeaders

        if_match = headers.getRawHeaders(b"if-match")
        if if_match is not None:
            if not _etag_listed(b",".join(if_match), etag, weak=False):
                _answer(request, 412, _PRECONDITION_FAILED)
                return None
        else:
            since = _single_date(headers.getRawHeaders(b"if-unmodified-since"))
            if since is not None and modified > since:
                _answer(request, 412, _PRECONDITION_FAILED)
                return None

        if_none_match = headers.getRawHeaders(b"if-none-match")
        if if_none_match is not None:
            not_modified = _etag_listed(b",".join(if_none_match), etag, weak=True)
        else:
            since = _single_date(headers.getRawHeaders(b"if-modified-since"))
            not_modified = since is not None and modified <= since

        span: tuple[int, int] | _Range = _Range.IGNORE
        if not not_modified:
            range_value = _single(headers.getRawHeaders(b"range"))
            if range_value is not None and _if_range_holds(
                headers.getRawHeaders(b"if-range"), etag, modified
            ):
                span = _parse_range(range_value, size)
            if span is _Range.UNSATISFIABLE:
                request.setHeader(b"Accept-Ranges", _BYTES)
                request.setHeader(b"Content-Range", b"bytes */%d" % size)
                _answer(request, 416, _RANGE_NOT_SATISFIABLE)
                return None

        request.setHeader(b"ETag", etag)
        request.setHeader(b"Last-Modified", _http_date(modified))
        cache_control = _NO_CACHE if name == self._index_name else self._cache_control
        if cache_control is not None:
            request.setHeader(b"Cache-Control", cache_control)
        if not_modified:
            request.setResponseCode(304)
            request.finish()
            return None

        if isinstance(span, tuple):
            start, end = span
            request.setResponseCode(206)
            request.setHeader(b"Content-Range", b"bytes %d-%d/%d" % (start, end - 1, size))
        else:
            start, end = 0, size
        length = end - start
        dot = name.rfind(".")
        content_type = (
            self._types.get(name[dot:].lower(), _OCTET_STREAM) if dot >= 0 else _OCTET_STREAM
        )
        request.setHeader(b"Content-Type", content_type)
        request.setHeader(b"Content-Length", b"%d" % length)
        request.setHeader(b"Accept-Ranges", _BYTES)

        if request.method == b"HEAD" or length == 0:
            request.finish()
            return None
        if length <= SMALL_FILE_LIMIT:
            body = _read_span(fd, start, length)
            request.write(body)
            if len(body) < length:
                _truncated(request, name)
            else:
                request.finish()
            return None
        producer = _FileProducer(request, fd, start, length, name)
        request.registerProducer(producer, False)
        return producer


def _content_etag(fd: int, info: os.stat_result) -> bytes | None:
    """
    C{"size-hash"} for the open file, or L{None} when it changed while being read.
    """
    size = info.st_size
    try:
        data = _read_span(fd, 0, size)
        after = os.fstat(fd)
    except OSError:
        return None
    if len(data) != size or (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (
        size,
        info.st_mtime_ns,
        info.st_ctime_ns,
    ):
        return None
    digest = hashlib.blake2b(data, digest_size=16).hexdigest().encode("ascii")
    return b'"%x-%s"' % (size, digest)


def _open_real(path: str) -> tuple[int, os.stat_result] | None:
    """
    Open a resolved path without following a link at its end.

    @param path: A real path inside the root.
    @return: The descriptor and its status, or L{None} when it cannot be opened.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    return fd, info


def _decode_segments(path: bytes) -> list[str] | None:
    """
    Split and percent-decode a raw request path.

    @param path: The raw path, after prefix stripping.
    @return: The non-empty segments, decoded; L{None} when any segment is a dot segment,
        a dotfile, invalid UTF-8, or hides a separator or NUL.
    """
    names: list[str] = []
    for raw in path.split(b"/"):
        if not raw:
            continue
        segment = unquote_to_bytes(raw) if b"%" in raw else raw
        if segment[:1] == b"." or b"/" in segment or b"\\" in segment or b"\0" in segment:
            return None
        try:
            names.append(segment.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return names


def _if_range_holds(values: Sequence[bytes] | None, etag: bytes, modified: int) -> bool:
    """
    Whether C{If-Range} lets the C{Range} header apply (RFC 9110 section 13.1.5).

    @param values: The C{If-Range} field lines, if any.
    @param etag: The file's strong entity tag.
    @param modified: The file's modification time, whole seconds.
    @return: C{True} without C{If-Range}, or when it names the current file.
    """
    if values is None:
        return True
    if len(values) != 1:
        return False
    validator = values[0].strip()
    if validator.startswith(b'"'):
        return validator == etag
    if validator.startswith(b"W/"):
        return False
    return _parse_date(validator) == modified


def _answer(request: _Response, code: int, body: bytes) -> None:
    """
    Finish C{request} with a short C{text/plain} error body.

    @param request: The request to answer.
    @param code: The status code.
    @param body: The body, a few ASCII words.
    """
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", _TEXT_PLAIN)
    request.setHeader(b"Content-Length", b"%d" % len(body))
    request.write(body)
    request.finish()


def _single(values: Sequence[bytes] | None) -> bytes | None:
    """
    The value of a header that must appear once.

    @param values: The header's field lines.
    @return: The only value, or L{None} when absent or repeated (then it is ignored).
    """
    if values is None or len(values) != 1:
        return None
    return values[0]


def _single_date(values: Sequence[bytes] | None) -> int | None:
    """
    The HTTP date of a header that must appear once.

    @param values: The header's field lines.
    @return: Seconds since the epoch, or L{None} when absent, repeated or not a date.
    """
    value = _single(values)
    return None if value is None else _parse_date(value)


def _parse_date(value: bytes) -> int | None:
    """
    Parse an HTTP date (IMF-fixdate and the two obsolete forms).

    @param value: The header value.
    @return: Seconds since the epoch, or L{None} when it is not a date.
    """
    try:
        return int(_parse_http_date(value.strip()))
    except Exception:
        # The parser reports malformed input through several exception types; any of
        # them means "not a date", which RFC 9110 says to ignore.
        return None


def _etag_listed(value: bytes, etag: bytes, weak: bool) -> bool:
    """
    Whether an C{If-Match} / C{If-None-Match} list selects the current file.

    @param value: The field value: C{*} or a comma-separated list of entity tags.
    @param etag: The file's strong entity tag.
    @param weak: Use weak comparison (C{If-None-Match}); otherwise strong (C{If-Match}).
    @return: C{True} when the list is C{*} or contains a tag that matches.
    """
    if value.strip() == b"*":
        return True
    for candidate in value.split(b","):
        tag = candidate.strip()
        if tag.startswith(b"W/"):
            if not weak:
                continue
            tag = tag[2:]
        if tag == etag:
            return True
    return False


def _parse_range(value: bytes, size: int) -> tuple[int, int] | _Range:
    """
    Interpret a C{Range} header for a file of C{size} bytes.

    @param value: The field value.
    @param size: The file size.
    @return: The half-open span C{(start, end)} to send, L{_Range.UNSATISFIABLE}, or
        L{_Range.IGNORE} for a malformed value, another unit, or several ranges.
    """
    unit, equals, ranges = value.partition(b"=")
    if not equals or unit.strip().lower() != b"bytes" or b"," in ranges:
        return _Range.IGNORE
    first, dash, last = ranges.partition(b"-")
    if not dash:
        return _Range.IGNORE
    # Lenient about blanks around the numbers, as Go's net/http is.
    first = first.strip()
    last = last.strip()
    if first:
        if not first.isdigit() or (last and not last.isdigit()):
            return _Range.IGNORE
        start = _position(first)
        end = _position(last) if last else _HUGE
        if end < start:
            return _Range.IGNORE
        if start >= size:
            return _Range.UNSATISFIABLE
        return start, min(end + 1, size)
    if not last.isdigit():
        return _Range.IGNORE
    suffix = _position(last)
    if suffix == 0 or size == 0:
        return _Range.UNSATISFIABLE
    return max(size - suffix, 0), size


def _position(digits: bytes) -> int:
    """
    A byte position from ASCII digits, capped at L{_HUGE}.

    @param digits: One or more ASCII digits.
    @return: The number, or L{_HUGE} when it has more digits than any file size.
    """
    return _HUGE if len(digits) > 18 else int(digits)


def _read_span(fd: int, offset: int, length: int) -> bytes:
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


def _truncated(request: _Response, name: str) -> None:
    """
    Give up on a body that cannot be completed: the file shrank or failed to read.

    @param request: The request whose response is cut short.
    @param name: The file name, for the log.
    """
    _log.warn("static file {name} shrank or failed while being sent", name=name)
    request.loseConnection()


@implementer(IPullProducer)
class _FileProducer:
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

    def __init__(self, request: _Response, fd: int, offset: int, length: int, name: str) -> None:
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
            _truncated(request, self._name)
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
