"""
The server layer's boundaries: the protocol boundary (L{IClientStream}) and the one seam
for other projects' private names (L{edgegw.seam}).
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel
from twisted.web.server import Request, Site
from twisted.web.test.requesthelper import DummyChannel, DummyRequest
from zope.interface.verify import verifyClass, verifyObject

from edgegw import seam
from edgegw.server.channel import GatewayChannel
from edgegw.server.request import GatewayRequest
from edgegw.stream.boundary import (
    IClientStream,
    UpgradeNotPossibleError,
    abort_client,
    client_closer,
    client_gone,
    close_after_response,
    stream_of,
    take_connection,
)
from tests.private_name_scan import scan

ROOT = Path(__file__).parent.parent
SEAM_MODULES = frozenset({"edgegw.seam"})
SEAM_CLASSES = frozenset({("edgegw.reactor", "EdgeReactor")})


def _channel() -> tuple[GatewayChannel, StringTransport]:
    site = Site(None)
    site.requestFactory = GatewayRequest  # type: ignore[assignment]
    channel = GatewayChannel()
    channel.site = site
    channel.requestFactory = GatewayRequest  # type: ignore[assignment]
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


class ClientStreamTests(SynchronousTestCase):
    def test_the_http11_channel_is_a_client_stream(self) -> None:
        verifyClass(IClientStream, GatewayChannel)
        channel, _ = _channel()
        verifyObject(IClientStream, channel)
        self.assertEqual(channel.protocolName, b"http/1.1")

    def test_a_request_finds_its_stream(self) -> None:
        channel, _ = _channel()
        request = GatewayRequest(channel)
        self.assertIs(stream_of(request), channel)
        self.assertIsNone(stream_of(DummyRequest([b""])))

    def test_client_gone(self) -> None:
        channel, _ = _channel()
        request = GatewayRequest(channel)
        self.assertFalse(client_gone(request))
        self.assertFalse(channel.clientGone(request))
        request.connectionLost(Exception("gone"))  # type: ignore[arg-type]
        self.assertTrue(client_gone(request))
        self.assertTrue(channel.clientGone(request))
        # A request of Twisted's own, or a test's that has no such state.
        self.assertFalse(client_gone(DummyRequest([b""])))

    def test_abort_client(self) -> None:
        channel, transport = _channel()
        abort_client(GatewayRequest(channel))
        self.assertTrue(transport.disconnecting)
        # On a channel that is no client stream: its transport.
        plain_channel = HTTPChannel()
        plain_channel.site = Site(None)  # type: ignore[attr-defined]
        plain_transport = StringTransport()
        plain_channel.makeConnection(plain_transport)
        plain = Request(plain_channel)
        abort_client(plain)
        self.assertTrue(plain_transport.disconnecting)

    def test_close_after_response(self) -> None:
        channel, _ = _channel()
        request = GatewayRequest(channel)
        close_after_response(request)
        self.assertFalse(channel.persistent)
        self.assertEqual(request.responseHeaders.getRawHeaders(b"connection"), [b"close"])

    def test_take_connection(self) -> None:
        """
        The HTTP/1.1 channel lets go of its transport (with what it read ahead) and
        releases the connection only when the request finishes.
        """
        channel, transport = _channel()
        released: list[object] = []
        channel._release = released.append
        request = GatewayRequest(channel)
        channel.requests.append(request)
        taken, pending = take_connection(request)
        self.assertIs(taken, transport)
        self.assertEqual(pending, b"")
        self.assertIsNone(channel.transport)
        self.assertEqual(released, [])
        notifications, request.notifications = request.notifications, []
        for notification in notifications:
            notification.callback(None)
        self.assertEqual(released, [channel])

    def test_the_closer_outlives_a_take_over(self) -> None:
        """
        What L{client_closer} gives drops the connection even after a tunnel has taken
        it over from the channel (a session's logout closes its WebSocket).
        """
        channel, transport = _channel()
        request = GatewayRequest(channel)
        channel.requests.append(request)
        close = client_closer(request)
        assert close is not None
        take_connection(request)
        self.assertIsNone(channel.transport)
        close()
        self.assertTrue(transport.disconnecting)

    def test_no_take_over_of_a_gone_client(self) -> None:
        """
        A client gone before the upstream's 101 arrives has no connection to hand over:
        L{ConnectionLost}, not an upgrade refused.
        """
        channel, _ = _channel()
        request = GatewayRequest(channel)
        request.connectionLost(Failure(ConnectionDone()))
        self.assertRaises(ConnectionLost, take_connection, request)

    def test_no_upgrade_without_a_client_stream(self) -> None:
        request = Request(DummyChannel())
        self.assertRaises(UpgradeNotPossibleError, take_connection, request)


class NoChannelOutsideTheServerTests(SynchronousTestCase):
    def test_no_module_above_the_server_reads_a_channel(self) -> None:
        """
        Outside the server layer and the boundary, nothing reads a request's C{channel},
        or a site's channels (or a parser's state): they talk to the client through
        L{IClientStream}, and to the connections through the Site's own methods.
        """
        found = []
        for path in sorted((ROOT / "edgegw").rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(("edgegw/server/", "edgegw/stream/", "edgegw/seam.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in ("channel", "channels"):
                    found.append(f"{relative}:{node.lineno}")
        self.assertEqual(found, [])


class PrivateNameTests(SynchronousTestCase):
    def test_no_private_name_outside_the_seam(self) -> None:
        """
        No module of edgegw but the seam (and the reactor subclass) uses a private name
        of Twisted, treq or txredisapi.
        """
        self.assertEqual([str(use) for use in scan("edgegw", SEAM_MODULES, SEAM_CLASSES)], [])

    def test_the_scan_finds_each_kind_of_use(self) -> None:
        """
        The scan above would fail: it finds a private attribute read on another object
        (one of a class edgegw never imports too), read or overridden through C{self} in
        a subclass (a class made in a function too), read through C{self} in a mixin
        that never sets it, a module's private function, names given as strings
        (C{getattr} with a constant, C{attrgetter}, C{vars()}), and private modules
        imported or loaded by name; the module's own private names are not uses.
        """
        package = Path(self.mktemp())
        (package / "probe_private").mkdir(parents=True)
        (package / "probe_private" / "__init__.py").write_text("")
        (package / "probe_private" / "uses.py").write_text(
            textwrap.dedent(
                """
                import importlib
                import operator

                from twisted.internet._sslverify import IOpenSSLTrustRoot
                from twisted.web import http
                from twisted.web.http import HTTPChannel

                NAME = "_writeDisconnecting"

                def gone(request):
                    return request._disconnected

                class Channel(HTTPChannel):
                    def _respondToBadRequestAndDisconnect(self):
                        return self._dataBuffer

                    def first(self):
                        return getattr(self, "_HTTPChannel__first_line", 0)

                class ReadAhead:
                    def read_ahead(self):
                        return self._handlingRequest

                class Body:
                    def __init__(self, channel):
                        self._buffer = []
                        self._channel = channel

                    def holds(self):
                        return bool(self._channel._busyReceiving)

                def sni(request):
                    return request.transport._tlsConnection

                def escape(text):
                    return http._escape(text)

                def closing(writer):
                    return getattr(writer, NAME)

                def indirect(request, headers):
                    return operator.attrgetter("_inFakeHead")(request), vars(headers)["_rawHeaders"]

                def private_module():
                    return importlib.import_module("twisted.internet._newtls")

                def make():
                    class Local(HTTPChannel):
                        def _receivedHeaderSize(self):
                            return 0

                    return Local

                class Own:
                    __slots__ = ("_mine",)

                    def __init__(self):
                        self._mine = 1

                    def read(self, other):
                        return self._mine + other._mine
                """
            )
        )
        sys.path.insert(0, str(package))
        self.addCleanup(sys.path.remove, str(package))
        self.addCleanup(
            lambda: [sys.modules.pop(name) for name in list(sys.modules) if "probe_private" in name]
        )
        names = sorted(use.name for use in scan("probe_private"))
        self.assertEqual(
            names,
            [
                "_HTTPChannel__first_line",
                "_busyReceiving",
                "_dataBuffer",
                "_disconnected",
                "_escape",
                "_handlingRequest",
                "_inFakeHead",
                "_rawHeaders",
                "_receivedHeaderSize",
                "_respondToBadRequestAndDisconnect",
                "_tlsConnection",
                "_writeDisconnecting",
                "twisted.internet._newtls",
                "twisted.internet._sslverify",
            ],
        )

    def test_a_missing_name_stops_the_import_naming_it(self) -> None:
        """
        A Twisted without a name the seam needs stops edgegw at import, saying which.
        """
        with self.assertRaises(ImportError) as raised:
            seam.needs(HTTPChannel, "_noSuchThing", "a test")
        self.assertIn("twisted.web.http.HTTPChannel._noSuchThing", str(raised.exception))
        self.assertIn("a test", str(raised.exception))
        before = len(seam.PRIVATE_NAMES)
        self.assertEqual(seam.needs(HTTPChannel, "_dataBuffer", "a test"), "_dataBuffer")
        del seam.PRIVATE_NAMES[before:]

    def test_the_docs_list_every_name(self) -> None:
        """
        docs/architecture.md's table of private names is the seam's list.
        """
        text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
        start = text.index("<!-- private-names:start -->")
        end = text.index("<!-- private-names:end -->")
        rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| ([^|]+) \|$", text[start:end], re.M)
        documented = [(owner, name, use.strip()) for owner, name, use in rows]
        expected = [(p.owner, p.name, p.use) for p in seam.PRIVATE_NAMES]
        self.assertEqual(documented, expected, "\n" + private_names_table())


def private_names_table() -> str:
    """
    The docs' table of the seam's private names, as it should read.
    """
    lines = ["| owner | name | used for |", "|---|---|---|"]
    lines += [f"| `{p.owner}` | `{p.name}` | {p.use} |" for p in seam.PRIVATE_NAMES]
    return "\n".join(lines)


if __name__ == "__main__":
    print(private_names_table())
