"""
A real OpenID provider for trial tests: node's C{oidc-provider} (tests/e2e/provider.mjs) on
loopback, and the helpers to log in through it without a browser.

  - L{start_provider}: spawn the provider for one test (killed and awaited at the test's
    cleanup); it answers at C{provider.issuer}, C{http://localhost:<port>}. A process
    starts in well under a second, so every test gets its own: no state (sessions,
    grants, refresh tokens, signing keys) is shared between tests;
  - L{login_through_forms}: drive an authorization request through the provider's
    development login and consent forms and return the URL it redirects the browser to
    (the client's redirect URI with C{code}, C{state} and C{iss});
  - L{CookieClient}: the HTTP client those helpers use unless given another: one request
    per call, redirects not followed, cookies kept per host (not per port, as browsers
    do) for as long as the client lives.

The provider's client is C{edgegw} (confidential, C{client_secret_basic}, PKCE S256
required, refresh tokens rotated); its users are C{alice} and C{bob} (any password).
tests/e2e/provider.mjs describes the claims, scopes and the resource C{urn:edgegw:api}.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable, Mapping
from html.parser import HTMLParser
from http.cookiejar import CookieJar
from typing import Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import attrs
from treq.client import HTTPClient
from twisted.internet import reactor as _global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python import log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

__all__ = [
    "CLIENT_ID",
    "E2E_DIR",
    "RESOURCE",
    "SERVICE_CLIENT",
    "SERVICE_CLIENT_ES256",
    "USERS",
    "CookieClient",
    "Fetch",
    "Form",
    "LoginError",
    "Provider",
    "ProviderError",
    "Reply",
    "client_credentials_token",
    "login_through_forms",
    "origin",
    "parse_forms",
    "start_provider",
    "with_query",
]

reactor: Any = _global_reactor

E2E_DIR = os.path.dirname(os.path.abspath(__file__))
PROVIDER_SCRIPT = os.path.join(E2E_DIR, "provider.mjs")
NODE_MODULES = os.path.join(E2E_DIR, "node_modules")
SETUP_HINT = "run `make test` (it runs npm ci in tests/e2e)"

CLIENT_ID = "edgegw"
# Client-credentials clients (same secret as CLIENT_ID): resource tokens signed RS256 / ES256.
SERVICE_CLIENT = "edgegw-service"
SERVICE_CLIENT_ES256 = "edgegw-service-es256"
RESOURCE = "urn:edgegw:api"
# The provider's static users (tests/e2e/provider.mjs) and the claims userinfo returns.
USERS: Mapping[str, Mapping[str, Any]] = {
    "alice": {
        "email": "alice@example.com",
        "email_verified": True,
        "name": "Alice Example",
        "given_name": "Alice",
        "family_name": "Example",
        "groups": [
            "CN=Admins,OU=Groups,DC=Example,DC=Com",
            "cn=Smith\\, John's Team,ou=groups,dc=example,dc=com",
        ],
    },
    "bob": {
        "email": "bob@example.com",
        "email_verified": True,
        "name": "Bob Builder",
        "given_name": "Bob",
        "family_name": "Builder",
        "groups": ["cn=users,ou=groups,dc=example,dc=com"],
    },
}

READY_TIMEOUT = 15.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class ProviderError(Exception):
    """
    The provider process did not start (or said something other than its ready line).
    """


class LoginError(Exception):
    """
    L{login_through_forms} could not get through the provider's forms.
    """


# -- HTTP ------------------------------------------------------------------------------


class Reply(NamedTuple):
    """
    One HTTP response: status, headers (lower-case names; repeated headers joined with
    C{", "}) and the whole body.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """
        The body, decoded as JSON.
        """
        return json.loads(self.body)


class Fetch(Protocol):
    """
    One HTTP request, C{GET} with C{data} as query parameters or C{POST} with C{data} as
    an urlencoded form, that follows no redirect and keeps cookies across calls:
    C{(url, data=None) -> (status, headers, body)}, headers looked up by lower-case name.
    """

    def __call__(
        self, url: str, data: Mapping[str, str] | None = None, /
    ) -> Awaitable[tuple[int, Mapping[str, str], bytes]]: ...


class CookieClient:
    """
    treq over a non-persistent connection pool (no connection outlives its response) and
    a cookie jar of its own: the standard library's, which scopes cookies by host and
    path but not by port, as browsers do. Redirects are never followed.
    """

    def __init__(self, reactor_: Any = None) -> None:
        self._reactor = reactor if reactor_ is None else reactor_
        self.pool = HTTPConnectionPool(self._reactor, persistent=False)
        self.cookies = CookieJar()
        self._http = HTTPClient(
            Agent(self._reactor, pool=self.pool),
            cookiejar=self.cookies,  # type: ignore[arg-type]
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        data: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Reply:
        """
        One request; C{data} is sent as an urlencoded form.
        """
        sent = Headers()
        for name, value in (headers or {}).items():
            sent.addRawHeader(name, value)
        response = await self._http.request(
            method,
            url,
            data=dict(data) if data is not None else None,
            headers=sent,
            allow_redirects=False,
            timeout=timeout,
        )
        body = await response.content()
        received: dict[str, str] = {}
        for name, values in response.headers.getAllRawHeaders():
            received[name.decode("latin-1").lower()] = ", ".join(
                value.decode("latin-1") for value in values
            )
        return Reply(response.code, received, body)

    async def get(self, url: str, data: Mapping[str, str] | None = None) -> Reply:
        """
        C{GET url}, with C{data} added to its query.
        """
        if data:
            url = with_query(url, data)
        return await self.request("GET", url)

    async def post(self, url: str, data: Mapping[str, str] | None = None) -> Reply:
        """
        C{POST url} with the form C{data}.
        """
        return await self.request("POST", url, data=data or {})


def with_query(url: str, params: Mapping[str, str]) -> str:
    """
    C{url} with C{params} appended to its query.
    """
    parts = urlsplit(url)
    query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), *params.items()])
    return urlunsplit(parts._replace(query=query))


def origin(url: str) -> tuple[str, str, int | None]:
    """
    The origin of C{url}: scheme, host and port (the scheme's default when implied).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


# -- the provider process --------------------------------------------------------------


class _ProviderProtocol(ProcessProtocol):
    """
    Waits for the provider's JSON ready line and keeps its stderr for failure messages.
    """

    def __init__(self) -> None:
        self.stdout = b""
        self.stderr = b""
        self.exited = False
        self.ready: Deferred[dict[str, Any]] = Deferred()
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.stdout += data
        if self.ready.called or b"\n" not in self.stdout:
            return
        line = self.stdout.split(b"\n", 1)[0]
        try:
            info = json.loads(line)
            if not isinstance(info, dict) or not {"issuer", "port"} <= info.keys():
                raise ValueError("no issuer and port")
        except ValueError as e:
            self.ready.errback(ProviderError(f"unexpected first line on stdout {line!r}: {e}"))
        else:
            self.ready.callback(info)

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Failure) -> None:
        self.exited = True
        if not self.ready.called:
            self.ready.errback(ProviderError(f"it exited before listening: {reason.value}"))
        self.ended.callback(None)


@attrs.define(eq=False)
class Provider:
    """
    A running provider and its client C{edgegw}'s credentials.
    """

    issuer: str
    port: int
    client_id: str
    client_secret: str
    redirect_uris: list[str]
    backchannel_logout_uri: str | None
    _protocol: _ProviderProtocol = attrs.field(repr=False)
    _stop: Callable[[], Deferred[None]] = attrs.field(repr=False)

    @property
    def discovery_url(self) -> str:
        """
        The provider's OpenID discovery document.
        """
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def stderr(self) -> str:
        """
        What the provider has written to stderr so far (its log).
        """
        return self._protocol.stderr.decode("utf-8", errors="replace")

    @property
    def running(self) -> bool:
        """
        Whether the process is still alive.
        """
        return not self._protocol.exited

    async def stop(self) -> None:
        """
        Kill the process and wait until it is gone (its port is then free for a
        restart: L{start_provider} with C{port=} and C{client_secret=}).
        """
        await self._stop()


def _node() -> str | None:
    return shutil.which("node") or shutil.which("nodejs")


async def start_provider(
    test: SynchronousTestCase,
    redirect_uris: list[str],
    backchannel_logout_uri: str | None = None,
    env: dict[str, str] | None = None,
    port: int = 0,
    client_secret: str | None = None,
) -> Provider:
    """
    Start tests/e2e/provider.mjs on C{port} (default: a free one) for C{test}; the
    process is killed and awaited at the test's cleanup (its stderr then goes to the
    test log). C{env} adds settings (e.g. C{E2E_OIDC_TTL_ACCESS_TOKEN}, see
    provider.mjs) and may override the ones made from the arguments. The client secret
    is a random one unless given. Fails C{test} (never skips it) when node or
    tests/e2e/node_modules is missing.
    """
    node = _node()
    if node is None:
        test.fail(f"node is not installed: {SETUP_HINT}")
    if not os.path.isdir(os.path.join(NODE_MODULES, "oidc-provider")):
        test.fail(f"tests/e2e/node_modules has no oidc-provider: {SETUP_HINT}")

    secret = client_secret or secrets.token_urlsafe(32)
    settings = {
        "E2E_OIDC_PORT": str(port),
        "E2E_OIDC_CLIENT_SECRET": secret,
        "E2E_OIDC_REDIRECT_URIS": " ".join(redirect_uris),
        "E2E_OIDC_BACKCHANNEL_LOGOUT_URI": backchannel_logout_uri or "",
        "E2E_OIDC_EXIT_ON_STDIN_EOF": "1",
        **(env or {}),
    }
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("E2E_OIDC_")},
        **settings,
    }
    protocol = _ProviderProtocol()
    process = reactor.spawnProcess(
        protocol, node, [node, PROVIDER_SCRIPT], env=environment, path=E2E_DIR
    )

    stopped: list[Deferred[None]] = []

    def stop() -> Deferred[None]:
        if not protocol.exited:
            with contextlib.suppress(ProcessExitedAlready):
                process.signalProcess("KILL")
        if not stopped:

            def logged(_: None) -> None:
                log.msg(f"OpenID provider stderr:\n{protocol.stderr.decode(errors='replace')}")

            protocol.ended.addCallback(logged)
            stopped.append(protocol.ended)
        ended: Deferred[None] = Deferred()

        def relay(result: object) -> object:
            ended.callback(None)
            return result

        stopped[0].addBoth(relay)
        return ended

    test.addCleanup(stop)
    try:
        info = await protocol.ready.addTimeout(READY_TIMEOUT, reactor)
    except Exception as e:
        test.fail(
            f"the OpenID provider (node {PROVIDER_SCRIPT}) did not start: {e}\n"
            f"its stderr:\n{protocol.stderr.decode(errors='replace')}"
        )
    return Provider(
        issuer=info["issuer"],
        port=int(info["port"]),
        client_id=CLIENT_ID,
        client_secret=settings["E2E_OIDC_CLIENT_SECRET"],
        redirect_uris=settings["E2E_OIDC_REDIRECT_URIS"].split(),
        backchannel_logout_uri=settings["E2E_OIDC_BACKCHANNEL_LOGOUT_URI"] or None,
        protocol=protocol,
        stop=stop,
    )


async def client_credentials_token(
    provider: Provider,
    client_id: str = SERVICE_CLIENT,
    resource: str = RESOURCE,
    client: CookieClient | None = None,
) -> str:
    """
    An access token for C{resource} from the provider's token endpoint through the
    client credentials grant (C{client_secret_basic}): the resource's JWT.
    """
    credentials = base64.b64encode(f"{client_id}:{provider.client_secret}".encode()).decode()
    reply = await (client or CookieClient()).request(
        "POST",
        f"{provider.issuer}/token",
        data={"grant_type": "client_credentials", "resource": resource},
        headers={"Authorization": f"Basic {credentials}"},
    )
    if reply.status != 200:
        raise ProviderError(f"client credentials grant refused: {reply.status} {reply.body!r}")
    token = reply.json()["access_token"]
    assert isinstance(token, str)
    return token


# -- forms -----------------------------------------------------------------------------


@attrs.define
class Form:
    """
    An HTML form: its id, action and method, the values of its fields (inputs that a
    browser would send, in document order) and its submit buttons as (name, value).
    """

    id: str | None
    action: str
    method: str
    fields: dict[str, str] = attrs.Factory(dict)
    buttons: list[tuple[str | None, str]] = attrs.Factory(list)

    def submission(self, **values: str) -> dict[str, str]:
        """
        The fields with C{values} filled in, plus the first submit button's name/value
        when it has a name (as a browser sends the button that was clicked).
        """
        data = {**self.fields, **values}
        if self.buttons:
            name, value = self.buttons[0]
            if name:
                data[name] = value
        return data


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._open: Form | None = None
        # Buttons outside their form (<button form="id">), matched once all forms are known.
        self._detached: list[tuple[str, str | None, str]] = []

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        attrs_ = {name: value or "" for name, value in attributes}
        if tag == "form":
            self._open = Form(
                id=attrs_.get("id"),
                action=attrs_.get("action", ""),
                method=attrs_.get("method", "get").lower(),
            )
            self.forms.append(self._open)
            return
        if tag not in ("input", "button"):
            return
        kind = attrs_.get("type", "submit" if tag == "button" else "text").lower()
        name = attrs_.get("name") or None
        value = attrs_.get("value", "")
        owner = attrs_.get("form")
        if kind in ("submit", "image"):
            if owner is not None:
                self._detached.append((owner, name, value))
            elif self._open is not None:
                self._open.buttons.append((name, value))
            return
        if kind in ("button", "reset", "file") or name is None:
            return
        if kind in ("checkbox", "radio") and "checked" not in attrs_:
            return
        target = self._open
        if owner is not None:
            target = next((f for f in self.forms if f.id == owner), None)
        if target is not None:
            target.fields[name] = value

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._open = None

    def close(self) -> None:
        super().close()
        for owner, name, value in self._detached:
            for form in self.forms:
                if form.id == owner:
                    form.buttons.append((name, value))


def parse_forms(html: bytes | str) -> list[Form]:
    """
    The forms of an HTML page, in document order.
    """
    parser = _FormParser()
    parser.feed(html.decode("utf-8", errors="replace") if isinstance(html, bytes) else html)
    parser.close()
    return parser.forms


# -- logging in ------------------------------------------------------------------------


def _is_authorization_request(url: str) -> bool:
    query = dict(parse_qsl(urlsplit(url).query))
    return "client_id" in query and "response_type" in query


def _excerpt(body: bytes, limit: int = 600) -> str:
    text = body.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "..."


async def login_through_forms(
    get: Fetch | None,
    post: Fetch | None,
    start_url: str,
    login: str,
    password: str = "pw",
    *,
    issuer: str | None = None,
    max_steps: int = 20,
) -> str:
    """
    Log C{login} in through the provider's development login and consent forms, starting
    at C{start_url}: an authorization URL, or any URL that redirects (maybe over several
    hops) to one. Redirects are followed until one leaves the provider, whose URL is
    returned: normally the client's redirect URI with C{code}, C{state} and C{iss}, or
    with C{error} when the provider refused the request.

    The provider is the origin of C{issuer} when given, else that of the first URL on
    the way that carries an authorization request (C{client_id} and C{response_type}).
    C{get} and C{post} (see L{Fetch}) make the requests: pass a L{CookieClient}'s (or a
    browser-like client's) to keep its cookies for what follows; when both are L{None}
    a fresh L{CookieClient} is used. Raises L{LoginError} when the provider answers with
    an error page or asks for the login again (an unknown user).
    """
    if get is None or post is None:
        if get is not None or post is not None:
            raise TypeError("pass both get and post, or neither")
        client = CookieClient()
        get, post = client.get, client.post
    provider = origin(issuer) if issuer is not None else None
    url, data = start_url, None
    logins = 0
    for _ in range(max_steps):
        if provider is None and _is_authorization_request(url):
            provider = origin(url)
        status, headers, body = await (get(url) if data is None else post(url, data))
        if status in REDIRECTS:
            location = headers.get("location")
            if not location:
                raise LoginError(f"{url} answered {status} without a Location")
            target = urljoin(url, location)
            if provider is not None and origin(target) != provider:
                return target
            if status not in (307, 308):
                data = None
            url = target
            continue
        if status != 200:
            raise LoginError(f"{url} answered {status}: {_excerpt(body)}")
        if provider is None or origin(url) != provider:
            raise LoginError(f"{url} is not the provider's and answered 200: {_excerpt(body)}")
        forms = [f for f in parse_forms(body) if f.method == "post"]
        if not forms:
            raise LoginError(f"no form at {url}: {_excerpt(body)}")
        form = next((f for f in forms if "prompt" in f.fields), forms[0])
        action = urljoin(url, form.action or url)
        if origin(action) != provider:
            raise LoginError(f"the form at {url} posts to {action}, outside the provider")
        values = {}
        if "login" in form.fields:
            logins += 1
            if logins > 1:
                raise LoginError(f"the provider asks for the login again: {login!r} refused")
            values["login"] = login
            if "password" in form.fields:
                values["password"] = password
        url, data = action, form.submission(**values)
    raise LoginError(f"still at the provider after {max_steps} steps (last: {url})")
