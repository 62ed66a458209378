"""
What the callers of upstreams share: building a target under an upstream's base path,
and reading a size-capped JSON body through treq.
"""

from __future__ import annotations

import json
from typing import Any

import treq
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


async def read_body(response: IResponse, limit: int) -> bytes:
    """
    Read C{response}'s whole body with treq's streaming C{collect}, never buffering more
    than C{limit} bytes: past it the connection is dropped.

    @raise BodyTooLargeError: The declared or received length is over C{limit}.
    """
    length = response.length
    if isinstance(length, int) and length > limit:
        raise BodyTooLargeError(f"body of {length} bytes")
    chunks: list[bytes] = []
    size = 0

    def collect(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > limit:
            # Raising here makes treq drop the connection: nothing past the cap is read.
            chunks.clear()
            raise BodyTooLargeError(f"body over {limit} bytes")
        chunks.append(data)

    await treq.collect(response, collect)
    return b"".join(chunks)


async def read_json(response: IResponse, limit: int) -> Any:
    """
    Read and parse C{response}'s JSON body (at most C{limit} bytes).

    @raise BodyTooLargeError: The body is over C{limit}.
    @raise NotJSONError: The body is empty or not JSON.
    """
    body = await read_body(response, limit)
    if not body:
        raise NotJSONError("empty body")
    try:
        return json.loads(body)
    except ValueError:
        raise NotJSONError("body is not JSON") from None
