"""
The request-plugins and response-plugins stages (chain positions 8 and 9).

Request plugins run after every gate, in document order; one may answer the request
itself, and the terminal (and any later plugin) is then skipped. Response plugins sit
closest to the terminal: they see the response first on its way out, in document order
from the terminal outward. They run as the head goes out (the body streams past them),
unless one of them wants the body: then it is buffered, up to the smallest
C{max_body_bytes} among them (past it the answer is a 502), and written once they have
all run. A plugin that raises fails the request with L{PluginError}, which the recover
stage answers with a 500 and logs with the route and the plugin's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from inspect import isawaitable
from typing import Any, Final, cast

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from edgegw.plugins.interfaces import IRequestHook, IResponseHook
from edgegw.plugins.messages import PluginRequest, PluginResponse, Protected, Reply, write_reply
from edgegw.stream.boundary import client_gone
from edgegw.stream.response_filter import (
    IResponseFilter,
    install_response_filter,
    passthrough,
    remove_response_filter,
)
from edgegw.terminal.answers import write_text
from edgegw.terminal.exchange import Exchange, Handler, Stage

__all__ = ["PluginError", "request_plugins_stage", "response_plugins_stage"]

_log = Logger(namespace="edgegw.plugins")

_NO_BODY_STATUS: Final = frozenset({204, 304})
_EVENT_STREAM: Final = b"text/event-stream"


class PluginError(Exception):
    """
    A plugin raised (or returned something it must not) while handling a request.

    @ivar plugin: The plugin resource's name.
    """

    def __init__(self, kind: str, plugin: str, cause: BaseException | str) -> None:
        detail = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f'{kind} "{plugin}" failed: {detail}')
        self.plugin = plugin


def request_plugins_stage(hooks: Sequence[tuple[str, IRequestHook]], protected: Protected) -> Stage:
    """
    The request-plugins stage: C{hooks} are (resource name, hook) in document order.
    """
    bound = tuple((name, hook.on_request) for name, hook in hooks)

    async def request_plugins(exchange: Exchange, next: Handler) -> None:
        request = exchange.request
        view = PluginRequest(exchange, protected)
        for name, on_request in bound:
            try:
                result: Any = on_request(view)
                if isawaitable(result):
                    result = await result
            except CancelledError as e:
                if client_gone(request):
                    raise  # the client went away: the runner cancelled the chain
                raise PluginError("RequestPlugin", name, e) from e
            except Exception as e:
                raise PluginError("RequestPlugin", name, e) from e
            if result is not None:
                if view.responded:
                    raise PluginError(
                        "RequestPlugin", name, "returned a Reply after answering with respond()"
                    )
                if not isinstance(result, Reply):
                    raise PluginError(
                        "RequestPlugin", name, f"returned {type(result).__name__}, not a Reply"
                    )
                try:
                    write_reply(request, result, protected)
                except ValueError as e:
                    raise PluginError("RequestPlugin", name, e) from e
                exchange.note("plugin_reply", name)
                return
            if view.responded:
                # It answered through respond(), or the client went away.
                exchange.note("plugin_reply", name)
                return
        await next(exchange)

    return request_plugins


def response_plugins_stage(
    hooks: Sequence[tuple[str, IResponseHook]], protected: Protected, reactor: IReactorTime
) -> Stage:
    """
    The response-plugins stage: C{hooks} are (resource name, hook) in document order, the
    first one closest to the terminal.
    """
    ordered = tuple(hooks)
    wanting = [hook.max_body_bytes for _, hook in ordered if hook.wants_body]
    limit = min(wanting) if wanting else 0

    async def response_plugins(exchange: Exchange, next: Handler) -> None:
        request = exchange.request
        watcher = _ResponseWatcher(exchange, ordered, protected, limit, reactor)
        install_response_filter(request, watcher)
        # The rest of the chain is a coroutine (compose, render_stage): wrapped so that
        # the watcher can cancel the terminal alone.
        terminal: Deferred[None] = ensureDeferred(cast(Any, next(exchange)))
        watcher.terminal = terminal
        try:
            await terminal
        except CancelledError:
            if watcher.outcome is None and not watcher.stopped:
                raise
        except Exception:
            watcher.restore()
            raise
        finally:
            watcher.stop()
        outcome = watcher.outcome
        if outcome is None:
            return
        watcher.restore()
        if isinstance(outcome, PluginError):
            raise outcome
        exchange.note("error", outcome)
        _log.warn(
            "route {route}: {reason} (request id {request_id})",
            route=exchange.route.pattern,
            reason=outcome,
            request_id=exchange.request_id,
        )
        write_text(request, 502, b"bad gateway\n")

    return response_plugins


# What a watcher is doing with the response.
_WAITING: Final = 0  # nothing has gone out yet
_BUFFERING: Final = 1  # holding the body for plugins that want it
_DISCARDING: Final = 2  # the response failed: the terminal's output is dropped
_RELEASED: Final = 3  # the plugins have run and the response went on to the client


@implementer(IResponseFilter)
class _ResponseWatcher:
    """
    Runs the response plugins on one response: as its head goes out, or over its
    buffered body.

    @ivar terminal: The running terminal, cancelled when the response fails.
    @ivar outcome: Why the response failed (a L{PluginError}, or the reason for a 502),
        or L{None}.
    @ivar stopped: The response was complete before the terminal was (a hook made it a
        204 or 304), so the terminal was cancelled.
    """

    def __init__(
        self,
        exchange: Exchange,
        hooks: tuple[tuple[str, IResponseHook], ...],
        protected: Protected,
        limit: int,
        reactor: IReactorTime,
    ) -> None:
        request = exchange.request
        self._exchange = exchange
        self._hooks = hooks
        self._protected = protected
        self._limit = limit
        self._reactor = reactor
        self._state = _WAITING
        self._chunks: list[bytes] = []
        self._size = 0
        self._pull: Any = None
        self._streaming = False
        # What stages before the terminal set, to answer an error with.
        self._saved = (
            request.code,
            request.code_message,
            list(request.responseHeaders.getAllRawHeaders()),
        )
        self.terminal: Deferred[None] | None = None
        self.outcome: PluginError | str | None = None
        self.stopped = False

    # -- IResponseFilter -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        state = self._state
        if state == _WAITING:
            if not self._begin():
                return
            if self._state == _RELEASED:
                self._request().write(data)
                return
        elif state != _BUFFERING:
            return
        if data:
            self._size += len(data)
            if self._size > self._limit:
                self._fail(f"response body over {self._limit} bytes for its response plugins")
                return
            self._chunks.append(data)

    def finish(self) -> None:
        state = self._state
        request = self._request()
        if state == _WAITING:
            if not self._begin():
                return
            if self._state == _RELEASED:
                request.finish()
                return
        elif state != _BUFFERING:
            return
        if client_gone(request):
            self._release()
            return
        body = b"".join(self._chunks)
        self._chunks = []
        response = self._run(body)
        if response is None:
            return
        if response.body is not None:
            body = response.body
        self._release()
        request.startedWriting = False
        headers = request.responseHeaders
        if request.code in _NO_BODY_STATUS:
            # No body, and no Content-Length announcing one (RFC 9110 section 8.6).
            headers.removeHeader(b"content-length")
            headers.removeHeader(b"transfer-encoding")
        else:
            headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
            request.write(body)
        request.finish()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if self._state == _WAITING and not self._begin():
            return
        state = self._state
        if state == _BUFFERING and not streaming:
            # Nothing reaches the connection, so it would never ask for more: pull here.
            self._pull = producer
            self._reactor.callLater(0, self._pull_next, producer)
        elif state == _BUFFERING:
            self._streaming = True
            passthrough.registerProducer(self._exchange.request, producer, True)
        elif state == _RELEASED:
            self._request().registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        if self._pull is not None:
            self._pull = None
        elif self._streaming:
            self._streaming = False
            passthrough.unregisterProducer(self._exchange.request)

    # -- the work --------------------------------------------------------------------

    def _request(self) -> Any:
        return self._exchange.request

    def _begin(self) -> bool:
        """
        The response starts: buffer it, or run the plugins on its head and let it go.

        @return: Whether the caller's output should go on (not when the plugins failed).
        """
        request = self._request()
        if self._limit and self._bufferable(request):
            self._state = _BUFFERING
            # Everyone else (recover, the terminal) must see a response that has started.
            request.startedWriting = True
            return True
        had_body = request.code not in _NO_BODY_STATUS
        if self._run(None) is None:
            return False
        if had_body and request.code in _NO_BODY_STATUS:
            # A hook made it a 204 or 304: it is complete now. Nothing of the terminal's
            # body may follow the head (the proxy writes through a bound method, past
            # Twisted's own guard), nor a Content-Length announcing one.
            headers = request.responseHeaders
            headers.removeHeader(b"content-length")
            headers.removeHeader(b"transfer-encoding")
            self._release()
            request.finish()
            install_response_filter(request, self)
            self._state = _DISCARDING
            self.stopped = True
            self._reactor.callLater(0, self._stop_terminal)
            return False
        self._release()
        return True

    @staticmethod
    def _bufferable(request: Any) -> bool:
        if request.method == b"HEAD" or request.code < 200 or request.code in _NO_BODY_STATUS:
            return False
        types = request.responseHeaders.getRawHeaders(b"content-type")
        return not (types and types[0].lower().startswith(_EVENT_STREAM))

    def _run(self, body: bytes | None) -> PluginResponse | None:
        """
        Run every hook over the response, first to last; L{None} when one failed.
        """
        view = PluginResponse(self._exchange, self._protected, body)
        for name, hook in self._hooks:
            try:
                hook.on_response(view)
            except Exception as e:
                error = PluginError("ResponsePlugin", name, e)
                error.__cause__ = e
                self._fail(error)
                return None
        return view

    def _fail(self, outcome: PluginError | str) -> None:
        self.outcome = outcome
        self._state = _DISCARDING
        self._chunks = []
        # A pulled producer is no longer pulled; stopping the terminal closes it.
        self._pull = None
        if self._streaming:
            self._streaming = False
            passthrough.unregisterProducer(self._exchange.request)
        # Not from inside the terminal's own write: stop it once this call has returned.
        self._reactor.callLater(0, self._stop_terminal)

    def _stop_terminal(self) -> None:
        terminal = self.terminal
        if terminal is not None and not terminal.called:
            terminal.cancel()

    def _pull_next(self, producer: Any) -> None:
        if self._pull is not producer or self._state != _BUFFERING:
            return
        if client_gone(self._request()):
            # The producer's own cleanup may not unregister it once the channel is gone.
            self._pull = None
            return
        producer.resumeProducing()
        if self._pull is producer:
            self._reactor.callLater(0, self._pull_next, producer)

    def stop(self) -> None:
        """
        The stage is done with the response: stop pulling, drop whatever the terminal
        still writes, and leave the request alone.
        """
        self._pull = None
        if self._state != _RELEASED:
            self._state = _DISCARDING
            self._chunks = []
        request = self._request()
        if request.response_filter is self:
            remove_response_filter(request)

    def _release(self) -> None:
        self._state = _RELEASED
        remove_response_filter(self._request())

    def restore(self) -> None:
        """
        Undo what the terminal set (status, headers), so that an error can be answered
        cleanly, unless its response has gone out to the client.
        """
        request = self._request()
        if request.response_filter is self:
            remove_response_filter(request)
        if self._state == _RELEASED or request.finished or client_gone(request):
            return
        request.startedWriting = False
        code, message, headers = self._saved
        request.code = code
        request.code_message = message
        response_headers = request.responseHeaders
        for name, _ in list(response_headers.getAllRawHeaders()):
            response_headers.removeHeader(name)
        for name, values in headers:
            response_headers.setRawHeaders(name, values)
