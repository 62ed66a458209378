"""
A reload that fails before the switch leaves nothing behind (issue 35, point 4): a
failure injected at each step -- loading, checking, building, opening the access log,
making the generation and its OTLP export, the IdP's take-over, starting each child
service, warming up -- or a cancellation or a stop of the daemon during the warm-up,
leaves the old configuration serving (a request over a real socket, its Redis store
answering) and nothing of the new one running: no thread, no open descriptor, no
pending reactor timer, no Redis connection (counted with C{CLIENT LIST} on a real
redis-server) more than before the reload. And the open-file limit follows the
connection cap of each configuration that takes over, never one that was refused.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from twisted.application.service import Service
from twisted.internet import reactor as _reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

import edgegw.reload as reload_module
from edgegw import generation as generation_module
from edgegw.assembly import assemble as assemble_module
from edgegw.config.errors import ConfigError, Problem
from edgegw.config.parse import load_config
from edgegw.generation import (
    AccessLogService,
    TelemetryService,
    UpstreamPoolService,
    open_access_log,
)
from edgegw.identity.provider import IdentityProvider
from edgegw.metrics import serve as serve_module
from edgegw.metrics.otlp import make_metric_exporter
from edgegw.server.gateway_site import DESCRIPTOR_RESERVE
from edgegw.service import GatewayService, build_service
from edgegw.sessions.server import ServerSessions
from edgegw.state.kvstore import KvStoreService
from edgegw.telemetry import Telemetry
from tests.support.backends import SiteBackend, answer
from tests.support.configs import GATEWAY, write_tree
from tests.support.fake_idp import FakeIdP
from tests.support.otlp_metrics import start_http_metrics
from tests.support.processes import port_of
from tests.support.raw_response import parse_response
from tests.support.rawclient import connect
from tests.support.redis import RedisServer, redis_command, redis_server
from tests.support.sessions import KEY, server_session_config

reactor: Any = _reactor

HEALTH = "---\nkind: Route\nmetadata: {name: h}\nspec: {match: /healthz, handler: {type: health}}\n"
MORE = HEALTH.replace("{name: h}", "{name: m}").replace("/healthz", "/more")


class InjectedError(RuntimeError):
    """
    The unexpected failure a test injects (a bug, not a configuration problem).
    """


def telemetry(collector: str) -> str:
    """
    A Telemetry resource with a span export (its batch processor's thread; nothing is
    sampled, so nothing is sent) and an OTLP metrics export to C{collector}.
    """
    return (
        "---\nkind: Telemetry\nmetadata: {name: t}\nspec:\n  service: {name: edge}\n"
        '  otlp: {endpoint: "http://127.0.0.1:9", timeout: 1s}\n'
        "  sampling: {ratio: 0}\n"
        f'  metrics: {{otlp: {{endpoint: "{collector}", interval: 3600s}}}}\n'
    )


@dataclass(frozen=True)
class Footprint:
    """
    What the process holds at one moment: its threads (the reactor's thread pool
    apart: its idle workers are the reactor's, shared by every configuration), its open
    descriptors (what each names), its pending reactor timers (by what they call), and
    the clients connected to the test's redis-server.
    """

    threads: frozenset[str]
    descriptors: Counter[str]
    timers: Counter[str]
    redis_clients: int

    def excess_over(self, before: Footprint) -> dict[str, object]:
        """
        What this footprint holds that C{before} did not (empty when nothing).
        """
        excess: dict[str, object] = {}
        if self.threads - before.threads:
            excess["threads"] = sorted(self.threads - before.threads)
        if self.descriptors - before.descriptors:
            excess["descriptors"] = dict(self.descriptors - before.descriptors)
        if self.timers - before.timers:
            excess["timers"] = dict(self.timers - before.timers)
        if self.redis_clients > before.redis_clients:
            excess["redis clients"] = self.redis_clients - before.redis_clients
        return excess


def _thread_names() -> frozenset[str]:
    return frozenset(
        f"{thread.name}#{thread.ident}"
        for thread in threading.enumerate()
        if not thread.name.startswith("PoolThread-")
    )


def _descriptors() -> Counter[str]:
    named: Counter[str] = Counter()
    directory = "/proc/self/fd"
    for fd in os.listdir(directory):
        try:
            target = os.readlink(os.path.join(directory, fd))
        except OSError:
            continue  # the listing's own descriptor, closed already
        # Sockets and pipes are named by inode: counted by kind.
        named[target.split(":[")[0] if ":[" in target else target] += 1
    return named


def _timer_key(call: Any) -> str:
    func = call.func
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{name}@{id(owner):x}" if owner is not None else name


def _timers() -> Counter[str]:
    return Counter(_timer_key(call) for call in reactor.getDelayedCalls())


async def _settle() -> None:
    # What a stop calls for the next reactor turn (a connection's last callbacks) runs.
    for _ in range(3):
        await deferLater(reactor, 0, lambda: None)


async def footprint(redis: RedisServer) -> Footprint:
    """
    The process's L{Footprint} now.
    """
    await _settle()
    clients = await redis_command(redis.port, "CLIENT", "LIST")
    return Footprint(
        _thread_names(),
        _descriptors(),
        _timers(),
        len([line for line in clients.splitlines() if line.strip()]),
    )


async def get(port: int, path: str) -> int:
    """
    GET C{path} on a new connection to 127.0.0.1:C{port} (closed after it); the status.
    """
    client = await connect(port)
    client.send(f"GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
    await client.closed
    return parse_response(client.received).status


class ReloadFailureTests(TestCase):
    """
    A failure at each step of a reload before the switch, on a gateway with every
    child service: an access-log file, the upstream pool, a Redis state store and
    server-side sessions over it, an IdP, span and OTLP metrics exports.
    """

    async def serving(self) -> tuple[GatewayService, str, RedisServer]:
        """
        Start such a gateway (stopped when the test ends), warm: its IdP discovered,
        its store connected and listening for ended sessions; then write the next
        configuration (another access-log file, one route more) for the reload.
        """
        self.redis = redis = await redis_server(self)
        idp = FakeIdP()
        await idp.start(self)
        backend = SiteBackend(answer(body=b"ok")).start()
        self.addCleanup(backend.stop)
        self.collector, _ = await start_http_metrics(self)
        self.before_start = await footprint(redis)
        self.logs = os.path.abspath(self.mktemp())
        os.makedirs(self.logs)
        self.texts = {
            name: self.configuration(name, idp.issuer, backend.port, extra)
            for name, extra in (("old", ""), ("new", MORE))
        }
        root = write_tree(self.mktemp(), {"a.yaml": self.texts["old"]})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        gateway = service.gateway
        assert gateway.idp is not None and gateway.state is not None
        for _ in range(500):
            clients = await redis_command(redis.port, "CLIENT", "LIST")
            # The store's command and pub/sub connections, and the one asking.
            if gateway.idp.ready and len(clients.splitlines()) == 3:
                break
            await deferLater(reactor, 0.01, lambda: None)
        else:
            self.fail("the gateway did not get warm")
        write_tree(root, {"a.yaml": self.texts["new"]})
        self.root = root
        return service, root, redis

    def configuration(self, name: str, issuer: str, upstream: int, extra: str) -> str:
        """
        The configuration C{name}: its access log in C{name}.log.
        """
        text = server_session_config(
            key=KEY,
            redis_address=self.redis.address,
            issuer=issuer,
            upstream=f"http://127.0.0.1:{upstream}",
            extra_routes=HEALTH + extra + telemetry(self.collector),
        )
        listen = '  listen: "127.0.0.1:0"\n'
        log = os.path.join(self.logs, f"{name}.log")
        return text.replace(listen, listen + f'  accessLog: {{output: "{log}"}}\n', 1)

    async def refused(
        self, service: GatewayService, failure: type[BaseException], step: str
    ) -> None:
        """
        Reload C{service}; check that the reload did not take, that C{failure} was
        logged (an unexpected one as C{reload failed}, a L{ConfigError} as C{reload
        refused}), that nothing of the new configuration keeps running, and that the
        old one serves on.
        """
        old = service.gateway
        old_generation = service.generation
        before = await footprint(self.redis)
        logged: list[str] = []
        observer: Any = lambda event: logged.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        try:
            taken = await service.reload()
        finally:
            globalLogPublisher.removeObserver(observer)
        after = await footprint(self.redis)
        self.assertFalse(taken, step)
        if issubclass(failure, ConfigError):
            self.assertTrue([line for line in logged if "reload refused" in line], step)
        else:
            self.assertEqual(len(self.flushLoggedErrors(failure)), 1, step)
            self.assertTrue([line for line in logged if "reload failed" in line], step)
        self.assertEqual(after.excess_over(before), {}, step)
        new_log = os.path.join(self.logs, "new.log")
        self.assertNotIn(new_log, after.descriptors, step)
        # The old configuration serves on, whole.
        self.assertIs(service.gateway, old, step)
        self.assertEqual(list(service), [service.listener, old_generation], step)
        self.assertTrue(all(child.running for child in old_generation), step)
        assert old.state is not None
        self.assertIsNone(await old.state.get(b"edgegw:test-probe"), step)
        self.assertEqual(await get(port_of(service), "/healthz"), 200, step)
        self.assertEqual(await get(port_of(service), "/more"), 404, step)

    def located(self, service: GatewayService) -> ConfigError:
        """
        A configuration problem, located at the Gateway resource.
        """
        location = service.gateway.config.gateway.location
        return ConfigError([Problem(location, "spec", "an injected problem")])

    async def at_each_failure(
        self,
        step: str,
        inject: Injector,
        config_error: bool = False,
    ) -> None:
        """
        Inject an unexpected failure at C{step} (and, with C{config_error}, a located
        configuration problem), reload, and check what L{refused} does; then, the
        injection gone, the reload takes.
        """
        service, _, _ = await self.serving()
        if config_error:
            with self.injected(service, inject, self.located(service)):
                await self.refused(service, ConfigError, f"{step}: ConfigError")
        with self.injected(service, inject, InjectedError(step)):
            await self.refused(service, InjectedError, f"{step}: unexpected")
        self.assertTrue(await service.reload(), step)
        self.assertEqual(await get(port_of(service), "/more"), 200, step)

    @contextmanager
    def injected(
        self,
        service: GatewayService,
        inject: Injector,
        error: BaseException,
    ) -> Iterator[None]:
        """
        A block in which C{inject} has patched what raises C{error}.
        """
        with _Patches() as patches:
            inject(patches, service, error)
            yield

    # -- before anything is built ----------------------------------------------------

    async def test_load_config(self) -> None:
        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(reload_module, "load_config", _raising(error))

        await self.at_each_failure("load_config", inject, config_error=True)

    async def test_check_restart_fields(self) -> None:
        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(reload_module, "check_restart_fields", _raising(error))

        await self.at_each_failure("check_restart_fields", inject, config_error=True)

    async def test_read_tls(self) -> None:
        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(service.listener, "read_tls", _raising(error))

        await self.at_each_failure("read_tls", inject, config_error=True)

    # -- building --------------------------------------------------------------------

    async def test_build_gateway(self) -> None:
        """
        Its last step fails: its Telemetry (and span export thread) was built.
        """

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(assemble_module, "edge_site", _raising(error))

        await self.at_each_failure("build_gateway", inject, config_error=True)

    async def test_open_access_log(self) -> None:
        """
        A located problem opens nothing; an unexpected failure comes once the file is
        open.
        """

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            if isinstance(error, ConfigError):
                patches.patch(reload_module, "open_access_log", _raising(error))
            else:
                patches.patch(reload_module, "open_access_log", _after(open_access_log, error))

        await self.at_each_failure("open_access_log", inject, config_error=True)

    async def test_the_metrics_export(self) -> None:
        """
        The exporter cannot be made (a located problem); or the generation cannot be
        made once its export was (a child that cannot join it): the exporter made is
        shut down.
        """
        made: list[Any] = []
        making = make_metric_exporter

        def recording(*args: Any) -> Any:
            exporter = making(*args)
            made.append(exporter)
            return exporter

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            made.clear()
            if isinstance(error, ConfigError):
                patches.patch(serve_module, "make_metric_exporter", _raising(RuntimeError("no")))
                return
            patches.patch(serve_module, "make_metric_exporter", recording)
            children = generation_module._children_of

            class Unparentable(Service):
                def setServiceParent(self, parent: Any) -> None:
                    raise error

            def with_unparentable(gateway: Any) -> list[Any]:
                return [*children(gateway), Unparentable()]

            patches.patch(generation_module, "_children_of", with_unparentable)

        await self.at_each_failure("generation_of", inject, config_error=True)
        # Made by the unexpected failure's reload, the last one injected.
        [exporter] = made
        self.assertTrue(getattr(exporter, "_shutdown", False), "the exporter is shut down")

    async def test_idp_take_over(self) -> None:
        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(IdentityProvider, "take_over", _raising(error))

        await self.at_each_failure("IdP take_over", inject)

    # -- starting the children ---------------------------------------------------------

    async def test_privileged_start(self) -> None:
        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(TelemetryService, "privilegedStartService", _raising(error))

        await self.at_each_failure("privilegedStartService", inject)

    async def starts(self, child: type[Service]) -> None:
        """
        C{child}'s C{startService} fails, before it starts anything, then once it has
        started: the children started before it (and it) stop, in reverse order.
        """
        for when in ("before", "after"):
            await self.at_each_failure(
                f"{child.__name__}.startService {when}", _failing_start(child, when)
            )

    async def test_access_log_start(self) -> None:
        await self.starts(AccessLogService)

    async def test_upstream_pool_start(self) -> None:
        await self.starts(UpstreamPoolService)

    async def test_state_store_start(self) -> None:
        await self.starts(KvStoreService)

    async def test_sessions_start(self) -> None:
        await self.starts(ServerSessions)

    async def test_idp_start(self) -> None:
        await self.starts(IdentityProvider)

    async def test_telemetry_start(self) -> None:
        await self.starts(TelemetryService)

    async def test_a_stop_that_fails_stops_the_others(self) -> None:
        """
        The last child fails to start, and then one of the started children fails to
        stop: the children before it stop all the same (the state store's Redis
        connections are closed).
        """

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(TelemetryService, "startService", _raising(error))
            stopping = IdentityProvider.stopService

            def failing_stop(provider: IdentityProvider) -> None:
                stopping(provider)
                raise InjectedError("cannot stop")

            patches.patch(IdentityProvider, "stopService", failing_stop)

        service, _, _ = await self.serving()
        with self.injected(service, inject, InjectedError("start")):
            before = await footprint(self.redis)
            self.assertFalse(await service.reload())
            after = await footprint(self.redis)
        self.assertEqual(len(self.flushLoggedErrors(InjectedError)), 2)
        self.assertEqual(after.excess_over(before), {})
        self.assertEqual(await get(port_of(service), "/healthz"), 200)

    async def test_the_reload_ends_once_what_started_has_stopped(self) -> None:
        """
        The reload's answer (and so a stop of the daemon, which waits for it) comes
        once the children that started have stopped: nothing of the new configuration
        is left to stop behind it.
        """
        service, _, redis = await self.serving()
        stopped: list[Deferred[None]] = []

        def slow_stop(pool: UpstreamPoolService) -> Deferred[None]:
            Service.stopService(pool)
            closing = pool.client.close()
            waited: Deferred[None] = Deferred()
            stopped.append(waited)
            return waited.addCallback(lambda _: closing)

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(TelemetryService, "startService", _raising(error))
            patches.patch(UpstreamPoolService, "stopService", slow_stop)

        before = await footprint(redis)
        with self.injected(service, inject, InjectedError("start")):
            reloading = service.reload()
            await _settle()
            self.assertEqual(len(stopped), 1)
            self.assertFalse(reloading.called)
            stopped[0].callback(None)
            self.assertFalse(await reloading)
        self.assertEqual(len(self.flushLoggedErrors(InjectedError)), 1)
        self.assertEqual((await footprint(redis)).excess_over(before), {})

    async def test_a_discard_that_fails_lets_go_of_the_rest(self) -> None:
        """
        Letting go of the span export fails: the access-log file is closed all the
        same, and the refusal is reported as the configuration problem it is.
        """

        kept: list[Telemetry] = []

        def failing(telemetry: Telemetry) -> None:
            kept.append(telemetry)
            raise InjectedError("discard")

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(reload_module, "open_access_log", _after(open_access_log, error))
            patches.patch(Telemetry, "discard", failing)

        service, _, _ = await self.serving()
        with self.injected(service, inject, self.located(service)):
            before = await footprint(self.redis)
            self.assertFalse(await service.reload())
            after = await footprint(self.redis)
        self.assertEqual(len(self.flushLoggedErrors(InjectedError)), 1)
        self.assertNotIn(os.path.join(self.logs, "new.log"), after.descriptors)
        # The span export's thread is what was not let go of.
        self.assertEqual(list(after.excess_over(before)), ["threads"])
        [telemetry] = kept
        telemetry.discard()
        self.assertEqual((await footprint(self.redis)).excess_over(before), {})

    # -- warming up --------------------------------------------------------------------

    async def test_warm_up_fails(self) -> None:
        async def failing(*args: object) -> list[str]:
            await deferLater(reactor, 0, lambda: None)
            raise InjectedError("warm-up")

        def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
            patches.patch(reload_module, "cold_parts", failing)

        await self.at_each_failure("cold_parts", inject)

    def forever_cold(self) -> None:
        """
        The new configuration never gets warm (the warm-up waits out its bound).
        """

        async def cold(*args: object) -> list[str]:
            return ["forced"]

        self.patch(reload_module, "cold_parts", cold)

    async def test_warm_up_cancelled(self) -> None:
        service, _, redis = await self.serving()
        service.warm_up_timeout = 60.0
        self.forever_cold()
        before = await footprint(redis)
        reloading = service.reload()
        await deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(reloading.called)
        reloading.cancel()
        self.assertFalse(await reloading)
        self.assertEqual(len(self.flushLoggedErrors(CancelledError)), 1)
        after = await footprint(redis)
        self.assertEqual(after.excess_over(before), {})
        self.assertEqual(await get(port_of(service), "/healthz"), 200)

    async def test_stop_during_the_warm_up(self) -> None:
        """
        The daemon stops while a reload warms up: once the stop is done, nothing of
        either configuration runs (as before the gateway started).
        """
        service, _, redis = await self.serving()
        service.warm_up_timeout = 60.0
        self.forever_cold()
        reloading = service.reload()
        await deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(reloading.called)
        await service.stopService()
        self.assertFalse(await reloading)
        after = await footprint(redis)
        self.assertEqual(after.excess_over(self.before_start), {})


class DescriptorLimitTests(TestCase):
    async def test_follows_each_switch_never_a_refused_reload(self) -> None:
        """
        The open-file limit is raised for the connection cap of each configuration
        that takes over, at its switch, and left alone by one that is refused, however
        late (its services started, or its warm-up failed).
        """
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))

        def needed(connections: int) -> int:
            return 2 * connections + DESCRIPTOR_RESERVE

        if hard != resource.RLIM_INFINITY and hard < needed(4000):
            self.fail(f"the hard open-file limit {hard} is below {needed(4000)}: raise it to test")

        def text(connections: int) -> dict[str, str]:
            return {"a.yaml": GATEWAY + f"  limits: {{maxConnections: {connections}}}\n" + HEALTH}

        root = write_tree(self.mktemp(), text(100))
        service = build_service(load_config(root, {}), reactor, source=root)
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed(100), hard))
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual(resource.getrlimit(resource.RLIMIT_NOFILE)[0], needed(100))
        write_tree(root, text(3000))

        async def refused(patches: dict[str, Any]) -> None:
            with _Patches() as patching:
                for name, value in patches.items():
                    owner, attribute = name.rsplit(".", 1)
                    patching.patch(_OWNERS[owner], attribute, value)
                self.assertFalse(await service.reload())
            self.assertEqual(len(self.flushLoggedErrors(InjectedError)), 1)
            self.assertEqual(resource.getrlimit(resource.RLIMIT_NOFILE)[0], needed(100))

        await refused({"UpstreamPoolService.startService": _raising(InjectedError("start"))})

        async def failing(*args: object) -> list[str]:
            raise InjectedError("warm-up")

        await refused({"reload.cold_parts": failing})
        self.assertTrue(await service.reload())
        self.assertEqual(resource.getrlimit(resource.RLIMIT_NOFILE)[0], needed(3000))
        write_tree(root, text(4000))
        self.assertTrue(await service.reload())
        self.assertEqual(resource.getrlimit(resource.RLIMIT_NOFILE)[0], needed(4000))


Injector = Callable[["_Patches", GatewayService, BaseException], None]
"""Patches, with the L{_Patches} given, what raises the error given on a reload."""

_OWNERS: dict[str, Any] = {"UpstreamPoolService": UpstreamPoolService, "reload": reload_module}


class _Patches:
    """
    Patches undone when the block ends (rather than when the test does).
    """

    def __init__(self) -> None:
        self.undo: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, value: Any) -> None:
        """
        Set C{owner.name} to C{value} until the block ends.
        """
        had = name in vars(owner)
        old = getattr(owner, name, None)
        setattr(owner, name, value)

        def undo() -> None:
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)

        self.undo.append(undo)

    def __enter__(self) -> _Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self.undo):
            undo()


def _failing_start(child: type[Service], when: str) -> Injector:
    """
    Make C{child}'s C{startService} raise: C{before} it starts anything, or C{after}.
    """

    def inject(patches: _Patches, service: GatewayService, error: BaseException) -> None:
        starting = child.startService
        failing = _raising(error) if when == "before" else _after(starting, error)
        patches.patch(child, "startService", failing)

    return inject


def _raising(error: BaseException) -> Callable[..., Any]:
    def raising(*args: object, **kwargs: object) -> Any:
        raise error

    return raising


def _after(real: Callable[..., Any], error: BaseException) -> Callable[..., Any]:
    def after(*args: object, **kwargs: object) -> Any:
        real(*args, **kwargs)
        raise error

    return after
