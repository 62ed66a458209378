"""
Finding: read_body's canceller calls response.abort(), but the responses the IdP client and
the api fan-out pass it are treq wrappers (_Response, and _BufferedResponse for the IdP
client, which does not pass unbuffered=True). proxyForInterface exposes only IResponse's
attributes: getattr(response, "abort", None) is None, so cancelling a body read (the IdP
call's deadline) never drops the connection. The stalled connection stays open, busy, in
the pool for as long as the IdP side keeps it.
"""

from __future__ import annotations

from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request

from edgegw.upstream.agent import NullCookieJar, UpstreamAgent
from edgegw.upstream.pool import Upstream, UpstreamClient
from edgegw.upstream.shared import read_body
from tests.support.backends import SiteBackend

reactor: Any = _reactor


def stall(request: Request) -> Any:
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"content-length", b"1000")
    request.write(b'{"partial": ')
    return NOT_DONE_YET


class CancelledReadDropsConnection(TestCase):
    def setUp(self) -> None:
        self.backend = SiteBackend(stall).start()
        self.addCleanup(self.backend.stop)
        self.origin = f"http://127.0.0.1:{self.backend.port}"
        self.upstream = Upstream.from_url(self.origin)
        self.pool = UpstreamClient(reactor)
        self.addCleanup(self.pool.close)

    async def _check(self, unbuffered: bool) -> None:
        # As IdentityProvider._http: treq HTTPClient over a plain UpstreamAgent.
        http = HTTPClient(UpstreamAgent(self.pool, reactor), cookiejar=NullCookieJar())  # type: ignore[arg-type]
        response = await http.request(
            "GET", self.origin + "/x", allow_redirects=False, unbuffered=unbuffered
        )
        reading = read_body(response, 4096)
        reading.cancel()
        with self.assertRaises(CancelledError):
            await reading
        await deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(
            self.pool.open_connections(self.upstream),
            0,
            "cancelled body read left its upstream connection open",
        )

    async def test_buffered_treq_response_as_the_idp_client_reads_it(self) -> None:
        await self._check(unbuffered=False)

    async def test_unbuffered_treq_response(self) -> None:
        await self._check(unbuffered=True)
