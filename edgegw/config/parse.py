"""
From YAML documents to the frozen L{Config}: every kind, every field, every rule.

Parsing never stops at the first problem: each resource is read completely, problems are
collected with their location, and L{load_config} raises one L{ConfigError} at the end.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs

from edgegw.config.errors import Location, Problems
from edgegw.config.fields import Node, suggest, type_name
from edgegw.config.load import Document, read_sources
from edgegw.config.model import (
    AccessLogSpec,
    AccessSpec,
    ApiBackendSpec,
    ApiHandlerSpec,
    AssertionAcceptSpec,
    AssertionIssueSpec,
    AssertionKeySpec,
    AssertionSpec,
    AuthSpec,
    BearerSpec,
    Config,
    CsrfSpec,
    GatewaySpec,
    GroupsSpec,
    HandlerSpec,
    HealthHandlerSpec,
    HstsSpec,
    IdentitySpec,
    IdpSpec,
    KvStoreConfig,
    LabelExpression,
    PluginSpec,
    PolicySpec,
    ProjectionSpec,
    ProxyHandlerSpec,
    RegoSpec,
    RequireSpec,
    RouteGroupSpec,
    RouteSpec,
    SecurityHeadersSpec,
    SecuritySpec,
    Selector,
    SessionSpec,
    StateProviderRef,
    StateProviderSpec,
    StaticHandlerSpec,
    TelemetrySpec,
)
from edgegw.edge.csrf import TrustedOriginError, validate_trusted_origin
from edgegw.routing.mux import ConflictError, Mux, PatternError
from edgegw.server.listen import endpoint_description

RESERVED_ACCESS_LOG_FIELDS = frozenset(
    {
        "method",
        "path",
        "status",
        "duration_ms",
        "bytes",
        "request_id",
        "route",
        "trace_id",
        "span_id",
        "request_headers",
        "upstream_calls",
        "authz_denied",
        "error",
        "client_gone",
        "tunnel_bytes_up",
        "api_error",
    }
)
"""Fields of an access-log line that constant C{accessLog.fields} may not overwrite."""

KINDS = (
    "Gateway",
    "IdP",
    "Telemetry",
    "Route",
    "RouteGroup",
    "Policy",
    "RequestPlugin",
    "ResponsePlugin",
    "StateProvider",
)
HANDLER_TYPES = ("api", "health", "reverse-proxy", "static")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_LABEL_VALUE = re.compile(r"[^\x00-\x1f\x7f]*\Z")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_METHOD = _TOKEN
_BAD_HEADER_VALUE = re.compile(r"[^\t\x20-\x7e]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*\Z")
# A character that cannot appear as it is in an RFC 3986 path: not unreserved, not a
# sub-delim, ":", "@" or "/", and not the "%" of a valid %XX escape.
_BAD_PATH = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]")
_BAD_QUERY = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+\Z")
# Underscores are not DNS host-name syntax, but service names (Docker Compose, SRV-style
# labels) use them and resolve fine over plain http.
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?\Z")


def load_config(source: str, environ: Mapping[str, str] | None = None) -> Config:
    """
    Load, interpolate and validate the configuration at C{source} (file or directory).

    @param environ: Variables for C{${VAR}} interpolation; defaults to C{os.environ}.
    @raise ConfigError: With every problem found.
    """
    problems = Problems()
    sources = read_sources(source, os.environ if environ is None else environ, problems)
    config = _Parser(source, problems, complete=sources.complete).parse(list(sources.documents))
    problems.raise_if_any()
    assert config is not None
    return config


# -- shared validators ---------------------------------------------------------------------


def is_local_redirect(path: str) -> bool:
    """
    Whether C{path} is a same-origin path: starts with C{/}, not C{//} or C{/\\}, and
    contains no C{://}.
    """
    return (
        path.startswith("/")
        and not path.startswith(("//", "/\\"))
        and "://" not in path
        and not any(c in path for c in "\r\n\x00")
    )


def _check_local_path(node: Node, key: str, value: str | None) -> None:
    if value is not None and not is_local_redirect(value):
        node.error(
            key,
            f'"{value}" is not a same-origin path: it must start with "/", must not start '
            'with "//" or "/\\" and must not contain "://"',
        )


def _check_header_name(node: Node, key: str, value: str | None) -> None:
    if value is not None and not _TOKEN.match(value):
        node.error(key, f'"{value}" is not a valid HTTP header name')


def _show(value: str) -> str:
    """
    C{value} for a message: characters that cannot be printed are escaped as in Python,
    so that every problem stays on one line.
    """
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in value
    )


def _describe(char: str) -> str:
    """
    One character for a message: C{a space}, C{"["}, C{"ä" (U+00E4)} or C{U+000D}.
    """
    if char == " ":
        return "a space"
    if char.isascii() and char.isprintable():
        return f'"{char}"'
    if char.isprintable():
        return f'"{char}" (U+{ord(char):04X})'
    return f"U+{ord(char):04X}"


def _percent_encode(text: str) -> str:
    return "".join(f"%{byte:02X}" for byte in text.encode("utf-8", "surrogatepass"))


def _check_header_value(node: Node, key: str, value: str | None) -> None:
    """
    A header value must be sendable as it is: visible ASCII, spaces and tabs (RFC 9110
    field-vchar without obs-text); anything else is refused or mangled by clients.
    """
    if value is None:
        return
    bad = _BAD_HEADER_VALUE.search(value)
    if bad is not None:
        node.error(
            key,
            f'"{_show(value)}" is not a valid HTTP header value: {_describe(bad.group())} '
            "is not allowed; use printable ASCII",
        )


def _check_url(node: Node, key: str, value: str | None, schemes: tuple[str, ...]) -> None:
    if value:
        problem = _url_problem(value, schemes)
        if problem is not None:
            node.error(key, problem)


def _url_problem(value: str, schemes: tuple[str, ...]) -> str | None:
    """
    Why C{value} is not a usable absolute URL with one of C{schemes}, or L{None}.

    Checked strictly, so that nothing fails later: ASCII only; the host an IP address
    (IPv6 in brackets) or a DNS name (internationalized names in punycode); no
    credentials; a port from 1 to 65535; a path of RFC 3986 path characters and
    C{%XX} escapes; no query or fragment.
    """
    shown = _show(value)
    invalid = f'"{shown}" is not a valid URL'
    wanted = " or ".join(f"{name}://" for name in schemes)
    scheme, separator, rest = value.partition("://")
    if not separator or scheme.lower() not in schemes or not _SCHEME.match(scheme):
        return f"{invalid}: expected {wanted} followed by a host"
    end = len(rest)
    for delimiter in "/?#":
        position = rest.find(delimiter)
        if position != -1:
            end = min(end, position)
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        redacted = f"{scheme}://***@{authority.rpartition('@')[2]}{tail}"
        return f'"{_show(redacted)}" is not a valid URL: credentials in the URL are not allowed'
    if not authority or (authority.startswith(":") and authority.count(":") == 1):
        return f"{invalid}: expected {wanted} followed by a host"
    problem = _authority_problem(authority)
    if problem is not None:
        return f"{invalid}: {problem}"
    path = tail.partition("?")[0].partition("#")[0]
    if path != tail:
        return f'"{shown}": a query or fragment is not allowed here'
    bad = _BAD_PATH.search(path)
    if bad is None:
        return None
    if bad.group() == "%":
        escape = _show(path[bad.start() : bad.start() + 3])
        return (
            f'{invalid}: "{escape}" is not a valid percent-escape (use "%" and two hex '
            'digits; "%25" for "%" itself)'
        )
    char = bad.group()
    return (
        f"{invalid}: {_describe(char)} is not allowed in the path; percent-encode it "
        f'("{_percent_encode(char)}")'
    )


def _authority_problem(authority: str) -> str | None:
    """
    What is wrong with C{host[:port]} (no credentials), or L{None}.
    """
    if authority.startswith("["):
        literal, bracket, port = authority[1:].partition("]")
        if not bracket:
            return f'"[{_show(literal)}" has no closing "]"'
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return f'"{_show(literal)}" is not a valid IPv6 address'
        if "%" in literal:
            return f'"{_show(literal)}": IPv6 zone identifiers are not supported'
        if port and not port.startswith(":"):
            return f'unexpected "{_show(port)}" after the IPv6 address'
        port = port[1:]
    else:
        host, _, port = authority.partition(":")
        if ":" in port:
            return 'an IPv6 address must be written in brackets, such as "[::1]"'
        problem = _host_problem(host)
        if problem is not None:
            return problem
    if port and not (port.isascii() and port.isdigit()):
        return f'the port "{_show(port)}" is not a number'
    if port and not 0 < int(port) < 65536:
        return f"the port must be between 1 and 65535, got {int(port)}"
    return None


def _host_problem(host: str) -> str | None:
    """
    What is wrong with a host that is not an IPv6 literal, or L{None}.
    """
    if not host.isascii():
        try:
            punycode = host.encode("idna").decode("ascii")
        except UnicodeError:
            example = ""
        else:
            example = f' ("{punycode}")'
        return (
            f'the host "{_show(host)}" is not ASCII: write internationalized names in '
            f"punycode{example}"
        )
    if _DOTTED_NUMBERS.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f'"{host}" is not a valid IPv4 address'
        return None
    name = host.removesuffix(".")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return (
            f'"{_show(host)}" is not a valid host name: use letters, digits, hyphens, '
            "underscores and dots (labels of 1 to 63 characters, not starting or ending with "
            '"-"), or an IP address'
        )
    return None


def _strip_prefix(node: Node) -> str | None:
    """
    C{stripPrefix}, percent-encoded as request paths are (UTF-8), so that C{/ä} matches
    the C{/%C3%A4} a client sends; RFC 3986 path characters and C{%XX} escapes are kept.
    """
    strip = node.string("stripPrefix")
    if strip is None:
        return None
    if not strip.startswith("/"):
        node.error("stripPrefix", f'"{_show(strip)}" must start with "/"')
        return strip
    return _BAD_PATH.sub(lambda found: _percent_encode(found.group()), strip)


def _output_problem(path: str) -> str | None:
    """
    Why the access log cannot be appended to the file at C{path}, or L{None}.
    """
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        return f"{path} is a directory"
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            return f"the directory of {path} is not a directory"
        return f"the directory of {path} does not exist"
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            return f"{path} cannot be written: permission denied"
    elif not os.access(directory, os.W_OK | os.X_OK):
        return f"{path} cannot be written: cannot create files in {directory}"
    return None


def _decode_key(text: str) -> bytes | None:
    """
    Standard or raw URL-safe base64, padding optional.
    """
    try:
        data = (text + "=" * (-len(text) % 4)).encode("ascii")
    except UnicodeEncodeError:
        return None
    for altchars in (None, b"-_"):
        try:
            return base64.b64decode(data, altchars=altchars, validate=True)
        except binascii.Error:
            continue
    return None


def _ed25519_key(node: Node, key: str, what: str) -> bytes:
    text = node.string(key, required=True)
    if not text:
        return b""
    raw = _decode_key(text)
    if raw is None:
        node.error(key, f"{what} is not valid base64 (standard or raw URL-safe)")
        return b""
    if len(raw) != 32:
        node.error(key, f"{what} must decode to exactly 32 bytes, got {len(raw)}")
        return b""
    return raw


# -- the parser ----------------------------------------------------------------------------


class _Parser:
    """
    @ivar complete: Whether every source file was read and parsed; when not, rules that
        look for a resource (the Gateway, a Policy, a StateProvider) are skipped, since
        it may be in a file that could not be read.
    """

    def __init__(self, source: str, problems: Problems, *, complete: bool = True) -> None:
        self.source = source
        self.problems = problems
        self.complete = complete

    def parse(self, documents: list[Document]) -> Config | None:
        gateways: list[tuple[Location, GatewaySpec]] = []
        idps: list[tuple[Location, IdpSpec]] = []
        telemetries: list[tuple[Location, TelemetrySpec]] = []
        routes: list[RouteSpec] = []
        groups: list[RouteGroupSpec] = []
        policies: dict[str, PolicySpec] = {}
        request_plugins: list[PluginSpec] = []
        response_plugins: list[PluginSpec] = []
        providers: dict[str, StateProviderSpec] = {}
        names: dict[tuple[str, str], Location] = {}

        for order, document in enumerate(documents):
            envelope = self._envelope(document)
            if envelope is None:
                continue
            kind, name, labels, spec = envelope
            location = document.location
            previous = names.get((kind, name))
            if previous is not None:
                self.problems.add(
                    location,
                    "metadata.name",
                    f'duplicate {kind} name "{name}" (first defined in {previous.describe()})',
                )
            else:
                names[(kind, name)] = location
            base = document.base_dir
            if kind == "Gateway":
                gateways.append(
                    (location, attrs.evolve(self._gateway(spec, base), location=location))
                )
            elif kind == "IdP":
                idps.append((location, attrs.evolve(self._idp(spec, name), location=location)))
            elif kind == "Telemetry":
                telemetries.append(
                    (location, attrs.evolve(self._telemetry(spec), location=location))
                )
            elif kind == "Route":
                route = self._route(spec, name, labels, location, order, base)
                if route is not None:
                    routes.append(route)
            elif kind == "RouteGroup":
                groups.append(self._route_group(spec, name, location, order))
            elif kind == "Policy":
                policies.setdefault(name, self._policy(spec, name, location, base))
            elif kind in ("RequestPlugin", "ResponsePlugin"):
                plugin = self._plugin(spec, name, cast(Any, kind), location, order)
                (request_plugins if kind == "RequestPlugin" else response_plugins).append(plugin)
            elif kind == "StateProvider":
                providers.setdefault(name, self._state_provider(spec, name, location))
            spec.finish()

        gateway = self._one_gateway(gateways)
        idp = self._at_most_one("IdP", idps)
        telemetry = self._at_most_one("Telemetry", telemetries)
        self._cross_checks(gateway, idp, routes, groups, policies, providers)
        if gateway is None:
            return None
        return Config(
            source=self.source,
            files=tuple(dict.fromkeys(d.location.file for d in documents)),
            gateway=gateway[1],
            routes=tuple(routes),
            route_groups=tuple(groups),
            policies=policies,
            request_plugins=tuple(request_plugins),
            response_plugins=tuple(response_plugins),
            state_providers=providers,
            idp=idp,
            telemetry=telemetry,
        )

    # -- envelope --------------------------------------------------------------------------

    def _envelope(self, document: Document) -> tuple[str, str, dict[str, str], Node] | None:
        location = document.location
        body = document.body
        if not isinstance(body, dict):
            self.problems.add(location, "", f"expected a resource mapping, got {type_name(body)}")
            return None
        root = Node(body, location, "", self.problems)
        root.know("apiVersion")
        if "apiVersion" in body and not isinstance(body["apiVersion"], str | int | float):
            root.error("apiVersion", f"expected a string, got {type_name(body['apiVersion'])}")
        kind = root.string("kind", required=True)
        if kind and kind not in KINDS:
            root.error(
                "kind",
                f'unknown kind "{kind}"{suggest(kind, list(KINDS))} '
                f"(expected one of {', '.join(KINDS)})",
            )
            return None
        metadata = root.mapping("metadata", required=True)
        name = ""
        labels: dict[str, str] = {}
        if metadata is not None:
            name = metadata.required_string("name")
            labels = metadata.string_map("labels") or {}
            for label, value in labels.items():
                if not label or not _LABEL_VALUE.match(label + value):
                    metadata.error(f"labels.{label}", "labels must be printable text")
            metadata.know("annotations")
            metadata.finish()
        spec = root.mapping("spec")
        if spec is None:
            if "spec" in body and body["spec"] is not None:
                return None
            spec = Node({}, location, "spec", self.problems)
        root.finish()
        if not kind:
            return None
        return kind, name, labels, spec

    # -- Gateway ---------------------------------------------------------------------------

    def _gateway(self, spec: Node, base_dir: str) -> GatewaySpec:
        listen = spec.string("listen", ":8080") or ":8080"
        try:
            endpoint_description(listen)
        except ValueError as e:
            spec.error("listen", str(e))
        trusted = spec.strings("trustedProxies")
        for index, entry in enumerate(trusted):
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                spec.error(
                    f"trustedProxies[{index}]",
                    f'"{entry}" is not an IP address, a CIDR such as "10.0.0.0/8", or "*"',
                )
        security = self._security(spec.mapping("security"))
        plugins = spec.strings("plugins")
        session = self._session(spec.mapping("session"))
        identity = self._identity(spec.mapping("identity"))
        auth = self._auth(spec.mapping("auth"))
        state = self._state_ref(spec.mapping("stateProvider"))
        if state is not None and session is None:
            spec.error("stateProvider", "requires a session block (its key encrypts the record)")
        return GatewaySpec(
            listen=listen,
            trusted_proxies=trusted,
            security=security,
            plugins=plugins,
            session=session,
            identity=identity,
            auth=auth,
            state_provider=state,
            drain_timeout=spec.duration("drainTimeout", 30.0) or 0.0,
            access_log=self._access_log(spec.mapping("accessLog"), base_dir),
        )

    def _access_log(self, node: Node | None, base_dir: str) -> AccessLogSpec:
        if node is None:
            return AccessLogSpec()
        output = node.string("output", "log", nonempty=True) or "log"
        if output not in ("log", "-"):
            output = os.path.normpath(os.path.join(base_dir, output))
            problem = _output_problem(output)
            if problem is not None:
                node.error("output", problem)
        node.finish()
        return AccessLogSpec(output=output)

    def _security(self, node: Node | None) -> SecuritySpec:
        if node is None:
            return SecuritySpec()
        csrf = CsrfSpec()
        csrf_node = node.mapping("csrf")
        if csrf_node is not None:
            origins = csrf_node.strings("trustedOrigins")
            for index, origin in enumerate(origins):
                try:
                    validate_trusted_origin(origin)
                except TrustedOriginError as e:
                    csrf_node.error(f"trustedOrigins[{index}]", str(e))
            patterns = csrf_node.strings("bypassPatterns")
            bypass: Mux[int] = Mux()
            for index, pattern in enumerate(patterns):
                try:
                    bypass.register(pattern, index)
                except (PatternError, ConflictError) as e:
                    csrf_node.error(f"bypassPatterns[{index}]", str(e))
            csrf = CsrfSpec(
                enabled=csrf_node.boolean("enabled", True),
                trusted_origins=origins,
                bypass_patterns=patterns,
            )
            csrf_node.finish()
        headers = SecurityHeadersSpec()
        headers_node = node.mapping("headers")
        if headers_node is not None:
            hsts = HstsSpec()
            hsts_node = headers_node.mapping("hsts")
            if hsts_node is not None:
                hsts = HstsSpec(
                    enabled=hsts_node.boolean("enabled", True),
                    max_age=hsts_node.integer("maxAge", 31536000, minimum=0),
                    include_subdomains=hsts_node.boolean("includeSubDomains", True),
                    preload=hsts_node.boolean("preload", False),
                )
                hsts_node.finish()
            values = {}
            for key, default in (
                ("frameOptions", "DENY"),
                ("contentTypeOptions", "nosniff"),
                ("referrerPolicy", "strict-origin-when-cross-origin"),
                ("contentSecurityPolicy", None),
            ):
                value = headers_node.string(key, default)
                _check_header_value(headers_node, key, value)
                values[key] = value
            headers = SecurityHeadersSpec(
                frame_options=values["frameOptions"] or "",
                content_type_options=values["contentTypeOptions"] or "",
                referrer_policy=values["referrerPolicy"] or "",
                hsts=hsts,
                content_security_policy=values["contentSecurityPolicy"],
            )
            headers_node.finish()
        node.finish()
        return SecuritySpec(csrf=csrf, headers=headers)

    def _session(self, node: Node | None) -> SessionSpec | None:
        if node is None:
            return None
        key_text = node.string("key", required=True) or ""
        key = key_text.encode("utf-8")
        if key_text and len(key) != 32:
            node.error("key", f"must be exactly 32 bytes (AES-256-GCM key), got {len(key)}")
        cookie_name = node.string("cookieName", "gw_session") or ""
        if not _TOKEN.match(cookie_name):
            node.error("cookieName", f'"{cookie_name}" is not a valid cookie name')
        fingerprint = node.strings("fingerprintHeaders", ("User-Agent",))
        for index, header in enumerate(fingerprint):
            _check_header_name(node, f"fingerprintHeaders[{index}]", header)
        info_path = node.string("infoPath", "/auth/session") or ""
        _check_local_path(node, "infoPath", info_path)
        post_logout = node.string("postLogoutRedirect", "/") or ""
        _check_local_path(node, "postLogoutRedirect", post_logout)
        session = SessionSpec(
            key=key,
            cookie_name=cookie_name,
            ttl=node.duration("ttl", 8 * 3600.0, positive=True) or 8 * 3600.0,
            fingerprint_headers=fingerprint,
            info_path=info_path,
            post_logout_redirect=post_logout,
        )
        node.finish()
        return session

    def _identity(self, node: Node | None) -> IdentitySpec:
        if node is None:
            return IdentitySpec()
        groups = GroupsSpec()
        groups_node = node.mapping("groups")
        if groups_node is not None:
            as_ = groups_node.string("as", "groups") or ""
            if not _TOKEN.match(as_):
                groups_node.error("as", f'"{as_}" cannot be used in a header name')
            groups = GroupsSpec(
                source=groups_node.string("source"),
                match=groups_node.strings("match"),
                render=cast(Any, groups_node.string("render", "cn", choices=("cn", "dn"))),
                as_=as_,
                strip=groups_node.strings("strip"),
            )
            groups_node.finish()
        identity = IdentitySpec(
            claims=node.strings("claims", ("email", "name", "given_name", "family_name")),
            groups=groups,
            user_info=cast(
                Any, node.string("userInfo", "auto", choices=("auto", "always", "never"))
            ),
            subject_claim=node.string("subjectClaim", "sub", nonempty=True) or "sub",
            assertion=self._assertion(node.mapping("assertion")),
        )
        node.finish()
        return identity

    def _assertion(self, node: Node | None) -> AssertionSpec | None:
        if node is None:
            return None
        issue = None
        issue_node = node.mapping("issue")
        if issue_node is not None:
            header = issue_node.string("header", "X-Gw-Identity") or ""
            _check_header_name(issue_node, "header", header)
            issue = AssertionIssueSpec(
                name=issue_node.required_string("name"),
                key_id=issue_node.required_string("keyId"),
                seed=_ed25519_key(issue_node, "key", "the Ed25519 seed"),
                ttl=issue_node.duration("ttl", 60.0, positive=True) or 60.0,
                header=header,
            )
            issue_node.finish()
        accept = None
        accept_node = node.mapping("accept")
        if accept_node is not None:
            header = accept_node.string("header", "X-Gw-Identity") or ""
            _check_header_name(accept_node, "header", header)
            keys = []
            for key_node in accept_node.nodes("keys", required=True):
                keys.append(
                    AssertionKeySpec(
                        key_id=key_node.required_string("keyId"),
                        public_key=_ed25519_key(key_node, "publicKey", "the Ed25519 public key"),
                    )
                )
                key_node.finish()
            accept = AssertionAcceptSpec(
                issuer=accept_node.required_string("issuer"),
                keys=tuple(keys),
                header=header,
                require_bearer=accept_node.boolean("requireBearer", True),
            )
            accept_node.finish()
        if issue is None and accept is None:
            node.error("", "configure issue, accept, or both")
        node.finish()
        return AssertionSpec(issue=issue, accept=accept)

    def _auth(self, node: Node | None) -> AuthSpec:
        if node is None:
            return AuthSpec()
        login = node.string("loginPath", "/auth/login") or ""
        logout = node.string("logoutPath", "/auth/logout") or ""
        _check_local_path(node, "loginPath", login)
        _check_local_path(node, "logoutPath", logout)
        node.finish()
        return AuthSpec(login_path=login, logout_path=logout)

    def _state_ref(self, node: Node | None) -> StateProviderRef | None:
        if node is None:
            return None
        type_ = node.required_string("type")
        config = node.opaque_mapping("config")
        kvstore = None
        if type_ == "kvstore":
            config_node = node.mapping("config", required=True)
            if config_node is not None:
                kvstore = self._kvstore(config_node)
        ref = StateProviderRef(
            type=type_,
            refresh_skew=node.duration("refreshSkew", 60.0) or 0.0,
            key_prefix=node.string("keyPrefix", "gw:sess:") or "",
            config=config,
            kvstore=kvstore,
        )
        node.finish()
        return ref

    def _kvstore(self, node: Node) -> KvStoreConfig:
        address = node.required_string("address")
        host, sep, port = address.rpartition(":")
        if address and (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536):
            node.error("address", f'"{address}" is not host:port')
        config = KvStoreConfig(
            address=address,
            user=node.string("user", "default") or "default",
            password=node.string("password"),
            db=node.integer("db", 0, minimum=0),
            tls=node.boolean("tls", False),
            timeout=node.duration("timeout", 3.0, positive=True) or 3.0,
        )
        node.finish()
        return config

    # -- IdP, Telemetry --------------------------------------------------------------------

    def _idp(self, spec: Node, name: str) -> IdpSpec:
        spec.string("type", required=True, choices=("oidc",))
        verification_only = spec.boolean("verificationOnly", False)
        issuer = spec.required_string("issuer")
        _check_url(spec, "issuer", issuer, ("https", "http"))
        client_id = spec.required_string("clientID")
        client_secret = spec.string("clientSecret")
        redirect_url = spec.string("redirectURL")
        if verification_only:
            for key, value in (("clientSecret", client_secret), ("redirectURL", redirect_url)):
                if value is not None:
                    spec.error(key, "not allowed with verificationOnly: true")
        _check_url(spec, "redirectURL", redirect_url, ("https", "http"))
        bearer = BearerSpec()
        bearer_node = spec.mapping("bearer")
        if bearer_node is not None:
            jwks = bearer_node.string("jwksURL")
            _check_url(bearer_node, "jwksURL", jwks, ("https", "http"))
            algs = (
                bearer_node.strings("signingAlgs", nonempty=True)
                if bearer_node.has("signingAlgs")
                else None
            )
            bearer = BearerSpec(
                jwks_url=jwks,
                audience_claim=bearer_node.string("audienceClaim", "aud", nonempty=True) or "aud",
                audience=bearer_node.string("audience", nonempty=True),
                signing_algs=algs,
            )
            bearer_node.finish()
        return IdpSpec(
            name=name,
            issuer=issuer,
            client_id=client_id,
            verification_only=verification_only,
            client_secret=client_secret,
            redirect_url=redirect_url,
            scopes=spec.strings("scopes", ("openid", "profile", "email"), nonempty=True),
            bearer=bearer,
        )

    def _telemetry(self, spec: Node) -> TelemetrySpec:
        service = spec.mapping("service", required=True)
        service_name = ""
        service_version = None
        if service is not None:
            service_name = service.required_string("name")
            service_version = service.string("version", nonempty=True)
            service.finish()
        resource_attributes: dict[str, str] = {}
        resource = spec.mapping("resource")
        if resource is not None:
            resource_attributes = resource.string_map("attributes") or {}
            resource.finish()
        endpoint = None
        protocol = "http/protobuf"
        headers: dict[str, str] = {}
        timeout = 10.0
        otlp = spec.mapping("otlp")
        if otlp is not None:
            endpoint = otlp.string("endpoint")
            _check_url(otlp, "endpoint", endpoint, ("http", "https"))
            protocol = (
                otlp.string("protocol", "http/protobuf", choices=("http/protobuf", "grpc"))
                or protocol
            )
            headers = otlp.string_map("headers") or {}
            for name, value in headers.items():
                _check_header_name(otlp, f"headers.{name}", name)
                _check_header_value(otlp, f"headers.{name}", value)
            timeout = otlp.duration("timeout", 10.0, positive=True) or 10.0
            otlp.finish()
        ratio = 1.0
        sampling = spec.mapping("sampling")
        if sampling is not None:
            ratio = sampling.number("ratio", 1.0, minimum=0.0, maximum=1.0)
            sampling.finish()
        level = "info"
        log_headers: tuple[str, ...] = ()
        log_fields: dict[str, str] = {}
        access_log = spec.mapping("accessLog")
        if access_log is not None:
            level = (
                access_log.string("level", "info", choices=("debug", "info", "warn", "error"))
                or level
            )
            log_headers = access_log.strings("requestHeaders")
            for index, name in enumerate(log_headers):
                _check_header_name(access_log, f"requestHeaders[{index}]", name)
            log_fields = access_log.string_map("fields") or {}
            for name in log_fields:
                if name in RESERVED_ACCESS_LOG_FIELDS:
                    access_log.error(
                        f"fields.{name}", f'"{name}" is a field the gateway writes itself'
                    )
            access_log.finish()
        return TelemetrySpec(
            service_name=service_name,
            service_version=service_version,
            resource_attributes=resource_attributes,
            otlp_endpoint=endpoint,
            otlp_protocol=cast(Any, protocol),
            otlp_headers=headers,
            otlp_timeout=timeout,
            sampling_ratio=ratio,
            access_log_level=cast(Any, level),
            access_log_headers=log_headers,
            access_log_fields=log_fields,
        )

    # -- Routes and groups -----------------------------------------------------------------

    def _route(
        self,
        spec: Node,
        name: str,
        labels: dict[str, str],
        location: Location,
        order: int,
        base_dir: str,
    ) -> RouteSpec | None:
        match = spec.required_string("match")
        route_type = spec.string("type", choices=("app", "service"))
        handler_node = spec.mapping("handler", required=True)
        handler = self._handler(handler_node, base_dir, match) if handler_node is not None else None
        access = self._access(spec.mapping("access"))
        if handler is None:
            return None
        return RouteSpec(
            name=name,
            location=location,
            order=order,
            match=match,
            handler=handler,
            labels=labels,
            type=cast(Any, route_type),
            access=access,
        )

    def _access(self, node: Node | None) -> AccessSpec:
        if node is None:
            return AccessSpec()
        auth = node.string("auth", choices=("required", "public"))
        authorize = node.strings("authorize")
        projection = ProjectionSpec()
        projection_node = node.mapping("projection")
        if projection_node is not None:
            projection_node.know("request")
            session_node = projection_node.mapping("session")
            if session_node is not None:
                claims = session_node.string_map("claims")
                for claim, header in (claims or {}).items():
                    _check_header_name(session_node, f"claims.{claim}", header)
                groups_header = None
                groups_node = session_node.mapping("groups")
                if groups_node is not None:
                    groups_header = groups_node.string("header", nonempty=True)
                    _check_header_name(groups_node, "header", groups_header)
                    groups_node.finish()
                projection = ProjectionSpec(claims=claims, groups_header=groups_header)
                session_node.finish()
            projection_node.finish()
        redirect = None
        on_deny = node.mapping("onDeny")
        if on_deny is not None:
            redirect = on_deny.string("redirect")
            _check_local_path(on_deny, "redirect", redirect)
            on_deny.finish()
        node.finish()
        return AccessSpec(
            auth=cast(Any, auth),
            authorize=tuple(dict.fromkeys(authorize)),
            projection=projection,
            on_deny_redirect=redirect,
        )

    def _selector(self, node: Node | None) -> Selector:
        if node is None:
            return Selector()
        match_labels = node.string_map("matchLabels") or {}
        expressions = []
        for item in node.nodes("matchExpressions"):
            key = item.required_string("key")
            operator = item.string(
                "operator", required=True, choices=("In", "NotIn", "Exists", "DoesNotExist")
            )
            values = item.strings("values")
            if operator in ("In", "NotIn") and not values:
                item.error("values", f"{operator} needs at least one value")
            if operator in ("Exists", "DoesNotExist") and item.has("values"):
                item.error("values", f"{operator} takes no values")
            item.finish()
            if operator:
                expressions.append(LabelExpression(key, cast(Any, operator), values))
        node.finish()
        return Selector(match_labels=match_labels, match_expressions=tuple(expressions))

    def _route_group(self, spec: Node, name: str, location: Location, order: int) -> RouteGroupSpec:
        return RouteGroupSpec(
            name=name,
            location=location,
            order=order,
            type=cast(Any, spec.string("type", choices=("app", "service"))),
            selector=self._selector(spec.mapping("selector")),
            access=self._access(spec.mapping("access")),
        )

    # -- Policy, plugins, state providers --------------------------------------------------

    def _policy(self, spec: Node, name: str, location: Location, base_dir: str) -> PolicySpec:
        require = None
        require_node = spec.mapping("require")
        if require_node is not None:
            groups = require_node.strings("groups")
            claims: dict[str, tuple[str, ...]] = {}
            claims_node = require_node.mapping("claims")
            if claims_node is not None:
                for claim, value in claims_node.raw.items():
                    claims_node.know(claim)
                    if isinstance(value, str):
                        claims[claim] = (value,)
                    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                        if not value:
                            claims_node.error(str(claim), "empty list: list at least one value")
                        claims[claim] = tuple(value)
                    else:
                        claims_node.error(
                            str(claim),
                            f"expected a string or a list of strings, got {type_name(value)}",
                        )
                claims_node.finish()
            if require_node.has("groups") and not groups:
                require_node.error("groups", "empty list: list at least one group")
            if not require_node.has("groups") and not (claims_node and claims_node.raw):
                require_node.error("", "a require block needs groups, claims, or both")
            require = RequireSpec(groups=groups, claims=claims)
            require_node.finish()
        rego = None
        rego_node = spec.mapping("rego")
        if rego_node is not None:
            path = rego_node.required_string("path")
            rego = RegoSpec(path=os.path.normpath(os.path.join(base_dir, path)) if path else "")
            rego_node.finish()
        if require is None and rego is None:
            spec.error("", "a Policy needs require, rego, or both")
        return PolicySpec(name=name, location=location, require=require, rego=rego)

    def _plugin(
        self, spec: Node, name: str, kind: Any, location: Location, order: int
    ) -> PluginSpec:
        return PluginSpec(
            name=name,
            kind=kind,
            location=location,
            order=order,
            plugin=spec.string("plugin", name, nonempty=True) or name,
            selector=self._selector(spec.mapping("selector")),
            config=spec.opaque_mapping("config"),
        )

    def _state_provider(self, spec: Node, name: str, location: Location) -> StateProviderSpec:
        return StateProviderSpec(
            name=name,
            location=location,
            type=spec.required_string("type"),
            config=spec.opaque_mapping("config"),
        )

    # -- handlers --------------------------------------------------------------------------

    def _handler(self, node: Node, base_dir: str, match: str) -> HandlerSpec | None:
        type_ = node.string("type", required=True)
        builders: dict[str, Callable[[Node, str, str], HandlerSpec]] = {
            "static": self._static,
            "reverse-proxy": self._proxy,
            "api": self._api,
            "health": lambda n, b, m: HealthHandlerSpec(),
        }
        if not type_:
            return None
        builder = builders.get(type_)
        if builder is None:
            node.error(
                "type",
                f'unknown handler type "{type_}"{suggest(type_, list(HANDLER_TYPES))} '
                f"(expected one of {', '.join(HANDLER_TYPES)})",
            )
            return None
        handler = builder(node, base_dir, match)
        node.finish()
        return handler

    def _static(self, node: Node, base_dir: str, match: str) -> HandlerSpec:
        directory = node.required_string("dir")
        resolved = os.path.normpath(os.path.join(base_dir, directory)) if directory else ""
        if resolved and not os.path.isdir(resolved):
            node.error("dir", f'"{directory}" is not a directory (resolved to {resolved})')
        index = node.string("index", "index.html", nonempty=True) or "index.html"
        if "/" in index or index.startswith("."):
            node.error("index", f'"{index}" must be a plain file name')
        strip = _strip_prefix(node)
        cache_control = node.string("cacheControl")
        _check_header_value(node, "cacheControl", cache_control)
        return StaticHandlerSpec(
            dir=resolved,
            index=index,
            spa_fallback=node.boolean("spaFallback", True),
            strip_prefix=strip,
            cache_control=cache_control,
        )

    def _proxy(self, node: Node, base_dir: str, match: str) -> HandlerSpec:
        upstream = node.required_string("upstream")
        _check_url(node, "upstream", upstream, ("http", "https"))
        strip = _strip_prefix(node)
        return ProxyHandlerSpec(
            upstream=upstream,
            strip_prefix=strip,
            preserve_host=node.boolean("preserveHost", False),
            forward_access_token=node.boolean("forwardAccessToken", False),
            forward_cookies=node.boolean("forwardCookies", False),
            forward_identity=node.boolean("forwardIdentity", False),
            timeout=node.duration("timeout", None, positive=True),
            insecure_skip_verify=node.boolean("insecureSkipVerify", False),
        )

    def _api(self, node: Node, base_dir: str, match: str) -> HandlerSpec:
        wildcards = set(re.findall(r"\{([^{}.$]+)(?:\.\.\.)?\}", match))
        backends = []
        seen: set[str] = set()
        for item in node.nodes("backends", required=True):
            group = item.required_string("group")
            if group in seen:
                item.error("group", f'duplicate group "{group}": groups must be unique')
            seen.add(group)
            upstream = item.required_string("upstream")
            _check_url(item, "upstream", upstream, ("http", "https"))
            path = item.required_string("path")
            if path and not path.startswith("/"):
                item.error("path", f'"{path}" must start with "/"')
            else:
                # A static query may follow the path (/users/{id}?expand=1).
                literal, question, query = _PLACEHOLDER.sub("x", path).partition("?")
                bad = _BAD_PATH.search(literal) or (_BAD_QUERY.search(query) if question else None)
                if bad is not None:
                    char = bad.group()
                    item.error(
                        "path",
                        f'"{_show(path)}": '
                        + (
                            "a percent-escape needs two hex digits"
                            if char == "%"
                            else f"{_describe(char)} is not allowed in a path; percent-encode "
                            f'it ("{_percent_encode(char)}")'
                        ),
                    )
            for placeholder in _PLACEHOLDER.findall(path):
                if placeholder not in wildcards:
                    known = ", ".join(sorted(wildcards)) or "none"
                    item.error(
                        "path",
                        f'placeholder "{{{placeholder}}}" is not a wildcard of the route '
                        f"match {match!r} (wildcards: {known})",
                    )
            method = item.string("method", "GET") or "GET"
            if not _METHOD.match(method):
                item.error("method", f'"{method}" is not a valid HTTP method')
            backends.append(
                ApiBackendSpec(
                    group=group,
                    upstream=upstream,
                    path=path,
                    method=method,
                    required=item.boolean("required", True),
                    forward_query=item.boolean("forwardQuery", False),
                    forward_access_token=item.boolean("forwardAccessToken", False),
                    forward_identity=item.boolean("forwardIdentity", False),
                )
            )
            item.finish()
        return ApiHandlerSpec(
            backends=tuple(backends), timeout=node.duration("timeout", None, positive=True)
        )

    # -- whole-configuration rules ---------------------------------------------------------

    def _one_gateway(
        self, gateways: list[tuple[Location, GatewaySpec]]
    ) -> tuple[Location, GatewaySpec] | None:
        if not gateways:
            if self.complete:
                self.problems.add(None, "", "no Gateway resource: exactly one is required")
            return None
        for location, _ in gateways[1:]:
            self.problems.add(
                location,
                "",
                "a second Gateway resource: exactly one is allowed "
                f"(the first is {gateways[0][0].describe()})",
            )
        return gateways[0]

    def _at_most_one(self, kind: str, found: list[tuple[Location, Any]]) -> Any:
        for location, _ in found[1:]:
            self.problems.add(
                location,
                "",
                f"a second {kind} resource: at most one is allowed "
                f"(the first is {found[0][0].describe()})",
            )
        return found[0][1] if found else None

    def _cross_checks(
        self,
        gateway: tuple[Location, GatewaySpec] | None,
        idp: IdpSpec | None,
        routes: list[RouteSpec],
        groups: list[RouteGroupSpec],
        policies: dict[str, PolicySpec],
        providers: dict[str, StateProviderSpec],
    ) -> None:
        mux: Mux[RouteSpec] = Mux()
        for route in routes:
            if not route.match:
                continue
            try:
                mux.register(route.match, route)
            except PatternError as e:
                self.problems.add(route.location, "spec.match", str(e))
            except ConflictError as e:
                self.problems.add(route.location, "spec.match", str(e))
        holders: list[RouteSpec | RouteGroupSpec] = [*routes, *groups]
        for holder in holders:
            for index, policy in enumerate(holder.access.authorize):
                if policy not in policies and self.complete:
                    self.problems.add(
                        holder.location,
                        f"spec.access.authorize[{index}]",
                        f'no Policy named "{policy}"' + suggest(policy, list(policies)),
                    )
        if gateway is None:
            return
        location, spec = gateway
        assertion = spec.identity.assertion
        if assertion is None or assertion.issue is None:
            for route in routes:
                handler = route.handler
                backends = getattr(handler, "backends", ())
                if getattr(handler, "forward_identity", False):
                    self.problems.add(
                        route.location,
                        "spec.handler.forwardIdentity",
                        "needs identity.assertion.issue in the Gateway to mint assertions",
                    )
                for index, backend in enumerate(backends):
                    if backend.forward_identity:
                        self.problems.add(
                            route.location,
                            f"spec.handler.backends[{index}].forwardIdentity",
                            "needs identity.assertion.issue in the Gateway to mint assertions",
                        )
        if idp is not None and idp.verification_only and spec.session is not None:
            self.problems.add(
                location,
                "spec.session",
                "a verificationOnly IdP cannot serve a configuration that has a session",
            )
        state = spec.state_provider
        known_types = {"kvstore"} | {provider.type for provider in providers.values()}
        if state is not None and state.type and state.type not in known_types and self.complete:
            self.problems.add(
                location,
                "spec.stateProvider.type",
                f'no state provider type "{state.type}": the shipped type is "kvstore"; '
                "others must be declared by a StateProvider resource",
            )
