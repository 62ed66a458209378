"""
What a reload (SIGHUP, L{GatewayService.reload}) carries over and what it lets go, on a
service tree running in this process over real sockets: a TLS listener's certificate
read again from its files, the IdP's discovery and keys carried over (no 503s while the
new client would rediscover them), the open-file limit fitted to a new connection cap,
nothing left running by a refused reload, and a swap that is all or nothing.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import ssl
import subprocess
import threading
import time
import weakref
from itertools import pairwise
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExportResult
from twisted.application.service import Service
from twisted.internet import reactor as _reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.server import NOT_DONE_YET

from edgegw.config.parse import load_config
from edgegw.generation import GenerationService
from edgegw.metrics import serve as serve_module
from edgegw.server.gateway_site import DESCRIPTOR_RESERVE
from edgegw.service import GatewayService, build_service
from edgegw.tap import reload_and_refreeze, tune_garbage_collector
from tests.support.backends import SiteBackend, answer
from tests.support.browser import Browser
from tests.support.certificates import make_certificate
from tests.support.configs import GATEWAY, write_tree
from tests.support.fake_idp import FakeIdP
from tests.support.otlp_metrics import CollectedPoint, start_http_metrics
from tests.support.processes import port_of
from tests.support.redis import redis_server
from tests.support.sessions import KEY, server_session_config

reactor: Any = _reactor

HEALTH = "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /healthz, handler: {type: health}}\n"


def with_idp(issuer: str) -> str:
    """
    A Gateway with a session block and an IdP resource for C{issuer}, no routes.
    """
    return (
        GATEWAY
        + '  session: {key: "0123456789abcdef0123456789abcdef"}\n'
        + "---\nkind: IdP\nmetadata: {name: idp}\nspec:\n  type: oidc\n"
        + f'  issuer: "{issuer}"\n  clientID: gw\n  clientSecret: gw-secret\n'
    )


class RecordingExporter:
    """
    An OTLP metric exporter that records its exports and shutdown (from pool threads):
    C{(number, started, ended, requests counted)} per export in C{exports}, and every
    step in the class's C{events}, in order.
    """

    _preferred_temporality: dict[Any, Any] = {}
    _preferred_aggregation: dict[Any, Any] = {}
    events: list[tuple[str, int]] = []
    _lock = threading.Lock()

    def __init__(self, number: int, seconds: float) -> None:
        self.number = number
        self.seconds = seconds
        self.exports: list[tuple[int, float, float, float]] = []
        if number == 0:
            RecordingExporter.events = []

    def _event(self, what: str) -> None:
        with self._lock:
            self.events.append((what, self.number))

    def export(self, data: Any, **kwargs: Any) -> MetricExportResult:
        started = time.monotonic()
        self._event("export")
        requests = sum(
            point.count
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "http.server.request.duration"
            for point in metric.data.data_points
        )
        time.sleep(self.seconds)
        self._event("exported")
        self.exports.append((self.number, started, time.monotonic(), requests))
        return MetricExportResult.SUCCESS

    def shutdown(self, **kwargs: Any) -> None:
        self._event("shutdown")


class ReloadCarryTests(TestCase):
    def serve(self, files: dict[str, str]) -> tuple[GatewayService, str]:
        """
        Build the tree from C{files} (a configuration directory), bind and start it; it
        stops when the test ends.
        """
        root = write_tree(self.mktemp(), files)
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        return service, root

    async def peer_certificate(self, port: int) -> str:
        """
        The certificate the TLS listener on C{port} presents to a new connection (PEM).
        """
        pem: str = await deferToThread(ssl.get_server_certificate, ("127.0.0.1", port), timeout=5)
        return pem

    async def test_tls_certificate_read_again(self) -> None:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key_path, cert_path, first = make_certificate(directory, "localhost")
        listen = f"ssl:0:interface=127.0.0.1:privateKey={key_path}:certKey={cert_path}"
        service, _ = self.serve({"a.yaml": GATEWAY.replace("127.0.0.1:0", listen) + HEALTH})
        port = port_of(service)
        self.assertEqual(
            ssl.PEM_cert_to_DER_cert(await self.peer_certificate(port)),
            ssl.PEM_cert_to_DER_cert(first.decode()),
        )
        # The operator renews the certificate at the same paths and reloads.
        renewed_dir = os.path.join(directory, "renewed")
        os.makedirs(renewed_dir)
        new_key, new_cert, second = make_certificate(renewed_dir, "localhost")
        shutil.copy(new_key, key_path)
        shutil.copy(new_cert, cert_path)
        self.assertTrue(await service.reload())
        self.assertEqual(
            ssl.PEM_cert_to_DER_cert(await self.peer_certificate(port)),
            ssl.PEM_cert_to_DER_cert(second.decode()),
        )
        # A key that does not match the certificate refuses the reload: the renewed
        # certificate keeps being served.
        make_certificate(directory, "localhost")  # a third key (and certificate) ...
        shutil.copy(new_cert, cert_path)  # ... under the renewed certificate
        self.assertFalse(await service.reload())
        self.assertEqual(
            ssl.PEM_cert_to_DER_cert(await self.peer_certificate(port)),
            ssl.PEM_cert_to_DER_cert(second.decode()),
        )

    async def test_idp_carried_over(self) -> None:
        idp = FakeIdP()
        await idp.start(self)
        text = (
            with_idp(idp.issuer)
            + "---\nkind: Route\nmetadata: {name: app}\nspec:\n  match: /app/\n"
            + "  type: app\n  access: {auth: required}\n  handler: {type: health}\n"
        )
        service, root = self.serve({"a.yaml": text})
        provider = service.gateway.idp
        assert provider is not None
        for _ in range(250):
            if provider.ready:
                break
            await deferLater(reactor, 0.02, lambda: None)
        self.assertTrue(provider.ready, provider.last_error)
        fetches = (idp.discovery_requests, idp.jwks_requests)
        # The IdP is gone when the reload comes: what the old client knows carries over.
        await idp.stop()
        self.assertTrue(await service.reload())
        carried = service.gateway.idp
        assert carried is not None
        self.assertIsNot(carried, provider)
        self.assertTrue(carried.ready)
        self.assertEqual(carried.metadata, provider.metadata)
        self.assertIs(carried.keys, provider.keys)
        port = port_of(service)
        login = await Browser().get(f"http://127.0.0.1:{port}/auth/login?return_to=/app/")
        self.assertEqual(login.status, 302)
        self.assertTrue(login.location and login.location.startswith(idp.issuer), login.location)
        # Nothing was fetched again: the old client's schedule goes on (15 minutes).
        self.assertEqual((idp.discovery_requests, idp.jwks_requests), fetches)
        # Another issuer starts cold: the reload waits for its discovery before the new
        # configuration serves.
        other = FakeIdP()
        await other.start(self)
        write_tree(root, {"a.yaml": text.replace(idp.issuer, other.issuer)})
        self.assertTrue(await service.reload())
        warmed = service.gateway.idp
        assert warmed is not None
        self.assertTrue(warmed.ready)
        self.assertEqual(other.discovery_requests, 1)
        login = await Browser().get(f"http://127.0.0.1:{port}/auth/login?return_to=/app/")
        self.assertEqual(login.status, 302)
        self.assertTrue(login.location and login.location.startswith(other.issuer))
        # One that cannot be reached takes over after the warm-up's bound, cold: 503
        # until it is discovered, as at a start.
        service.warm_up_timeout = 0.3
        write_tree(root, {"a.yaml": text.replace(idp.issuer, "http://127.0.0.1:9")})
        self.assertTrue(await service.reload())
        cold = service.gateway.idp
        assert cold is not None
        self.assertFalse(cold.ready)
        again = await Browser().get(f"http://127.0.0.1:{port}/auth/login?return_to=/app/")
        self.assertEqual(again.status, 503)

    async def test_refused_reload_leaves_no_export_thread(self) -> None:
        telemetry = (
            "---\nkind: Telemetry\nmetadata: {name: t}\nspec:\n  service: {name: edge}\n"
            '  otlp: {endpoint: "http://127.0.0.1:9"}\n'
        )
        service, root = self.serve({"a.yaml": GATEWAY + HEALTH + telemetry})
        before = set(threading.enumerate())
        # Refused after the new gateway's Telemetry was built: a Rego file that does not
        # compile (the build fails), then an access log that cannot be opened.
        write_tree(
            root,
            {
                "policies/p.rego": "package gw.authz\ndeny contains x if {",
                "a.yaml": GATEWAY
                + HEALTH
                + telemetry
                + "---\nkind: Policy\nmetadata: {name: p}\nspec: {rego: {path: policies/p.rego}}\n",
            },
        )
        self.assertFalse(await service.reload())
        directory = os.path.join(root, "a-directory")
        os.makedirs(directory)
        write_tree(
            root,
            {"a.yaml": GATEWAY + f'  accessLog: {{output: "{directory}"}}\n' + HEALTH + telemetry},
        )
        os.remove(os.path.join(root, "policies", "p.rego"))
        self.assertFalse(await service.reload())
        self.assertEqual(set(threading.enumerate()) - before, set())

    async def test_new_connection_cap_fits_the_descriptor_limit(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        service, root = self.serve(
            {"a.yaml": GATEWAY + "  limits: {maxConnections: 100}\n" + HEALTH}
        )
        wanted = 2 * 3000 + DESCRIPTOR_RESERVE
        if hard != resource.RLIM_INFINITY and hard < wanted:
            self.fail(f"the hard open-file limit {hard} is below {wanted}: raise it to test")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2 * 100 + DESCRIPTOR_RESERVE, hard))
        write_tree(root, {"a.yaml": GATEWAY + "  limits: {maxConnections: 3000}\n" + HEALTH})
        self.assertTrue(await service.reload())
        self.assertGreaterEqual(resource.getrlimit(resource.RLIMIT_NOFILE)[0], wanted)

    async def test_a_reload_replaces_one_generation(self) -> None:
        """
        The tree holds the listener and one generation of services; a reload puts the
        new generation in (running, each child once), and the one it replaces leaves the
        tree and stops, its children with it.
        """
        service, root = self.serve({"a.yaml": GATEWAY + HEALTH})
        old = service.generation
        old_children = list(old)
        self.assertEqual(list(service), [service.listener, old])
        more = HEALTH.replace("{name: h}", "{name: m}").replace("/healthz", "/more")
        write_tree(root, {"a.yaml": GATEWAY + HEALTH + more})
        self.assertTrue(await service.reload())
        new = service.generation
        self.assertIsNot(new, old)
        self.assertEqual(list(service), [service.listener, new])
        self.assertIs(new.parent, service)
        self.assertTrue(new.running)
        self.assertTrue(all(child.running for child in new))
        self.assertEqual([child.name for child in new], [child.name for child in old_children])
        await service.retired()
        self.assertIsNone(old.parent)
        self.assertFalse(old.running)
        self.assertFalse(any(child.running for child in old_children))

    async def test_swap_is_all_or_nothing(self) -> None:
        service, _ = self.serve({"a.yaml": GATEWAY + HEALTH})
        old = service.gateway
        generation = service.generation
        children = list(generation)
        self.assertTrue(all(child.running for child in children))

        class Broken(Service):
            def startService(self) -> None:
                raise RuntimeError("cannot start")

        building = service.generation_of

        def with_broken(gateway: Any) -> GenerationService:
            built = building(gateway)
            broken = Broken()
            broken.setName("broken")
            broken.setServiceParent(built)
            return built

        self.patch(service, "generation_of", with_broken)
        self.assertFalse(await service.reload())
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertIs(service.gateway, old)
        self.assertEqual(list(service), [service.listener, generation])
        self.assertEqual(list(generation), children)
        self.assertTrue(all(child.running for child in children))
        for child in children:
            self.assertIs(generation.getServiceNamed(child.name), child)
        reply = await Browser().get(f"http://127.0.0.1:{port_of(service)}/healthz")
        self.assertEqual(reply.status, 200)

    async def test_state_store_connected_before_it_serves(self) -> None:
        redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"ok")).start()
        self.addCleanup(backend.stop)
        text = server_session_config(
            key=KEY,
            redis_address=redis.address,
            issuer=idp.issuer,
            upstream=f"http://127.0.0.1:{backend.port}",
        )
        service, _ = self.serve({"a.yaml": text})
        self.assertTrue(await service.reload())
        store = service.gateway.state
        assert store is not None
        # At once: the new store's connection was up before the switch (without the
        # warm-up, this read is refused as not connected, and so are sessions).
        self.assertIsNone(await store.get(b"anything"))

    async def test_stop_while_a_reload_warms_up(self) -> None:
        text = with_idp("http://127.0.0.1:9") + HEALTH
        service, _ = self.serve({"a.yaml": text})
        old = service.gateway
        reloading = service.reload()
        # A second SIGHUP meanwhile is the same reload, run again once it is done.
        self.assertIs(service.reload(), reloading)
        await deferLater(reactor, 0.2, lambda: None)
        self.assertFalse(reloading.called)
        await service.stopService()
        self.assertFalse(await reloading)
        self.assertIs(service.gateway, old)
        self.assertFalse(any(child.running for child in [*service, *service.generation]))

    async def test_tls_files_read_only_when_the_context_is_built_refuse_the_reload(self) -> None:
        """
        What only building the TLS context reads (a dhParameters file) is read at the
        reload, not at the first handshake after it: a missing one refuses the reload,
        and the running certificate keeps serving.
        """
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key_path, cert_path, first = make_certificate(directory, "localhost")
        dh_path = os.path.join(directory, "dh.pem")
        subprocess.run(
            ["openssl", "dhparam", "-dsaparam", "-out", dh_path, "2048"],
            check=True,
            capture_output=True,
        )
        listen = (
            f"ssl:0:interface=127.0.0.1:privateKey={key_path}:certKey={cert_path}"
            f":dhParameters={dh_path}"
        )
        service, _ = self.serve({"a.yaml": GATEWAY.replace("127.0.0.1:0", listen) + HEALTH})
        port = port_of(service)
        before = ssl.PEM_cert_to_DER_cert(first.decode())
        served = await self.peer_certificate(port)
        self.assertEqual(ssl.PEM_cert_to_DER_cert(served), before)
        os.remove(dh_path)
        self.assertFalse(await service.reload())
        served = await self.peer_certificate(port)
        self.assertEqual(ssl.PEM_cert_to_DER_cert(served), before)

    async def test_replaced_gateways_are_freed_though_the_serving_one_is_frozen(self) -> None:
        """
        The daemon freezes the serving gateway out of the collector's sight; a reload
        (as SIGHUP runs it) unfreezes first and freezes again once the replaced gateway
        has retired, so that its reference cycles (the IdP client's) are collected.
        """
        threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *threshold)
        self.addCleanup(gc.unfreeze)
        idp = FakeIdP()
        await idp.start(self)
        text = with_idp(idp.issuer) + HEALTH
        service, _ = self.serve({"a.yaml": text})
        tune_garbage_collector()
        replaced = []
        for _ in range(3):
            provider = service.gateway.idp
            assert provider is not None
            replaced.append(weakref.ref(provider))
            del provider
            await reload_and_refreeze(service)
        gc.collect()
        self.assertEqual([ref() for ref in replaced], [None, None, None])

    async def test_unreadable_tls_files_keep_the_running_certificate(self) -> None:
        """
        Files readable at start only (before twistd dropped privileges) do not refuse a
        reload: the rest of the configuration is taken, the certificate kept.
        """
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        key_path, cert_path, first = make_certificate(directory, "localhost")
        listen = f"ssl:0:interface=127.0.0.1:privateKey={key_path}:certKey={cert_path}"
        base = GATEWAY.replace("127.0.0.1:0", listen) + HEALTH
        service, root = self.serve({"a.yaml": base})
        port = port_of(service)
        from edgegw.server import listen as listen_module

        def unreadable(*args: object) -> None:
            raise PermissionError(13, "Permission denied")

        self.patch(listen_module, "serverFromString", unreadable)
        more = HEALTH.replace("{name: h}", "{name: more}").replace("/healthz", "/more")
        write_tree(root, {"a.yaml": base + more})
        self.assertTrue(await service.reload())
        self.assertEqual(len(service.gateway.routes), 2)
        served = await self.peer_certificate(port)
        self.assertEqual(ssl.PEM_cert_to_DER_cert(served), ssl.PEM_cert_to_DER_cert(first.decode()))

    async def test_metrics_count_on_and_the_old_export_stops_at_the_switch(self) -> None:
        endpoint, collected = await start_http_metrics(self)
        held: list[Any] = []

        def hold(request: Any) -> int:
            held.append(request)
            return NOT_DONE_YET

        backend = SiteBackend(hold).start()
        self.addCleanup(backend.stop)
        telemetry = (
            "---\nkind: Telemetry\nmetadata: {name: t}\nspec:\n  service: {name: edge}\n"
            f'  metrics: {{otlp: {{endpoint: "{endpoint}", interval: 3600s}}}}\n'
            "---\nkind: Route\nmetadata: {name: slow}\nspec:\n  match: /slow\n"
            "  access: {auth: public}\n"
            f'  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend.port}"}}\n'
        )
        service, root = self.serve({"a.yaml": GATEWAY + HEALTH + telemetry})
        assert service.port is not None
        origin = f"http://127.0.0.1:{port_of(service.port)}"
        self.assertEqual((await Browser().get(origin + "/healthz")).status, 200)
        slow = ensureDeferred(Browser().get(origin + "/slow"))
        while not held:
            await deferLater(reactor, 0.01, lambda: None)
        old = service.generation.getServiceNamed("metrics-export")
        more = HEALTH.replace("{name: h}", "{name: m}").replace("/healthz", "/more")
        write_tree(root, {"a.yaml": GATEWAY + HEALTH + more + telemetry})
        self.assertTrue(await service.reload())
        # Stopped at the switch with its last export, while the old gateway still drains.
        self.assertFalse(old.running)
        await collected.wait_until(lambda: len(collected.exports) == 1)
        new = service.generation.getServiceNamed("metrics-export")
        self.assertIsNot(new, old)
        held[0].write(b"late")
        held[0].finish()
        self.assertEqual((await slow).status, 200)
        self.assertEqual((await Browser().get(origin + "/healthz")).status, 200)
        await service.retired()
        await new.export()

        def count(export: list[CollectedPoint], route: str) -> float:
            return sum(
                point.value
                for point in export
                if point.name == "http.server.request.duration"
                and point.attributes["http.route"] == route
            )

        # One series throughout: the request in flight across the reload counted once.
        self.assertEqual(len(collected.exports), 2)
        self.assertEqual([count(e, "/healthz") for e in collected.exports], [1, 2])
        self.assertEqual([count(e, "/slow") for e in collected.exports], [0, 1])

    def metrics_files(
        self, endpoint: str, limit: int, extra: str = "", gateway: str = GATEWAY
    ) -> dict[str, str]:
        """
        A configuration with a health route and Telemetry exporting metrics over OTLP
        to C{endpoint} (hourly: only a stop exports), C{limit} series per metric.
        """
        telemetry = (
            "---\nkind: Telemetry\nmetadata: {name: t}\nspec:\n  service: {name: edge}\n"
            f"  metrics: {{cardinalityLimit: {limit}, "
            f'otlp: {{endpoint: "{endpoint}", interval: 3600s}}}}\n'
        )
        return {"a.yaml": gateway + HEALTH + telemetry + extra}

    async def test_a_refused_reload_keeps_the_limit_a_switch_brings_its_own(self) -> None:
        """
        A configuration refused once its metrics were built (a Rego file that does not
        compile) leaves the running gateway's cardinality limit alone; one that takes
        over brings its limit, and its export starts as the old one's stops.
        """
        endpoint, collected = await start_http_metrics(self)
        service, root = self.serve(self.metrics_files(endpoint, 1000))
        running = service.generation.getServiceNamed("metrics-export")
        metrics = service.gateway.metrics
        assert metrics is not None
        policy = "---\nkind: Policy\nmetadata: {name: p}\nspec: {rego: {path: policies/p.rego}}\n"
        write_tree(root, {"policies/p.rego": "package gw.authz\ndeny contains x if {"})
        write_tree(root, self.metrics_files(endpoint, 1, policy))
        self.assertFalse(await service.reload())
        self.assertIs(service.gateway.metrics, metrics)
        self.assertEqual(metrics.server_duration.limit, 1000)
        self.assertIs(service.generation.getServiceNamed("metrics-export"), running)

        write_tree(root, self.metrics_files(endpoint, 3))
        self.assertTrue(await service.reload())
        carried = service.gateway.metrics
        assert carried is not None
        self.assertIs(carried.server_duration, metrics.server_duration)
        self.assertEqual(metrics.server_duration.limit, 3)
        exporting = service.generation.getServiceNamed("metrics-export")
        self.assertIsNot(exporting, running)
        self.assertTrue(exporting.running)
        self.assertFalse(running.running)
        await collected.wait_until(lambda: len(collected.exports) == 1)

    async def test_a_configuration_that_never_served_never_exports(self) -> None:
        """
        While a reload warms up (its IdP unreachable) the running export alone sends
        the series; stopped meanwhile, only the running gateway's last export goes out.
        """
        endpoint, collected = await start_http_metrics(self)
        service, root = self.serve(self.metrics_files(endpoint, 1000))
        # with_idp's Gateway, its IdP resource after the rest.
        gateway, _, idp = with_idp("http://127.0.0.1:9").partition("---\n")
        write_tree(root, self.metrics_files(endpoint, 1000, "---\n" + idp, gateway))
        reloading = service.reload()
        await deferLater(reactor, 0.2, lambda: None)
        self.assertFalse(reloading.called)
        await service.stopService()
        self.assertFalse(await reloading)
        await collected.wait_until(lambda: len(collected.exports) >= 1)
        await deferLater(reactor, 0.5, lambda: None)
        self.assertEqual(len(collected.exports), 1)

    async def test_an_export_that_cannot_be_built_refuses_the_reload(self) -> None:
        """
        The new OTLP export is built with the rest of the configuration: when it cannot
        be, the reload is refused with a located problem (no traceback) before the
        switch, and the running configuration serves on whole (its export included).
        """
        endpoint, _ = await start_http_metrics(self)
        service, root = self.serve(self.metrics_files(endpoint, 1000))
        old = service.gateway
        generation = service.generation
        children = list(generation)

        def failing(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the exporter cannot be built")

        self.patch(serve_module, "make_metric_exporter", failing)
        logged: list[str] = []
        observer: Any = lambda event: logged.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        write_tree(root, self.metrics_files(endpoint, 500))
        self.assertFalse(await service.reload())
        self.assertEqual(self.flushLoggedErrors(), [])
        [refused] = [line for line in logged if "reload refused" in line]
        self.assertIn("Telemetry", refused)
        self.assertIn("spec.metrics.otlp", refused)
        self.assertIn("RuntimeError: the exporter cannot be built", refused)
        self.assertIs(service.gateway, old)
        self.assertIs(service.listener.factory, old.site)
        self.assertEqual(list(service), [service.listener, generation])
        self.assertEqual(list(generation), children)
        self.assertTrue(all(child.running for child in children))

    def recording_exporters(self, slow: dict[int, float]) -> list[RecordingExporter]:
        """
        Replace the OTLP metric exporter: the exporters made from now on, numbered in
        the order they are made, record what they do, the ones in C{slow} taking that
        many seconds per export.
        """
        made: list[RecordingExporter] = []

        def make(*args: object) -> RecordingExporter:
            made.append(RecordingExporter(len(made), slow.get(len(made), 0.0)))
            return made[-1]

        self.patch(serve_module, "make_metric_exporter", make)
        return made

    async def test_exports_of_one_series_never_overlap(self) -> None:
        """
        Two reloads in a row against a slow collector: the replaced exports' last
        exports and the new one's run one after another, in order, each carrying no
        fewer requests than the one before.
        """
        made = self.recording_exporters({0: 0.3, 1: 0.3, 2: 0.3})
        service, root = self.serve(self.metrics_files("http://127.0.0.1:9", 1000))
        assert service.port is not None
        origin = f"http://127.0.0.1:{port_of(service.port)}"
        for limit in (999, 998):
            self.assertEqual((await Browser().get(origin + "/healthz")).status, 200)
            write_tree(root, self.metrics_files("http://127.0.0.1:9", limit))
            self.assertTrue(await service.reload())
        await service.stopService()
        await service.retired()
        exports = sorted(
            (export for exporter in made for export in exporter.exports), key=lambda e: e[1]
        )
        self.assertEqual([number for number, _, _, _ in exports], [0, 1, 2])
        for before, after in pairwise(exports):
            self.assertLessEqual(before[2], after[1])
            self.assertLessEqual(before[3], after[3])

    async def test_another_collector_does_not_wait_for_the_old_one(self) -> None:
        """
        A reload that moves the export to another collector (away from one that does
        not answer) exports there while the old collector's last export still hangs.
        """
        made = self.recording_exporters({0: 1.5})
        service, root = self.serve(self.metrics_files("http://127.0.0.1:9", 1000))
        write_tree(root, self.metrics_files("http://127.0.0.1:10", 1000))
        self.assertTrue(await service.reload())
        await service.generation.getServiceNamed("metrics-export").export()
        self.assertEqual(len(made[1].exports), 1)
        self.assertEqual(made[0].exports, [])
        await service.stopService()
        await service.retired()
        self.assertEqual(len(made[0].exports), 1)

    async def test_a_failure_after_the_switch_never_stops_what_serves(self) -> None:
        """
        A bug past the point where the new configuration serves is logged as a failed
        reload, but its services keep running (rather than a gateway serving on stopped
        ones).
        """
        service, root = self.serve({"a.yaml": GATEWAY + HEALTH})
        # Never retired (the bug): its site's timers are stopped here.
        self.addCleanup(service.gateway.site.doStop)

        def broken(*args: object) -> None:
            raise RuntimeError("a bug while retiring")

        self.patch(service.generation, "retire", broken)
        more = HEALTH.replace("{name: h}", "{name: m}").replace("/healthz", "/more")
        write_tree(root, {"a.yaml": GATEWAY + HEALTH + more})
        self.assertFalse(await service.reload())
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(len(service.gateway.routes), 2)
        children = list(service.generation)
        self.assertTrue(service.generation.running)
        self.assertTrue(all(child.running for child in children), children)
        assert service.port is not None
        reply = await Browser().get(f"http://127.0.0.1:{port_of(service.port)}/more")
        self.assertEqual(reply.status, 200)

    async def test_a_stop_never_runs_two_exports_at_once(self) -> None:
        """
        The daemon stops while a replaced export's last export is stuck on a slow
        collector, past drainTimeout: its wait is abandoned, not its lock, so the new
        export's last export and both exporters' shutdowns still come after it.
        """
        self.recording_exporters({0: 1.5})
        quick = GATEWAY + "  drainTimeout: 0.2s\n"
        service, root = self.serve(self.metrics_files("http://127.0.0.1:9", 1000, "", quick))
        write_tree(root, self.metrics_files("http://127.0.0.1:9", 999, "", quick))
        self.assertTrue(await service.reload())
        await service.stopService()
        await service.retired()
        events = RecordingExporter.events
        self.assertEqual(events[:3], [("export", 0), ("exported", 0), ("export", 1)])
        self.assertEqual(sorted(events[3:]), [("exported", 1), ("shutdown", 0), ("shutdown", 1)])
        self.assertLess(events.index(("exported", 1)), events.index(("shutdown", 1)))


class ReloadIntoAFailedStopTests(TestCase):
    async def test_a_reload_never_switches_into_a_tree_whose_stop_failed(self) -> None:
        """
        A stop that fails while a reload warms up leaves no stop under way: the reload
        still abandons its configuration (nothing of it keeps running) rather than
        switching into a tree that is not running.
        """
        import edgegw.reload as reload_module

        root = write_tree(self.mktemp(), {"a.yaml": GATEWAY + HEALTH})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        cold = [True]

        async def cold_parts(*args: object) -> list[str]:
            return ["forced"] if cold[0] else []

        self.patch(reload_module, "cold_parts", cold_parts)
        adopted: list[GenerationService] = []
        adopt = service.adopt

        def recording_adopt(generation: GenerationService) -> GenerationService:
            adopted.append(generation)
            return adopt(generation)

        self.patch(service, "adopt", recording_adopt)
        built: list[GenerationService] = []
        generation_of = service.generation_of

        def recording_generation_of(gateway: Any) -> GenerationService:
            generation = generation_of(gateway)
            built.append(generation)
            return generation

        self.patch(service, "generation_of", recording_generation_of)
        reloading = service.reload()
        await deferLater(reactor, 0.1, lambda: None)

        def broken() -> None:
            raise RuntimeError("a bug in a stop")

        listener_stop = service.listener.stopService
        self.patch(service.listener, "stopService", broken)
        with self.assertRaises(RuntimeError):
            await service.stopService()
        self.assertFalse(service.running)
        self.assertTrue(service.stopping)
        cold[0] = False
        self.assertFalse(await reloading)
        self.assertEqual(adopted, [])
        self.assertEqual(len(built), 1)
        self.assertFalse([child.name for child in built[0] if child.running])
        self.assertEqual(self.flushLoggedErrors(AssertionError), [])
        # What the failed stop left running.
        await listener_stop()
        await service.generation.stopService()
        service.generation.gateway.site.doStop()
