"""
The one seam between edgegw and other projects' private names.

Every read or write of a name Twisted, treq or txredisapi keep private (a leading
underscore), and every reliance on how they work inside, is in this module (and in the
reactor subclass of L{edgegw.reactor}), behind names of our own: functions such as
L{client_gone}, and base classes whose public methods stand for Twisted's private hooks
(L{RequestSeam}, L{ChannelSeam}). Any of those projects' releases may change such a name
without a deprecation, so each is probed when this module is imported: a Twisted that
lacks one stops edgegw at startup (and the tests) with an L{ImportError} naming it, never
with an C{AttributeError} in the middle of a request.

L{PRIVATE_NAMES} lists them all, with what each is used for; docs/architecture.md's
table ("Other projects' private names") is checked against it by the tests, and a test
fails when a private name of those projects is used anywhere else in edgegw/.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

import attrs
import txredisapi  # type: ignore[import-untyped]
from hyperlink import EncodedURL
from treq.client import HTTPClient
from twisted.internet import _sslverify
from twisted.internet._sslverify import IOpenSSLTrustRoot as IOpenSSLTrustRoot
from twisted.internet.abstract import FileDescriptor
from twisted.internet.endpoints import AdoptedStreamServerEndpoint, SSL4ServerEndpoint
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.internet.tcp import Port
from twisted.protocols.basic import LineReceiver
from twisted.web.http import HTTPChannel
from twisted.web.http import Request as HTTPRequest
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from edgegw.header_names import canonical_name
from edgegw.header_names import canonical_names as _canonical

__all__ = [
    "PRIVATE_NAMES",
    "RAW_DICT_WRITABLE",
    "ChannelSeam",
    "GatewayHeaders",
    "IOpenSSLTrustRoot",
    "PreparedURL",
    "PrivateName",
    "RequestSeam",
    "WholeRedisReplies",
    "adopt_listening_port",
    "client_gone",
    "endpoint_tls_context",
    "mark_client_gone",
    "raw_fields",
    "set_endpoint_tls_context",
]


@attrs.frozen
class PrivateName:
    """
    One private name of another project that edgegw uses.

    @ivar owner: The dotted name of the class or module that has it.
    @ivar name: The name.
    @ivar use: What edgegw uses it for.
    """

    owner: str
    name: str
    use: str


PRIVATE_NAMES: Final[list[PrivateName]] = []
"""Every private name used here and in L{edgegw.reactor}, in the order they are probed."""

_T = TypeVar("_T")


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _set_by_methods(owner: type, name: str) -> bool:
    for cls in owner.__mro__:
        for value in vars(cls).values():
            function = getattr(value, "__func__", value)
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and name in _code_names(code):
                return True
    return False


def needs(owner: type | types.ModuleType, name: str, use: str) -> str:
    """
    Probe C{owner} for the private C{name} and record it in L{PRIVATE_NAMES}.

    A class has the name when it or a base defines it, or a method of theirs uses it (an
    attribute set on instances); a module when it defines it.

    @return: C{name}.
    @raise ImportError: C{owner} lacks it (this version of its project is not one edgegw
        can run on).
    """
    if isinstance(owner, types.ModuleType):
        dotted = owner.__name__
        present = hasattr(owner, name)
    else:
        dotted = f"{owner.__module__}.{owner.__qualname__}"
        present = hasattr(owner, name) or _set_by_methods(owner, name)
    if not present:
        project = dotted.partition(".")[0]
        raise ImportError(
            f"edgegw needs {dotted}.{name} ({use}), which this version of {project} lacks"
        )
    PRIVATE_NAMES.append(PrivateName(dotted, name, use))
    return name


# The request: twisted.web.http.Request and twisted.web.server.Request.

needs(HTTPRequest, "_disconnected", "whether the client connection is gone")
needs(HTTPRequest, "_cleanup", "ending a finished request (held while its body is read)")
needs(Request, "_inFakeHead", "whether Twisted answers HEAD by rendering a GET")
needs(Request, "_encoder", "whether Twisted encodes the body (then no whole write)")


def client_gone(request: Any) -> bool:
    """
    Whether C{request}'s client connection is gone: it can no longer be answered
    (Twisted's C{finish} raises then).
    """
    try:
        gone: bool = request._disconnected
    except AttributeError:
        # Not a Twisted request (a test's stand-in): it never loses a client.
        return False
    return gone


def mark_client_gone(request: HTTPRequest) -> None:
    """
    Mark C{request}'s client connection gone, before anything learns that it is.
    """
    request._disconnected = True


class RequestSeam(Request):
    """
    L{twisted.web.server.Request} with its private hook for ending a request under a
    public name (L{endRequest}), and the private state its whole writes need
    (L{rewritesBody}).
    """

    def _cleanup(self) -> None:
        self.endRequest()

    def endRequest(self) -> None:
        """
        End the finished request as Twisted does (the channel's C{requestDone}, the
        C{notifyFinish} notifications). Subclasses may hold it back.
        """
        HTTPRequest._cleanup(self)

    def rewritesBody(self) -> bool:
        """
        Whether Twisted would change the body on its way out: a HEAD answered by
        rendering a GET, or a content encoder.
        """
        return bool(self._inFakeHead) or self._encoder is not None


# The HTTP/1.1 parser: twisted.web.http.HTTPChannel and its LineReceiver.

needs(HTTPChannel, "_respondToBadRequestAndDisconnect", "answering a malformed request")
needs(HTTPChannel, "_HTTPChannel__first_line", "whether the request line is being read")
needs(HTTPChannel, "_HTTPChannel__header", "a header line held back to look for a fold")
needs(HTTPChannel, "_receivedHeaderSize", "the header section's size so far (431)")
needs(HTTPChannel, "_command", "the parsed request line: method")
needs(HTTPChannel, "_path", "the parsed request line: target")
needs(HTTPChannel, "_version", "the parsed request line: version")
needs(HTTPChannel, "_handlingRequest", "whether a request is being answered")
needs(HTTPChannel, "_networkProducer", "the transport as the channel's read producer")
needs(HTTPChannel, "_waitingForTransport", "whether the channel holds reading")
needs(HTTPChannel, "_dataBuffer", "bytes read ahead while a request is answered")
needs(LineReceiver, "_buffer", "bytes of a line not yet delivered")
needs(LineReceiver, "_busyReceiving", "whether lines are being delivered")


class ChannelSeam(HTTPChannel):
    """
    L{twisted.web.http.HTTPChannel} with the parser state its subclass reads, and its
    private hooks, under public names.
    """

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.badRequest()

    def badRequest(self) -> None:
        """
        A request is malformed (request line, header line, chunked framing, a header
        section over C{totalHeadersSize}): Twisted answers 400 and closes.
        """
        HTTPChannel._respondToBadRequestAndDisconnect(self)

    def parserIdle(self) -> bool:
        """
        Whether Twisted's parser holds nothing: no request object, none being answered,
        no bytes or line of a head buffered, not inside a delivery of lines.
        """
        return bool(
            not self.requests
            and self.line_mode
            and not self._buffer
            and not self._busyReceiving
            and self._HTTPChannel__first_line  # type: ignore[attr-defined]
            and not self._HTTPChannel__header  # type: ignore[attr-defined]
            and not self._handlingRequest
        )

    def readingRequestLine(self) -> bool:
        """
        Whether the line being read is a request line (else a header line).
        """
        return bool(self._HTTPChannel__first_line)  # type: ignore[attr-defined]

    def headerSectionTooLarge(self) -> bool:
        """
        Whether the request's header section is over C{totalHeadersSize}.
        """
        return bool(self._receivedHeaderSize > self.totalHeadersSize)

    def requestLine(self) -> tuple[bytes, bytes, bytes]:
        """
        The method, target and version of the request whose head was just parsed.
        """
        return self._command, self._path, self._version

    def requestVersion(self) -> bytes:
        """
        The version of the request whose head was just parsed.
        """
        return self._version

    def headParsed(
        self,
        request: Any,
        method: bytes,
        target: bytes,
        version: bytes,
        fields: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """
        Deliver a whole bodiless head parsed in one pass, as Twisted's C{lineReceived}
        does for each of its lines and then for its end; bytes that arrived meanwhile
        are parsed after it.
        """
        # As LineReceiver does while it delivers lines: bytes arriving meanwhile wait.
        self._busyReceiving = True
        try:
            self.requests.append(request)
            self._command = method
            self._path = target
            self._version = version
            add = request.requestHeaders.addRawHeader
            for name, value in fields:
                add(name, value)
            self.allHeadersReceived()
            if self.length == 0:
                self.allContentReceived()
        finally:
            self._busyReceiving = False
        if self._buffer:
            LineReceiver.dataReceived(self, b"")

    def replaceReadProducer(self, make: Callable[[Any, bool], _T]) -> _T:
        """
        Put C{make(transport, held)} in the transport's place as what the channel pauses
        and resumes reading through (C{held}: whether the channel holds reading now).
        """
        replacement = make(self._networkProducer, self._waitingForTransport)
        self._networkProducer = replacement  # type: ignore[assignment]
        return replacement

    def nothingReadAhead(self) -> bool:
        """
        Whether no bytes of a later request were read (Twisted leaves an empty C{b""}
        behind each request body).
        """
        return not any(self._dataBuffer) and not self._buffer

    def takeReadAhead(self) -> bytes:
        """
        The bytes read ahead while the current request was answered, taken from the
        parser (which will not see them).
        """
        pending = b"".join(self._dataBuffer)
        self._dataBuffer = []
        return pending


# Headers: twisted.web.http_headers.Headers' dict of canonical names to values.

needs(Headers, "_rawHeaders", "the dict of canonical names to values, read and written")


def _raw_dict_writable() -> bool:
    headers = Headers()
    headers.setRawHeaders(b"x-probe-name", [b"v"])
    raw = getattr(headers, "_rawHeaders", None)
    return isinstance(raw, dict) and raw == {canonical_name(b"x-probe-name"): [b"v"]}


RAW_DICT_WRITABLE: Final = _raw_dict_writable()
"""
Whether C{Headers}' dict is the dict of canonical name -> values that L{raw_fields}
hands out; without it, callers take C{Headers}' public methods.
"""


def raw_fields(headers: Headers) -> dict[bytes, list[bytes]]:
    """
    C{headers}' own dict of canonical names (as C{getAllRawHeaders} reports them) to
    values: read and written directly, with values already free of CR and LF, where
    L{RAW_DICT_WRITABLE}.
    """
    return headers._rawHeaders


if RAW_DICT_WRITABLE:

    class GatewayHeaders(Headers):
        """
        L{Headers} with look-ups, sets, additions and removals of C{bytes} names that
        skip the name encoder (~0.1 µs a look-up, ~0.3 µs a set).

        A proxied request asks its headers for ~17 values and sets ~7; each
        L{Headers.getRawHeaders} call encodes the name through Twisted's name encoder
        and each L{Headers.setRawHeaders} sanitises every value. This does the same with
        a module-level cache of canonical names and a check that a value holds no line
        break, for C{bytes} names and values; anything else (C{str} names or values, a
        value with a line break, a name not seen before) takes Twisted's own method,
        which also refuses an invalid name as Twisted does.
        """

        __slots__ = ()

        def hasHeader(self, name: Any) -> bool:
            if type(name) is bytes:
                return (_canonical.get(name) or canonical_name(name)) in self._rawHeaders
            return Headers.hasHeader(self, name)

        def removeHeader(self, name: Any) -> None:
            if type(name) is bytes:
                self._rawHeaders.pop(_canonical.get(name) or canonical_name(name), None)
            else:
                Headers.removeHeader(self, name)

        def addRawHeader(self, name: Any, value: Any) -> None:
            # Every field of a request head comes this way (~0.3 µs a field saved).
            if type(name) is bytes and type(value) is bytes and 10 not in value and 13 not in value:
                canonical = _canonical.get(name) or canonical_name(name)
                values = self._rawHeaders.get(canonical)
                if values is None:
                    self._rawHeaders[canonical] = [value]
                else:
                    values.append(value)
                return
            Headers.addRawHeader(self, name, value)

        def getRawHeaders(self, name: Any, default: Any = None) -> Any:
            if type(name) is bytes:
                canonical = _canonical.get(name) or canonical_name(name)
                return self._rawHeaders.get(canonical) or default
            return Headers.getRawHeaders(self, name, default)

        def setRawHeaders(self, name: Any, values: Sequence[Any]) -> None:
            # A list only: the check below reads the values once, and an iterator handed
            # on to Headers after it would have lost them.
            if type(name) is bytes and type(values) is list:
                canonical = _canonical.get(name) or canonical_name(name)
                kept = []
                for value in values:
                    # LF and CR as ints: membership of an int is a byte scan (~12 ns),
                    # of a bytes object a substring search (~100 ns).
                    if type(value) is not bytes or 10 in value or 13 in value:
                        break
                    kept.append(value)
                else:
                    self._rawHeaders[canonical] = kept
                    return
            Headers.setRawHeaders(self, name, values)

else:  # pragma: no cover - a Twisted whose Headers is built otherwise

    class GatewayHeaders(Headers):  # type: ignore[no-redef]
        """
        Plain L{Headers}: this Twisted's C{Headers} has no C{_rawHeaders} dict.
        """

        __slots__ = ()


# Listening: twisted.internet.endpoints and twisted.internet.tcp.

needs(SSL4ServerEndpoint, "_sslContextFactory", "the context factory each connection asks")
needs(AdoptedStreamServerEndpoint, "_used", "whether the adopted socket is listened on")
needs(AdoptedStreamServerEndpoint, "_setNonBlocking", "making the adopted socket non-blocking")
needs(Port, "_fromListeningDescriptor", "a port on an adopted listening socket")


def endpoint_tls_context(endpoint: SSL4ServerEndpoint) -> IOpenSSLContextFactory:
    """
    The context factory an C{ssl:} endpoint asks for a context on each new connection.
    """
    return endpoint._sslContextFactory  # type: ignore[no-any-return]


def set_endpoint_tls_context(endpoint: SSL4ServerEndpoint, factory: object) -> None:
    """
    Have an C{ssl:} endpoint ask C{factory} for each new connection's context.
    """
    endpoint._sslContextFactory = factory


def adopt_listening_port(
    endpoint: AdoptedStreamServerEndpoint, port_class: type[Port], factory: Any
) -> Port | None:
    """
    What the reactor's C{adoptStreamPort} does for C{endpoint}'s socket, with
    C{port_class} as the port; L{None} if the endpoint was listened on already.
    """
    if endpoint._used:
        return None
    endpoint._used = True
    endpoint._setNonBlocking(endpoint.fileno)
    return port_class._fromListeningDescriptor(  # type: ignore[no-any-return]
        endpoint.reactor, endpoint.fileno, endpoint.addressFamily, factory
    )


# TLS trust roots: twisted.internet._sslverify.

needs(_sslverify, "IOpenSSLTrustRoot", "the trust root interface (not re-exported)")


# The reactor: EdgeReactor (edgegw.reactor) is an EPollReactor subclass.

needs(EPollReactor, "_poller", "polling without the legacy log context")
needs(EPollReactor, "_selectables", "file descriptor to selectable")
needs(EPollReactor, "_writes", "file descriptors registered for EPOLLOUT")
needs(EPollReactor, "_doReadOrWrite", "handling one event as the event loop does")
needs(FileDescriptor, "_writeDisconnecting", "whether a writer half-closes (no eager send)")
needs(FileDescriptor, "_tempDataLen", "bytes a writer holds outside its dataBuffer")


# treq: how it turns the URL it is given into the request's URI.


def relies_on(function: Callable[..., Any], text: str, use: str) -> str:
    """
    Probe C{function}'s source for C{text} (how it works inside, where no private name
    says so) and record it in L{PRIVATE_NAMES}.

    @return: C{text}.
    @raise ImportError: The source does not say so (this version of its project works
        otherwise).
    """
    dotted = f"{function.__module__}.{function.__qualname__}"
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        source = ""
    if text not in source:
        project = dotted.partition(".")[0]
        raise ImportError(
            f"edgegw relies on {dotted} doing {text} ({use}), which this version of "
            f"{project} does not"
        )
    PRIVATE_NAMES.append(PrivateName(dotted, text, use))
    return text


relies_on(
    HTTPClient.request,
    "isinstance(url, EncodedURL)",
    "an EncodedURL is taken as it is (PreparedURL)",
)
relies_on(
    HTTPClient.request,
    ".to_uri().to_text()",
    "the request's URI is the URL's to_uri().to_text() (PreparedURL)",
)


class PreparedURL(EncodedURL):
    """
    An absolute URI the gateway has already built in its final form (ASCII, percent-
    encoded, the host IDNA-encoded once at load), handed to treq as it is.

    treq turns every URL it is given into a hyperlink URL and back (C{to_uri().to_text()}),
    which re-encodes the host label by label with IDNA on every call: about 25 µs, half of
    treq's own cost per call. This URL is its own URI form and its own text, so that work
    is skipped; nothing else of hyperlink's URL is used by treq on this path (so it is
    for C{HTTPClient.request} without C{params}: treq would rebuild a URL for those).
    """

    def __init__(self, text: str) -> None:
        # hyperlink's parsing is what this class exists to avoid: no super().__init__.
        self._prepared = text

    def to_uri(self) -> PreparedURL:
        """
        Already a URI.
        """
        return self

    def to_text(self, with_password: bool = False) -> str:
        """
        The URI as built.
        """
        return self._prepared

    def __repr__(self) -> str:
        return f"PreparedURL({self._prepared!r})"

    def __str__(self, with_password: bool = False) -> str:
        return self._prepared

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PreparedURL) and other._prepared == self._prepared

    def __hash__(self) -> int:
        return hash(self._prepared)


# txredisapi: its own line receiver, which pauses after each bulk reply.

needs(txredisapi.LineReceiver, "setLineMode", "collecting what follows a bulk reply")


needs(txredisapi.BaseRedisProtocol, "_build_command", "encoding a command for the wire")


class LeanRedisCommands:
    """
    Encodes commands of bytes, str and int arguments in one pass (a mixin for
    txredisapi's protocols): txredisapi 1.6 encodes each argument and its length through
    a generic method call apiece (~4 µs a six-argument EVALSHA). Any other argument
    (a float, a bool, ...) takes txredisapi's own encoding, so the bytes sent are the
    same.
    """

    def _build_command(self, *args: Any, **kwargs: Any) -> bytes:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            kind = type(arg)
            if kind is bytes:
                value = arg
            elif kind is str:
                try:
                    value = arg.encode()
                except UnicodeEncodeError:
                    # txredisapi's own error (InvalidData) for it.
                    return super()._build_command(*args, **kwargs)  # type: ignore[misc, no-any-return]
            elif kind is int:
                value = b"%d" % arg
            else:
                return super()._build_command(*args, **kwargs)  # type: ignore[misc, no-any-return]
            parts.append(b"$%d\r\n%s\r\n" % (len(value), value))
        return b"".join(parts)


class WholeRedisReplies:
    """
    Parses every reply one read brings, at once (a mixin for txredisapi's protocols).

    txredisapi 1.6's line receiver, on finishing a bulk reply (a GET's value), pauses the
    connection and parses the rest of what was read on a later reactor turn: under load,
    one reply a turn. Here the rest is parsed in the same turn, iteratively (no
    recursion however many replies arrive together).
    """

    _rest = b""

    def setLineMode(self, extra: bytes | str = b"") -> None:
        self.line_mode = 1
        if extra:
            self._rest += extra if isinstance(extra, bytes) else extra.encode()

    def dataReceived(self, data: bytes, unpause: bool = False) -> None:
        super().dataReceived(data, unpause)  # type: ignore[misc]
        while self._rest and self.transport is not None and not self.transport.disconnecting:
            rest, self._rest = self._rest, b""
            super().dataReceived(rest)  # type: ignore[misc]

    line_mode: int
    transport: Any
