"""
A minimal fan-out server on stock C{treq} over Twisted's C{Agent}: the floor that
edgegw's C{api} route is compared against (the api counterpart of L{bench.agent_proxy}).

One Twisted Site whose leaf resource answers C{GET /dash/{id}} by calling every
configured backend path concurrently with a plain C{treq.HTTPClient} (its defaults:
cookie jar, redirects followed, gzip offered) over an C{Agent} on a persistent
L{HTTPConnectionPool}, reading each body with C{treq.json_content}, and answering the
merged C{{"group": document, ...}} as C{application/json}; C{502} when any call fails
(a connection error, a non-2xx status, a body that is not JSON). No access log, no
routing beyond that one pattern, no timeout, no header policy: nothing but the fan-out.

Run as C{python -m bench.treq_fanout --port PORT --backend http://127.0.0.1:N
--path a=/a/{id} --path b=/b --path c=/c}.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import treq
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from bench.agent_proxy import QuietSite, listen

PREFIX = b"/dash/"
"""The one route: C{GET /dash/{id}}, C{{id}} one non-empty path segment."""
PLACEHOLDER = "{id}"
"""Where a backend path template takes the request's C{{id}}."""


class BackendError(Exception):
    """A backend answered with a status other than 2xx."""


def _json_body(response: IResponse) -> Deferred[Any]:
    if not 200 <= response.code < 300:
        raise BackendError(f"status {response.code}")
    return treq.json_content(response)


def _write(request: Request, status: int, content_type: bytes, body: bytes) -> None:
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [content_type])
    request.write(body)
    request.finish()


class FanOutResource(Resource):
    """
    The Site's only resource: C{GET /dash/{id}} fans out to every backend path.

    @ivar client: The treq client, over an Agent on the persistent pool.
    @ivar backend: The backends' origin (C{http://127.0.0.1:N}), without a final C{/}.
    @ivar paths: Group to path template (C{{id}} filled in per request).
    """

    isLeaf = True

    def __init__(self, client: HTTPClient, backend: str, paths: dict[str, str]) -> None:
        super().__init__()
        self.client = client
        self.backend = backend.rstrip("/")
        self.paths = paths

    def render(self, request: Request) -> bytes | int:
        """Start the backend calls and answer when all of them are in (or one failed)."""
        if request.method != b"GET":
            request.setResponseCode(405)
            request.responseHeaders.setRawHeaders(b"allow", [b"GET"])
            return b""
        path = request.path
        identifier = path[len(PREFIX) :]
        if not path.startswith(PREFIX) or not identifier or b"/" in identifier:
            request.setResponseCode(404)
            return b"not found\n"
        value = quote(identifier.decode("utf-8", "surrogateescape"), safe="")
        groups = list(self.paths)
        calls = [
            self.client.get(
                self.backend + self.paths[group].replace(PLACEHOLDER, value)
            ).addCallback(_json_body)
            for group in groups
        ]
        everything: Deferred[list[Any]] = gatherResults(calls, consumeErrors=True)
        request.notifyFinish().addErrback(lambda _: everything.cancel())

        def answer(documents: list[Any]) -> None:
            if not request._disconnected:
                merged = dict(zip(groups, documents, strict=True))
                _write(request, 200, b"application/json", json.dumps(merged).encode())

        def failed(reason: Failure) -> None:
            if not request._disconnected:
                _write(request, 502, b"text/plain", b"bad gateway\n")

        everything.addCallbacks(answer, failed)
        return NOT_DONE_YET


def make_site(backend: str, paths: dict[str, str], pool_size: int) -> QuietSite:
    """
    The fan-out's Site: treq over an Agent on a persistent pool keeping up to
    C{pool_size} idle connections to C{backend} (all paths share one host, so the pool
    must hold every call in flight: the fan-out times the client connections).
    """
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = pool_size
    pool.cachedConnectionTimeout = 600
    client = HTTPClient(Agent(reactor, pool=pool))
    return QuietSite(FanOutResource(client, backend, paths))


def _group_path(text: str) -> tuple[str, str]:
    group, sep, path = text.partition("=")
    if not sep or not group or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"GROUP=/path such as a=/a/{{id}}, got {text!r}")
    return group, path


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the fan-out on 127.0.0.1 until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.treq_fanout", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--backend", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument(
        "--path",
        dest="paths",
        type=_group_path,
        action="append",
        required=True,
        metavar="GROUP=PATH",
        help="a backend path answered as member GROUP ({id}: the request's); repeat",
    )
    parser.add_argument("--pool-size", type=int, default=150, help="idle backend connections")
    args = parser.parse_args(argv)
    listen(args.port, make_site(args.backend, dict(args.paths), args.pool_size))
    reactor.run()


if __name__ == "__main__":
    main()
