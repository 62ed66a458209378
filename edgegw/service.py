"""
The gateway as a Twisted service: listen on start, drain in-flight requests on stop.
"""

from __future__ import annotations

import sys

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort, IReactorCore, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from edgegw.gateway import Gateway
from edgegw.server.listen import server_endpoint


class GatewayService(MultiService):
    """
    Serves one L{Gateway} on its configured listen address.

    On stop (SIGTERM under twistd) it stops accepting connections, makes every further
    response close its connection, and waits up to C{Gateway.spec.drainTimeout} for the
    requests in flight to finish before letting the reactor stop.
    """

    _log = Logger()

    def __init__(self, gateway: Gateway, reactor: IReactorCore) -> None:
        super().__init__()
        self.gateway = gateway
        self.reactor = reactor
        self.port: IListeningPort | None = None

    def privilegedStartService(self) -> None:
        """
        Bind the listening socket before twistd drops privileges, so that a failure to
        bind stops startup with a clear message.
        """
        listen = self.gateway.config.gateway.listen
        try:
            endpoint = server_endpoint(self.reactor, listen)
        except ValueError as e:
            sys.stderr.write(f"edgegw: cannot listen on {listen}: {e}\n")
            raise SystemExit(1) from None
        listening = endpoint.listen(self.gateway.site)
        outcome: list[IListeningPort | Failure] = []
        listening.addBoth(outcome.append)
        if outcome and isinstance(outcome[0], Failure):
            sys.stderr.write(
                f"edgegw: cannot listen on {self.gateway.config.gateway.listen}: "
                f"{outcome[0].getErrorMessage()}\n"
            )
            raise SystemExit(1)
        if outcome:
            self.port = outcome[0]  # type: ignore[assignment]
        else:
            listening.addCallback(self._listening)
        super().privilegedStartService()

    def _listening(self, port: IListeningPort) -> None:
        self.port = port

    def startService(self) -> None:
        super().startService()
        if self.port is not None:
            self._log.info(
                "edgegw listening on {address} with {count} routes",
                address=self.port.getHost(),
                count=len(self.gateway.routes),
            )

    def stopService(self) -> Deferred[None]:
        """
        Stop accepting, then wait (bounded) for in-flight requests.
        """
        super().stopService()
        return self._drain()

    def _drain(self) -> Deferred[None]:
        inflight = self.gateway.inflight
        port, self.port = self.port, None
        if port is not None:
            port.stopListening()
        drained = inflight.drain()
        if inflight.count:
            self._log.info(
                "draining {count} request(s) in flight (up to {timeout}s)",
                count=inflight.count,
                timeout=self.gateway.config.gateway.drain_timeout,
            )
        reactor: IReactorTime = self.reactor  # type: ignore[assignment]
        timeout = self.gateway.config.gateway.drain_timeout
        drained.addTimeout(timeout, reactor, onTimeoutCancel=self._gave_up)
        drained.addCallback(self._closed)
        return drained

    def _closed(self, result: object) -> Deferred[None]:
        writer = self.gateway.access_log.writer
        if writer is not None:
            writer.close()
        closed = self.gateway.upstream_client.close()
        telemetry = self.gateway.telemetry
        if telemetry is not None:
            # Export what is left; the exporter's own timeout bounds this.
            closed.addCallback(lambda _: telemetry.shutdown())
        return closed

    def _gave_up(self, result: object, timeout: float) -> None:
        self._log.warn(
            "drain timeout: {count} request(s) still in flight after {timeout}s; closing",
            count=self.gateway.inflight.count,
            timeout=timeout,
        )
