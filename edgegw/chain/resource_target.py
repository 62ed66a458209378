"""
A plain Resource mounted on the mux, skipping the per-route chain.
"""

from __future__ import annotations

from time import monotonic

from twisted.logger import Logger
from twisted.web.resource import IResource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import InFlight, IRouteTarget
from edgegw.terminal.answers import abort, write_text

_log = Logger(namespace="edgegw.auth")


@implementer(IRouteTarget)
class ResourceTarget:
    """
    A Resource rendered as Twisted would, with no per-route stages: the gateway's own
    endpoints (login, logout and the like) are mounted this way. Its answers are still
    logged, one access-log line each with the pattern as the route, and counted in
    flight like a route's (a shutdown waits for them and closes their connections).
    """

    def __init__(
        self, pattern: str, resource: IResource, access: AccessLog, inflight: InFlight
    ) -> None:
        self.pattern = pattern
        self.resource = resource
        self.access = access
        self.inflight = inflight

    def serve(self, request: Request, params: dict[str, str]) -> int:
        """
        Render the resource; answer what it returned, or let it answer later.
        """
        started = monotonic()
        self.inflight.started(request)
        request.notifyFinish().addBoth(self._done, request, started)
        try:
            body = self.resource.render(request)
        except Exception:
            # What recover does for a route: a logged 500 in plain words, never
            # Twisted's HTML traceback page.
            _log.failure("unhandled error in {pattern}", pattern=self.pattern)
            if request.startedWriting:
                abort(request)
            else:
                write_text(request, 500, b"internal server error\n")
            return NOT_DONE_YET
        if body is not NOT_DONE_YET and not request.finished:
            # As Twisted's Request.render answers a resource's bytes.
            request.setHeader(b"content-length", b"%d" % len(body))
            request.write(body)
            request.finish()
        return NOT_DONE_YET

    def _done(self, result: object, request: Request, started: float) -> None:
        self.inflight.finished(request)
        self.access.edge(request, started, self.pattern)
