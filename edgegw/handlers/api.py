"""
The C{api} terminal: one request fans out to several backends at once, and their JSON
answers are merged into one object, one member per backend C{group}.

Backends are called concurrently with the gateway's own upstream client (the proxy's
pool): redirects are never followed (a 3xx is a failed call), there is no cookie jar (a
backend's C{Set-Cookie} goes nowhere, least of all to another user's request), nothing
is decompressed (no C{Accept-Encoding} is sent; an encoded body is not JSON and fails),
and a body is read up to L{MAX_BACKEND_BODY} bytes at most.

A call fails on a connection error, a non-2xx status, a 2xx body that is not JSON (empty
included) or is too large, or the overall C{timeout}. A failed required backend answers
the request at once (502, or 504 when it timed out) and cancels the calls still running;
a failed optional backend is left out and named in C{X-Gw-Partial}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.chain.exchange import Exchange
from edgegw.chain.respond import write_text
from edgegw.config.model import ApiBackendSpec, ApiHandlerSpec
from edgegw.handlers.proxy import join_path
from edgegw.upstream.calls import describe_error, start_call
from edgegw.upstream.http11 import UpstreamResponse
from edgegw.upstream.pool import Upstream, UpstreamClient

MAX_BACKEND_BODY = 10 * 1024 * 1024
"""The largest backend body read (10 MiB); a larger one is a failed call."""

PARTIAL_HEADER = b"X-Gw-Partial"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_JSON = b"application/json"
# Request headers a backend call copies from the client's request; everything else
# (Cookie above all) stays behind.
_COPIED = (b"x-request-id", b"accept-language", b"user-agent")


class BackendCallError(Exception):
    """
    One backend call failed; the message is for the log only.
    """


class BodyTooLargeError(BackendCallError):
    """
    A backend body went past L{MAX_BACKEND_BODY}.
    """


class UnsafeWildcardError(ValueError):
    """
    A path wildcard value that would change a backend path's structure (C{.}, C{..}).
    """


def fill_path(template: Sequence[str | tuple[str]], params: dict[str, str]) -> bytes:
    """
    Fill a backend path template: literal parts as written, each placeholder with its
    wildcard value percent-encoded so that it stays one path segment (C{/}, C{?}, C{#},
    C{%} and everything outside the unreserved set are encoded).

    @raise UnsafeWildcardError: A value is C{.} or C{..}: even encoded, a backend that decodes
        before normalising would climb the path.
    """
    out: list[str] = []
    for part in template:
        if isinstance(part, str):
            out.append(part)
            continue
        value = params.get(part[0], "")
        if value in (".", ".."):
            raise UnsafeWildcardError(value)
        out.append(quote(value, safe="", encoding="utf-8", errors="surrogateescape"))
    return "".join(out).encode("ascii")


def parse_template(path: str) -> tuple[str | tuple[str], ...]:
    """
    Split a backend path into literal strings and C{(name,)} placeholders, at load.
    """
    parts: list[str | tuple[str]] = []
    position = 0
    for found in _PLACEHOLDER.finditer(path):
        if found.start() > position:
            parts.append(path[position : found.start()])
        parts.append((found.group(1),))
        position = found.end()
    if position < len(path):
        parts.append(path[position:])
    return tuple(parts)


def _with_query(target: bytes, query: bytes) -> bytes:
    """
    Add the client's query to a backend target that may carry a static query of its own.
    """
    if not query:
        return target
    return target + (b"&" if b"?" in target else b"?") + query


class _Sink:
    """
    Collects a backend body, failing the call past the size cap.
    """

    def __init__(self, response: UpstreamResponse) -> None:
        self.response = response
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_BACKEND_BODY:
            # Stop reading at the cap: never buffer past it.
            self.too_large = True
            self.chunks = []
            self.response.abort()
            return
        self.chunks.append(data)


@attrs.frozen
class _Backend:
    """
    One backend, compiled at load.
    """

    spec: ApiBackendSpec
    upstream: Upstream
    base_path: bytes
    template: tuple[str | tuple[str], ...]
    method: bytes
    group_json: str


@attrs.define
class _Outcome:
    """
    What one backend call came to.
    """

    value: Any = None
    ok: bool = False
    timed_out: bool = False
    reason: str = ""
    status: int | None = None


class ApiHandler:
    """
    Fans a request out to the configured backends and merges their JSON.

    @param spec: The route's C{api} handler block.
    @param client: The gateway's shared upstream client.
    @param clock: For the overall timeout.
    """

    def __init__(self, spec: ApiHandlerSpec, client: UpstreamClient, clock: IReactorTime) -> None:
        self.spec = spec
        self.client = client
        self.clock = clock
        self.timeout = spec.timeout
        self.backends = tuple(
            _Backend(
                spec=backend,
                upstream=Upstream.from_url(backend.upstream),
                base_path=urlsplit(backend.upstream).path.encode("ascii").rstrip(b"/"),
                template=parse_template(backend.path),
                method=backend.method.encode("ascii"),
                group_json=json.dumps(backend.group),
            )
            for backend in spec.backends
        )

    def describe(self) -> str:
        """
        One line for the route table.
        """
        groups = ", ".join(
            backend.group + ("" if backend.required else "?") for backend in self.spec.backends
        )
        timeout = f", timeout {self.timeout:g}s" if self.timeout is not None else ""
        return f"api [{groups}]{timeout}"

    # -- one call --------------------------------------------------------------------------

    def _headers(self, backend: _Backend, exchange: Exchange) -> list[tuple[bytes, bytes]]:
        request = exchange.request
        incoming = request.requestHeaders
        headers: list[tuple[bytes, bytes]] = [
            (b"Host", backend.upstream.authority),
            (b"Accept", _JSON),
        ]
        for name in _COPIED:
            values = incoming.getRawHeaders(name)
            if values:
                headers.append((name, values[0]))
        # The projection stage's trusted identity headers (inbound X-User-* were stripped).
        if exchange.principal is not None:
            for name, values in incoming.getAllRawHeaders():
                if name.lower().startswith(b"x-user-"):
                    headers.extend((name, value) for value in values)
        peer = getattr(request.getClientAddress(), "host", "")
        chain = incoming.getRawHeaders(b"x-forwarded-for")
        forwarded_for = peer.encode("ascii", "replace")
        if chain:
            forwarded_for = b", ".join([*chain, forwarded_for])
        headers.append((b"X-Forwarded-For", forwarded_for))
        principal = exchange.principal
        if backend.spec.forward_access_token and principal is not None and principal.access_token:
            headers.append((b"Authorization", b"Bearer " + principal.access_token.encode("ascii")))
        return headers

    async def _call(
        self, backend: _Backend, exchange: Exchange, target: bytes, fan_out: _FanOut
    ) -> _Outcome:
        headers = self._headers(backend, exchange)
        call = start_call(
            exchange, backend.spec.group, backend.upstream, backend.method, target, headers
        )
        outcome = _Outcome()
        response: UpstreamResponse | None = None
        try:
            response = await self.client.request(backend.upstream, backend.method, target, headers)
            outcome.status = response.code
            if not 200 <= response.code < 300:
                response.abort()
                raise BackendCallError(f"status {response.code}")
            if response.length is not None and response.length > MAX_BACKEND_BODY:
                response.abort()
                raise BodyTooLargeError(f"body of {response.length} bytes")
            sink = _Sink(response)
            try:
                await response.deliver(sink)
            except Exception:
                if sink.too_large:
                    raise BodyTooLargeError(f"body over {MAX_BACKEND_BODY} bytes") from None
                raise
            if sink.too_large:
                raise BodyTooLargeError(f"body over {MAX_BACKEND_BODY} bytes")
            body = b"".join(sink.chunks)
            if not body:
                raise BackendCallError("empty body")
            try:
                outcome.value = json.loads(body)
            except ValueError:
                raise BackendCallError("body is not JSON") from None
            outcome.ok = True
        except CancelledError:
            if response is not None:
                response.abort()
            call.end(outcome.status, "timeout" if fan_out.timed_out else "cancelled")
            raise
        except Exception as e:
            outcome.reason = str(e) if isinstance(e, BackendCallError) else describe_error(e)
        call.end(outcome.status, None if outcome.ok else outcome.reason)
        return outcome

    # -- the fan-out -----------------------------------------------------------------------

    async def __call__(self, exchange: Exchange) -> None:
        request = exchange.request
        query = request.uri.partition(b"?")[2]
        try:
            targets = [
                _with_query(
                    join_path(backend.base_path, fill_path(backend.template, exchange.params)),
                    query if backend.spec.forward_query else b"",
                )
                for backend in self.backends
            ]
        except UnsafeWildcardError:
            exchange.note("api_error", "unsafe path wildcard value")
            write_text(request, 400, b"bad request\n")
            return
        outcomes = await _FanOut(self, exchange, targets).run()
        self._answer(request, outcomes)

    def _answer(self, request: Request, outcomes: Sequence[_Outcome | None]) -> None:
        merged: dict[str, Any] = {}
        partial: list[str] = []
        for backend, outcome in zip(self.backends, outcomes, strict=True):
            if outcome is not None and outcome.ok:
                merged[backend.spec.group] = outcome.value
                continue
            if backend.spec.required:
                timed_out = outcome is not None and outcome.timed_out
                if timed_out:
                    write_text(request, 504, b"gateway timeout\n")
                else:
                    write_text(request, 502, b"bad gateway\n")
                return
            partial.append(backend.spec.group)
        body = json.dumps(merged, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        headers = request.responseHeaders
        headers.setRawHeaders(b"content-type", [_JSON])
        headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
        headers.setRawHeaders(b"cache-control", [b"no-store"])
        if partial:
            headers.setRawHeaders(PARTIAL_HEADER, [",".join(partial).encode("utf-8")])
        request.write(body)
        request.finish()


class _FanOut:
    """
    Runs one request's backend calls concurrently; finishes when all are done, when a
    required one fails (the rest are cancelled), or when the overall timeout fires.
    """

    def __init__(self, handler: ApiHandler, exchange: Exchange, targets: list[bytes]) -> None:
        self.handler = handler
        self.exchange = exchange
        self.targets = targets
        count = len(handler.backends)
        self.outcomes: list[_Outcome | None] = [None] * count
        self.calls: list[Deferred[_Outcome]] = []
        self.remaining = count
        self.timed_out = False
        self.settled = False
        self.done: Deferred[list[_Outcome | None]] = Deferred(self._cancel_all)
        self.timer: IDelayedCall | None = None

    def run(self) -> Deferred[list[_Outcome | None]]:
        handler = self.handler
        # Start every call before watching any: a call that fails synchronously may end the
        # fan-out at once, and the calls it must then cancel have to exist already.
        for index, backend in enumerate(handler.backends):
            self.calls.append(
                Deferred.fromCoroutine(
                    handler._call(backend, self.exchange, self.targets[index], self)
                )
            )
        for index, call in enumerate(self.calls):
            call.addBoth(self._finished, index)
        if handler.timeout is not None and not self.done.called:
            self.timer = handler.clock.callLater(handler.timeout, self._time_out)
        return self.done

    def _finished(self, result: _Outcome | Failure, index: int) -> None:
        if isinstance(result, Failure):
            if not result.check(CancelledError):
                result = _Outcome(reason=result.getErrorMessage() or "error")
            elif self.timed_out:
                result = _Outcome(timed_out=True, reason="timeout")
            else:
                # Cancelled because the request is over (answered, or its client is gone).
                return None
        self.outcomes[index] = result
        self.remaining -= 1
        if self.settled:
            return None
        required_failed = not result.ok and self.handler.backends[index].spec.required
        if required_failed or self.remaining == 0:
            # Decided once: cancelling the other calls below may complete some of them
            # synchronously, and they come back here.
            self.settled = True
            self._stop_timer()
            if required_failed:
                # Before answering, so that the cancelled calls are in the access-log line
                # and their spans end inside the request's.
                self._cancel_outstanding()
            self.done.callback(self.outcomes)
        return None

    def _time_out(self) -> None:
        self.timer = None
        self.timed_out = True
        self._cancel_outstanding()

    def _stop_timer(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None

    def _cancel_outstanding(self) -> None:
        for index, call in enumerate(self.calls):
            if self.outcomes[index] is None and not call.called:
                call.cancel()

    def _cancel_all(self, done: Deferred[list[_Outcome | None]]) -> None:
        # The request itself was cancelled (the client went away).
        self._stop_timer()
        self._cancel_outstanding()
