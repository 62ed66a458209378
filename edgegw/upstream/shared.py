"""
What the callers of upstreams share: building a target under an upstream's base path,
and reading a size-capped JSON body through treq, parsed strictly.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import treq
from twisted.internet.defer import Deferred, fail
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse


class BodyTooLargeError(Exception):
    """
    A response body went past the caller's cap; reading stopped there.
    """


class NotJSONError(Exception):
    """
    A response body that is empty or not JSON.
    """


def join_path(prefix: bytes, path: bytes) -> bytes:
    """
    Join an upstream's base path and a request path with exactly one slash between them.
    """
    if not prefix:
        return path
    if prefix.endswith(b"/") and path.startswith(b"/"):
        return prefix + path[1:]
    if not prefix.endswith(b"/") and not path.startswith(b"/"):
        return prefix + b"/" + path
    return prefix + path


def read_body(response: IResponse, limit: int) -> Deferred[bytes]:
    """
    Read C{response}'s whole body with treq's streaming C{collect}, never buffering more
    than C{limit} bytes: past it the upstream connection is dropped.

    @return: Fires with the body; fails with L{BodyTooLargeError} when the declared or
        received length is over C{limit}, or with the upstream's failure. Cancelling it
        aborts the upstream connection (when the response can be aborted).
    """
    length = response.length
    if isinstance(length, int) and length > limit:
        # Nothing of it is read: the connection must still be dropped, or it would stay
        # open, paused, with nobody to close it.
        response.deliverBody(_Refuse())
        return fail(BodyTooLargeError(f"body of {length} bytes"))
    collector = _CappedCollector(limit)
    collecting: Deferred[None] = treq.collect(response, collector.collect)
    # Cancelling the read (a caller's deadline) drops the connection: a body that stalls
    # must not keep it busy in the pool, nor keep arriving into a collector nobody waits
    # for. Whatever the abort makes the body protocol report, the read then fails with
    # CancelledError, as a cancelled Deferred does.
    read = _Read()
    reading: Deferred[bytes] = Deferred(lambda _: read.cancel(response))
    collecting.addCallbacks(collector.body, collector.failed).addBoth(read.settle, reading)
    return reading


class _Read:
    """
    The state of one body read: whether it was cancelled.
    """

    cancelled = False

    def cancel(self, response: IResponse) -> None:
        self.cancelled = True
        # treq wraps the agent's response (_Response, _BufferedResponse), each holding
        # the one it wraps as `original`: the gateway's own response is the one that can
        # abort its connection.
        wrapped: Any = response
        for _ in range(8):
            abort = getattr(wrapped, "abort", None)
            if abort is not None:
                abort()
                return
            wrapped = getattr(wrapped, "original", None)
            if wrapped is None:
                return

    def settle(self, result: bytes | Failure, reading: Deferred[bytes]) -> None:
        if self.cancelled or reading.called:
            return  # cancelled: the connection's failure that follows is expected
        if isinstance(result, Failure):
            reading.errback(result)
        else:
            reading.callback(result)


class _CappedCollector:
    """
    Keeps body pieces up to a cap; past it, raises (treq then drops the connection).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False

    def collect(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self.too_large = True
            self.chunks = []
            raise BodyTooLargeError(f"body over {self.limit} bytes")
        self.chunks.append(data)

    def body(self, result: None) -> bytes:
        return b"".join(self.chunks)

    def failed(self, reason: Failure) -> Failure:
        if self.too_large and not reason.check(BodyTooLargeError):
            # Dropping the connection at the cap can surface as the connection's own
            # failure: the cause is the size.
            return Failure(BodyTooLargeError(f"body over {self.limit} bytes"))
        return reason


class _Refuse(Protocol):
    """
    A body protocol that drops the connection as soon as it is given it.
    """

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.stopProducing()


def read_json(response: IResponse, limit: int) -> Deferred[Any]:
    """
    Read and parse C{response}'s JSON body (at most C{limit} bytes).

    @return: Fires with the parsed value; fails with L{BodyTooLargeError} when the body
        is over C{limit}, L{NotJSONError} when it is empty or not JSON.
    """
    return read_body(response, limit).addCallback(parse_json)


_LARGEST_FLOAT = sys.float_info.max
# A \u escape of a UTF-16 surrogate (D800-DFFF). A lone one parses into a string that
# cannot be encoded again; only a body that has such an escape needs the encode check
# (and an escaped backslash before the "u" merely makes the check run for nothing).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NumberOutOfRangeError(ValueError):
    """
    A number literal beyond the largest double (C{1e999}): it would become C{Infinity}.
    """


def _finite_float(text: str) -> float:
    value = float(text)
    if -_LARGEST_FLOAT <= value <= _LARGEST_FLOAT:
        return value
    raise _NumberOutOfRangeError(text[:40])


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder, built once (json.loads would build one per call with these hooks). The C
# scanner calls the hooks only for float literals and for NaN/Infinity/-Infinity.
_decode = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant).decode
_encode_unchecked = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode


def parse_json(body: bytes) -> Any:
    """
    Parse a JSON body strictly (RFC 8259): UTF-8 text (no byte-order mark, no encoded
    surrogates), no C{NaN}/C{Infinity}/C{-Infinity}, no number beyond the largest double
    (it would turn into C{Infinity}), no string with a lone surrogate (C{"\\ud800"}: it
    could not be written out again). What it returns can always be written back as
    valid JSON in UTF-8.

    @raise NotJSONError: It is empty or not such JSON.
    """
    if not body:
        raise NotJSONError("empty body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise NotJSONError("body is not UTF-8") from None
    try:
        value = _decode(text)
    except _NumberOutOfRangeError as e:
        raise NotJSONError(f"number out of range: {e}") from None
    except (ValueError, RecursionError):
        raise NotJSONError("body is not JSON") from None
    if _SURROGATE_ESCAPE.search(body) is not None:
        # Surrogate pairs were joined by the parser; a lone surrogate was not, and
        # encoding to UTF-8 refuses it (at C speed, and only for such bodies).
        try:
            _encode_unchecked(value).encode("utf-8")
        except UnicodeEncodeError:
            raise NotJSONError("lone surrogate in a string") from None
    return value
