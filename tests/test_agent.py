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
from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.upstream.agent import (
    ContentCodingError,
    NullCookieJar,
    PreparedURL,
    UpstreamAgent,
)
from edgegw.upstream.pool import Upstream, UpstreamClient
from edgegw.upstream.shared import BodyTooLargeError, NotJSONError, read_body, read_json
from tests.support.backends import RecordedRequest, SiteBackend


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
        response = await self.get("/big")
        with self.assertRaises(BodyTooLargeError):
            await read_body(response, 100)
        self.assertEqual(self.pool.idle_connections(self.upstream), 0)

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
        reading = Deferred.fromCoroutine(read_body(response, 1000))
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
