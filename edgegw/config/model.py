"""
The frozen, typed configuration: one class per resource kind and per nested block.

Every field of the reference is here with its default, so that no later code ever reads
raw YAML. Objects are built by L{edgegw.config.parse} and never change after loading.
Durations are seconds as C{float}; C{None} means "not configured".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from edgegw.config.errors import Location

RouteType = Literal["app", "service"]
AuthMode = Literal["required", "public"]

DEFAULT_LISTEN = ":8080"
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_WARMUP_TIMEOUT = 10.0


# -- Gateway -------------------------------------------------------------------------------


@attrs.frozen
class CsrfSpec:
    """C{Gateway.spec.security.csrf}."""

    enabled: bool = True
    trusted_origins: tuple[str, ...] = ()
    bypass_patterns: tuple[str, ...] = ()


@attrs.frozen
class HstsSpec:
    """C{Gateway.spec.security.headers.hsts}."""

    enabled: bool = True
    max_age: int = 31536000
    include_subdomains: bool = True
    preload: bool = False


@attrs.frozen
class SecurityHeadersSpec:
    """C{Gateway.spec.security.headers}; an empty string omits that header."""

    frame_options: str = "DENY"
    content_type_options: str = "nosniff"
    referrer_policy: str = "strict-origin-when-cross-origin"
    hsts: HstsSpec = HstsSpec()
    content_security_policy: str | None = None


@attrs.frozen
class SecuritySpec:
    """C{Gateway.spec.security}."""

    csrf: CsrfSpec = CsrfSpec()
    headers: SecurityHeadersSpec = SecurityHeadersSpec()
    encoded_slashes: Literal["reject", "decode", "keep"] = "reject"


@attrs.frozen
class SessionSpec:
    """C{Gateway.spec.session}: the encrypted session cookie."""

    key: bytes = attrs.field(repr=False)
    cookie_name: str = "gw_session"
    ttl: float = 8 * 3600.0
    fingerprint_headers: tuple[str, ...] = ("User-Agent",)
    info_path: str = "/auth/session"
    post_logout_redirect: str = "/"
    host_prefix: bool = True


@attrs.frozen
class GroupsSpec:
    """C{Gateway.spec.identity.groups}."""

    source: str | None = None
    match: tuple[str, ...] = ()
    render: Literal["cn", "dn"] = "cn"
    as_: str = "groups"
    strip: tuple[str, ...] = ()


@attrs.frozen
class AssertionIssueSpec:
    """C{identity.assertion.issue}: minting identity assertions for peers."""

    name: str
    key_id: str
    seed: bytes = attrs.field(repr=False)
    ttl: float = 60.0
    header: str = "X-Gw-Identity"
    audience: str | None = None


@attrs.frozen
class AssertionKeySpec:
    """One entry of C{identity.assertion.accept.keys}."""

    key_id: str
    public_key: bytes


@attrs.frozen
class AssertionAcceptSpec:
    """C{identity.assertion.accept}: verifying identity assertions from peers."""

    issuer: str
    keys: tuple[AssertionKeySpec, ...]
    header: str = "X-Gw-Identity"
    require_bearer: bool = True
    audience: str | None = None


@attrs.frozen
class AssertionSpec:
    """C{identity.assertion}; either side may be absent."""

    issue: AssertionIssueSpec | None = None
    accept: AssertionAcceptSpec | None = None


@attrs.frozen
class IdentitySpec:
    """C{Gateway.spec.identity}."""

    claims: tuple[str, ...] = ("email", "name", "given_name", "family_name")
    groups: GroupsSpec = GroupsSpec()
    user_info: Literal["auto", "always", "never"] = "auto"
    subject_claim: str = "sub"
    assertion: AssertionSpec | None = None


@attrs.frozen
class AuthSpec:
    """C{Gateway.spec.auth}: the browser login endpoints."""

    login_path: str = "/auth/login"
    logout_path: str = "/auth/logout"
    backchannel_logout_path: str = "/auth/backchannel-logout"
    post_logout_redirect_url: str | None = None
    """
    C{postLogoutRedirectURL}: the C{post_logout_redirect_uri} of a logout at the IdP;
    L{None}: the gateway's own C{logoutPath}, which checks the returned C{state}.
    """


@attrs.frozen
class KvStoreConfig:
    """
    C{stateProvider.config} for the C{kvstore} (Redis) provider.

    @ivar address: The one Redis (host:port); empty with C{sentinels}.
    @ivar sentinels: The Sentinels (host:port each) asked for the address of the master
        named C{master_name}, instead of one C{address}.
    """

    address: str = ""
    user: str = "default"
    password: str | None = attrs.field(default=None, repr=False)
    db: int = 0
    tls: bool = False
    timeout: float = 3.0
    ca_file: str | None = None
    sentinels: tuple[str, ...] = ()
    master_name: str = ""
    sentinel_user: str | None = None
    sentinel_password: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class StateProviderRef:
    """C{Gateway.spec.stateProvider}: opt-in server-side session state."""

    type: str
    refresh_skew: float = 60.0
    key_prefix: str = "gw:sess:"
    config: Mapping[str, Any] = attrs.field(factory=dict)
    kvstore: KvStoreConfig | None = None


@attrs.frozen
class AccessLogSpec:
    """
    C{Gateway.spec.accessLog}: where access-log lines go.

    @ivar output: C{"log"} (the twistd log, through twisted.logger), C{"-"} (standard
        output, plain JSON lines) or an absolute file path (JSON lines, appended).
    """

    output: str = "log"


@attrs.frozen
class LimitsSpec:
    """
    C{Gateway.spec.limits}: how long the gateway waits for slow clients, and how many
    connections it keeps open.

    @ivar header_timeout: Seconds from the first byte of a request head to its end.
    @ivar body_timeout: Seconds a request body may go without a byte while it is read.
    @ivar send_timeout: Seconds a client may leave the gateway unable to write to it
        (its receive window full) before the connection is dropped.
    @ivar max_connections: The most open client connections (0: no cap).
    @ivar max_connections_per_address: The most open client connections from one
        address, trusted proxies exempt (0: no cap).
    @ivar max_connections_per_upstream: The most connections to one upstream (0: no
        bound); requests beyond it wait for one.
    @ivar upstream_queue_timeout: The longest such wait when the route has no timeout
        (api calls included); then 503.
    @ivar max_streams_per_connection: The most concurrent streams on one HTTP/2
        connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    """

    header_timeout: float = 60.0
    body_timeout: float = 60.0
    send_timeout: float = 60.0
    max_connections: int = 8192
    max_connections_per_address: int = 512
    max_connections_per_upstream: int = 1024
    upstream_queue_timeout: float = 60.0
    max_streams_per_connection: int = 100


@attrs.frozen
class CertificateSpec:
    """
    One entry of C{Gateway.spec.tls.certificates}, read and checked at load.

    @ivar cert_file: The PEM file of the certificate and its chain (leaf first), its
        path resolved against the directory of the YAML file.
    @ivar key_file: The PEM file of its private key (unencrypted), resolved likewise.
    @ivar names: The host names it serves (its DNS subjectAltNames, else a common name
        that is a host name), lowercase; C{*.example.com} for a wildcard.
    @ivar chain_pem: The certificates as read (what is served: the files are not read
        again until a reload).
    @ivar key_pem: The private key as read.
    """

    cert_file: str
    key_file: str
    names: tuple[str, ...] = ()
    chain_pem: bytes = attrs.field(default=b"", repr=False)
    key_pem: bytes = attrs.field(default=b"", repr=False)


@attrs.frozen
class TlsSpec:
    """
    C{Gateway.spec.tls}: TLS on the gateway's listener.

    @ivar certificates: At least one; chosen by SNI, the first for clients without SNI
        or with a name no certificate has.
    @ivar min_version: C{"1.2"} or C{"1.3"}.
    @ivar http2: Whether ALPN offers C{h2} (then C{http/1.1}).
    """

    certificates: tuple[CertificateSpec, ...]
    min_version: str = "1.2"
    http2: bool = True


@attrs.frozen
class RedirectHttpSpec:
    """
    C{Gateway.spec.redirectHTTP}: a plain-HTTP listener that sends every request to the
    TLS listener (308), serving only ACME HTTP-01 challenges.

    @ivar listen: Its listen address (the forms of C{listen}, not C{ssl:}).
    @ivar acme_webroot: The directory whose C{.well-known/acme-challenge/} files are
        served (certbot's C{--webroot -w}), resolved against the YAML file; L{None}: none.
    @ivar https_port: The port the redirects name; L{None}: the TLS listener's own.
    """

    listen: str
    acme_webroot: str | None = None
    https_port: int | None = None


@attrs.frozen
class ReloadSpec:
    """
    C{Gateway.spec.reload} (an edgegw addition): how a reload (SIGHUP) takes over.

    @ivar warmup_timeout: The most seconds a reloaded configuration whose IdP or state
        store it could not carry over waits to be warm (discovery and keys loaded,
        store answering) before it serves anyway; the new configuration's value bounds
        its own warm-up.
    """

    warmup_timeout: float = DEFAULT_WARMUP_TIMEOUT


@attrs.frozen
class CompressionSpec:
    """
    C{Gateway.spec.compression}: responses compressed on the fly.

    @ivar enabled: Whether any route compresses.
    @ivar encodings: The codings used, the gateway's preferred first (C{zstd}, C{br},
        C{gzip}).
    @ivar min_size: A body of known length under this many bytes goes as it is.
    @ivar types: The media types compressed (C{text/*}: every C{text/} type),
        lowercase.
    @ivar static_cache_size: The bytes of static files' compressed bodies kept per
        process (0: none; each is compressed per request).
    """

    enabled: bool = True
    encodings: tuple[str, ...] = ("zstd", "br", "gzip")
    min_size: int = 1024
    types: tuple[str, ...] = (
        "text/*",
        "application/json",
        "application/javascript",
        "application/xml",
        "application/manifest+json",
        "image/svg+xml",
        "application/wasm",
    )
    static_cache_size: int = 32 * 1024 * 1024


@attrs.frozen
class GatewaySpec:
    """The one C{Gateway} resource."""

    listen: str = DEFAULT_LISTEN
    trusted_proxies: tuple[str, ...] = ()
    security: SecuritySpec = SecuritySpec()
    plugins: tuple[str, ...] = ()
    session: SessionSpec | None = None
    identity: IdentitySpec = IdentitySpec()
    auth: AuthSpec = AuthSpec()
    state_provider: StateProviderRef | None = None
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    access_log: AccessLogSpec = AccessLogSpec()
    limits: LimitsSpec = LimitsSpec()
    readiness_path: str | None = None
    tls: TlsSpec | None = None
    redirect_http: RedirectHttpSpec | None = None
    compression: CompressionSpec = CompressionSpec()
    reload: ReloadSpec = ReloadSpec()
    location: Location | None = attrs.field(default=None, eq=False, repr=False)


# -- IdP and Telemetry ---------------------------------------------------------------------


@attrs.frozen
class BearerSpec:
    """C{IdP.spec.bearer}: how access tokens are verified."""

    jwks_url: str | None = None
    audience_claim: str = "aud"
    audience: str | None = None
    signing_algs: tuple[str, ...] | None = None
    cache_ttl: float = 300.0


@attrs.frozen
class IdpSpec:
    """The optional C{IdP} resource (an OIDC provider)."""

    name: str
    issuer: str
    client_id: str
    type: Literal["oidc"] = "oidc"
    verification_only: bool = False
    client_secret: str | None = attrs.field(default=None, repr=False)
    redirect_url: str | None = None
    scopes: tuple[str, ...] = ("openid", "profile", "email")
    resource: str | None = None
    bearer: BearerSpec = BearerSpec()
    location: Location | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def callback_path(self) -> str:
        """
        The callback route: the path of C{redirectURL}, else C{/auth/callback}.
        """
        from urllib.parse import urlsplit

        if self.redirect_url:
            try:
                path = urlsplit(self.redirect_url).path
            except ValueError:
                path = ""
            if path.startswith("/"):
                return path
        return "/auth/callback"


AccessLogLevel = Literal["debug", "info", "warn", "error"]


@attrs.frozen
class MetricsSpec:
    """
    C{Telemetry.metrics}: where the gateway's metrics go.

    @ivar prometheus_listen: C{prometheus.listen}: a listen address of its own serving
        the Prometheus text format (L{None}: no scrape listener).
    @ivar prometheus_path: C{prometheus.path}: the scrape path on it.
    @ivar otlp_endpoint: The collector the metrics are exported to over OTLP
        (C{otlp.endpoint}, else the Telemetry's own; L{None}: no export).
    @ivar otlp_interval: C{otlp.interval}: time between two exports.
    @ivar cardinality_limit: C{cardinalityLimit}: series per metric before further
        ones fold into one overflow series.
    """

    prometheus_listen: str | None = None
    prometheus_path: str = "/metrics"
    otlp_endpoint: str | None = None
    otlp_interval: float = 60.0
    cardinality_limit: int = 2000


@attrs.frozen
class TelemetrySpec:
    """
    The optional C{Telemetry} resource.

    @ivar service_name: C{service.name} (required).
    @ivar service_version: C{service.version}, a resource attribute.
    @ivar resource_attributes: C{resource.attributes}: more resource attributes
        (C{deployment.environment.name: prod}).
    @ivar otlp_endpoint: C{otlp.endpoint}: the collector; no export without it.
    @ivar otlp_protocol: C{otlp.protocol}: C{http/protobuf} or C{grpc}.
    @ivar otlp_headers: C{otlp.headers}: sent with every export (an API key).
    @ivar otlp_timeout: C{otlp.timeout}: per export.
    @ivar sampling_ratio: C{sampling.ratio}: share of new traces recorded (0 to 1);
        a sampled or unsampled parent from C{traceparent} is followed.
    @ivar access_log_level: C{accessLog.level}.
    @ivar access_log_headers: C{accessLog.requestHeaders}: request headers added to
        each access-log line (under C{request_headers}).
    @ivar access_log_fields: C{accessLog.fields}: constant fields added to every line.
    @ivar metrics: C{metrics}: L{None} without the block (no metrics at all).
    """

    service_name: str
    service_version: str | None = None
    resource_attributes: Mapping[str, str] = attrs.field(factory=dict)
    otlp_endpoint: str | None = None
    otlp_protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    otlp_headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    otlp_timeout: float = 10.0
    sampling_ratio: float = 1.0
    access_log_level: AccessLogLevel = "info"
    access_log_headers: tuple[str, ...] = ()
    access_log_fields: Mapping[str, str] = attrs.field(factory=dict)
    metrics: MetricsSpec | None = None
    location: Location | None = attrs.field(default=None, eq=False, repr=False)


# -- Routes, groups, policies --------------------------------------------------------------


@attrs.frozen
class ProjectionSpec:
    """C{access.projection}."""

    claims: Mapping[str, str] | None = None
    groups_header: str | None = None


@attrs.frozen
class AccessSpec:
    """
    An access block (Route or RouteGroup). C{None} means "not set here", so that merging
    can tell an explicit value from a default.
    """

    auth: AuthMode | None = None
    authorize: tuple[str, ...] = ()
    projection: ProjectionSpec = ProjectionSpec()
    on_deny_redirect: str | None = None


@attrs.frozen
class LabelExpression:
    """One C{selector.matchExpressions} item."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """
        Whether a resource with C{labels} satisfies this expression.
        """
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@attrs.frozen
class Selector:
    """A label selector; the empty selector matches every route."""

    match_labels: Mapping[str, str] = attrs.field(factory=dict)
    match_expressions: tuple[LabelExpression, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """
        Whether a resource with C{labels} is selected.
        """
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(expression.matches(labels) for expression in self.match_expressions)


@attrs.frozen
class RouteGroupSpec:
    """A C{RouteGroup} resource."""

    name: str
    location: Location
    order: int
    type: RouteType | None = None
    selector: Selector = Selector()
    access: AccessSpec = AccessSpec()


@attrs.frozen
class RequireSpec:
    """C{Policy.spec.require}: the built-in rule."""

    groups: tuple[str, ...] = ()
    claims: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)


@attrs.frozen
class RegoSpec:
    """C{Policy.spec.rego}; C{path} is already resolved against the config location."""

    path: str


@attrs.frozen
class PolicySpec:
    """A C{Policy} resource."""

    name: str
    location: Location
    require: RequireSpec | None = None
    rego: RegoSpec | None = None


@attrs.frozen
class PluginSpec:
    """A C{RequestPlugin} or C{ResponsePlugin} resource."""

    name: str
    kind: Literal["RequestPlugin", "ResponsePlugin"]
    location: Location
    order: int
    plugin: str
    selector: Selector = Selector()
    config: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class StateProviderSpec:
    """A C{StateProvider} resource: declares a provider type and its default config."""

    name: str
    location: Location
    type: str
    config: Mapping[str, Any] = attrs.field(factory=dict)


# -- Handlers ------------------------------------------------------------------------------


DEFAULT_PRECOMPRESSED: Final = ("br", "zstd", "gzip")
"""The default of a static handler's C{precompressed}."""


@attrs.frozen
class StaticHandlerSpec:
    """C{handler.type: static}; C{dir} is absolute (resolved against the config file)."""

    dir: str
    index: str = "index.html"
    spa_fallback: bool = True
    strip_prefix: str | None = None
    cache_control: str | None = None
    precompressed: tuple[str, ...] = DEFAULT_PRECOMPRESSED
    compress: bool = True

    type = "static"


@attrs.frozen
class ProxyHandlerSpec:
    """C{handler.type: reverse-proxy}."""

    upstream: str
    strip_prefix: str | None = None
    preserve_host: bool = False
    forward_access_token: bool = False
    forward_cookies: bool = False
    forward_identity: bool = False
    timeout: float | None = None
    insecure_skip_verify: bool = False
    compress: bool = True

    type = "reverse-proxy"


@attrs.frozen
class ApiBackendSpec:
    """One C{api} backend."""

    group: str
    upstream: str
    path: str
    method: str = "GET"
    required: bool = True
    forward_query: bool = False
    forward_access_token: bool = False
    forward_identity: bool = False


@attrs.frozen
class ApiHandlerSpec:
    """C{handler.type: api}: concurrent fan-out with merged JSON."""

    backends: tuple[ApiBackendSpec, ...]
    timeout: float | None = None
    compress: bool = True

    type = "api"


@attrs.frozen
class HealthHandlerSpec:
    """C{handler.type: health}."""

    compress: bool = True

    type = "health"


HandlerSpec = StaticHandlerSpec | ProxyHandlerSpec | ApiHandlerSpec | HealthHandlerSpec


@attrs.frozen
class RouteSpec:
    """A C{Route} resource, as written (before groups are merged in)."""

    name: str
    location: Location
    order: int
    match: str
    handler: HandlerSpec
    labels: Mapping[str, str] = attrs.field(factory=dict)
    type: RouteType | None = None
    access: AccessSpec = AccessSpec()


# -- The whole configuration ---------------------------------------------------------------


@attrs.frozen
class Config:
    """
    Everything loaded from C{--config}, validated.

    @ivar source: The file or directory it was loaded from.
    @ivar files: The YAML files read, in document order.
    """

    source: str
    files: tuple[str, ...]
    gateway: GatewaySpec
    routes: tuple[RouteSpec, ...] = ()
    route_groups: tuple[RouteGroupSpec, ...] = ()
    policies: Mapping[str, PolicySpec] = attrs.field(factory=dict)
    request_plugins: tuple[PluginSpec, ...] = ()
    response_plugins: tuple[PluginSpec, ...] = ()
    state_providers: Mapping[str, StateProviderSpec] = attrs.field(factory=dict)
    idp: IdpSpec | None = None
    telemetry: TelemetrySpec | None = None

    @property
    def identity_enabled(self) -> bool:
        """
        Whether any session or IdP is configured (otherwise rule 4: the session,
        auth-gate and projection stages pass requests through).
        """
        return self.gateway.session is not None or self.idp is not None
