"""
Compression on the fly: the response-side stage of the server layer.

A route whose responses may be compressed gives each request a L{ResponseCoding}
(L{CompressionPolicy.offer}, when the route starts): the coding the client prefers among
the gateway's, chosen from its C{Accept-Encoding}. The request hands the coding its
output calls once no response filter (the response plugins) holds them, so plugins see
the identity body, and the coding decides as the head goes out (the first write, or the
finish of an empty response) whether the body is compressed:

  - never a 1xx, 204, 206 or 304 response, an empty body, a C{HEAD} body (the head is
    the one a C{GET} would get: C{Content-Encoding}, the variant C{ETag}, no
    C{Content-Length}), a type outside the policy's types (C{text/event-stream} never), a
    body already encoded, one a C{Cache-Control: no-transform} protects, the answer to a
    C{Range} request, a body whose known length is under C{minSize}, or a streamed body
    to an HTTP/1.0 client (it would be delimited by the connection's close alone);
  - C{Vary: Accept-Encoding} on every response whose type could be compressed (the
    identity answer too) and every 304 whose type is unknown or could be;
  - compressed: C{Content-Encoding} set, C{Content-Length} the encoded length when the
    whole body came in one write, else dropped, C{Accept-Ranges} dropped (ranges are
    answered from the identity body), digests of the identity body dropped, and a strong
    C{ETag} made the coding's variant (C{"abc"} -> C{"abc-br"}).

On the request side, the chosen coding's variant tags in C{If-None-Match} (strong, or
their weak form) and C{If-Match} are turned back into the base tags the handler or
backend knows, so that either tag gives a 304; a 304 whose tag was sent as a variant
carries the variant again. (A backend whose own tags end in the same suffix, C{"v1-br"},
is read as if they were variants: a conditional request naming C{"v1-br"} is then
evaluated against C{"v1"}; Caddy's C{encode} reads them so too.)

An encoder that fails (it cannot allocate its memory) before anything of the body is
sent leaves the response as it is, uncompressed; one that fails later drops the client
connection, so that the client sees a broken transfer. Either is logged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from twisted.logger import Logger
from twisted.web.server import Request

from edgegw.compression.accept import AcceptedCodings
from edgegw.compression.codings import CODINGS, Coding, Encoder
from edgegw.compression.static_cache import FileVersion, StaticBodyCache
from edgegw.stream.boundary import abort_client

__all__ = [
    "HOLD_LIMIT",
    "CompressionPolicy",
    "ResponseCoding",
    "attach_coding",
    "compresses_whole",
    "media_type_matcher",
]

_log = Logger(namespace="edgegw.compression")

_EVENT_STREAM: Final = b"text/event-stream"
_VARY_VALUE: Final = b"Accept-Encoding"
_TYPE_CACHE_SIZE: Final = 256
_TYPE_CACHED_LENGTH: Final = 128
# Digests of the body as the handler wrote it (RFC 3230 Digest is of the content as
# sent, encoded: the backend's no longer holds either).
_DIGESTS: Final = (b"content-md5", b"content-digest", b"repr-digest", b"digest")
_NO_TRANSFORM: Final = re.compile(rb"(?:^|[\s,])no-transform(?:$|[\s,=])", re.IGNORECASE)
_VARY_TOKENS: Final = re.compile(rb"(?:^|[\s,])(?:accept-encoding|\*)(?:$|[\s,])", re.IGNORECASE)
_NOTHING: Final[frozenset[bytes]] = frozenset()

HOLD_LIMIT: Final = 256 * 1024
"""
A body of known length up to this many bytes that would be compressed is worth reading
whole before it is written (L{compresses_whole}): it is then compressed at once and sent
with its length, where written in pieces it would be flushed after each and chunked.
"""


def media_type_matcher(types: Sequence[str]) -> tuple[frozenset[bytes], tuple[bytes, ...]]:
    """
    The exact media types and the C{type/} prefixes (from C{type/*}) of C{types}.
    """
    exact = frozenset(t.lower().encode("ascii") for t in types if not t.endswith("/*"))
    prefixes = tuple(t[:-1].lower().encode("ascii") for t in types if t.endswith("/*"))
    return exact, prefixes


class CompressionPolicy:
    """
    What one configuration compresses: its codings in order of preference, the smallest
    body compressed, the media types. Built once per configuration.
    """

    def __init__(
        self,
        encodings: Sequence[str],
        min_size: int,
        types: Sequence[str],
        static_cache_size: int = 0,
    ) -> None:
        """
        @param encodings: Names of L{CODINGS}, the gateway's preferred first.
        @param min_size: A body of known length under this many bytes is not compressed.
        @param types: Media types (C{text/*}: every C{text/} type) whose bodies are.
        @param static_cache_size: The bytes of static files' compressed bodies kept
            (L{StaticBodyCache}; 0: none kept, each compressed per request).
        """
        self.accepted = AcceptedCodings(encodings)
        self.min_size = min_size
        self.static_cache = StaticBodyCache(static_cache_size) if static_cache_size > 0 else None
        self._exact, self._prefixes = media_type_matcher(types)
        self._types: dict[bytes, bool] = {}
        self._strippers = {name: _VariantStripper(CODINGS[name]) for name in encodings}
        self._identity = ResponseCoding(self, None, _NOTHING)

    def compressible(self, content_type: bytes) -> bool:
        """
        Whether a body of C{content_type} (parameters ignored) may be compressed.
        """
        known = self._types.get(content_type)
        if known is None:
            media = content_type.partition(b";")[0].strip().lower()
            known = media != _EVENT_STREAM and (
                media in self._exact or media.startswith(self._prefixes)
            )
            if len(content_type) <= _TYPE_CACHED_LENGTH:
                if len(self._types) >= _TYPE_CACHE_SIZE:
                    self._types.clear()
                self._types[content_type] = known
        return known

    def offer(self, request: Any) -> ResponseCoding:
        """
        The coding of C{request}'s response: the client's preferred coding, its variant
        tags in the request's preconditions turned into base tags.
        """
        headers = request.requestHeaders
        name = self.accepted.best(headers.getRawHeaders(b"accept-encoding"))
        if name is None:
            return self._identity
        stripper = self._strippers[name]
        variants = stripper.strip(headers, b"if-none-match", weak=True)
        stripper.strip(headers, b"if-match", weak=False)
        return ResponseCoding(self, stripper.coding, variants)


class _VariantStripper:
    """
    Turns one coding's variant entity tags back into base tags.
    """

    def __init__(self, coding: Coding) -> None:
        self.coding = coding
        self._suffix = coding.etag_suffix + b'"'
        suffix = re.escape(coding.etag_suffix)
        # A tag (strong, or also weak) ending in the suffix, where a tag may start.
        self._strong = re.compile(rb'(^|[\s,])()"([^"]*)' + suffix + rb'"')
        self._any = re.compile(rb'(^|[\s,])(W/)?"([^"]*)' + suffix + rb'"')

    def strip(self, headers: Any, name: bytes, *, weak: bool) -> frozenset[bytes]:
        """
        Turn the variant tags of field C{name} into base tags.

        @param weak: Whether weak tags are turned too (C{If-None-Match}'s weak
            comparison matches them).
        @return: The opaque parts (C{abc}) of the tags that were variants.
        """
        values = headers.getRawHeaders(name)
        if not values:
            return _NOTHING
        field = values[0] if len(values) == 1 else b",".join(values)
        if self._suffix not in field:
            return _NOTHING
        pattern = self._any if weak else self._strong
        bases = frozenset(match.group(3) for match in pattern.finditer(field))
        if not bases:
            return _NOTHING
        headers.setRawHeaders(name, [pattern.sub(rb'\1\2"\3"', field)])
        return bases


class ResponseCoding:
    """
    One response's compression: decided as its head goes out, then applied to each write.

    The request (L{GatewayRequest<edgegw.server.request.GatewayRequest>}) calls
    L{write}, L{finish} and L{whole} instead of writing itself while no response filter
    is installed; each ends in the methods of Twisted's L{Request} (the head goes out with
    the first write, as always). Once it has decided to send the body as it is, the
    coding takes itself off the request: the rest goes straight out. A coding without a
    coding to compress with (the client accepts none) holds nothing of its response until
    then, so one is shared by all such requests (L{CompressionPolicy.offer}).
    """

    __slots__ = ("_coding", "_encoder", "_failed", "_policy", "_variants")

    def __init__(
        self, policy: CompressionPolicy, coding: Coding | None, variants: frozenset[bytes]
    ) -> None:
        """
        @param variants: The opaque parts of the tags the client sent as variants of
            C{coding} in C{If-None-Match}.
        """
        self._policy = policy
        self._coding = coding
        self._variants = variants
        self._encoder: Encoder | None = None
        self._failed = False

    @property
    def coding(self) -> Coding | None:
        """
        The coding the client prefers (L{None}: none of the gateway's).
        """
        return self._coding

    def write(self, request: Any, data: bytes) -> None:
        """
        Write C{data} of the body, compressed when the response is.
        """
        encoder = self._encoder
        if encoder is not None:
            try:
                data = encoder.compress(data) if data else data
            except Exception:
                self._fail(request)
                return
            Request.write(request, data)
            return
        if self._failed:
            return
        lengths = request.responseHeaders.getRawHeaders(b"content-length")
        # The whole body in one write: compressed at once, sent with its length.
        if lengths and data and lengths[0] == b"%d" % len(data):
            Request.write(request, self.whole(request, data))
            return
        request.response_coding = None
        length = _length(lengths)
        coding = self._choose(request, length)
        if coding is None:
            Request.write(request, data)
            return
        if _head_only(request):
            _apply(request.responseHeaders, coding)
            Request.write(request, data)
            return
        if request.clientproto == b"HTTP/1.0":
            # No chunks: the end of a compressed stream of unknown length would be the
            # connection's close alone, which a cut transfer looks like too.
            Request.write(request, data)
            return
        try:
            encoder = coding.encoder(length)
            first = encoder.compress(data) if data else data
        except Exception:
            _log.failure("the {coding} encoder failed: the body goes as it is", coding=coding.name)
            Request.write(request, data)
            return
        self._encoder = encoder
        request.response_coding = self
        _apply(request.responseHeaders, coding)
        Request.write(request, first)

    def finish(self, request: Any) -> None:
        """
        Finish the response (its encoder's last bytes first).
        """
        if self._failed:
            # The connection is being dropped: no end of the body may follow.
            return
        request.response_coding = None
        encoder = self._encoder
        if encoder is not None:
            self._encoder = None
            try:
                tail = encoder.finish()
            except Exception:
                self._fail(request)
                return
            if tail:
                Request.write(request, tail)
        else:
            headers = request.responseHeaders
            if _head_only(request):
                # The head a GET would get: its length is the one the handler announced.
                coding = self._choose(request, _length(headers.getRawHeaders(b"content-length")))
                if coding is not None:
                    _apply(headers, coding)
            else:
                # Nothing was written: an empty body, which is never compressed.
                self._choose(request, 0)
        Request.finish(request)

    def whole(self, request: Any, body: bytes) -> bytes:
        """
        C{body} is the whole body, nothing of it written yet: decide, and return what to
        send (compressed, with its C{Content-Length} set, when the response is).
        """
        request.response_coding = None
        coding = self._choose(request, len(body))
        if coding is None:
            return body
        if _head_only(request):
            _apply(request.responseHeaders, coding)
            return body
        return self._compressed(request, coding, body)

    def write_cached(
        self,
        request: Any,
        version: FileVersion,
        length: int,
        read: Callable[[], bytes | None],
    ) -> bool:
        """
        Answer with a static file's body compressed whole, from the policy's
        L{StaticBodyCache} (compressed and stored first on a miss), when the response
        would be compressed and the file is one the cache takes; the head is made the
        compressed body's (as L{whole} makes it) and the response finished.

        Nothing is done (C{False}) when the response would not be compressed, the
        policy keeps no cache, the file is over the cache's L{entry limit
        <StaticBodyCache.entry_limit>}, a response filter is installed (a response plugin's
        hooks run on the head first and may forbid the transform), or the file
        could not be read whole unchanged (C{read} gave L{None}): the caller then writes
        the body as it would have.

        @param version: What identifies the file's version (never from the request).
        @param length: The file's size, the whole body's length.
        @param read: The file's bytes, or L{None} if it changed while being read.
        @return: Whether the response was answered.
        """
        cache = self._policy.static_cache
        coding = self._coding
        if (
            cache is None
            or coding is None
            or length > cache.entry_limit
            or request.response_filter is not None
            or request.startedWriting
            or _head_only(request)
            or self._choose(request, length, mark=False) is None
        ):
            return False

        def compress() -> bytes | None:
            body = read()
            if body is None:
                return None
            try:
                return coding.whole(body)
            except Exception:
                # The request's own path compresses (and logs) it again, or sends it as
                # it is.
                return None

        encoded = cache.body(version, coding.name, compress)
        if encoded is None:
            return False
        request.response_coding = None
        self._choose(request, length)
        headers = request.responseHeaders
        _apply(headers, coding)
        headers.setRawHeaders(b"content-length", [b"%d" % len(encoded)])
        request.write_whole(encoded)
        return True

    def _compressed(self, request: Any, coding: Coding, body: bytes) -> bytes:
        """
        C{body} compressed at once and the head made its own (as it is, should the
        encoder fail).
        """
        try:
            encoded = coding.whole(body)
        except Exception:
            _log.failure("the {coding} encoder failed: the body goes as it is", coding=coding.name)
            return body
        headers = request.responseHeaders
        _apply(headers, coding)
        headers.setRawHeaders(b"content-length", [b"%d" % len(encoded)])
        return encoded

    def _fail(self, request: Any) -> None:
        """
        The encoder failed once part of the body was sent: drop the connection.
        """
        coding = self._coding
        _log.failure(
            "the {coding} encoder failed mid-body: the connection is dropped",
            coding=coding.name if coding is not None else "",
        )
        self._encoder = None
        self._failed = True
        request.response_coding = self
        abort_client(request)

    def would_compress(self, request: Any, length: int | None) -> bool:
        """
        Whether the body, were it written now, would be compressed (nothing is changed).

        @param length: The identity body's length, when known.
        """
        return self._choose(request, length, mark=False) is not None

    def _choose(self, request: Any, length: int | None, mark: bool = True) -> Coding | None:
        """
        Whether the body is compressed, with which coding; set C{Vary} (and a 304's tag)
        unless C{mark} is false.

        @param length: The identity body's length, when known.
        """
        code = request.code
        headers = request.responseHeaders
        if mark and request.etag is not None:
            # Twisted would add it after this decision, as it was set (setETag).
            headers.setRawHeaders(b"etag", [request.etag])
            request.etag = None
        policy = self._policy
        types = headers.getRawHeaders(b"content-type")
        if code == 304:
            if not mark:
                return None
            if not types or policy.compressible(types[0]):
                _add_vary(headers)
            coding = self._coding
            # Not for a representation encoded already (a precompressed file): its tag
            # is its own.
            if (
                self._variants
                and coding is not None
                and not headers.getRawHeaders(b"content-encoding")
            ):
                _variant_tag(headers, coding, self._variants)
            return None
        if code < 200 or code == 204 or code == 206:
            return None
        if not types or not policy.compressible(types[0]):
            return None
        if mark:
            _add_vary(headers)
        coding = self._coding
        if (
            coding is None
            or headers.getRawHeaders(b"content-encoding")
            # An empty body stays empty (minSize 0 included): no coding's stream is.
            or (length is not None and (length == 0 or length < policy.min_size))
            or request.requestHeaders.getRawHeaders(b"range")
        ):
            return None
        cache_control = headers.getRawHeaders(b"cache-control")
        if cache_control and any(_NO_TRANSFORM.search(value) for value in cache_control):
            return None
        return coding


def _apply(headers: Any, coding: Coding) -> None:
    """
    Make the head that of the body compressed with C{coding}.
    """
    headers.setRawHeaders(b"content-encoding", [coding.token])
    headers.removeHeader(b"content-length")
    headers.removeHeader(b"accept-ranges")
    for name in _DIGESTS:
        headers.removeHeader(name)
    _variant_tag(headers, coding, None)


def _head_only(request: Any) -> bool:
    # A HEAD, or a HEAD Twisted answers by rendering a GET and dropping its body.
    return request.method == b"HEAD" or bool(request.rewritesBody())


def _length(values: list[bytes] | None) -> int | None:
    if values and values[0].isdigit():
        return int(values[0])
    return None


def _add_vary(headers: Any) -> None:
    values = headers.getRawHeaders(b"vary")
    if not values:
        headers.setRawHeaders(b"vary", [_VARY_VALUE])
    elif not any(_VARY_TOKENS.search(value) for value in values):
        headers.setRawHeaders(b"vary", [*values, _VARY_VALUE])


def _variant_tag(headers: Any, coding: Coding, only: frozenset[bytes] | None) -> None:
    """
    Make a strong C{ETag} the coding's variant (when C{only} is given: if its opaque
    part is one of them).
    """
    tags = headers.getRawHeaders(b"etag")
    if tags:
        tag = tags[0]
        strong = len(tag) >= 2 and tag[:1] == b'"' and tag[-1:] == b'"'
        if strong and (only is None or tag[1:-1] in only):
            headers.setRawHeaders(b"etag", [tag[:-1] + coding.etag_suffix + b'"'])


def compresses_whole(request: Any, length: int) -> bool:
    """
    Whether C{request}'s response, whose head is set and whose body is C{length} bytes,
    would be compressed, and is short enough (L{HOLD_LIMIT}) to be read whole first.
    """
    coding = getattr(request, "response_coding", None)
    return length <= HOLD_LIMIT and coding is not None and coding.would_compress(request, length)


def attach_coding(request: Any, coding: ResponseCoding) -> None:
    """
    Have C{request}'s response go through C{coding} (a request that cannot, a test's
    stand-in, is left as it is).
    """
    if hasattr(type(request), "response_coding"):
        request.response_coding = coding
