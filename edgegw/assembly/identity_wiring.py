"""
Identity, wired for one gateway: the IdP client, the session cookie and the server-side
sessions over the state store, Bearer and assertion verification, the browser-login
endpoints mounted beside the routes, and the state store itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime

from edgegw.assembly.observers import observe_idp
from edgegw.auth.backchannel import BackchannelLogoutResource
from edgegw.auth.callback import CallbackResource
from edgegw.auth.context import BrowserLogin
from edgegw.auth.endpoint import AuthEndpoint
from edgegw.auth.login import LoginResource
from edgegw.auth.logout import LogoutResource
from edgegw.auth.session_view import SessionViewResource
from edgegw.chain.access_log import AccessLog
from edgegw.chain.pipeline import InFlight, IRouteTarget
from edgegw.chain.resource_target import ResourceTarget
from edgegw.config.effective import EffectiveRoute
from edgegw.config.errors import Location, Problems
from edgegw.config.model import Config
from edgegw.identity.assertion import AssertionUnavailableError, AssertionVerifier, ClaimOnce
from edgegw.identity.bearer import BearerVerifier
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.login_state import LoginStates
from edgegw.identity.provider import CALL_TIMEOUT, IdentityProvider
from edgegw.identity.session_cookie import SessionCookie
from edgegw.metrics.gateway_metrics import NO_METRICS, IMetrics
from edgegw.sessions.server import ServerSessions
from edgegw.state.providers import UnknownProviderError, find_provider
from edgegw.state.store import IStateStore, StoreError
from edgegw.telemetry import Telemetry
from edgegw.upstream.agent import UpstreamAgent
from edgegw.upstream.pool import UpstreamClient


@attrs.frozen
class IdentityStages:
    """
    What identity adds to the per-route chains (rule 4: nothing when neither a session
    block nor an IdP is configured).

    @ivar session: The session cookie, when a session block is configured.
    @ivar seconds: The reactor's clock.
    @ivar trusted_origins: C{security.csrf.trustedOrigins}.
    @ivar login_path: Where app routes send anonymous navigations, when login is mounted.
    @ivar bearer: Verifies Bearer tokens on service routes, when an IdP is configured.
    @ivar assertions: Verifies inbound identity assertions on service routes, with
        C{identity.assertion.accept}: their token ids recorded in the state store with
        a C{stateProvider}, else per process.
    @ivar server: The server-side sessions, with a C{stateProvider}.
    """

    session: SessionCookie | None
    seconds: Callable[[], float]
    trusted_origins: tuple[str, ...]
    login_path: str | None
    bearer: BearerVerifier | None = None
    assertions: AssertionVerifier | None = None
    server: ServerSessions | None = None


def wire_identity(
    config: Config,
    routes: Sequence[EffectiveRoute],
    client: UpstreamClient,
    reactor: IReactorTime,
    telemetry: Telemetry | None,
    store: IStateStore | None = None,
    metrics: IMetrics = NO_METRICS,
) -> tuple[IdentityProvider | None, BrowserLogin | None, IdentityStages | None]:
    """
    The IdP client (with any IdP), the browser login (session and IdP both configured)
    and the identity stages.
    """
    gateway = config.gateway
    session = gateway.session
    idp = config.idp
    assertion = gateway.identity.assertion
    accept = assertion.accept if assertion is not None else None
    if session is None and idp is None and accept is None:
        return None, None, None
    cookie = None
    login = None
    provider = None
    bearer = None
    groups = GroupRenderer(gateway.identity.groups)
    if idp is not None:
        agent = UpstreamAgent(
            client,
            reactor,
            timeout=CALL_TIMEOUT,
            tracer=telemetry.tracer if telemetry is not None else None,
            metrics=metrics,
        )
        provider = IdentityProvider(idp, agent, reactor, metrics=metrics)
        observe_idp(metrics, provider)
        bearer = BearerVerifier(
            provider,
            gateway.identity,
            groups,
            reactor,
            keep_token=any(_forwards_access_token(route) for route in routes),
        )
    server = None
    shared = _claim_once(store) if store is not None and gateway.state_provider else None
    if session is not None:
        cookie = SessionCookie(session, reactor)
        ref = gateway.state_provider
        if store is not None and ref is not None:
            server = ServerSessions(
                store, cookie, ref.key_prefix, ref.refresh_skew, provider, reactor, metrics
            )
        if provider is not None and idp is not None and not idp.verification_only:
            login = BrowserLogin(
                provider=provider,
                sessions=cookie,
                logins=LoginStates(
                    cookie.sealer, session.cookie_name, reactor, session.host_prefix
                ),
                identity=gateway.identity,
                groups=groups,
                callback_path=idp.callback_path,
                redirect_url=idp.redirect_url,
                keep_access_token=any(_forwards_access_token(route) for route in routes),
                reactor=reactor,
                server=server,
                metrics=metrics,
            )
    return (
        provider,
        login,
        IdentityStages(
            session=cookie,
            seconds=reactor.seconds,
            trusted_origins=gateway.security.csrf.trusted_origins,
            login_path=gateway.auth.login_path if login is not None else None,
            bearer=bearer,
            assertions=(
                AssertionVerifier(accept, reactor, shared=shared) if accept is not None else None
            ),
            server=server,
        ),
    )


def _claim_once(store: IStateStore) -> ClaimOnce:
    """
    The assertions' replay record in C{store}: one C{SET NX PX} per accepted assertion
    (L{IStateStore.acquire}, a lock never released), so that the first use at any
    instance sharing the store wins, and a store that cannot tell fails closed.
    """

    async def claim(key: bytes, ttl: float) -> bool:
        try:
            first: bool = await store.acquire(key, b"1", ttl)
        except StoreError as e:
            raise AssertionUnavailableError(
                f"replay record unavailable (state store: {e or type(e).__name__})"
            ) from None
        return first

    return claim


def _forwards_access_token(effective: EffectiveRoute) -> bool:
    handler = effective.spec.handler
    if getattr(handler, "forward_access_token", False):
        return True
    return any(backend.forward_access_token for backend in getattr(handler, "backends", ()))


def mount_login(
    reserved: dict[str, IRouteTarget],
    config: Config,
    login: BrowserLogin,
    access: AccessLog,
    inflight: InFlight,
) -> tuple[tuple[str, str], ...]:
    """
    Mount the login, callback, logout and session-view endpoints (and, with a state
    provider, the back-channel logout): answered for their exact paths before the mux
    routes anything (routes that could never be reached
    because of them were reported at load).

    @return: The endpoints as (method, path) pairs.
    """
    gateway = config.gateway
    session = gateway.session
    assert session is not None
    mounted: tuple[tuple[str, AuthEndpoint], ...] = (
        (gateway.auth.login_path, LoginResource(login)),
        (login.callback_path, CallbackResource(login)),
        (
            gateway.auth.logout_path,
            LogoutResource(login, session.post_logout_redirect, gateway.auth),
        ),
        (session.info_path, SessionViewResource(login)),
    )
    if login.server is not None:
        mounted += (
            (
                gateway.auth.backchannel_logout_path,
                BackchannelLogoutResource(login.provider, login.server),
            ),
        )
    for path, resource in mounted:
        reserved[path] = ResourceTarget(path, resource, access, inflight)
    return tuple((resource.method.decode("ascii"), path) for path, resource in mounted)


def state_store(
    config: Config, reactor: IReactorTime, options: Mapping[str, Any]
) -> IStateStore | None:
    """
    The Gateway's state store, not started, when it has a C{stateProvider} (for the
    server-side sessions with a session block, the assertions' replay record with
    C{identity.assertion.accept}, and the plugins' state).
    """
    ref = config.gateway.state_provider
    if ref is None:
        return None
    return find_provider(ref.type).build(ref.config, ref.key_prefix, reactor, **options)


def check_state_providers(config: Config, problems: Problems) -> None:
    """
    Every state provider type named (the Gateway's C{stateProvider}, each StateProvider
    resource) must be installed (package entry points, group C{edgegw.state_providers}),
    and its C{config} must be what that provider accepts.
    """
    gateway = config.gateway
    named: list[tuple[Location | None, str, str, Mapping[str, Any]]] = []
    state = gateway.state_provider
    if state is not None and state.type:
        named.append((gateway.location, "spec.stateProvider", state.type, state.config))
    for resource in config.state_providers.values():
        named.append((resource.location, "spec", resource.type, resource.config))
    for where, path, type_, provider_config in named:
        try:
            factory = find_provider(type_)
        except UnknownProviderError as e:
            problems.add(where, f"{path}.type", str(e))
            continue
        if where is not None:
            for problem in factory.validate(provider_config, where, f"{path}.config"):
                problems.add(problem.location, problem.field, problem.message)
