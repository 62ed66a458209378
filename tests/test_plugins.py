"""
Request and response plugins end to end: plugins registered through real entry points
(L{tests.support.plugin_dists}), RequestPlugin and ResponsePlugin resources in a
configuration directory, a real gateway and real backends on loopback sockets.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.protocol import Factory
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET, Request
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Message, TextMessage
from wsproto.events import Request as WSRequest

from edgegw.assembly.assemble import build_gateway
from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.plugins.manifest import same_version
from edgegw.plugins.messages import Reply
from edgegw.plugins.registry import describe_plugins, plugin_names
from edgegw.plugins.stages import PluginError, _ResponseWatcher
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import RawBackend, RawConnection, RawRequest, SiteBackend
from tests.support.configs import GATEWAY, write_tree
from tests.support.log_capture import capture_log
from tests.support.plugin_dists import PluginBoomError, install_distribution, install_plugins
from tests.support.processes import connections_closed, listen_local, port_of
from tests.support.rawclient import connect, response_complete
from tests.test_proxy import EchoWebSocket
from tests.test_proxy import parse as parse_response

reactor: Any = _reactor

INSTALLED = (
    "body-limit, boom, cancels, coro, headers, hollow, later, missing, nothing, rate-limit, "
    "replier, rewriter, status, strict, tagger, upper"
)
"""Every plugin name registered while the test plugins are installed, as listed."""


# -- configuration -------------------------------------------------------------------


def route(name: str, match: str, upstream: str, labels: Mapping[str, str] | None = None) -> str:
    """
    A reverse-proxy Route document.
    """
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    handler = {"type": "reverse-proxy", "upstream": upstream}
    spec = {"match": match, "handler": handler}
    return f"---\nkind: Route\nmetadata: {json.dumps(metadata)}\nspec: {json.dumps(spec)}\n"


def static_route(name: str, match: str, directory: str) -> str:
    """
    A static Route document serving C{directory}.
    """
    spec = {"match": match, "handler": {"type": "static", "dir": directory}}
    return f"---\nkind: Route\nmetadata: {json.dumps({'name': name})}\nspec: {json.dumps(spec)}\n"


def plugin(
    kind: str,
    name: str,
    uses: str | None = None,
    config: Mapping[str, Any] | None = None,
    selector: Mapping[str, Any] | None = None,
) -> str:
    """
    A RequestPlugin or ResponsePlugin document (JSON is YAML).

    @param uses: C{spec.plugin} (left out when L{None}: the name is the plugin's).
    """
    spec: dict[str, Any] = {}
    if uses is not None:
        spec["plugin"] = uses
    if selector is not None:
        spec["selector"] = dict(selector)
    if config is not None:
        spec["config"] = dict(config)
    return f"---\nkind: {kind}\nmetadata: {json.dumps({'name': name})}\nspec: {json.dumps(spec)}\n"


def request_plugin(name: str, uses: str | None = None, **kwargs: Any) -> str:
    """A RequestPlugin document."""
    return plugin("RequestPlugin", name, uses, **kwargs)


def response_plugin(name: str, uses: str | None = None, **kwargs: Any) -> str:
    """A ResponsePlugin document."""
    return plugin("ResponsePlugin", name, uses, **kwargs)


def config_tree(test: TestCase, files: Mapping[str, str]) -> str:
    """
    A configuration directory: the Gateway in C{00-gateway.yaml}, then C{files}.
    """
    return write_tree(test.mktemp(), {"00-gateway.yaml": GATEWAY, **files})


def serve(test: TestCase, files: Mapping[str, str]) -> int:
    """
    Build the gateway of L{config_tree}C{(files)}, listen on 127.0.0.1 until C{test}
    ends, and return its port.
    """
    root = config_tree(test, files)
    client = UpstreamClient(reactor)
    built = build_gateway(load_config(root, {}), reactor, client)
    listening = listen_local(built.site)
    test.addCleanup(connections_closed)
    test.addCleanup(client.close)
    test.addCleanup(listening.stopListening)
    return port_of(listening)


def config_problems(test: TestCase, files: Mapping[str, str]) -> list[str]:
    """
    The problems building the gateway of L{config_tree}C{(files)} reports (as strings,
    file paths relative to the directory).
    """
    root = config_tree(test, files)
    try:
        build_gateway(load_config(root, {}), reactor, UpstreamClient(reactor))
    except ConfigError as e:
        return [str(p).removeprefix(root + os.sep) for p in e.problems]
    raise AssertionError("expected a ConfigError")


# -- the client ----------------------------------------------------------------------


Response = tuple[int, dict[str, list[str]], bytes]


def parse_head(data: bytes) -> tuple[int, dict[str, list[str]]]:
    """
    Status and headers (lowercased names) of the response head at the start of C{data}.
    """
    head = data.partition(b"\r\n\r\n")[0]
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(": ")
        headers.setdefault(name.lower(), []).append(value)
    return int(lines[0].split(" ")[1]), headers


def parse(data: bytes) -> Response:
    """
    Status, headers (lowercased names) and body (dechunked) of one response.
    """
    return parse_response(data)


def request_bytes(
    method: str, target: str, headers: Sequence[tuple[str, str]] = (), body: bytes | None = None
) -> bytes:
    """
    One HTTP/1.1 request (C{Connection: close}; C{Content-Length} when C{body} is given).
    """
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway.test", "Connection: close"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def fetch(
    port: int,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> Response:
    """
    One request over a fresh connection; the whole response.
    """
    client = await connect(port)
    client.send(request_bytes(method, target, headers, body))
    data = await client.until(response_complete)
    await client.close()
    return parse(data)


async def fetch_raw(port: int, data: bytes) -> bytes:
    """
    Send C{data} over a fresh connection; everything received until the gateway closes
    it (the request says C{Connection: close}).
    """
    client = await connect(port)
    client.send(data)
    await client.closed
    return client.received


async def sleep(seconds: float) -> None:
    """Wait C{seconds} on the real reactor."""
    await deferLater(reactor, seconds, lambda: None)


def plugin_failures(events: list[dict[str, Any]]) -> list[PluginError]:
    """
    The plugin failures the recover stage logged among C{events}.
    """
    return [
        event["log_failure"].value
        for event in events
        if event.get("log_namespace") == "edgegw.recover"
        and event.get("log_failure") is not None
        and event["log_failure"].check(PluginError)
    ]


# -- the backend ---------------------------------------------------------------------


class Backend:
    """
    A recording L{SiteBackend} answering per path:

      - C{.../chunked}: C{"chunk one, "} then, a moment later, C{"chunk two"}, with no
        length (chunked);
      - C{.../big}: 5000 bytes of C{"x"};
      - C{.../empty}: 204;
      - C{.../unchanged}: 304 with an C{ETag};
      - C{.../events}: an event stream: its head, C{"data: one"} a moment later, then
        nothing until the test writes more and finishes it (L{streams});
      - anything else: 200 C{"hello"} (text/plain) with C{X-Backend: yes} and
        C{X-Tags: backend}.

    @ivar streams: The event-stream requests, still open until the test finishes them.
    """

    def __init__(self, test: TestCase) -> None:
        self.streams: list[Request] = []
        self._later: list[Any] = []
        self.site = SiteBackend(self._respond).start()
        test.addCleanup(lambda: ensureDeferred(self.site.stop()))
        test.addCleanup(self._cancel)
        self.url = f"http://127.0.0.1:{self.site.port}"

    @property
    def hits(self) -> int:
        """How many requests the backend has received."""
        return len(self.site.requests)

    def _cancel(self) -> None:
        for call in self._later:
            if call.active():
                call.cancel()

    def _respond(self, request: Request) -> bytes | int:
        path = request.path
        headers = request.responseHeaders
        if path.endswith(b"/chunked"):
            headers.setRawHeaders(b"content-type", [b"text/plain"])
            request.write(b"chunk one, ")

            def rest() -> None:
                if not request._disconnected:
                    request.write(b"chunk two")
                    request.finish()

            self._later.append(reactor.callLater(0.02, rest))
            return NOT_DONE_YET
        if path.endswith(b"/big"):
            headers.setRawHeaders(b"content-type", [b"text/plain"])
            return b"x" * 5000
        if path.endswith(b"/empty"):
            request.setResponseCode(204)
            return b""
        if path.endswith(b"/unchanged"):
            request.setResponseCode(304)
            headers.setRawHeaders(b"etag", [b'"v1"'])
            return b""
        if path.endswith(b"/events"):
            headers.setRawHeaders(b"content-type", [b"text/event-stream"])
            headers.setRawHeaders(b"cache-control", [b"no-cache"])
            request.write(b"")
            self.streams.append(request)

            def first() -> None:
                if not request._disconnected:
                    request.write(b"data: one\n\n")

            self._later.append(reactor.callLater(0.05, first))
            return NOT_DONE_YET
        headers.setRawHeaders(b"content-type", [b"text/plain"])
        headers.setRawHeaders(b"x-backend", [b"yes"])
        headers.setRawHeaders(b"x-tags", [b"backend"])
        return b"hello"

    def header(self, index: int, name: bytes) -> list[bytes]:
        """
        Every value of C{name} in the C{index}th request received.
        """
        lowered = name.lower()
        return [value for key, value in self.site.requests[index].headers if key.lower() == lowered]


class PluginTestCase(TestCase):
    """
    The test plugins are installed, and a recording backend listens.
    """

    timeout = 10

    def setUp(self) -> None:
        install_plugins(self)
        self.backend = Backend(self)


# -- 1. order ------------------------------------------------------------------------


class OrderTests(PluginTestCase):
    """
    Plugins run in document order across the files of a configuration directory (files
    in lexical order), whatever their names: request plugins on the way in, response
    plugins from the terminal outward.
    """

    def files(self) -> dict[str, str]:
        upstream = self.backend.url
        return {
            # Document order: zulu (a), yankee (b, async), xray (c) for requests;
            # the names sort the other way round.
            "10-first.yaml": request_plugin("zulu", "tagger", config={"tag": "a"})
            + response_plugin("out-zulu", "tagger", config={"tag": "1"})
            + response_plugin("winner-first", "headers", config={"set": {"X-Winner": "first"}}),
            "20-second.yaml": route("r", "/", upstream)
            + request_plugin("yankee", "later", config={"value": "b", "delay": 0.02})
            + response_plugin("out-yankee", "tagger", config={"tag": "2"}),
            "30-third.yaml": request_plugin("xray", "tagger", config={"tag": "c"})
            + response_plugin("out-xray", "tagger", config={"tag": "3"})
            + response_plugin("winner-second", "headers", config={"set": {"X-Winner": "second"}}),
        }

    async def test_request_plugins_in_document_order(self) -> None:
        port = serve(self, self.files())
        status, _, body = await fetch(port, "GET", "/x", [("X-Tags", "client")])
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual(self.backend.header(0, b"x-tags"), [b"client,a,b,c"])

    async def test_response_plugins_from_the_terminal_outward(self) -> None:
        port = serve(self, self.files())
        status, headers, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (200, b"hello"))
        # The backend's value first, then each plugin in document order.
        self.assertEqual(headers["x-tags"], ["backend,1,2,3"])
        # The later document runs later: its value is the one the client sees.
        self.assertEqual(headers["x-winner"], ["second"])


# -- 2. selectors --------------------------------------------------------------------


class SelectorTests(PluginTestCase):
    """
    A plugin resource runs on the routes its selector selects (as a RouteGroup's
    selector does), and only there.
    """

    def files(self) -> dict[str, str]:
        upstream = self.backend.url

        def tag(name: str, selector: Mapping[str, Any]) -> str:
            return request_plugin(
                name, "tagger", config={"tag": name, "header": "X-Sel"}, selector=selector
            )

        return {
            "10-routes.yaml": route("api", "/api/", upstream, {"tier": "api"})
            + route("web", "/web/", upstream, {"tier": "web"})
            + route("plain", "/plain/", upstream)
            + route("beta", "/beta/", upstream, {"tier": "api", "beta": "1"})
            + route("db", "/db/", upstream, {"tier": "db", "stage": "x"}),
            "20-plugins.yaml": tag("L", {"matchLabels": {"tier": "api"}})
            + tag("I", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]})
            + tag(
                "N",
                {
                    "matchExpressions": [
                        {"key": "tier", "operator": "NotIn", "values": ["api", "db"]}
                    ]
                },
            )
            + tag("E", {"matchExpressions": [{"key": "beta", "operator": "Exists"}]})
            + tag("D", {"matchExpressions": [{"key": "stage", "operator": "DoesNotExist"}]})
            + tag(
                "B",
                {
                    "matchLabels": {"tier": "api"},
                    "matchExpressions": [{"key": "beta", "operator": "DoesNotExist"}],
                },
            ),
        }

    async def test_selected_routes(self) -> None:
        port = serve(self, self.files())
        expected = {
            "/api/x": [b"L,D,B"],
            "/web/x": [b"I,N,D"],
            "/plain/x": [b"N,D"],
            "/beta/x": [b"L,E,D"],
            # Selected by none: untouched.
            "/db/x": [],
        }
        for index, (target, tags) in enumerate(expected.items()):
            status, _, _ = await fetch(port, "GET", target)
            self.assertEqual(status, 200)
            self.assertEqual(self.backend.site.requests[index].uri, target.encode())
            self.assertEqual(self.backend.header(index, b"x-sel"), tags, target)

    async def test_no_selector_selects_every_route(self) -> None:
        upstream = self.backend.url
        port = serve(
            self,
            {
                "10-routes.yaml": route("api", "/api/", upstream, {"tier": "api"})
                + route("plain", "/plain/", upstream)
                + request_plugin("in-all", "tagger", config={"tag": "in"})
                + response_plugin("out-all", "tagger", config={"tag": "out"})
                + response_plugin(
                    "out-api",
                    "tagger",
                    config={"tag": "api"},
                    selector={"matchLabels": {"tier": "api"}},
                ),
            },
        )
        _, api, _ = await fetch(port, "GET", "/api/x")
        _, plain, _ = await fetch(port, "GET", "/plain/x")
        self.assertEqual(self.backend.header(0, b"x-tags"), [b"in"])
        self.assertEqual(self.backend.header(1, b"x-tags"), [b"in"])
        self.assertEqual(api["x-tags"], ["backend,out,api"])
        self.assertEqual(plain["x-tags"], ["backend,out"])

    async def test_unselected_route_untouched(self) -> None:
        upstream = self.backend.url
        selector = {"matchLabels": {"tier": "api"}}
        port = serve(
            self,
            {
                "10-routes.yaml": route("api", "/api/", upstream, {"tier": "api"})
                + route("other", "/other/", upstream, {"tier": "web"})
                + request_plugin("in", "boom", selector=selector)
                + response_plugin("out", "status", config={"status": 203}, selector=selector)
                + response_plugin("up", "upper", selector=selector),
            },
        )
        status, headers, body = await fetch(port, "GET", "/other/x", [("X-Tags", "client")])
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual(headers["x-tags"], ["backend"])
        self.assertEqual(headers["content-length"], ["5"])
        self.assertNotIn("x-upper", headers)
        self.assertEqual(self.backend.header(0, b"x-tags"), [b"client"])
        self.flushLoggedErrors(PluginError)
        status, _, _ = await fetch(port, "GET", "/api/x")
        self.assertEqual(status, 500)
        self.assertEqual(self.backend.hits, 1)
        self.assertEqual(len(self.flushLoggedErrors(PluginError)), 1)


# -- 3. short-circuit ----------------------------------------------------------------


class ShortCircuitTests(PluginTestCase):
    """
    A request plugin's L{Reply} answers the request: the backend never sees it, and the
    plugins after it never run.
    """

    async def test_reply(self) -> None:
        upstream = self.backend.url
        port = serve(
            self,
            {
                "10-routes.yaml": route("open", "/open/", upstream, {"tier": "open"})
                + route("stop", "/stop/", upstream, {"tier": "stop"}),
                "20-plugins.yaml": request_plugin("first", "tagger", config={"tag": "a"})
                + request_plugin(
                    "stopper",
                    "replier",
                    config={
                        "status": 418,
                        "body": "short and stout\n",
                        "headers": {"X-Reply": "yes", "Cache-Control": "no-store"},
                    },
                    selector={"matchLabels": {"tier": "stop"}},
                )
                + request_plugin("after", "boom", selector={"matchLabels": {"tier": "stop"}}),
            },
        )
        status, _, body = await fetch(port, "GET", "/open/x")
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual(self.backend.hits, 1)
        status, headers, body = await fetch(port, "GET", "/stop/x")
        self.assertEqual((status, body), (418, b"short and stout\n"))
        self.assertEqual(headers["x-reply"], ["yes"])
        self.assertEqual(headers["cache-control"], ["no-store"])
        self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
        self.assertEqual(headers["content-length"], ["16"])
        # The gateway's own headers are still there.
        self.assertEqual(headers["x-frame-options"], ["DENY"])
        self.assertEqual(len(headers["x-request-id"]), 1)
        self.assertEqual(self.backend.hits, 1)
        self.assertEqual(self.flushLoggedErrors(PluginError), [])

    async def test_async_reply(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin(
                    "wait",
                    "later",
                    config={"delay": 0.02, "reply": {"status": 403, "body": "not now\n"}},
                )
                + request_plugin("after", "boom"),
            },
        )
        status, headers, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (403, b"not now\n"))
        self.assertEqual(headers["content-length"], ["8"])
        self.assertEqual(self.backend.hits, 0)
        self.assertEqual(self.flushLoggedErrors(PluginError), [])

    async def test_reply_with_gateway_header_is_500(self) -> None:
        events = capture_log(self)
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin(
                    "framer", "replier", config={"headers": {"X-Frame-Options": "ALLOWALL"}}
                ),
            },
        )
        status, headers, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (500, b"internal server error\n"))
        self.assertEqual(headers["x-frame-options"], ["DENY"])
        self.assertEqual(self.backend.hits, 0)
        self.assertEqual([e.plugin for e in plugin_failures(events)], ["framer"])
        self.flushLoggedErrors(PluginError)


# -- 4. request rewrites -------------------------------------------------------------


class RequestRewriteTests(PluginTestCase):
    """
    What request plugins change reaches the backend; what would break the gateway's
    invariants answers 500 instead.
    """

    async def test_header_edits_reach_backend(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin(
                    "edits",
                    "headers",
                    config={
                        "remove": ["X-Drop"],
                        "set": {"X-Set": "new"},
                        "add": {"X-Add": ["one", "two"], "X-Fresh": "yes"},
                    },
                ),
            },
        )
        status, _, _ = await fetch(
            port,
            "GET",
            "/x",
            [("X-Drop", "gone"), ("X-Set", "old"), ("X-Set", "older"), ("X-Add", "zero")],
        )
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, b"x-drop"), [])
        self.assertEqual(self.backend.header(0, b"x-set"), [b"new"])
        self.assertEqual(self.backend.header(0, b"x-add"), [b"zero", b"one", b"two"])
        self.assertEqual(self.backend.header(0, b"x-fresh"), [b"yes"])

    async def test_client_gone_while_plugin_decides(self) -> None:
        events = capture_log(self)
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("slow", "later", config={"delay": 0.1}),
            },
        )
        client = await connect(port)
        client.send(request_bytes("GET", "/x"))
        await sleep(0.02)
        await client.close()
        await sleep(0.15)
        self.assertEqual(self.backend.hits, 0)
        self.assertEqual(plugin_failures(events), [])

    async def test_coroutine_hook(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("coro")
                + request_plugin("tag", "tagger", config={"tag": "after"}),
            },
        )
        status, _, _ = await fetch(port, "GET", "/x")
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, b"x-coro"), [b"yes"])
        self.assertEqual(self.backend.header(0, b"x-tags"), [b"after"])

    async def test_path_and_query_rewrites_reach_backend(self) -> None:
        upstream = self.backend.url

        def rewrite(name: str, tier: str, **config: str) -> str:
            return request_plugin(
                name, "rewriter", config=config, selector={"matchLabels": {"tier": tier}}
            )

        port = serve(
            self,
            {
                "10-routes.yaml": route("both", "/both/", upstream, {"tier": "both"})
                + route("path", "/path/", upstream, {"tier": "path"})
                + route("query", "/query/", upstream, {"tier": "query"})
                + route("noquery", "/noquery/", upstream, {"tier": "noquery"}),
                "20-plugins.yaml": rewrite("p1", "both", path="/v2/items", query="a=1&b=%20x")
                + rewrite("p2", "path", path="/moved/a%20b")
                + rewrite("p3", "query", query="only=1")
                + rewrite("p4", "noquery", query=""),
            },
        )
        for target in ("/both/x?old=1", "/path/x?keep=yes", "/query/x?old=1", "/noquery/x?q=1"):
            status, _, body = await fetch(port, "GET", target)
            self.assertEqual((status, body), (200, b"hello"), target)
        self.assertEqual(
            [r.uri for r in self.backend.site.requests],
            [b"/v2/items?a=1&b=%20x", b"/moved/a%20b?keep=yes", b"/query/x?only=1", b"/noquery/x"],
        )

    async def test_unclean_path_is_500(self) -> None:
        events = capture_log(self)
        upstream = self.backend.url
        bad = ["/a/../b", "//x", "x/y", "/a/./b", "/a%2fb", "/a%2e%2e/b", "/a b", "/a\\b", "/a?b"]
        routes = "".join(
            route(f"r{i}", f"/r{i}/", upstream, {"n": str(i)}) for i in range(len(bad))
        )
        plugins = "".join(
            request_plugin(
                f"bad{i}",
                "rewriter",
                config={"path": path},
                selector={"matchLabels": {"n": str(i)}},
            )
            for i, path in enumerate(bad)
        )
        port = serve(self, {"10-routes.yaml": routes + plugins})
        for i, path in enumerate(bad):
            status, _, body = await fetch(port, "GET", f"/r{i}/x")
            self.assertEqual((status, body), (500, b"internal server error\n"), path)
        self.assertEqual(self.backend.hits, 0)
        self.assertEqual(
            [e.plugin for e in plugin_failures(events)], [f"bad{i}" for i in range(len(bad))]
        )
        self.flushLoggedErrors(PluginError)

    async def test_gateway_owned_header_at_runtime_is_500(self) -> None:
        events = capture_log(self)
        upstream = self.backend.url
        owned = ["X-User-Id", "X-Forwarded-For", "X-Request-Id", "Content-Length", "Host"]
        routes = "".join(
            route(f"r{i}", f"/r{i}/", upstream, {"n": str(i)}) for i in range(len(owned))
        )
        plugins = "".join(
            request_plugin(
                f"own{i}",
                "tagger",
                config={"tag": "x", "header": name},
                selector={"matchLabels": {"n": str(i)}},
            )
            for i, name in enumerate(owned)
        )
        port = serve(self, {"10-routes.yaml": routes + plugins})
        for i, name in enumerate(owned):
            status, _, body = await fetch(port, "GET", f"/r{i}/x")
            self.assertEqual((status, body), (500, b"internal server error\n"), name)
        self.assertEqual(self.backend.hits, 0)
        self.assertEqual(len(plugin_failures(events)), len(owned))
        self.flushLoggedErrors(PluginError)


# -- 5. response rewrites ------------------------------------------------------------


class ResponseRewriteTests(PluginTestCase):
    """
    Response plugins change the status, the headers and (when buffered) the body.
    """

    def files(self) -> dict[str, str]:
        upstream = self.backend.url

        def only(tier: str) -> dict[str, Any]:
            return {"matchLabels": {"tier": tier}}

        return {
            "10-routes.yaml": route("status", "/status/", upstream, {"tier": "status"})
            + route("headers", "/headers/", upstream, {"tier": "headers"})
            + route("body", "/body/", upstream, {"tier": "body"}),
            "20-plugins.yaml": response_plugin(
                "accepted", "status", config={"status": 202}, selector=only("status")
            )
            + response_plugin(
                "edits",
                "headers",
                config={
                    "remove": ["X-Backend"],
                    "set": {"Cache-Control": "no-store"},
                    "add": {"Link": ["</a.css>; rel=preload", "</b.js>; rel=preload"]},
                },
                selector=only("headers"),
            )
            + response_plugin("up", "upper", selector=only("body")),
        }

    async def test_status(self) -> None:
        port = serve(self, self.files())
        status, headers, body = await fetch(port, "GET", "/status/x")
        self.assertEqual((status, body), (202, b"hello"))
        self.assertEqual(headers["x-backend"], ["yes"])

    async def test_headers(self) -> None:
        port = serve(self, self.files())
        status, headers, body = await fetch(port, "GET", "/headers/x")
        self.assertEqual((status, body), (200, b"hello"))
        self.assertNotIn("x-backend", headers)
        self.assertEqual(headers["cache-control"], ["no-store"])
        self.assertEqual(headers["link"], ["</a.css>; rel=preload", "</b.js>; rel=preload"])
        self.assertEqual(headers["x-tags"], ["backend"])

    async def test_body_with_length(self) -> None:
        port = serve(self, self.files())
        status, headers, body = await fetch(port, "GET", "/body/x")
        self.assertEqual((status, body), (200, b"[HELLO]"))
        self.assertEqual(headers["content-length"], ["7"])
        self.assertEqual(headers["x-upper"], ["5"])
        self.assertNotIn("transfer-encoding", headers)

    async def test_body_of_chunked_response(self) -> None:
        port = serve(self, self.files())
        client = await connect(port)
        client.send(request_bytes("GET", "/body/chunked"))
        await client.closed
        status, headers, body = parse(client.received)
        self.assertEqual((status, body), (200, b"[CHUNK ONE, CHUNK TWO]"))
        self.assertEqual(headers["content-length"], ["22"])
        self.assertNotIn("transfer-encoding", headers)
        self.assertEqual(headers["x-upper"], ["20"])
        self.assertTrue(client.received.endswith(b"\r\n\r\n[CHUNK ONE, CHUNK TWO]"))

    async def test_body_twice_on_one_connection(self) -> None:
        port = serve(self, self.files())
        client = await connect(port)
        keep_alive = request_bytes("GET", "/body/x").replace(b"Connection: close", b"X-A: b")
        client.send(keep_alive)
        first = await client.until(response_complete)
        client.received = b""
        client.send(request_bytes("GET", "/body/chunked"))
        second = await client.until(response_complete)
        await client.close()
        self.assertEqual(parse(first)[0::2], (200, b"[HELLO]"))
        self.assertEqual(parse(second)[0::2], (200, b"[CHUNK ONE, CHUNK TWO]"))

    async def test_status_and_body_together(self) -> None:
        upstream = self.backend.url
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", upstream)
                + response_plugin("up", "upper")
                + response_plugin("gone", "status", config={"status": 410})
                + response_plugin("tag", "tagger", config={"tag": "t"}),
            },
        )
        status, headers, body = await fetch(port, "GET", "/chunked")
        self.assertEqual((status, body), (410, b"[CHUNK ONE, CHUNK TWO]"))
        self.assertEqual(headers["content-length"], ["22"])
        self.assertEqual(headers["x-tags"], ["t"])

    async def test_not_buffered_for_head_204_and_304(self) -> None:
        port = serve(self, self.files())
        status, headers, body = await fetch(port, "GET", "/body/empty")
        self.assertEqual((status, body), (204, b""))
        self.assertEqual(headers["x-upper"], ["unbuffered"])
        status, headers, body = await fetch(port, "GET", "/body/unchanged")
        self.assertEqual((status, body), (304, b""))
        self.assertEqual(headers["x-upper"], ["unbuffered"])
        self.assertEqual(headers["etag"], ['"v1"'])
        client = await connect(port)
        client.send(request_bytes("HEAD", "/body/x"))
        await client.closed
        status, headers = parse_head(client.received)
        self.assertEqual((status, client.received.partition(b"\r\n\r\n")[2]), (200, b""))
        self.assertEqual(headers["x-upper"], ["unbuffered"])
        self.assertEqual(headers["content-length"], ["5"])

    async def test_static_file_body(self) -> None:
        static = os.path.abspath(self.mktemp())
        os.makedirs(static)
        content = b"abcdefghij" * 20000
        with open(os.path.join(static, "page.txt"), "wb") as stream:
            stream.write(content)
        port = serve(
            self,
            {
                "10-routes.yaml": static_route("files", "/", static)
                + response_plugin("up", "upper", config={"maxBodyBytes": 300000}),
            },
        )
        client = await connect(port)
        client.send(request_bytes("GET", "/page.txt"))
        await client.closed
        status, headers, body = parse(client.received)
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-length"], [str(len(content) + 2)])
        self.assertEqual(headers["x-upper"], [str(len(content))])
        self.assertEqual(body, b"[" + content.upper() + b"]")

    async def test_static_file_over_bound_is_502(self) -> None:
        static = os.path.abspath(self.mktemp())
        os.makedirs(static)
        with open(os.path.join(static, "page.txt"), "wb") as stream:
            stream.write(b"a" * 200000)
        port = serve(
            self,
            {
                "10-routes.yaml": static_route("files", "/", static)
                + response_plugin("up", "upper", config={"maxBodyBytes": 199999}),
            },
        )
        status, headers, body = await fetch(port, "GET", "/page.txt")
        self.assertEqual((status, body), (502, b"bad gateway\n"))
        self.assertNotIn("x-upper", headers)

    async def test_websocket_tunnel_through_response_plugins(self) -> None:
        echo = listen_local(Factory.forProtocol(EchoWebSocket))
        self.addCleanup(echo.stopListening)
        port = serve(
            self,
            {
                "10-routes.yaml": route("ws", "/ws", f"http://127.0.0.1:{port_of(echo)}")
                + response_plugin("tag", "tagger", config={"tag": "t"})
                + response_plugin("up", "upper"),
            },
        )
        client = await connect(port)
        ws = WSConnection(ConnectionType.CLIENT)
        client.send(ws.send(WSRequest(host="gateway.test", target="/ws")))
        await client.until(b"\r\n\r\n")
        self.assertTrue(client.received.startswith(b"HTTP/1.1 101 "), client.received)
        ws.receive_data(client.received)
        client.received = b""
        self.assertIsInstance(next(iter(ws.events())), AcceptConnection)
        client.send(ws.send(Message(data="hello")))
        await client.until(lambda data: len(data) >= 7)
        ws.receive_data(client.received)
        [echoed] = list(ws.events())
        assert isinstance(echoed, TextMessage)
        self.assertEqual(echoed.data, "hello")
        await client.close()


# -- 6. streaming --------------------------------------------------------------------


class StreamingTests(PluginTestCase):
    """
    Header-only response plugins let the body stream; a body-wanting one buffers it,
    up to its bound.
    """

    async def stream_through(self, port: int) -> dict[str, list[str]]:
        """
        Read an event stream from C{/events}: the first event must arrive while the
        backend still holds the stream open; return the head's headers.
        """
        client = await connect(port)
        client.send(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        first = await client.until(b"data: one\n\n")
        self.assertEqual(len(self.backend.streams), 1)
        stream = self.backend.streams[0]
        self.assertFalse(stream.finished)
        self.assertNotIn(b"data: two", first)
        status, headers = parse_head(first)
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], ["text/event-stream"])
        self.assertEqual(headers["transfer-encoding"], ["chunked"])
        stream.write(b"data: two\n\n")
        await client.until(b"data: two\n\n")
        self.assertFalse(stream.finished)
        stream.finish()
        whole = await client.until(b"0\r\n\r\n")
        await client.close()
        self.assertEqual(parse(whole)[2], b"data: one\n\ndata: two\n\n")
        return headers

    async def test_event_stream_through_header_plugin(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + response_plugin("tag", "tagger", config={"tag": "sse"})
                + response_plugin("edits", "headers", config={"set": {"X-Accel-Buffering": "no"}}),
            },
        )
        headers = await self.stream_through(port)
        self.assertEqual(headers["x-tags"], ["sse"])
        self.assertEqual(headers["x-accel-buffering"], ["no"])

    async def test_event_stream_not_buffered_for_body_plugin(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + response_plugin("up", "upper")
                + response_plugin("tag", "tagger", config={"tag": "sse"}),
            },
        )
        headers = await self.stream_through(port)
        self.assertEqual(headers["x-upper"], ["unbuffered"])
        self.assertEqual(headers["x-tags"], ["sse"])

    async def test_chunked_body_streams_through_header_plugin(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + response_plugin("tag", "tagger", config={"tag": "t"}),
            },
        )
        client = await connect(port)
        client.send(request_bytes("GET", "/chunked"))
        # The first piece arrives before the backend has written the second.
        first = await client.until(b"chunk one, ")
        self.assertNotIn(b"chunk two", first)
        await client.closed
        status, headers, body = parse(client.received)
        self.assertEqual((status, body), (200, b"chunk one, chunk two"))
        self.assertEqual(headers["transfer-encoding"], ["chunked"])
        self.assertEqual(headers["x-tags"], ["t"])

    async def test_body_over_bound_is_502(self) -> None:
        events = capture_log(self)
        upstream = self.backend.url
        port = serve(
            self,
            {
                "10-routes.yaml": route("one", "/one/", upstream, {"tier": "one"})
                + route("two", "/two/", upstream, {"tier": "two"}),
                # /one/: bound 4999 (one under the body's 5000).
                "20-plugins.yaml": response_plugin(
                    "small",
                    "upper",
                    config={"maxBodyBytes": 4999},
                    selector={"matchLabels": {"tier": "one"}},
                )
                # /two/: the smallest of two bounds applies (10, then 5000).
                + response_plugin(
                    "tiny",
                    "upper",
                    config={"maxBodyBytes": 10},
                    selector={"matchLabels": {"tier": "two"}},
                )
                + response_plugin(
                    "exact",
                    "upper",
                    config={"maxBodyBytes": 5000},
                    selector={"matchLabels": {"tier": "two"}},
                ),
            },
        )
        for target in ("/one/big", "/two/big", "/two/chunked", "/one/big"):
            status, headers, body = await fetch(port, "GET", target)
            self.assertEqual((status, body), (502, b"bad gateway\n"), target)
            self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
            self.assertNotIn("x-upper", headers)
        # Within the bound: 5 bytes.
        status, _, body = await fetch(port, "GET", "/two/x")
        self.assertEqual((status, body), (200, b"[[HELLO]]"))
        warnings = [e for e in events if e.get("log_namespace") == "edgegw.plugins"]
        self.assertEqual(len(warnings), 4)
        self.assertIn("over 4999 bytes", warnings[0]["reason"])

    async def test_body_at_bound_passes(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + response_plugin("up", "upper", config={"maxBodyBytes": 5000}),
            },
        )
        status, headers, body = await fetch(port, "GET", "/big")
        self.assertEqual((status, body), (200, b"[" + b"X" * 5000 + b"]"))
        self.assertEqual(headers["content-length"], ["5002"])


# -- 7. failing plugins --------------------------------------------------------------


class FailureTests(PluginTestCase):
    """
    A plugin that raises answers 500 (nothing of the backend's answer reaches the
    client), logged with the plugin resource's name.
    """

    def assert_logged(self, events: list[dict[str, Any]], kind: str, names: list[str]) -> None:
        failures = plugin_failures(events)
        self.assertEqual([f.plugin for f in failures], names)
        for failure in failures:
            self.assertEqual(
                str(failure),
                f'{kind} "{failure.plugin}" failed: '
                f"PluginBoomError: {kind.removesuffix('Plugin').lower()} plugin exploded",
            )
        self.assertEqual(len(self.flushLoggedErrors(PluginError)), len(names))

    async def test_raising_request_plugin(self) -> None:
        events = capture_log(self)
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("fine", "tagger", config={"tag": "a"})
                + request_plugin("kaboom", "boom")
                + request_plugin("never", "replier", config={"status": 200, "body": "no"}),
            },
        )
        status, headers, body = await fetch(port, "POST", "/x", body=b"payload")
        self.assertEqual((status, body), (500, b"internal server error\n"))
        self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
        self.assertEqual(self.backend.hits, 0)
        self.assertIsInstance(plugin_failures(events)[0].__cause__, PluginBoomError)
        self.assert_logged(events, "RequestPlugin", ["kaboom"])

    async def test_raising_response_plugin(self) -> None:
        events = capture_log(self)
        upstream = self.backend.url
        port = serve(
            self,
            {
                "10-routes.yaml": route("head", "/head/", upstream, {"tier": "head"})
                + route("body", "/body/", upstream, {"tier": "body"}),
                "20-plugins.yaml": response_plugin("before", "tagger", config={"tag": "a"})
                + response_plugin("kaboom", "boom", selector={"matchLabels": {"tier": "head"}})
                + response_plugin(
                    "kaboom-buffered",
                    "boom",
                    config={"wantsBody": True},
                    selector={"matchLabels": {"tier": "body"}},
                )
                + response_plugin("after", "status", config={"status": 203}),
            },
        )
        for target in ("/head/x", "/head/chunked", "/body/x", "/body/chunked", "/head/big"):
            raw = await fetch_raw(port, request_bytes("GET", target))
            status, headers, body = parse(raw)
            self.assertEqual((status, body), (500, b"internal server error\n"), target)
            self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
            self.assertEqual(headers["content-length"], ["22"])
            for leaked in ("x-backend", "x-tags", "transfer-encoding"):
                self.assertNotIn(leaked, headers, target)
            for part in (b"hello", b"chunk", b"xxx", b"backend"):
                self.assertNotIn(part, raw, target)
        self.assertEqual(self.backend.hits, 5)
        self.assert_logged(
            events,
            "ResponsePlugin",
            ["kaboom", "kaboom", "kaboom-buffered", "kaboom-buffered", "kaboom"],
        )

    async def test_raising_response_plugin_on_event_stream(self) -> None:
        events = capture_log(self)
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + response_plugin("kaboom", "boom"),
            },
        )
        raw = await fetch_raw(port, request_bytes("GET", "/events"))
        status, headers, body = parse(raw)
        self.assertEqual((status, body), (500, b"internal server error\n"))
        self.assertNotIn("text/event-stream", headers["content-type"])
        self.assertNotIn(b"data:", raw)
        self.assert_logged(events, "ResponsePlugin", ["kaboom"])
        # The backend's stream is let go.
        stream = self.backend.streams[0]
        while not stream._disconnected:
            await sleep(0.01)


# -- 8. configuration errors ---------------------------------------------------------


class ConfigErrorTests(PluginTestCase):
    """
    A plugin's own config checks, an unknown plugin and a plugin of the wrong kind are
    configuration errors located at the resource and the field.
    """

    async def test_plugin_validation_located(self) -> None:
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url),
                "20-plugins.yaml": request_plugin("ok", "strict", config={"level": 2})
                + request_plugin("lvl", "strict", config={"level": "high"})
                + response_plugin("several", "strict", config={"level": 9, "colour": "red"})
                + response_plugin("empty", "strict"),
            },
        )
        self.assertEqual(
            problems,
            [
                '20-plugins.yaml, document 2, RequestPlugin "lvl": spec.config.level: '
                "must be an integer from 1 to 3",
                '20-plugins.yaml, document 3, ResponsePlugin "several": spec.config.colour: '
                "unknown field (expected: level)",
                '20-plugins.yaml, document 3, ResponsePlugin "several": spec.config.level: '
                "must be an integer from 1 to 3",
                '20-plugins.yaml, document 4, ResponsePlugin "empty": spec.config.level: '
                "must be an integer from 1 to 3",
            ],
        )

    def test_check_reports_located_errors(self) -> None:
        root = config_tree(
            self,
            {
                "10-routes.yaml": route("r", "/", "http://127.0.0.1:1")
                + request_plugin("lvl", "strict", config={"level": 0}),
            },
        )
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(check(root, out, err), 1)
        self.assertEqual(out.getvalue(), "")
        path = os.path.join(root, "10-routes.yaml")
        self.assertEqual(
            err.getvalue(),
            "edgegw: configuration has 1 error:\n"
            f'  {path}, document 2, RequestPlugin "lvl": spec.config.level: '
            "must be an integer from 1 to 3\n",
        )

    async def test_unknown_and_unusable_plugins(self) -> None:
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url),
                "20-plugins.yaml": request_plugin("nope")
                + response_plugin("named", "no-such-plugin")
                + request_plugin("resp-only", "status", config={"status": 203})
                + response_plugin("req-only", "body-limit", config={"maxBytes": 10})
                + request_plugin("not-a-plugin", "nothing")
                + response_plugin("broken", "missing"),
            },
        )
        where = "20-plugins.yaml, document"
        self.assertEqual(
            problems,
            [
                f'{where} 1, RequestPlugin "nope": spec.plugin: '
                f'no plugin "nope" is installed (installed: {INSTALLED})',
                f'{where} 3, RequestPlugin "resp-only": spec.plugin: '
                'plugin "status" cannot be used as a RequestPlugin: '
                "it does not provide IRequestPlugin",
                f'{where} 5, RequestPlugin "not-a-plugin": spec.plugin: '
                'plugin "nothing" (tests.support.plugin_dists:nothing) '
                "does not provide IRequestPlugin or IResponsePlugin",
                f'{where} 2, ResponsePlugin "named": spec.plugin: '
                f'no plugin "no-such-plugin" is installed (installed: {INSTALLED})',
                f'{where} 4, ResponsePlugin "req-only": spec.plugin: '
                'plugin "body-limit" cannot be used as a ResponsePlugin: '
                "it does not provide IResponsePlugin",
                f'{where} 6, ResponsePlugin "broken": spec.plugin: '
                'plugin "missing" (tests.support.plugin_dists:no_such_object) cannot be loaded: '
                "module 'tests.support.plugin_dists' has no attribute 'no_such_object'",
            ],
        )

    async def test_name_is_the_default_plugin(self) -> None:
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("tagger", config={"tag": "by-name"}),
            },
        )
        status, _, _ = await fetch(port, "GET", "/x")
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, b"x-tags"), [b"by-name"])


class DistributionTests(TestCase):
    """
    Plugins are found through the entry points of installed distributions: installing
    one adds its plugins, uninstalling it takes them away, with no change to edgegw.
    """

    def test_installed_and_uninstalled(self) -> None:
        self.assertEqual(plugin_names(), ["body-limit", "headers", "rate-limit"])
        uninstall = install_distribution(self.mktemp())
        self.addCleanup(uninstall)
        self.assertEqual(plugin_names(), INSTALLED.split(", "))
        listing = describe_plugins().splitlines()
        self.assertIn(
            f"{'tagger':<20} {'RequestPlugin,ResponsePlugin':<29} "
            "tests.support.plugin_dists:tagger (edgegw-test-plugins 1.0)",
            listing,
        )
        self.assertIn(
            f"{'status':<20} {'ResponsePlugin':<29} "
            "tests.support.plugin_dists:status (edgegw-test-plugins 1.0)",
            listing,
        )
        self.assertIn(f"{'nothing':<20} {'not a plugin':<29} ", "\n".join(listing))
        uninstall()
        self.assertEqual(plugin_names(), ["body-limit", "headers", "rate-limit"])
        root = config_tree(
            self,
            {"10-routes.yaml": route("r", "/", "http://127.0.0.1:1") + request_plugin("tagger")},
        )
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(check(root, out, err), 1)
        self.assertIn(
            'RequestPlugin "tagger": spec.plugin: '
            'no plugin "tagger" is installed (installed: body-limit, headers, rate-limit)',
            err.getvalue(),
        )


# -- 9. the shipped plugins ----------------------------------------------------------


class HeadersPluginTests(PluginTestCase):
    """
    The shipped C{headers} plugin (request side: L{RequestRewriteTests}; response side:
    L{ResponseRewriteTests}) refuses at load what the gateway frames or owns.
    """

    async def test_refuses_gateway_headers(self) -> None:
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url),
                "20-plugins.yaml": request_plugin(
                    "req",
                    "headers",
                    config={
                        "remove": ["X-Kept", "X-User-Id"],
                        "set": {"Content-Length": "5", "X-Fine": "ok"},
                        "add": {"X-Forwarded-For": "203.0.113.9"},
                    },
                )
                + response_plugin(
                    "resp",
                    "headers",
                    config={"set": {"X-Frame-Options": "ALLOWALL"}, "remove": ["Content-Length"]},
                )
                + request_plugin("nothing-to-do", "headers", config={})
                + request_plugin(
                    "bad-values",
                    "headers",
                    config={"set": {"X-A": "line\nbreak", "Bad Name": "x"}, "colour": "red"},
                ),
            },
        )
        where = "20-plugins.yaml, document"
        self.assertEqual(
            problems,
            [
                f'{where} 1, RequestPlugin "req": spec.config.remove[1]: '
                "X-User-Id is set by the gateway; a plugin cannot change it",
                f'{where} 1, RequestPlugin "req": spec.config.set.Content-Length: '
                "Content-Length is set by the gateway; a plugin cannot change it",
                f'{where} 1, RequestPlugin "req": spec.config.add.X-Forwarded-For: '
                "X-Forwarded-For is set by the gateway; a plugin cannot change it",
                f'{where} 3, RequestPlugin "nothing-to-do": spec.config: '
                "needs at least one of remove, set or add",
                f'{where} 4, RequestPlugin "bad-values": spec.config.colour: '
                "unknown field (expected one of: remove, set, add)",
                f'{where} 4, RequestPlugin "bad-values": spec.config.set.X-A: '
                "'line\\nbreak' is not a valid header value",
                f'{where} 4, RequestPlugin "bad-values": spec.config.set.Bad Name: '
                "'Bad Name' is not a valid header name",
                f'{where} 2, ResponsePlugin "resp": spec.config.remove[0]: '
                "Content-Length is set by the gateway; a plugin cannot change it",
                f'{where} 2, ResponsePlugin "resp": spec.config.set.X-Frame-Options: '
                "X-Frame-Options is set by the gateway; a plugin cannot change it",
            ],
        )


class BodyLimitTests(TestCase):
    """
    The shipped C{body-limit} plugin refuses bodies over C{maxBytes} with 413, before
    the backend sees a complete request.
    """

    timeout = 10

    def setUp(self) -> None:
        install_plugins(self)
        self.raw = RawBackend(self._answer, on_head=True).start()
        self.addCleanup(lambda: ensureDeferred(self.raw.stop()))
        self.heads: list[RawRequest] = []

    def _answer(self, request: RawRequest, connection: RawConnection) -> None:
        if not request.complete:
            self.heads.append(request)
            return
        body = b"got %d" % len(request.body)
        connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def serve(self, max_bytes: object, response_plugins: str = "") -> int:
        return serve(
            self,
            {
                "10-routes.yaml": route("r", "/", f"http://127.0.0.1:{self.raw.port}")
                + request_plugin("limit", "body-limit", config={"maxBytes": max_bytes})
                + response_plugins,
            },
        )

    def complete_requests(self) -> list[RawRequest]:
        return [r for c in self.raw.connections for r in c.requests]

    def upstream_bytes(self) -> bytes:
        return b"".join(bytes(c.received) for c in self.raw.connections)

    async def test_content_length_over(self) -> None:
        port = self.serve(10)
        status, headers, body = await fetch(port, "POST", "/x", body=b"a" * 11)
        self.assertEqual((status, body), (413, b"payload too large\n"))
        self.assertEqual(headers["content-type"], ["text/plain; charset=utf-8"])
        self.assertEqual(self.raw.connections, [])

    async def test_content_length_over_with_expect_continue(self) -> None:
        port = self.serve(10)
        raw = await fetch_raw(
            port,
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n",
        )
        self.assertTrue(raw.startswith(b"HTTP/1.1 413 "), raw)
        self.assertNotIn(b"100 Continue", raw)
        self.assertEqual(parse(raw)[2], b"payload too large\n")
        self.assertEqual(self.raw.connections, [])

    async def test_connection_usable_after_413(self) -> None:
        port = self.serve(10)
        client = await connect(port)
        client.send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nabcdefghijk")
        first = parse(await client.until(response_complete))
        client.received = b""
        client.send(request_bytes("POST", "/y", body=b"abc"))
        await client.closed
        self.assertEqual((first[0], first[2]), (413, b"payload too large\n"))
        self.assertEqual(parse(client.received)[0::2], (200, b"got 3"))
        self.assertEqual([r.body for r in self.complete_requests()], [b"abc"])

    async def test_content_length_at_limit(self) -> None:
        port = self.serve("1KiB")
        status, _, body = await fetch(port, "POST", "/x", body=b"a" * 1024)
        self.assertEqual((status, body), (200, b"got 1024"))
        status, _, _ = await fetch(port, "POST", "/x", body=b"a" * 1025)
        self.assertEqual(status, 413)
        self.assertEqual(len(self.complete_requests()), 1)

    async def chunked_over(self, port: int) -> Response:
        client = await connect(port)
        client.send(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n6\r\nAAAAAA\r\n"
        )
        # The first piece streams on to the backend before the rest is sent.
        while b"AAAAAA" not in self.upstream_bytes():
            await sleep(0.005)
        client.send(b"6\r\nBBBBBB\r\n")
        data = await client.until(response_complete)
        await client.close()
        # The backend's request is broken off: its connection closes, and it never
        # sees a complete request, nor any byte past the limit.
        await self.raw.all_lost()
        self.assertEqual(self.complete_requests(), [])
        self.assertEqual(len(self.heads), 1)
        self.assertNotIn(b"B", self.upstream_bytes().partition(b"\r\n\r\n")[2])
        return parse(data)

    async def test_chunked_over(self) -> None:
        port = self.serve(10)
        status, headers, body = await self.chunked_over(port)
        self.assertEqual((status, body), (413, b"payload too large\n"))
        self.assertEqual(headers["content-length"], ["18"])

    async def test_chunked_over_with_response_plugin(self) -> None:
        port = self.serve(10, response_plugin("tag", "tagger", config={"tag": "t"}))
        status, _, body = await self.chunked_over(port)
        self.assertEqual((status, body), (413, b"payload too large\n"))

    async def test_chunked_within(self) -> None:
        port = self.serve(10)
        client = await connect(port)
        client.send(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n4\r\nAAAA\r\n6\r\nBBBBBB\r\n0\r\n\r\n"
        )
        status, _, body = parse(await client.until(response_complete))
        await client.close()
        self.assertEqual((status, body), (200, b"got 10"))
        self.assertEqual([r.body for r in self.complete_requests()], [b"AAAABBBBBB"])

    async def test_no_body(self) -> None:
        port = self.serve(0)
        status, _, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (200, b"got 0"))
        status, _, body = await fetch(port, "POST", "/x", body=b"")
        self.assertEqual((status, body), (200, b"got 0"))
        status, _, body = await fetch(port, "POST", "/x", body=b"a")
        self.assertEqual((status, body), (413, b"payload too large\n"))

    def test_bad_max_bytes(self) -> None:
        upstream = f"http://127.0.0.1:{self.raw.port}"
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", upstream)
                + request_plugin("a", "body-limit", config={"maxBytes": "lots"})
                + request_plugin("b", "body-limit", config={"maxBytes": -1})
                + request_plugin("c", "body-limit", config={"maxBytes": True})
                + request_plugin("d", "body-limit", config={"maxByte": 10})
                + request_plugin("e", "body-limit")
                + request_plugin("f", "body-limit", config={"maxBytes": "10 MiB"}),
            },
        )
        where = "10-routes.yaml, document"
        self.assertEqual(
            problems,
            [
                f'{where} 2, RequestPlugin "a": spec.config.maxBytes: '
                "'lots' is not a size (such as 1048576, 512KiB or 10MB)",
                f'{where} 3, RequestPlugin "b": spec.config.maxBytes: must not be negative',
                f'{where} 4, RequestPlugin "c": spec.config.maxBytes: must be a size in bytes',
                f'{where} 5, RequestPlugin "d": spec.config.maxByte: '
                "unknown field (expected: maxBytes)",
                f'{where} 5, RequestPlugin "d": spec.config.maxBytes: is required',
                f'{where} 6, RequestPlugin "e": spec.config.maxBytes: is required',
            ],
        )


# -- 10. edgegw check ----------------------------------------------------------------


class CheckTests(PluginTestCase):
    """
    C{edgegw check} shows each route's request and response plugins, in the order they
    run.
    """

    def test_route_table(self) -> None:
        upstream = "http://127.0.0.1:1"
        root = config_tree(
            self,
            {
                "10-routes.yaml": route("api", "/api/", upstream, {"tier": "api"})
                + route("web", "/web/", upstream, {"tier": "web"})
                + route("bare", "/bare/", upstream, {"tier": "none"}),
                "20-plugins.yaml": request_plugin(
                    "zz-tag",
                    "tagger",
                    config={"tag": "a"},
                    selector={"matchLabels": {"tier": "api"}},
                )
                + request_plugin(
                    "aa-limit",
                    "body-limit",
                    config={"maxBytes": 10},
                    selector={
                        "matchExpressions": [
                            {"key": "tier", "operator": "In", "values": ["api", "web"]}
                        ]
                    },
                )
                + response_plugin(
                    "out-1",
                    "headers",
                    config={"set": {"Cache-Control": "no-store"}},
                    selector={"matchLabels": {"tier": "web"}},
                )
                + response_plugin(
                    "out-0",
                    "upper",
                    selector={
                        "matchExpressions": [
                            {"key": "tier", "operator": "NotIn", "values": ["none"]}
                        ]
                    },
                ),
            },
        )
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(check(root, out, err), 0, err.getvalue())
        lines = out.getvalue().splitlines()
        header = lines.index(next(line for line in lines if line.startswith("PATTERN")))
        self.assertEqual(
            lines[header].split()[:10],
            [
                "PATTERN",
                "NAME",
                "TYPE",
                "AUTH",
                "GROUPS",
                "POLICIES",
                "ON-DENY",
                "REQUEST-PLUGINS",
                "RESPONSE-PLUGINS",
                "HANDLER",
            ],
        )
        rows = {
            cells[1]: (cells[7], cells[8])
            for cells in (line.split() for line in lines[header + 1 :] if line.strip())
        }
        self.assertEqual(
            rows,
            {
                "api": ("zz-tag,aa-limit", "out-0"),
                "web": ("aa-limit", "out-1,out-0"),
                "bare": ("-", "-"),
            },
        )


class NoBodyStatusTests(PluginTestCase):
    """
    A plugin that answers 204 or 304, or turns a response into one, leaves no body and
    (for 204) no Content-Length on the wire: the next response on the connection starts
    right after the head.
    """

    async def test_plugin_sets_204_or_304(self) -> None:
        """
        Header-only and body-wanting hooks that set 204 or 304, and a 204 Reply.
        """
        upstream = self.backend.url

        def only(value: str) -> dict[str, dict[str, str]]:
            return {"matchLabels": {"s": value}}

        port = serve(
            self,
            {
                "10-routes.yaml": route("nc", "/nc/", upstream, {"s": "204"})
                + route("nm", "/nm/", upstream, {"s": "304"})
                + route("ncb", "/ncb/", upstream, {"s": "204b"})
                + route("reply", "/reply/", upstream, {"s": "reply"})
                + response_plugin("up", "upper", selector=only("204b"))
                + response_plugin("nc", "status", config={"status": 204}, selector=only("204"))
                + response_plugin("ncb", "status", config={"status": 204}, selector=only("204b"))
                + response_plugin("nm", "status", config={"status": 304}, selector=only("304"))
                + request_plugin(
                    "r", "replier", config={"status": 204, "body": ""}, selector=only("reply")
                ),
            },
        )
        cases = [
            ("/nc/x", 204),
            ("/nc/chunked", 204),
            ("/nm/x", 304),
            ("/nm/chunked", 304),
            ("/ncb/x", 204),
            ("/reply/x", 204),
        ]
        wrong: list[tuple[str, str]] = []
        for target, expected in cases:
            client = await connect(port)
            client.send(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await client.until(b"\r\n\r\n")
            await sleep(0.05)
            client.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await client.closed
            status, headers = parse_head(client.received)
            after = client.received.partition(b"\r\n\r\n")[2]
            if status != expected:
                wrong.append((target, f"status {status}"))
            if not after.startswith(b"HTTP/1.1 "):
                wrong.append((target, f"body bytes after the head: {after[:20]!r}"))
            if expected == 204 and "content-length" in headers:
                wrong.append((target, f"Content-Length: {headers['content-length']}"))
            if "transfer-encoding" in headers:
                wrong.append((target, "Transfer-Encoding"))
        self.assertEqual(wrong, [])

    def test_reply_refuses_a_body_with_no_body_status(self) -> None:
        """
        A 204 or 304 Reply with a body is a plugin error (ValueError), not a framing one.
        """
        for status in (204, 304):
            with self.assertRaises(ValueError):
                Reply(status, "x")
        self.assertEqual(Reply(204).body, b"")


class PluginEdgeCaseTests(PluginTestCase):
    """
    The plugin stages at their edges: a client leaving mid-buffering, a hook raising
    C{CancelledError}, a client's C{Connection} list, configurations that cannot work,
    duplicate and incomplete registrations, manifest versions compared as releases.
    """

    async def test_disconnect_while_buffering_a_static_file_stops_pulling(self) -> None:
        """
        A client that goes away while a static file is buffered for a body-wanting hook
        leaves no producer pulled from the reactor forever (the file producer's own
        cleanup cannot unregister once the channel is gone).
        """
        static = os.path.abspath(self.mktemp())
        os.makedirs(static)
        with open(os.path.join(static, "big.bin"), "wb") as stream:
            stream.truncate(32 * 1024 * 1024)  # sparse: 512 pulls of 64 KiB
        pulls = []
        original = _ResponseWatcher._pull_next

        def counted(watcher: _ResponseWatcher, producer: Any) -> None:
            pulls.append(1)
            original(watcher, producer)

        self.patch(_ResponseWatcher, "_pull_next", counted)
        port = serve(
            self,
            {
                "10-routes.yaml": static_route("files", "/", static)
                + response_plugin("up", "upper", config={"maxBodyBytes": 64 * 1024 * 1024}),
            },
        )
        client = await connect(port)
        client.send(request_bytes("GET", "/big.bin"))
        await sleep(0.005)
        await client.close()
        await sleep(0.2)
        settled = len(pulls)
        self.assertLess(settled, 512)
        await sleep(0.2)
        self.assertEqual(len(pulls), settled)

    async def test_cancelled_error_from_a_hook_is_a_500(self) -> None:
        """
        A hook failing with CancelledError while the client is still there fails the
        request (500), rather than leaving it unanswered as if the client had gone.
        """
        port = serve(
            self,
            {"10-routes.yaml": route("r", "/", self.backend.url) + request_plugin("c", "cancels")},
        )
        status, _, body = await fetch(port, "GET", "/x")
        self.assertEqual((status, body), (500, b"internal server error\n"))
        self.assertEqual(self.backend.hits, 0)
        self.flushLoggedErrors(PluginError)

    async def test_client_connection_list_cannot_strip_plugin_headers(self) -> None:
        """
        A header a request plugin sets reaches the backend even when the client names it
        in its Connection list (which strips the client's own hop-by-hop headers).
        """
        port = serve(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("key", "headers", config={"set": {"X-Backend-Key": "s3cret"}}),
            },
        )
        status, _, _ = await fetch(
            port, "GET", "/x", [("Connection", "close, X-Backend-Key, X-Mine"), ("X-Mine", "m")]
        )
        self.assertEqual(status, 200)
        self.assertEqual(self.backend.header(0, b"x-backend-key"), [b"s3cret"])
        self.assertEqual(self.backend.header(0, b"x-mine"), [])

    def test_headers_plugin_refuses_configured_gateway_headers_at_load(self) -> None:
        """
        Header names the configuration makes the gateway's own (the assertion header,
        always protected) are refused at load, not with a 500 on every request.
        """
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("forge", "headers", config={"set": {"X-GW-Identity": "forged"}}),
            },
        )
        self.assertEqual(
            problems,
            [
                '10-routes.yaml, document 2, RequestPlugin "forge": '
                "spec.config.set.X-GW-Identity: X-GW-Identity is set by the gateway; a plugin "
                "cannot change it"
            ],
        )

    def test_a_name_registered_twice_is_refused(self) -> None:
        """
        Two distributions registering one plugin name (here edgegw's own body-limit) is
        an error naming both, never a silent choice by sys.path order.
        """
        install_plugins(self, {"body-limit": "tests.support.plugin_dists:tagger"}, name="evil-dist")
        problems = config_problems(
            self,
            {
                "10-routes.yaml": route("r", "/", self.backend.url)
                + request_plugin("limit", "body-limit", config={"maxBytes": 10}),
            },
        )
        self.assertEqual(len(problems), 1, problems)
        self.assertIn(
            'RequestPlugin "limit": spec.plugin: plugin "body-limit" is registered by more '
            "than one installed distribution (edgegw.plugins.body_limit:plugin (edgegw), "
            "tests.support.plugin_dists:tagger (evil-dist)): uninstall all but one",
            problems[0],
        )

    def test_a_hook_without_its_method_is_a_located_error(self) -> None:
        """
        A hook that claims IRequestHook without on_request is refused at load, located.
        """
        problems = config_problems(
            self, {"10-routes.yaml": route("r", "/", self.backend.url) + request_plugin("hollow")}
        )
        self.assertEqual(len(problems), 1, problems)
        self.assertIn(
            'RequestPlugin "hollow": spec.plugin: plugin "hollow" returned HollowHook, which '
            "does not provide IRequestHook",
            problems[0],
        )

    def test_same_version(self) -> None:
        """
        Manifest versions compare as PEP 440 release numbers: 1.2 is 1.2.0.
        """
        self.assertTrue(same_version("1.2", "1.2.0"))
        self.assertTrue(same_version("2", "2.0.0"))
        self.assertTrue(same_version("1.0rc1", "1.0.0RC1"))
        self.assertFalse(same_version("1.2", "1.2.1"))
        self.assertFalse(same_version("1.0rc1", "1.0"))
