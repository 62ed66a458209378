"""
L{StaticHandler}, the C{static} terminal: the request's path looked up in the tree, the
preconditions and range applied to the file found, the headers and the body written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from twisted.logger import Logger
from twisted.web.http import datetimeToString
from twisted.web.server import Request

from edgegw.compression.accept import AcceptedCodings
from edgegw.compression.codings import CODINGS
from edgegw.config.model import DEFAULT_PRECOMPRESSED, StaticHandlerSpec
from edgegw.handlers.static.conditional import (
    Range,
    etag_listed,
    if_range_holds,
    parse_range,
    single,
    single_date,
)
from edgegw.handlers.static.content_types import OCTET_STREAM, content_types
from edgegw.handlers.static.file_body import (
    SMALL_FILE_LIMIT,
    EntityTags,
    FileProducer,
    Response,
    read_span,
    read_unchanged,
    truncated,
)
from edgegw.handlers.static.lookup import StaticTree, decode_segments
from edgegw.terminal.exchange import IExchange
from edgegw.terminal.resource import TerminalResource

__all__ = ["StaticHandler"]

# The namespace of the one module this package was: the log lines stay as they were.
_log = Logger(namespace="edgegw.handlers.static")

_http_date: Callable[[float], bytes] = datetimeToString

_TEXT_PLAIN: Final = b"text/plain; charset=utf-8"
_NO_CACHE: Final = b"no-cache"
_PRIVATE: Final = b"private"
_BYTES: Final = b"bytes"
_ALLOW: Final = b"GET, HEAD"
_ACCEPT_ENCODING: Final = b"Accept-Encoding"

_NOT_FOUND: Final = b"not found"
_METHOD_NOT_ALLOWED: Final = b"method not allowed"
_PRECONDITION_FAILED: Final = b"precondition failed"
_RANGE_NOT_SATISFIABLE: Final = b"range not satisfiable"


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
        self._tree = StaticTree(spec.dir, spec.index)
        self._index = spec.index
        self._index_name = self._tree.index_name
        self._spa_fallback = spec.spa_fallback
        self._strip_prefix = spec.strip_prefix.encode("utf-8") if spec.strip_prefix else None
        self._cache_control = (
            spec.cache_control.encode("latin-1") if spec.cache_control is not None else None
        )
        self._types = content_types()
        self._etags = EntityTags()
        self._precompressed = AcceptedCodings(spec.precompressed) if spec.precompressed else None
        if not os.path.isdir(self._tree.root):
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
        if self._spec.precompressed != DEFAULT_PRECOMPRESSED:
            listed = "/".join(self._spec.precompressed)
            parts.append(f"precompressed {listed}" if listed else "no precompressed")
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
        response: Response = request
        method = response.method
        if method != b"GET" and method != b"HEAD":
            response.setHeader(b"Allow", _ALLOW)
            _answer(response, 405, _METHOD_NOT_ALLOWED)
            return

        path = response.path
        if self._strip_prefix is not None and path.startswith(self._strip_prefix):
            path = path[len(self._strip_prefix) :]
        names = decode_segments(path)
        if names is None:
            _answer(response, 404, _NOT_FOUND)
            return

        tree = self._tree
        target = tree.open_target(names, path.endswith(b"/"))
        if target is None and names and self._spa_fallback and "." not in names[-1]:
            target = tree.open_index(tree.base)
        if target is None:
            _answer(response, 404, _NOT_FOUND)
            return

        fd, info, name, real = target
        producer: FileProducer | None = None
        try:
            encoding: bytes | None = None
            if self._precompressed is not None:
                fd, info, encoding = self._sidecar(response, fd, info, real)
            producer = self._respond(response, fd, info, name, encoding, real)
        finally:
            if producer is None:
                os.close(fd)
        if producer is not None:
            await producer.done

    def _sidecar(
        self, request: Response, fd: int, info: os.stat_result, real: str
    ) -> tuple[int, os.stat_result, bytes | None]:
        """
        The file to send: the precompressed sidecar the client accepts best, when there
        is one at least as new as the file (which is closed then), else the file.

        @return: The open file, its status, and its C{Content-Encoding} (L{None}: the
            file itself).
        """
        assert self._precompressed is not None
        ranked = self._precompressed.ranked(
            request.requestHeaders.getRawHeaders(b"accept-encoding")
        )
        for name in ranked:
            coding = CODINGS[name]
            found = self._tree.open_sidecar(real, coding.sidecar)
            if found is None:
                continue
            sidecar_fd, sidecar_info = found
            if sidecar_info.st_mtime_ns < info.st_mtime_ns or sidecar_info.st_size == 0:
                # Older than the file (left from a build before it), or empty (no
                # coding's stream is): never served.
                os.close(sidecar_fd)
                continue
            os.close(fd)
            return sidecar_fd, sidecar_info, coding.token
        return fd, info, None

    def _respond(
        self,
        request: Response,
        fd: int,
        info: os.stat_result,
        name: str,
        encoding: bytes | None = None,
        real: str | None = None,
    ) -> FileProducer | None:
        """
        Answer with the open file: preconditions, range, headers and body.

        @param request: The request to answer.
        @param fd: The open file; the caller closes it unless a producer is returned.
        @param info: The file's status.
        @param name: The file name that picks the content type and the caching rule.
        @param encoding: The C{Content-Encoding} of a precompressed sidecar in C{fd}.
        @param real: The file's real path (L{None}: its compressed body is not cached).
        @return: The producer now streaming the body and owning C{fd}, if one was needed.
        """
        if self._precompressed is not None:
            # What is sent depends on Accept-Encoding, on every answer about the file.
            request.setHeader(b"Vary", _ACCEPT_ENCODING)
        size = info.st_size
        modified = info.st_mtime_ns // 1_000_000_000
        etag = self._etags.tag(fd, info)
        headers = request.requestHeaders

        if_match = headers.getRawHeaders(b"if-match")
        if if_match is not None:
            if not etag_listed(b",".join(if_match), etag, weak=False):
                _answer(request, 412, _PRECONDITION_FAILED)
                return None
        else:
            since = single_date(headers.getRawHeaders(b"if-unmodified-since"))
            if since is not None and modified > since:
                _answer(request, 412, _PRECONDITION_FAILED)
                return None

        if_none_match = headers.getRawHeaders(b"if-none-match")
        if if_none_match is not None:
            not_modified = etag_listed(b",".join(if_none_match), etag, weak=True)
        else:
            since = single_date(headers.getRawHeaders(b"if-modified-since"))
            not_modified = since is not None and modified <= since

        span: tuple[int, int] | Range = Range.IGNORE
        if not not_modified:
            range_value = single(headers.getRawHeaders(b"range"))
            if range_value is not None and if_range_holds(
                headers.getRawHeaders(b"if-range"), etag, modified
            ):
                span = parse_range(range_value, size)
            if span is Range.UNSATISFIABLE:
                request.setHeader(b"Accept-Ranges", _BYTES)
                request.setHeader(b"Content-Range", b"bytes */%d" % size)
                _answer(request, 416, _RANGE_NOT_SATISFIABLE)
                return None

        if encoding is not None:
            request.setHeader(b"Content-Encoding", encoding)
        request.setHeader(b"ETag", etag)
        request.setHeader(b"Last-Modified", _http_date(modified))
        cache_control = _NO_CACHE if name == self._index_name else self._cache_control
        if cache_control is None and _authenticated(request):
            # A file behind a login is not for a shared cache to hand to anyone: the same
            # rule as the reverse-proxy's for a response without Cache-Control.
            cache_control = _PRIVATE
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
            self._types.get(name[dot:].lower(), OCTET_STREAM) if dot >= 0 else OCTET_STREAM
        )
        request.setHeader(b"Content-Type", content_type)
        request.setHeader(b"Content-Length", b"%d" % length)
        request.setHeader(b"Accept-Ranges", _BYTES)

        if request.method == b"HEAD" or length == 0:
            request.finish()
            return None
        coding = getattr(request, "response_coding", None)
        if (
            coding is not None
            and real is not None
            and encoding is None
            and length == size
            and coding.write_cached(
                request,
                (info.st_dev, info.st_ino, size, info.st_mtime_ns, info.st_ctime_ns),
                size,
                lambda: read_unchanged(fd, info),
            )
        ):
            # Compressed whole, once per file version and coding (the compression's
            # static cache); the head was made the compressed body's.
            return None
        if length <= SMALL_FILE_LIMIT:
            body = read_span(fd, start, length)
            request.write(body)
            if len(body) < length:
                truncated(request, name)
            else:
                request.finish()
            return None
        producer = FileProducer(request, fd, start, length, name)
        request.registerProducer(producer, False)
        return producer


def _answer(request: Response, code: int, body: bytes) -> None:
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


def _authenticated(request: Response) -> bool:
    """
    Whether C{request} carries a principal (its route's session stage set one).
    """
    # The request's own component lookup: half the cost of adapting through zope.
    get_component = getattr(request, "getComponent", None)
    exchange = get_component(IExchange) if get_component is not None else None
    return getattr(exchange, "principal", None) is not None
