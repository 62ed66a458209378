"""
Compression on the fly: the response-side stage of the server layer.

A route whose responses may be compressed gives each request a L{ResponseCoding}
(L{CompressionPolicy.offer}, when the route starts): the coding the client prefers among
the gateway's, chosen from its C{Accept-Encoding}. The request hands the coding its
output calls once no response filter (the response plugins) holds them, so plugins see
the identity body, and the coding decides as the head goes out (the first write, or the
finish of an empty response) whether the body is compressed:

  - never a 1xx, 204, 206 or 304 response, a C{HEAD} body (the head is the one a C{GET}
    would get: C{Content-Encoding}, the variant C{ETag}, no C{Content-Length}), a type
    outside the policy's types (C{text/event-stream} never), a body already encoded, one
    a C{Cache-Control: no-transform} protects, the answer to a C{Range} request, or a body
    whose known length is under C{minSize};
  - C{Vary: Accept-Encoding} on every response whose type could be compressed (the
    identity answer too) and every 304;
  - compressed: C{Content-Encoding} set, C{Content-Length} the encoded length when the
    whole body came in one write, else dropped, C{Accept-Ranges} dropped (ranges are
    answered from the identity body), digests of the identity body dropped, and a strong
    C{ETag} made the coding's variant (C{"abc"} -> C{"abc-br"}).

On the request side, the chosen coding's variant tags in C{If-None-Match} and C{If-Match}
are turned back into the base tags the handler or backend knows, so that either tag
gives a 304; a 304 answering a variant carries the variant tag again. (A backend whose
own tags end in the same suffix, C{"v1-br"}, is read as if they were variants: at worst
a 304 for a tag the client did not quite send; Caddy's C{encode} reads them so too.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from twisted.web.server import Request

from edgegw.compression.accept import AcceptedCodings
from edgegw.compression.codings import CODINGS, Coding, Encoder

__all__ = ["CompressionPolicy", "ResponseCoding", "attach_coding", "media_type_matcher"]

_EVENT_STREAM: Final = b"text/event-stream"
_VARY_VALUE: Final = b"Accept-Encoding"
_TYPE_CACHE_SIZE: Final = 256
_DIGESTS: Final = (b"content-md5", b"content-digest", b"repr-digest")
_NO_TRANSFORM: Final = re.compile(rb"(?:^|[\s,])no-transform(?:$|[\s,=])", re.IGNORECASE)
_VARY_TOKENS: Final = re.compile(rb"(?:^|[\s,])(?:accept-encoding|\*)(?:$|[\s,])", re.IGNORECASE)


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

    def __init__(self, encodings: Sequence[str], min_size: int, types: Sequence[str]) -> None:
        """
        @param encodings: Names of L{CODINGS}, the gateway's preferred first.
        @param min_size: A body of known length under this many bytes is not compressed.
        @param types: Media types (C{text/*}: every C{text/} type) whose bodies are.
        """
        self.accepted = AcceptedCodings(encodings)
        self.min_size = min_size
        self._exact, self._prefixes = media_type_matcher(types)
        self._types: dict[bytes, bool] = {}
        self._strippers = {name: _VariantStripper(CODINGS[name]) for name in encodings}
        self._identity = ResponseCoding(self, None, False)

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
        variant = stripper.strip(headers, b"if-none-match")
        stripper.strip(headers, b"if-match")
        return ResponseCoding(self, stripper.coding, variant)


class _VariantStripper:
    """
    Turns one coding's variant entity tags back into base tags.
    """

    def __init__(self, coding: Coding) -> None:
        self.coding = coding
        self._suffix = coding.etag_suffix + b'"'
        # A strong tag (not after "W/") ending in the suffix.
        self._pattern = re.compile(rb'(^|[\s,])"([^"]*)' + re.escape(coding.etag_suffix) + rb'"')

    def strip(self, headers: Any, name: bytes) -> bool:
        values = headers.getRawHeaders(name)
        if not values:
            return False
        field = values[0] if len(values) == 1 else b",".join(values)
        if self._suffix not in field:
            return False
        stripped, count = self._pattern.subn(rb'\1"\2"', field)
        if not count:
            return False
        headers.setRawHeaders(name, [stripped])
        return True


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

    __slots__ = ("_coding", "_encoder", "_policy", "_variant")

    def __init__(self, policy: CompressionPolicy, coding: Coding | None, variant: bool) -> None:
        self._policy = policy
        self._coding = coding
        self._variant = variant
        self._encoder: Encoder | None = None

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
        if encoder is None:
            lengths = request.responseHeaders.getRawHeaders(b"content-length")
            # The whole body in one write: compressed at once, sent with its length.
            if lengths and data and lengths[0] == b"%d" % len(data):
                Request.write(request, self.whole(request, data))
                return
            request.response_coding = None
            length = _length(lengths)
            coding = self._decide(request, length)
            if coding is None:
                Request.write(request, data)
                return
            encoder = self._encoder = coding.encoder(length)
            request.response_coding = self
        Request.write(request, encoder.compress(data) if data else data)

    def finish(self, request: Any) -> None:
        """
        Finish the response (its encoder's last bytes first).
        """
        request.response_coding = None
        encoder = self._encoder
        if encoder is not None:
            self._encoder = None
            tail = encoder.finish()
            if tail:
                Request.write(request, tail)
        elif _head_only(request):
            # The head a GET would get: its length is the one the handler announced.
            length = _length(request.responseHeaders.getRawHeaders(b"content-length"))
            self._decide(request, length)
        else:
            # Nothing was written: an empty body.
            self._decide(request, 0)
        Request.finish(request)

    def whole(self, request: Any, body: bytes) -> bytes:
        """
        C{body} is the whole body, nothing of it written yet: decide, and return what to
        send (compressed, with its C{Content-Length} set, when the response is).
        """
        request.response_coding = None
        coding = self._decide(request, len(body))
        if coding is None:
            return body
        encoded = coding.whole(body)
        request.responseHeaders.setRawHeaders(b"content-length", [b"%d" % len(encoded)])
        return encoded

    def _decide(self, request: Any, length: int | None) -> Coding | None:
        """
        Set the head's fields for the representation sent, and say whether the body is
        compressed, with which coding.

        @param length: The identity body's length, when known.
        """
        code = request.code
        headers = request.responseHeaders
        if request.etag is not None:
            # Twisted would add it after this decision, as it was set (setETag).
            headers.setRawHeaders(b"etag", [request.etag])
            request.etag = None
        if code == 304:
            _add_vary(headers)
            # Not for a representation encoded already (a precompressed file): its tag
            # is its own.
            if (
                self._variant
                and self._coding is not None
                and not headers.getRawHeaders(b"content-encoding")
            ):
                _variant_tag(headers, self._coding)
            return None
        if code < 200 or code == 204 or code == 206:
            return None
        policy = self._policy
        types = headers.getRawHeaders(b"content-type")
        if not types or not policy.compressible(types[0]):
            return None
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
        headers.setRawHeaders(b"content-encoding", [coding.token])
        headers.removeHeader(b"content-length")
        headers.removeHeader(b"accept-ranges")
        for name in _DIGESTS:
            headers.removeHeader(name)
        _variant_tag(headers, coding)
        if _head_only(request):
            return None
        return coding


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


def _variant_tag(headers: Any, coding: Coding) -> None:
    tags = headers.getRawHeaders(b"etag")
    if tags:
        tag = tags[0]
        if len(tag) >= 2 and tag[:1] == b'"' and tag[-1:] == b'"':
            headers.setRawHeaders(b"etag", [tag[:-1] + coding.etag_suffix + b'"'])


def attach_coding(request: Any, coding: ResponseCoding) -> None:
    """
    Have C{request}'s response go through C{coding} (a request that cannot, a test's
    stand-in, is left as it is).
    """
    if hasattr(type(request), "response_coding"):
        request.response_coding = coding
