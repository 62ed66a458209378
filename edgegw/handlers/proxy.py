"""
The C{reverse-proxy} terminal: one upstream, streamed both ways.

Requests are sent with the gateway's own HTTP/1.1 client over pooled connections; request
bodies stream from the client to the upstream as they arrive and responses stream back,
with a slow reader on either side pausing the other. An upgrade to WebSocket becomes a
L{Tunnel}. The C{timeout} covers connecting, sending the request and receiving the
response head (a streaming response, such as server-sent events, may then last as long
as it likes); when it fires the upstream call is cancelled and the client gets 504. Any
other failure before the response head is a 502; a failure mid-body aborts the client
connection so that it cannot mistake a truncated body for a whole one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import CancelledError, TimeoutError
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.web.server import Request
from zope.interface import implementer

from edgegw.compression.response_coding import compresses_whole
from edgegw.config.model import ProxyHandlerSpec
from edgegw.handlers.hop_by_hop import HOP_BY_HOP, connection_tokens, is_websocket_upgrade
from edgegw.handlers.tunnel import Tunnel
from edgegw.header_names import MAX_NAME_LENGTH, USER_PREFIX, canonical_name
from edgegw.identity.assertion import AssertionIssuer
from edgegw.identity.cookies import set_cookie_name, without_cookies
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.seam import RAW_DICT_WRITABLE, raw_fields
from edgegw.stream.boundary import UpgradeNotPossibleError, client_gone, write_whole
from edgegw.terminal.answers import abort, write_text
from edgegw.terminal.exchange import Exchange, exchange_of
from edgegw.terminal.resource import TerminalResource
from edgegw.upstream.calls import UpstreamCall, describe_error, start_call
from edgegw.upstream.pool import UpstreamClient, UpstreamUnavailableError
from edgegw.upstream.response import BodySink, UpstreamResponse
from edgegw.upstream.shared import join_path
from edgegw.upstream.upstreams import Upstream

_log = Logger()

_DIRECT = RAW_DICT_WRITABLE

# What relay_head does with a response header.
_RELAY, _SKIP, _CONNECTION, _COOKIE = 0, 1, 2, 3

# Connection values that name no field to remove (as sent, in the usual spellings; not
# "close": a field named Close is hop-by-hop then).
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"Keep-Alive"})

_MAX_PLANS = 1_000
"""Response header names a proxy route remembers what to do with."""

_CONTENT_LENGTH = canonical_name(b"content-length")
_CACHE_CONTROL = canonical_name(b"cache-control")
_PRIVATE = b"private"

BODYLESS_METHODS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE", b"CONNECT"})
# Headers the gateway itself sets on every request it forwards, or frames itself.
_REPLACED = frozenset(
    {
        b"host",
        b"content-length",
        b"expect",
        b"x-forwarded-for",
        b"x-forwarded-proto",
        b"x-forwarded-host",
    }
)
# Request headers whose forwarded value is the gateway's (the request-id stage writes
# X-Request-Id back to the request; X-Forwarded-* are rebuilt below): a client's
# Connection header cannot name them away. X-User-* and the other projected identity
# headers are the gateway's too.
_GATEWAY_SET = frozenset(
    {b"x-request-id", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host"}
)


@implementer(IPushProducer)
class _Relay:
    """
    Streams an upstream body into the client response; the client's flow control pauses
    and resumes the upstream read.
    """

    def __init__(self, request: Request, response: UpstreamResponse) -> None:
        self.write = request.write
        self.response = response

    def pauseProducing(self) -> None:
        self.response.pause()

    def resumeProducing(self) -> None:
        self.response.resume()

    def stopProducing(self) -> None:
        self.response.abort()


class ProxyHandler(TerminalResource):
    """
    Forwards requests to one upstream.

    @param spec: The route's C{reverse-proxy} handler block.
    @param client: The gateway's shared upstream client (connection pool).
    @param reactor: For the timeout.
    @param gateway_headers: Lowercased names of response headers that the gateway sets
        itself (security headers, C{Server}); the upstream's values do not override them.
    @param assertion_headers: Lowercased identity-assertion header names: never forwarded
        from the client, since a backend may only receive assertions the gateway minted.
    @param identity_headers: Lowercased identity header names that some route projects
        outside C{X-User-*}: the gateway's to set, so a client's C{Connection} header
        cannot remove them.
    """

    def __init__(
        self,
        spec: ProxyHandlerSpec,
        client: UpstreamClient,
        reactor: IReactorTime,
        gateway_headers: frozenset[bytes] = frozenset(),
        assertion_headers: frozenset[bytes] = frozenset({b"x-gw-identity"}),
        identity_headers: frozenset[bytes] = frozenset(),
        own_cookie: Callable[[bytes], bool] | None = None,
        issuer: AssertionIssuer | None = None,
        metrics: IMetrics = NO_METRICS,
    ) -> None:
        """
        @param own_cookie: Says whether a cookie name is the gateway's own (session,
            login state): with C{forwardCookies} such cookies are still never sent.
        @param issuer: Mints the identity assertion sent with C{forwardIdentity}.
        @param metrics: Counts the upstream calls.
        """
        super().__init__()
        self.spec = spec
        self.metrics = metrics
        self.issuer = issuer if spec.forward_identity else None
        self.client = client
        self.reactor = reactor
        self.upstream = Upstream.from_url(spec.upstream, verify_tls=not spec.insecure_skip_verify)
        self.base_path = urlsplit(spec.upstream).path.encode("ascii").rstrip(b"/")
        self.strip_prefix = spec.strip_prefix.encode("utf-8") if spec.strip_prefix else b""
        self.timeout = spec.timeout
        # The client's Authorization never goes upstream as it is: forwardAccessToken
        # sends the principal's own token instead. HTTP2-Settings belongs to an h2c
        # upgrade, which the gateway never forwards.
        drop = set(HOP_BY_HOP) | _REPLACED | assertion_headers
        drop.update((b"authorization", b"http2-settings"))
        # The Cookie header goes upstream only with forwardCookies, and then without the
        # gateway's own cookies (a backend never sees the sealed session).
        drop.add(b"cookie")
        self.own_cookie = own_cookie
        self.drop_request = frozenset(drop)
        self.gateway_set = _GATEWAY_SET | identity_headers
        # The gateway writes its own Server and Date with every response head, and one
        # Content-Length of its own reading (relay_head).
        self.skip_response = HOP_BY_HOP | gateway_headers | {b"server", b"date", b"content-length"}
        # Response header name as sent -> (canonical name, what relay_head does with it).
        self._response_plans: dict[bytes, tuple[bytes, int]] = {}

    def describe(self) -> str:
        """
        One line for the route table.
        """
        parts = []
        if self.spec.strip_prefix:
            parts.append(f"strip {self.spec.strip_prefix}")
        if self.spec.timeout is not None:
            parts.append(f"timeout {self.spec.timeout:g}s")
        for flag, name in (
            (self.spec.preserve_host, "preserve host"),
            (self.spec.forward_cookies, "cookies"),
            (self.spec.forward_access_token, "access token"),
            (self.spec.forward_identity, "identity"),
            (self.spec.insecure_skip_verify, "INSECURE tls"),
        ):
            if flag:
                parts.append(name)
        extra = f" ({', '.join(parts)})" if parts else ""
        return f"reverse-proxy {self.spec.upstream}{extra}"

    # -- request ---------------------------------------------------------------------------

    def target(self, request: Request) -> bytes:
        """
        The upstream request-target: base path + request path (less C{stripPrefix}) +
        query, the path kept exactly as the client encoded it.
        """
        # The edge has already put every target in origin form (/path?query).
        path, sep, query = request.uri.partition(b"?")
        strip = self.strip_prefix
        if strip and path.startswith(strip):
            path = path[len(strip) :] or b"/"
            if path[:1] != b"/":
                path = b"/" + path
        path = join_path(self.base_path, path)
        return path + sep + query

    def request_headers(
        self, request: Request, exchange: Exchange, upgrade: bool
    ) -> list[tuple[bytes, bytes]]:
        """
        The headers to send upstream: the client's, less hop-by-hop and gateway-owned
        ones, plus C{Host} and the C{X-Forwarded-*} set.

        The headers the client's C{Connection} names are removed, except those the
        gateway sets itself (C{X-Request-Id}, C{X-Forwarded-*}, projected identity
        headers) and those request plugins set: the client's hop-by-hop list covers the
        client's own headers only.
        """
        incoming = request.requestHeaders
        drop = self.drop_request
        named = connection_tokens(incoming.getRawHeaders(b"connection"))
        if named:
            gateway_set = self.gateway_set
            # Nor those a request plugin set: a client must not strip them.
            plugin_set = exchange.plugin_headers or ()
            named = frozenset(
                name
                for name in named
                if name not in gateway_set
                and not name.startswith(USER_PREFIX)
                and name not in plugin_set
            )
        out: list[tuple[bytes, bytes]] = []
        append = out.append
        for name, values in incoming.getAllRawHeaders():
            lower = name.lower()
            if lower in drop or lower in named:
                continue
            for value in values:
                append((name, value))
        host_values = incoming.getRawHeaders(b"host")
        inbound_host = host_values[0] if host_values else b""
        append((b"Host", inbound_host if self.spec.preserve_host else self.upstream.authority))
        peer = request.getClientAddress()
        peer_host = getattr(peer, "host", "")
        chain = incoming.getRawHeaders(b"x-forwarded-for")
        forwarded_for = peer_host.encode("ascii", "replace")
        if chain:
            forwarded_for = b", ".join([*chain, forwarded_for])
        append((b"X-Forwarded-For", forwarded_for))
        proto = incoming.getRawHeaders(b"x-forwarded-proto")
        append(
            (
                b"X-Forwarded-Proto",
                proto[0] if proto else (b"https" if request.isSecure() else b"http"),
            )
        )
        forwarded_host = incoming.getRawHeaders(b"x-forwarded-host")
        if forwarded_host or inbound_host:
            append((b"X-Forwarded-Host", forwarded_host[0] if forwarded_host else inbound_host))
        if self.spec.forward_cookies:
            cookies = incoming.getRawHeaders(b"cookie")
            if cookies:
                own = self.own_cookie
                cookie = (
                    without_cookies(list(cookies), own) if own is not None else b"; ".join(cookies)
                )
                if cookie:
                    append((b"Cookie", cookie))
        principal = exchange.principal
        if self.spec.forward_access_token and principal is not None and principal.access_token:
            out.append((b"Authorization", b"Bearer " + principal.access_token.encode("ascii")))
        issuer = self.issuer
        if issuer is not None and principal is not None:
            # Minted for this request (the client's own was dropped with the other
            # assertion headers): a backend only sees assertions this gateway made.
            out.append((issuer.header, issuer.mint(principal)))
        if upgrade:
            # Only WebSocket is tunnelled, whatever else the client offered (h2c above all:
            # a backend switching to it would take the connection past the gateway).
            out.append((b"Connection", b"Upgrade"))
            out.append((b"Upgrade", b"websocket"))
        return out

    def _refresh(
        self, exchange: Exchange, outgoing: list[tuple[bytes, bytes]]
    ) -> Callable[[], list[tuple[bytes, bytes]]] | None:
        """
        For a forwardIdentity request: the headers again with a newly minted assertion,
        for the pool's retry (the peer accepts each token id once).
        """
        issuer = self.issuer
        principal = exchange.principal
        if issuer is None or principal is None:
            return None
        name = issuer.header

        def refresh() -> list[tuple[bytes, bytes]]:
            return [
                (field, issuer.mint(principal) if field == name else value)
                for field, value in outgoing
            ]

        return refresh

    # -- response --------------------------------------------------------------------------

    def relay_head(
        self, request: Request, response: UpstreamResponse, private: bool = False
    ) -> None:
        """
        Copy the upstream's status and end-to-end headers to the client response,
        repeated headers (C{Set-Cookie}) in order.

        C{Content-Length} is the gateway's own: one field with the length the upstream
        client read (identical repeated values collapsed; differing ones failed the
        response already), and none on 204 and 304, which have no body.

        @param private: The request carries a principal: a response that relays no
            C{Cache-Control} directive gets C{Cache-Control: private} (a shared cache
            must not keep one user's answer for another); the upstream's own
            C{Cache-Control} is relayed as it is, C{public} included.
        """
        request.setResponseCode(response.code, response.phrase or None)
        # Relay the upstream's headers as they are: no Content-Type of Twisted's own
        # (text/html) on a response that had none.
        request.defaultContentType = None
        plans = self._response_plans
        own = self.own_cookie
        named: frozenset[bytes] = frozenset()
        relayed: dict[bytes, list[bytes]] = {}
        for name, value in response.headers:
            plan = plans.get(name)
            if plan is None:
                plan = self._plan(name)
            canonical, kind = plan
            if kind:
                if kind == _SKIP:
                    continue
                if kind == _CONNECTION:
                    # Hop-by-hop names (keep-alive) are skipped anyway: nothing to filter
                    # for nginx's "Connection: keep-alive" (-0.5 µs), nor to parse.
                    if value not in _PLAIN_CONNECTION:
                        listed = connection_tokens([value]) - self.skip_response
                        if listed:
                            named = named | listed
                    continue
                if own is not None and own(set_cookie_name(value)):
                    # A backend never sets (or clears) the gateway's session or login
                    # cookies: it could swap a visitor's session for another one.
                    _log.warn(
                        "dropped a Set-Cookie for the gateway's own cookie from {upstream}",
                        upstream=self.spec.upstream,
                    )
                    continue
            values = relayed.get(canonical)
            if values is None:
                relayed[canonical] = [value]
            else:
                values.append(value)
        if named:
            relayed = {
                canonical: values
                for canonical, values in relayed.items()
                if canonical.lower() not in named
            }
        code = response.code
        if response.length is not None and code != 204 and code != 304:
            relayed[_CONTENT_LENGTH] = [b"%d" % response.length]
        if private:
            # After the Connection filtering: a Cache-Control the upstream named
            # hop-by-hop is not relayed, so it does not count. An empty field has no
            # directive either (a cache would apply its heuristics).
            cache_control = relayed.get(_CACHE_CONTROL)
            if cache_control is None or not any(value.strip() for value in cache_control):
                relayed[_CACHE_CONTROL] = [_PRIVATE]
        headers = request.responseHeaders
        if _DIRECT:
            # Names canonical already, values from the upstream parser (no CR or LF):
            # into Twisted's dict at once (-1.5 µs a small proxied response of 8 fields).
            raw_fields(headers).update(relayed)
        else:
            for canonical, values in relayed.items():
                headers.setRawHeaders(canonical, values)

    def _plan(self, name: bytes) -> tuple[bytes, int]:
        """
        What L{relay_head} does with a response header named C{name} (as sent): its
        canonical name and whether it is relayed, skipped, a C{Connection} header or a
        C{Set-Cookie} to check; remembered for names up to 64 bytes, 1,000 names.
        """
        lower = name.lower()
        if lower == b"connection":
            kind = _CONNECTION
        elif lower in self.skip_response:
            kind = _SKIP
        elif lower == b"set-cookie":
            kind = _COOKIE
        else:
            kind = _RELAY
        plan = (canonical_name(name), kind)
        if len(name) <= MAX_NAME_LENGTH and len(self._response_plans) < _MAX_PLANS:
            self._response_plans[name] = plan
        return plan

    # -- the terminal ----------------------------------------------------------------------

    async def respond(self, request: Request) -> None:
        """
        Forward C{request} (whose route's exchange it reads) and relay the answer.
        """
        exchange = exchange_of(request)
        method = request.method
        headers = request.requestHeaders
        upgrade = method == b"GET" and is_websocket_upgrade(
            headers.getRawHeaders(b"connection"), headers.getRawHeaders(b"upgrade")
        )
        body: Any = exchange.body
        outgoing = self.request_headers(request, exchange, upgrade)
        if body is not None and body.length == 0:
            body = None
        if body is None and method not in BODYLESS_METHODS:
            outgoing.append((b"Content-Length", b"0"))
        target = self.target(request)
        call = start_call(
            exchange, "upstream", self.upstream, method, target, outgoing, None, self.metrics
        )
        pending = self.client.request(
            self.upstream,
            method,
            target,
            outgoing,
            body,
            upgrade=upgrade,
            refresh=self._refresh(exchange, outgoing),
        )
        if self.timeout is not None:
            pending.addTimeout(self.timeout, self.reactor)
        try:
            response = await pending
        except CancelledError:
            call.end(error="cancelled")
            raise
        except TimeoutError:
            call.end(error="timeout")
            write_text(request, 504, b"gateway timeout\n")
            return
        except UpstreamUnavailableError:
            # No connection could be had (maxConnectionsPerUpstream): nothing was sent.
            call.end(error="no upstream connection available")
            write_text(request, 503, b"service unavailable\n")
            return
        except Exception as e:
            call.end(error=describe_error(e))
            write_text(request, 502, b"bad gateway\n")
            return
        if response.code == 101:
            if not upgrade or not is_websocket_upgrade([b"upgrade"], _values(response, b"upgrade")):
                call.end(response.code, "101 to something other than websocket")
                response.abort()
                write_text(request, 502, b"bad gateway\n")
                return
            call.end(response.code)
            if client_gone(request):
                # The client left while the upstream agreed: nothing to tunnel.
                response.abort()
                return
            tunnel = Tunnel(request, response, self.own_cookie)
            try:
                await tunnel.start()
            except UpgradeNotPossibleError:
                # The client's protocol cannot hand its connection over (HTTP/2).
                response.abort()
                write_text(request, 502, b"bad gateway\n")
                return
            exchange.note("tunnel_bytes_up", tunnel.to_upstream)
            return
        self.relay_head(request, response, exchange.principal is not None)
        await self._relay_body(request, response, call)

    async def _relay_body(
        self, request: Request, response: UpstreamResponse, call: UpstreamCall
    ) -> None:
        if not response.has_body:
            call.end(response.code)
            request.finish()
            await response.deliver(_Discard())
            return
        body = response.body
        if body is not None:
            # Read with the head: no producer, no second wait (with the pool side, ~6 µs).
            call.end(response.code)
            if not client_gone(request):
                write_whole(request, body)
            return
        length = response.length
        if length is not None and compresses_whole(request, length):
            # A body the client gets compressed, short enough to read whole first: then
            # compressed at once and sent with its length (not flushed piece by piece).
            await self._relay_whole(request, response, call)
            return
        relay = _Relay(request, response)
        request.registerProducer(relay, True)
        # Send the head now: a stream (server-sent events) may have no body byte for a
        # long time, and the client must see the response start. Twisted only writes the
        # head on the first write; an empty write sends it and nothing else.
        request.write(b"")
        whole = await _deliver(response, relay, call)
        request.unregisterProducer()
        if not whole:
            abort(request)
        elif not client_gone(request):
            request.finish()

    async def _relay_whole(
        self, request: Request, response: UpstreamResponse, call: UpstreamCall
    ) -> None:
        pieces: list[bytes] = []
        if not await _deliver(response, _Collect(pieces), call):
            # As for a body streamed: the client sees a broken transfer, never a short
            # body it would trust. (Unless it is gone already: its channel may have
            # answered it, a malformed upload's 400, which dropping would lose.)
            if not client_gone(request):
                abort(request)
        elif not client_gone(request):
            write_whole(request, b"".join(pieces))


async def _deliver(response: UpstreamResponse, sink: BodySink, call: UpstreamCall) -> bool:
    """
    The upstream's body into C{sink}, the call ended with how it went: whether the body
    came whole (else the upstream broke off). Cancelled, the upstream exchange is aborted.
    """
    try:
        await response.deliver(sink)
    except CancelledError:
        call.end(response.code, "cancelled mid-body")
        response.abort()
        raise
    except Exception as e:
        call.end(response.code, "body: " + describe_error(e))
        return False
    call.end(response.code)
    return True


def _values(response: UpstreamResponse, name: bytes) -> list[bytes]:
    return [value for header, value in response.headers if header.lower() == name]


class _Collect:
    """
    Keeps the pieces of a body read whole (at most
    L{HOLD_LIMIT<edgegw.compression.response_coding.HOLD_LIMIT>} bytes).
    """

    def __init__(self, pieces: list[bytes]) -> None:
        self.write = pieces.append


class _Discard:
    def write(self, data: bytes) -> None:
        pass
