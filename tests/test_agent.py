"""
treq over the gateway's own upstream client: L{UpstreamAgent}, the capped body reader,
and the policies the agent applies to every call, against real backends on 127.0.0.1.
"""

from __future__ import annotations

import gzip
from typing import Any

import treq
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, TimeoutError, ensureDeferred
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.upstream.agent import (
    ContentCodingError,
    NullCookieJar,
    PreparedURL,
    UpstreamAgent,
)
from edgegw.upstream.pool import UpstreamClient
from edgegw.upstream.shared import BodyTooLargeError, NotJSONError, read_body, read_json
from edgegw.upstream.upstreams import Upstream
from tests.support.backends import RawBackend, RecordedRequest, SiteBackend, scripted


def respond(request: Request) -> bytes | int:
    """
    The test backend: answers by path.
    """
    path = request.path
    if path == b"/json":
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"set-cookie", b"session=user-a")
        return b'{"ok":true}'
    if path == b"/gzip":
        request.setHeader(b"content-encoding", b"gzip")
        return gzip.compress(b'{"ok":true}')
    if path == b"/big":
        return b"x" * 5000
    if path == b"/empty":
        return b""
    if path == b"/nothing":
        request.setResponseCode(204)
        return b""
    if path == b"/chunked-big":
        # No Content-Length: chunked, so only reading finds out how large it is.
        request.write(b"x" * 3000)
        request.write(b"y" * 3000)
        request.finish()
        return NOT_DONE_YET
    if path == b"/stream":
        # The head and a little body now, the rest never: the caller has to give up.
        request.write(b"partial")
        return NOT_DONE_YET
    return b"plain"


class AgentTests(TestCase):
    def setUp(self) -> None:
        self.backend = SiteBackend(respond).start()
        self.addCleanup(self.backend.stop)
        self.origin = f"http://127.0.0.1:{self.backend.port}"
        self.upstream = Upstream.from_url(self.origin)
        self.pool = UpstreamClient(reactor)
        self.addCleanup(self.pool.close)
        self.agent = UpstreamAgent(self.pool, reactor)
        self.http = HTTPClient(self.agent, cookiejar=NullCookieJar())  # type: ignore[arg-type]

    def last(self) -> RecordedRequest:
        return self.backend.requests[-1]

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.http.request(
            "GET", self.origin + path, allow_redirects=False, unbuffered=True, **kw
        )

    async def test_treq_over_the_pool(self) -> None:
        response = await self.get("/json")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"application/json"])
        self.assertEqual(await read_json(response, 1000), {"ok": True})
        # The connection went back to the pool and is reused.
        await treq.content(await self.get("/other"))
        self.assertEqual(self.pool.idle_connections(self.upstream), 1)

    async def test_identity_replaces_any_offered_coding(self) -> None:
        await treq.content(await self.get("/plain", headers={"Accept-Encoding": "br"}))
        # treq itself offers gzip; the agent asks for no coding at all.
        self.assertEqual(self.last().header(b"accept-encoding"), b"identity")

    async def test_unasked_coding_fails_the_call(self) -> None:
        with self.assertRaises(ContentCodingError):
            await self.get("/gzip")

    async def test_cookies_are_never_kept(self) -> None:
        await treq.content(await self.get("/json"))
        await treq.content(await self.get("/plain"))
        self.assertIsNone(self.last().header(b"cookie"))

    async def test_request_body_is_framed_by_the_pool(self) -> None:
        response = await self.http.request(
            "POST", self.origin + "/plain", data=b"hello", unbuffered=True
        )
        await treq.content(response)
        last = self.last()
        self.assertEqual(
            (last.method, last.body, last.header(b"content-length")), (b"POST", b"hello", b"5")
        )

    async def test_prepared_url_is_sent_as_built(self) -> None:
        url = PreparedURL(self.origin + "/a%2Fb/%E2%9C%93?q=%20x")
        response = await self.http.request("GET", url, unbuffered=True)
        await treq.content(response)
        self.assertEqual(self.last().uri, b"/a%2Fb/%E2%9C%93?q=%20x")
        self.assertEqual(self.last().header(b"host"), self.origin[7:].encode("ascii"))

    async def test_body_over_the_cap_stops_reading(self) -> None:
        lost = self.backend.next_lost()
        response = await self.get("/big")
        with self.assertRaises(BodyTooLargeError):
            await read_body(response, 100)
        await lost
        self.assertEqual(self.pool.idle_connections(self.upstream), 0)

    async def test_body_over_the_cap_while_reading_is_too_large(self) -> None:
        errors: list[Any] = []
        observer = errors.append
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(observer)  # type: ignore[arg-type]
        self.addCleanup(globalLogPublisher.removeObserver, observer)  # type: ignore[arg-type]
        lost = self.backend.next_lost()
        response = await self.get("/chunked-big")
        with self.assertRaises(BodyTooLargeError):
            await read_body(response, 4000)
        await lost
        self.assertEqual(self.pool.idle_connections(self.upstream), 0)
        # Dropping the connection inside treq's collector ended nothing twice.
        self.assertEqual([e for e in errors if e.get("isError")], [])

    async def test_declared_body_over_the_cap_drops_the_connection(self) -> None:
        backend = RawBackend(
            scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 20000000\r\n\r\npartial")
        ).start()
        self.addCleanup(lambda: ensureDeferred(backend.stop()))
        lost = backend.next_lost()
        response = await self.http.request(
            "GET", f"http://127.0.0.1:{backend.port}/", unbuffered=True
        )
        with self.assertRaises(BodyTooLargeError):
            await read_body(response, 1000)
        # Not left open and paused with nobody to close it.
        await lost

    async def test_empty_and_non_json_bodies(self) -> None:
        with self.assertRaises(NotJSONError):
            await read_json(await self.get("/empty"), 100)
        with self.assertRaises(NotJSONError):
            await read_json(await self.get("/plain"), 100)

    async def test_not_an_http_url(self) -> None:
        with self.assertRaises(ValueError):
            await self.agent.request(b"GET", b"ftp-ish/no-scheme")

    async def test_cancelled_body_read_drops_the_connection(self) -> None:
        records: list[dict[str, Any]] = []
        context = _Context(records)
        call = self.agent.call(context, "slow")
        http = HTTPClient(call, cookiejar=NullCookieJar())  # type: ignore[arg-type]
        response = await http.request("GET", self.origin + "/stream", unbuffered=True)
        reading = read_body(response, 1000)
        reading.cancel()
        call.abort()
        call.end(response.code, "cancelled")
        with self.assertRaises(CancelledError):
            await reading
        self.assertEqual(len(records), 1)
        self.assertEqual((records[0]["name"], records[0]["status"]), ("slow", 200))
        self.assertEqual(records[0]["error"], "cancelled")
        self.assertEqual(self.pool.idle_connections(self.upstream), 0)

    async def test_bound_call_is_recorded_once_with_the_callers_verdict(self) -> None:
        records: list[dict[str, Any]] = []
        call = self.agent.call(_Context(records), "profile")
        http = HTTPClient(call, cookiejar=NullCookieJar())  # type: ignore[arg-type]
        response = await http.request("GET", self.origin + "/plain", unbuffered=True)
        await treq.content(response)
        self.assertEqual(records, [])  # the body is read; the verdict is the caller's
        call.end(response.code, "body is not JSON")
        call.end(200)
        self.assertEqual(len(records), 1)
        self.assertEqual(records[0]["error"], "body is not JSON")
        with self.assertRaises(RuntimeError):
            call.request(b"GET", (self.origin + "/plain").encode("ascii"))

    async def test_caller_headers_cannot_frame_or_redirect_the_request(self) -> None:
        call = self.agent.call(
            None,
            "x",
            [(b"Host", b"evil.test"), (b"Content-Length", b"0"), (b"X-Ok", b"1")],
        )
        http = HTTPClient(call, cookiejar=NullCookieJar())  # type: ignore[arg-type]
        response = await http.request(
            "POST", self.origin + "/plain", data=b"hello", unbuffered=True
        )
        await treq.content(response)
        last = self.last()
        self.assertEqual(
            [v for n, v in last.headers if n.lower() == b"host"], [self.origin[7:].encode()]
        )
        self.assertEqual([v for n, v in last.headers if n.lower() == b"content-length"], [b"5"])
        self.assertEqual((last.body, last.header(b"x-ok")), (b"hello", b"1"))

    async def test_refused_coding_is_recorded_with_its_status(self) -> None:
        records: list[dict[str, Any]] = []
        call = self.agent.call(_Context(records), "zipped")
        http = HTTPClient(call, cookiejar=NullCookieJar())  # type: ignore[arg-type]
        with self.assertRaises(ContentCodingError):
            await http.request("GET", self.origin + "/gzip", unbuffered=True)
        call.end(None, "caller's later verdict")
        self.assertEqual(len(records), 1)
        self.assertEqual(records[0]["status"], 200)
        self.assertIn("ContentCodingError", records[0]["error"])

    async def test_bodiless_response_ends_its_span_at_once(self) -> None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        agent = UpstreamAgent(self.pool, reactor, tracer=provider.get_tracer("test"))
        response = await treq.request(
            "GET", self.origin + "/nothing", agent=agent, unbuffered=True, allow_redirects=False
        )
        # treq never asks for the body of a response with no body.
        self.assertEqual(await treq.content(response), b"")
        [span] = exporter.get_finished_spans()
        self.assertEqual(span.attributes["http.response.status_code"], 204)  # type: ignore[index]

    async def test_call_outside_a_request_has_its_own_span(self) -> None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        agent = UpstreamAgent(self.pool, reactor, tracer=provider.get_tracer("test"))
        response = await treq.request(
            "GET", self.origin + "/plain", agent=agent, unbuffered=True, allow_redirects=False
        )
        await treq.content(response)
        [span] = exporter.get_finished_spans()
        self.assertEqual(span.kind, SpanKind.CLIENT)
        self.assertEqual(span.attributes["http.response.status_code"], 200)  # type: ignore[index]
        traceparent = self.last().header(b"traceparent") or b""
        self.assertIn(f"{span.context.trace_id:032x}".encode("ascii"), traceparent)


class _Context:
    """
    A request's call log (the exchange's part the agent uses).
    """

    span = None
    tracer = None

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def add_call(self, record: dict[str, Any]) -> None:
        self.records.append(record)


class ConnectingCancelTests(SynchronousTestCase):
    """
    A call cancelled while its TCP connection is still being set up is a cancellation
    (and, under a deadline, a timeout): not an ordinary connection failure.
    """

    def request(self, clock: MemoryReactorClock) -> Deferred[Any]:
        client = UpstreamClient(clock)
        upstream = Upstream("http", "127.0.0.1", 8080)
        return client.request(upstream, b"GET", b"/", [(b"Host", upstream.authority)])

    def test_cancel_while_connecting(self) -> None:
        clock = MemoryReactorClock()
        pending = self.request(clock)
        pending.cancel()
        self.failureResultOf(pending, CancelledError)

    def test_deadline_while_connecting_is_a_timeout(self) -> None:
        clock = MemoryReactorClock()
        pending = self.request(clock)
        pending.addTimeout(1.0, clock)
        clock.advance(1.0)
        self.failureResultOf(pending, TimeoutError)
