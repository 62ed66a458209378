"""
Where the metrics go: the Prometheus scrape listener (a listen address of its own, never
the public one) and the periodic OTLP export, as services of the daemon's tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource as OtelResource
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.resource import NoResource, Resource
from twisted.web.server import Request, Site

from edgegw.config.addresses import endpoint_description
from edgegw.config.model import MetricsSpec, TelemetrySpec
from edgegw.metrics.instruments import Registry
from edgegw.metrics.otlp import MetricsExportService, make_metric_exporter
from edgegw.metrics.prometheus import MetricsPage

__all__ = ["ScrapeListener", "export_service", "scrape_root"]

_log = Logger(namespace="edgegw.metrics")


class _ScrapeRoot(Resource):
    """
    The scrape path answers the metrics; anything else is a 404.
    """

    def __init__(self, path: bytes, page: MetricsPage) -> None:
        super().__init__()
        self.path = path
        self.page = page

    def getChildWithDefault(self, name: bytes, request: Request) -> Resource:
        if request.path == self.path:
            return self.page
        return NoResource()

    def render(self, request: Request) -> bytes:
        if request.path == self.path:
            return self.page.render(request)  # type: ignore[no-any-return]
        return NoResource().render(request)  # type: ignore[no-any-return]


def scrape_root(registry: Registry, path: str, resource: Mapping[str, Any]) -> Resource:
    """
    The scrape listener's resource: C{GET path} answers the registry in the Prometheus
    text format.
    """
    return _ScrapeRoot(path.encode("ascii"), MetricsPage(registry, resource))


class ScrapeListener(Service):
    """
    Listens on C{listen} (a listen address, as the Gateway's) with C{site}, whose
    resource is a L{scrape_root}.

    @ivar port: The listening port, while running.
    """

    def __init__(self, reactor: Any, listen: str, site: Site) -> None:
        self.reactor = reactor
        self.listen = listen
        self.site = site
        self.port: IListeningPort | None = None
        self._starting: Deferred[Any] | None = None

    def startService(self) -> None:
        super().startService()
        endpoint = serverFromString(self.reactor, endpoint_description(self.listen))
        self._starting = endpoint.listen(self.site)
        self._starting.addCallbacks(self._listening, self._failed)

    def _listening(self, port: IListeningPort) -> None:
        self.port = port
        _log.info("metrics scrape listener on {address}", address=port.getHost())

    def _failed(self, failure: Any) -> None:
        # Metrics are not worth the traffic: the gateway keeps serving without them.
        _log.error(
            "metrics scrape listener cannot listen on {listen}: {reason}",
            listen=self.listen,
            reason=failure.getErrorMessage(),
        )

    def stopService(self) -> Deferred[object]:
        super().stopService()

        def stop(_: object) -> object:
            port, self.port = self.port, None
            return None if port is None else port.stopListening()

        starting = self._starting if self._starting is not None else succeed(None)
        self._starting = None
        return starting.addCallback(stop)

    def serve(self, registry: Registry, path: str, resource: OtelResource) -> None:
        """
        Answer scrapes of C{path} from C{registry}, with C{resource} as C{target_info},
        from now on (a reload's new gateway).
        """
        root = self.site.resource
        assert isinstance(root, _ScrapeRoot)
        root.path = path.encode("ascii")
        root.page = MetricsPage(registry, dict(resource.attributes))


def export_service(
    telemetry: TelemetrySpec,
    metrics: MetricsSpec,
    registry: Registry,
    resource: OtelResource,
    reactor: Any,
    lock: DeferredLock | None = None,
) -> MetricsExportService | None:
    """
    The OTLP export C{metrics} asks for, of C{registry}; L{None} without an endpoint.

    @param lock: Held by each export (see L{MetricsExportService}).
    """
    if metrics.otlp_endpoint is None:
        return None
    exporter = make_metric_exporter(
        metrics.otlp_endpoint,
        telemetry.otlp_protocol,
        telemetry.otlp_headers,
        telemetry.otlp_timeout,
    )
    return MetricsExportService(registry, resource, exporter, reactor, metrics.otlp_interval, lock)
