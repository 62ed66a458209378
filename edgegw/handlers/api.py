"""
The C{api} terminal: one request fans out to several backends at once, and their JSON
answers are merged into one object, one member per backend C{group}.

Backends are called concurrently through C{treq.HTTPClient} over the gateway's own
upstream agent (L{UpstreamAgent}: the proxy's pool): redirects are never followed (a 3xx
is a failed call), the cookie jar stores nothing (a backend's C{Set-Cookie} goes nowhere,
least of all to another user's request), nothing is decompressed (the agent asks for
C{identity} and fails a call answered with any other coding), and a body is read with
treq's streaming C{collect} up to L{MAX_BACKEND_BODY} bytes at most.

A call fails on a connection error, a non-2xx status, a 2xx body that is not strict JSON
(empty included; see L{parse_json<edgegw.upstream.shared.parse_json>}) or is too large,
or the overall C{timeout}. A failed required backend answers
the request at once (502, or 504 when it timed out) and cancels the calls still running;
a failed optional backend is left out and named in C{X-Gw-Partial}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import partial
from typing import Any
from urllib.parse import quote, urlsplit

import attrs
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from twisted.web.server import Request

from edgegw.config.model import ApiBackendSpec, ApiHandlerSpec
from edgegw.header_names import USER_PREFIX
from edgegw.identity.assertion import AssertionIssuer
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.routing.paths import has_dot_segment
from edgegw.stream.boundary import client_gone
from edgegw.terminal.answers import write_text
from edgegw.terminal.exchange import Exchange, exchange_of
from edgegw.terminal.resource import TerminalResource
from edgegw.upstream.agent import NullCookieJar, PreparedURL, UpstreamAgent
from edgegw.upstream.calls import describe_error
from edgegw.upstream.shared import BodyTooLargeError, NotJSONError, join_path, read_json
from edgegw.upstream.upstreams import Upstream

MAX_BACKEND_BODY = 10 * 1024 * 1024
"""The largest backend body read (10 MiB); a larger one is a failed call."""

PARTIAL_HEADER = b"X-Gw-Partial"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_JSON = b"application/json"
# Built once (json.dumps with options builds an encoder per call); allow_nan=False: never
# serve invalid JSON as application/json, whatever reached the merge.
_encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
# Request headers a backend call copies from the client's request; everything else
# (Cookie above all) stays behind.
_COPIED = (b"x-request-id", b"accept-language", b"user-agent")


class BackendCallError(Exception):
    """
    One backend call failed; the message is for the log only.
    """


class UnsafeWildcardError(ValueError):
    """
    A path wildcard value that would change a backend path's structure: a dot segment
    (C{.}, C{..}), also between the slashes inside the value (C{../admin}, C{a/..}).
    """


def fill_path(template: Sequence[str | tuple[str]], params: dict[str, str]) -> bytes:
    """
    Fill a backend path template: literal parts as written, each placeholder with its
    wildcard value percent-encoded so that it stays one path segment (C{/}, C{?}, C{#},
    C{%} and everything outside the unreserved set are encoded).

    @raise UnsafeWildcardError: A value is or contains a dot segment, as the edge refuses
        in request paths (L{has_dot_segment}): even encoded, a backend that decodes before
        normalising would climb the path.
    """
    out: list[str] = []
    for part in template:
        if isinstance(part, str):
            out.append(part)
            continue
        value = params.get(part[0], "")
        if has_dot_segment(value):
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


_NO_COOKIES = NullCookieJar()


@attrs.frozen
class _Backend:
    """
    One backend, compiled at load.
    """

    spec: ApiBackendSpec
    upstream: Upstream
    origin: str
    base_path: bytes
    template: tuple[str | tuple[str], ...]
    method: str


def _compile(spec: ApiBackendSpec) -> _Backend:
    upstream = Upstream.from_url(spec.upstream)
    return _Backend(
        spec=spec,
        upstream=upstream,
        origin=f"{upstream.scheme}://" + upstream.authority.decode("ascii"),
        base_path=urlsplit(spec.upstream).path.encode("ascii").rstrip(b"/"),
        template=parse_template(spec.path),
        method=spec.method,
    )


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


class ApiHandler(TerminalResource):
    """
    Fans a request out to the configured backends and merges their JSON.

    @param spec: The route's C{api} handler block.
    @param agent: The gateway's upstream agent (treq runs over it).
    @param clock: For the overall timeout.
    @ivar identity_headers: Lowercased identity header names that some route projects
        outside C{X-User-*} (a claims map, a custom groups header): sent to the backends
        like C{X-User-*}, as the reverse-proxy sends them.
    """

    def __init__(
        self,
        spec: ApiHandlerSpec,
        agent: UpstreamAgent,
        clock: IReactorTime,
        issuer: AssertionIssuer | None = None,
        metrics: IMetrics = NO_METRICS,
        identity_headers: frozenset[bytes] = frozenset(),
    ) -> None:
        """
        @param issuer: Mints the identity assertion for backends with C{forwardIdentity}.
        @param metrics: Counts partial answers (the agent counts the calls).
        @param identity_headers: See L{identity_headers}.
        """
        super().__init__()
        self.spec = spec
        self.identity_headers = identity_headers
        self.metrics = metrics
        self.issuer = issuer
        self.agent = agent
        self.clock = clock
        self.timeout = spec.timeout
        self.backends = tuple(_compile(backend) for backend in spec.backends)

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

    def backend_headers(self, exchange: Exchange) -> list[tuple[bytes, bytes]]:
        """
        The headers every backend call of C{exchange} carries.
        """
        request = exchange.request
        incoming = request.requestHeaders
        headers: list[tuple[bytes, bytes]] = [(b"Accept", _JSON)]
        for name in _COPIED:
            values = incoming.getRawHeaders(name)
            if values:
                headers.append((name, values[0]))
        # The projection stage's trusted identity headers, the same set the reverse-proxy
        # sends: the stage stripped every inbound X-User-* and every other projected
        # name on every route, so what is left of them is the stage's own.
        if exchange.principal is not None:
            identity = self.identity_headers
            for name, values in incoming.getAllRawHeaders():
                lower = name.lower()
                if lower.startswith(USER_PREFIX) or lower in identity:
                    headers.extend((name, value) for value in values)
        peer = getattr(request.getClientAddress(), "host", "")
        chain = incoming.getRawHeaders(b"x-forwarded-for")
        forwarded_for = peer.encode("ascii", "replace")
        if chain:
            forwarded_for = b", ".join([*chain, forwarded_for])
        headers.append((b"X-Forwarded-For", forwarded_for))
        return headers

    async def call_backend(
        self,
        backend: _Backend,
        exchange: Exchange,
        headers: list[tuple[bytes, bytes]],
        target: bytes,
        fan_out: _FanOut,
    ) -> _Outcome:
        """
        One backend's call of a fan-out, and what came of it.
        """
        principal = exchange.principal
        if backend.spec.forward_access_token and principal is not None and principal.access_token:
            token = b"Bearer " + principal.access_token.encode("ascii")
            headers = [*headers, (b"Authorization", token)]
        issuer = self.issuer
        fresh = None
        if backend.spec.forward_identity and issuer is not None and principal is not None:
            # A fresh assertion per call (and per retry of it): each has its own token id.
            mint = partial(issuer.mint, principal)
            fresh = (issuer.header, mint)
            headers = [*headers, (issuer.header, mint())]
        # The request's headers ride with the call's agent as the byte pairs the pool
        # writes: a Twisted Headers object here would be copied by treq's content-decoder
        # wrapper and flattened again by the agent, for nothing.
        agent = self.agent.call(exchange, backend.spec.group, headers, fresh)
        http = HTTPClient(agent, cookiejar=_NO_COOKIES)  # type: ignore[arg-type]
        outcome = _Outcome()
        error_class: str | None = None
        try:
            response = await http.request(
                backend.method,
                PreparedURL(backend.origin + target.decode("ascii")),
                cookies=_NO_COOKIES,
                allow_redirects=False,
                unbuffered=True,
            )
            outcome.status = response.code
            if not 200 <= response.code < 300:
                agent.abort()
                raise BackendCallError(f"status {response.code}")
            outcome.value = await read_json(response, MAX_BACKEND_BODY)
            outcome.ok = True
        except CancelledError:
            agent.abort()
            agent.end(outcome.status, "timeout" if fan_out.timed_out else "cancelled")
            raise
        except BackendCallError as e:
            outcome.reason = str(e)
            # As the semantic conventions ask for an unsuccessful status: the code.
            error_class = str(outcome.status)
        except (BodyTooLargeError, NotJSONError) as e:
            outcome.reason = str(e)
            error_class = type(e).__name__
        except Exception as e:
            outcome.reason = describe_error(e)
        if not outcome.ok:
            # Whatever failed, the connection is not left open (a no-op once it is done).
            agent.abort()
        agent.end(outcome.status, None if outcome.ok else outcome.reason, error_class)
        return outcome

    # -- the fan-out -----------------------------------------------------------------------

    async def respond(self, request: Request) -> None:
        """
        Call every backend for C{request} (whose route's exchange gives the path
        wildcards) and answer the merged JSON.
        """
        exchange = exchange_of(request)
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
        route = exchange.route
        self._answer(request, outcomes, route.pattern if route is not None else "")

    def _answer(self, request: Request, outcomes: Sequence[_Outcome | None], route: str) -> None:
        if client_gone(request):
            # The client went away while the last calls settled: nobody to answer.
            return
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
        try:
            body = _encode_json(merged).encode("utf-8")
        except (ValueError, RecursionError):
            # A value parse_json let through that cannot be written out here: nested
            # deeper than this point of the stack allows. That call failed after all.
            if _refuse_unwritable(outcomes):
                self._answer(request, outcomes, route)
            else:
                write_text(request, 502, b"bad gateway\n")
            return
        headers = request.responseHeaders
        headers.setRawHeaders(b"content-type", [_JSON])
        headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
        headers.setRawHeaders(b"cache-control", [b"no-store"])
        if partial:
            headers.setRawHeaders(PARTIAL_HEADER, [",".join(partial).encode("utf-8")])
            self.metrics.api_partial(route)
        request.write(body)
        request.finish()


def _refuse_unwritable(outcomes: Sequence[_Outcome | None]) -> bool:
    """
    Mark the successful outcomes whose value cannot be written as JSON as failed.

    @return: Whether any was.
    """
    refused = False
    for outcome in outcomes:
        if outcome is not None and outcome.ok:
            try:
                _encode_json(outcome.value)
            except (ValueError, RecursionError):
                outcome.ok = False
                outcome.reason = "body cannot be written back as JSON"
                refused = True
    return refused


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
        headers = handler.backend_headers(self.exchange)
        # Start every call before watching any: a call that fails synchronously may end the
        # fan-out at once, and the calls it must then cancel have to exist already.
        for index, backend in enumerate(handler.backends):
            self.calls.append(
                Deferred.fromCoroutine(
                    handler.call_backend(backend, self.exchange, headers, self.targets[index], self)
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
