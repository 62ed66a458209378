"""
Request and response plugins for tests, and a way to register them as a real
distribution would: through entry points in the C{edgegw.plugins} group.

L{install_distribution} writes a fake installed distribution (a C{.dist-info} directory
with C{METADATA} and C{entry_points.txt}) into a temporary directory and puts that
directory on C{sys.path}, so that C{importlib.metadata.entry_points} finds the
entry points exactly as it finds edgegw's own. The entry points name the plugin
objects below (this module is importable as C{tests.support.plugin_dists}).

The plugins (by the names L{TEST_PLUGINS} registers them under):

  - C{tagger} (request and response): appends C{config.tag} to a header (C{config.header},
    default C{X-Tags}) as a comma-separated list, request or response side;
  - C{replier} (request): answers with a L{Reply} (C{status}, C{body}, C{headers});
  - C{rewriter} (request): sets the path and/or the query (C{path}, C{query});
  - C{boom} (request and response): raises L{PluginBoomError};
  - C{later} (request): answers after C{delay} seconds through a L{Deferred} (sets
    C{header} to C{value}, or replies when C{reply} is given);
  - C{coro} (request): a coroutine that adds C{X-Coro: yes};
  - C{status} (response only): sets the status to C{config.status};
  - C{upper} (response): wants the body (up to C{maxBodyBytes}, default 4096),
    upper-cases it and wraps it in brackets;
  - C{strict} (request and response): refuses its config with L{PluginConfigError}
    unless C{level} is an integer from 1 to 3 and nothing else is given;
  - C{nothing}: an object providing neither plugin interface;
  - C{missing}: an entry point whose object does not exist (cannot be loaded).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from edgegw.plugins.interfaces import (
    IRequestHook,
    IRequestPlugin,
    IResponseHook,
    IResponsePlugin,
    PluginConfigError,
)
from edgegw.plugins.messages import PluginRequest, PluginResponse, Reply

__all__ = [
    "DISTRIBUTION",
    "TEST_PLUGINS",
    "PluginBoomError",
    "install_distribution",
    "install_plugins",
]

reactor: Any = _reactor

DISTRIBUTION = "edgegw-test-plugins"
"""The fake distribution's name."""

TEST_PLUGINS: Mapping[str, str] = {
    "tagger": "tests.support.plugin_dists:tagger",
    "replier": "tests.support.plugin_dists:replier",
    "rewriter": "tests.support.plugin_dists:rewriter",
    "boom": "tests.support.plugin_dists:boom",
    "later": "tests.support.plugin_dists:later",
    "coro": "tests.support.plugin_dists:coro",
    "status": "tests.support.plugin_dists:status",
    "upper": "tests.support.plugin_dists:upper",
    "strict": "tests.support.plugin_dists:strict",
    "cancels": "tests.support.plugin_dists:cancels",
    "hollow": "tests.support.plugin_dists:hollow",
    "nothing": "tests.support.plugin_dists:nothing",
    "missing": "tests.support.plugin_dists:no_such_object",
}
"""Every test plugin, by entry point name, as C{module:object}."""


def install_distribution(
    directory: str,
    entries: Mapping[str, str] = TEST_PLUGINS,
    name: str = DISTRIBUTION,
    version: str = "1.0",
) -> Callable[[], None]:
    """
    Register C{entries} (entry point name -> C{module:object}) in the C{edgegw.plugins}
    group through a fake distribution installed in C{directory} (created), which is
    put first on C{sys.path}.

    @return: Uninstalls it: takes C{directory} off C{sys.path} and forgets the modules
        imported from it.
    """
    root = os.path.abspath(directory)
    dist_info = os.path.join(root, f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(dist_info)
    with open(os.path.join(dist_info, "METADATA"), "w", encoding="utf-8") as stream:
        stream.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    with open(os.path.join(dist_info, "entry_points.txt"), "w", encoding="utf-8") as stream:
        stream.write("[edgegw.plugins]\n")
        for entry, target in entries.items():
            stream.write(f"{entry} = {target}\n")
    sys.path.insert(0, root)
    importlib.invalidate_caches()

    def uninstall() -> None:
        while root in sys.path:
            sys.path.remove(root)
        # Modules imported from the directory itself (none, unless a test put one
        # there: the test plugins live in this module) go with it.
        for module_name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None) or ""
            if origin.startswith(root + os.sep):
                del sys.modules[module_name]
        importlib.invalidate_caches()

    return uninstall


def install_plugins(
    test: SynchronousTestCase,
    entries: Mapping[str, str] = TEST_PLUGINS,
    name: str = DISTRIBUTION,
    version: str = "1.0",
) -> str:
    """
    L{install_distribution} in a new temporary directory of C{test}, until C{test} ends.

    @return: The directory put on C{sys.path}.
    """
    root: str = os.path.abspath(test.mktemp())
    test.addCleanup(install_distribution(root, entries, name, version))
    return root


class PluginBoomError(Exception):
    """
    What the C{boom} plugin raises.
    """


def _tag_config(config: Mapping[str, Any]) -> tuple[str, str]:
    tag = config.get("tag")
    if not isinstance(tag, str):
        raise PluginConfigError("tag", "must be a string")
    header = config.get("header", "X-Tags")
    if not isinstance(header, str):
        raise PluginConfigError("header", "must be a string")
    return header, tag


def _append(headers: Any, name: str, tag: str) -> None:
    current = headers.get(name)
    headers.set(name, f"{current},{tag}" if current else tag)


@implementer(IRequestHook)
class TagRequest:
    """
    Appends a tag to a request header.
    """

    def __init__(self, header: str, tag: str) -> None:
        self.header = header
        self.tag = tag

    def on_request(self, request: PluginRequest) -> None:
        _append(request.headers, self.header, self.tag)


@implementer(IResponseHook)
class TagResponse:
    """
    Appends a tag to a response header, as the head goes out.
    """

    wants_body = False
    max_body_bytes = 0

    def __init__(self, header: str, tag: str) -> None:
        self.header = header
        self.tag = tag

    def on_response(self, response: PluginResponse) -> None:
        _append(response.headers, self.header, self.tag)


@implementer(IRequestPlugin, IResponsePlugin)
class Tagger:
    """
    The C{tagger} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> TagRequest:
        return TagRequest(*_tag_config(config))

    def response_hook(self, config: Mapping[str, Any]) -> TagResponse:
        return TagResponse(*_tag_config(config))


@implementer(IRequestHook)
class ReplyHook:
    """
    Answers every request itself.
    """

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    def on_request(self, request: PluginRequest) -> Reply:
        return self.reply


@implementer(IRequestPlugin)
class Replier:
    """
    The C{replier} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> ReplyHook:
        return ReplyHook(
            Reply(
                int(config.get("status", 200)),
                str(config.get("body", "")),
                dict(config.get("headers", {})),
            )
        )


@implementer(IRequestHook)
class RewriteHook:
    """
    Sets the path and/or the query.
    """

    def __init__(self, path: str | None, query: str | None) -> None:
        self.path = path
        self.query = query

    def on_request(self, request: PluginRequest) -> None:
        if self.path is not None:
            request.path = self.path
        if self.query is not None:
            request.query = self.query


@implementer(IRequestPlugin)
class Rewriter:
    """
    The C{rewriter} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> RewriteHook:
        return RewriteHook(config.get("path"), config.get("query"))


@implementer(IRequestHook)
class BoomRequest:
    """
    Raises on every request.
    """

    def on_request(self, request: PluginRequest) -> None:
        raise PluginBoomError("request plugin exploded")


@implementer(IResponseHook)
class BoomResponse:
    """
    Raises on every response (optionally as one that wants the body).
    """

    def __init__(self, wants_body: bool) -> None:
        self.wants_body = wants_body
        self.max_body_bytes = 4096 if wants_body else 0

    def on_response(self, response: PluginResponse) -> None:
        raise PluginBoomError("response plugin exploded")


@implementer(IRequestPlugin, IResponsePlugin)
class Boom:
    """
    The C{boom} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> BoomRequest:
        return BoomRequest()

    def response_hook(self, config: Mapping[str, Any]) -> BoomResponse:
        return BoomResponse(bool(config.get("wantsBody", False)))


@implementer(IRequestHook)
class LaterHook:
    """
    Decides after a delay, through a L{Deferred}.
    """

    def __init__(self, delay: float, header: str, value: str, reply: Reply | None) -> None:
        self.delay = delay
        self.header = header
        self.value = value
        self.reply = reply

    def on_request(self, request: PluginRequest) -> Deferred[Reply | None]:
        decided: Deferred[Reply | None] = Deferred()

        def decide() -> None:
            if self.reply is not None:
                decided.callback(self.reply)
                return
            _append(request.headers, self.header, self.value)
            decided.callback(None)

        reactor.callLater(self.delay, decide)
        return decided


@implementer(IRequestPlugin)
class Later:
    """
    The C{later} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> LaterHook:
        reply = config.get("reply")
        return LaterHook(
            float(config.get("delay", 0.05)),
            str(config.get("header", "X-Tags")),
            str(config.get("value", "later")),
            Reply(int(reply["status"]), str(reply.get("body", ""))) if reply else None,
        )


@implementer(IRequestHook)
class CoroHook:
    """
    A coroutine hook.
    """

    async def on_request(self, request: PluginRequest) -> None:
        d: Deferred[None] = Deferred()
        reactor.callLater(0.01, d.callback, None)
        await d
        request.headers.add("X-Coro", "yes")


@implementer(IRequestPlugin)
class Coro:
    """
    The C{coro} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> CoroHook:
        return CoroHook()


@implementer(IResponseHook)
class StatusHook:
    """
    Sets the response status.
    """

    wants_body = False
    max_body_bytes = 0

    def __init__(self, status: int) -> None:
        self.status = status

    def on_response(self, response: PluginResponse) -> None:
        response.status = self.status


@implementer(IResponsePlugin)
class Status:
    """
    The C{status} plugin (response only).
    """

    def response_hook(self, config: Mapping[str, Any]) -> StatusHook:
        return StatusHook(int(config["status"]))


@implementer(IResponseHook)
class UpperHook:
    """
    Upper-cases the whole (buffered) body and wraps it in brackets (so that its length
    changes), and says how long the body it saw was in C{X-Upper}.
    """

    wants_body = True

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    def on_response(self, response: PluginResponse) -> None:
        body = response.body
        if body is None:
            response.headers.set("X-Upper", "unbuffered")
            return
        response.headers.set("X-Upper", str(len(body)))
        response.body = b"[" + body.upper() + b"]"


@implementer(IResponsePlugin)
class Upper:
    """
    The C{upper} plugin.
    """

    def response_hook(self, config: Mapping[str, Any]) -> UpperHook:
        return UpperHook(int(config.get("maxBodyBytes", 4096)))


@implementer(IRequestHook)
class NoRequest:
    def on_request(self, request: PluginRequest) -> None:
        pass


@implementer(IResponseHook)
class NoResponse:
    wants_body = False
    max_body_bytes = 0

    def on_response(self, response: PluginResponse) -> None:
        pass


def _strict_config(config: Mapping[str, Any]) -> None:
    problems = [(str(key), "unknown field (expected: level)") for key in config if key != "level"]
    level = config.get("level")
    if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 3:
        problems.append(("level", "must be an integer from 1 to 3"))
    if problems:
        raise PluginConfigError.of(problems)


@implementer(IRequestPlugin, IResponsePlugin)
class Strict:
    """
    The C{strict} plugin: its config must be exactly C{{level: 1..3}}.
    """

    def request_hook(self, config: Mapping[str, Any]) -> NoRequest:
        _strict_config(config)
        return NoRequest()

    def response_hook(self, config: Mapping[str, Any]) -> NoResponse:
        _strict_config(config)
        return NoResponse()


@implementer(IRequestHook)
class CancelsHook:
    """
    Fails with C{CancelledError} although nobody cancelled anything.
    """

    def on_request(self, request: PluginRequest) -> Deferred[None]:
        return fail(CancelledError())


@implementer(IRequestPlugin)
class Cancels:
    """
    The C{cancels} plugin.
    """

    def request_hook(self, config: Mapping[str, Any]) -> CancelsHook:
        return CancelsHook()


@implementer(IRequestHook)
class HollowHook:  # type: ignore[misc]  # deliberately lacks on_request
    """
    Says it provides IRequestHook but has no C{on_request}.
    """


@implementer(IRequestPlugin)
class Hollow:
    """
    The C{hollow} plugin: its hook lacks the method the interface requires.
    """

    def request_hook(self, config: Mapping[str, Any]) -> HollowHook:
        return HollowHook()


tagger = Tagger()
replier = Replier()
rewriter = Rewriter()
boom = Boom()
later = Later()
coro = Coro()
status = Status()
upper = Upper()
strict = Strict()
cancels = Cancels()
hollow = Hollow()
nothing = object()
