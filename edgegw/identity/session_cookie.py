"""
The gateway session: a sealed, possibly chunked cookie that holds who the caller is.

The record is compact JSON sealed with L{SESSION_AAD}. It is bound to the browser by a
fingerprint of configured request headers, checked on every read. Reading runs on every
request of an app route, so everything that does not depend on the request is prepared
once, at construction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.web.server import Request

from edgegw.config.model import SessionSpec
from edgegw.identity.cookies import (
    HOST_PREFIX,
    MAX_CHUNK,
    AmbiguityLog,
    AmbiguousCookieError,
    CookieName,
    carried_chunks,
    clear_chunked,
    clear_cookie,
    cookie_values,
    read_unambiguous,
    write_chunked,
)
from edgegw.identity.login_state import login_cookie_prefix
from edgegw.identity.principal import ClaimValue, Principal
from edgegw.identity.sealing import SESSION_AAD, Sealer, open_record

_VERSION = 1
_FINGERPRINT_SIZE = hashlib.sha256().digest_size

MAX_OPENED = 4096
"""Opened session cookies kept per gateway (the sealed value -> its record)."""

MAX_OPENED_SIZE = 4096
"""The largest sealed value kept opened (a one-cookie session, in practice)."""

MAX_SESSION_CHUNKS = 3
"""
The most cookies one session may take (about 11 KB sealed): with the pending login-state
cookies and the usual request headers it stays inside the gateway's 16 KiB header budget.
"""


class SessionTooLargeError(ValueError):
    """
    A session record too large to be carried in the browser's cookies.
    """


@attrs.frozen
class SessionRecord:
    """
    What the session cookie holds.

    @ivar subject: The principal subject; never empty.
    @ivar passport: The allowlisted claims.
    @ivar groups: The rendered group names.
    @ivar issued_at: When the session began, unix seconds.
    @ivar expires_at: When the session ends, unix seconds.
    @ivar fingerprint: SHA-256 of the configured request headers at login.
    @ivar access_token: The IdP access token, when kept.
    @ivar access_token_expires_at: When the access token expires, unix seconds.
    @ivar refresh_token: The IdP refresh token (server-side sessions only).
    @ivar id_token: The latest id_token (the login's, or a refresh's), the hint of a
        logout at the IdP: with server-side sessions always, in cookie mode only while
        the sealed session still fits in one cookie with it.
    @ivar idp_session: The id_token's C{sid} claim, the IdP's own session id that a
        back-channel logout may name (server-side sessions only).
    """

    subject: str
    passport: Mapping[str, ClaimValue]
    groups: tuple[str, ...]
    issued_at: int
    expires_at: int
    fingerprint: bytes = attrs.field(repr=False)
    access_token: str | None = attrs.field(default=None, repr=False)
    access_token_expires_at: int | None = None
    refresh_token: str | None = attrs.field(default=None, repr=False)
    id_token: str | None = attrs.field(default=None, repr=False)
    idp_session: str | None = None
    _principal: Principal | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def principal(self) -> Principal:
        """
        The caller this session authenticates (one object per record: what projection
        renders for it is kept on it, see L{Principal.memo}).
        """
        principal = self._principal
        if principal is None:
            principal = Principal(self.subject, self.passport, self.groups, self.access_token)
            object.__setattr__(self, "_principal", principal)
        return principal


class Fingerprint:
    """
    The fingerprint of a request: SHA-256 over C{name=value\\n} for each configured header
    in order, the name lowercased and the value the header's lines joined by C{, } (empty
    when absent).
    """

    def __init__(self, header_names: Sequence[str]) -> None:
        """
        @param header_names: The request headers to hash, in order.
        """
        lowered = [name.lower().encode("ascii") for name in header_names]
        self._headers = tuple((name, name + b"=") for name in lowered)

    def of(self, request: Request) -> bytes:
        """
        The fingerprint of C{request}.
        """
        digest = hashlib.sha256()
        headers = request.requestHeaders
        for name, prefix in self._headers:
            digest.update(prefix)
            values = headers.getRawHeaders(name)
            if values:
                digest.update(b", ".join(values))
            digest.update(b"\n")
        return digest.digest()


def fingerprint_of(request: Request, header_names: Sequence[str]) -> bytes:
    """
    The fingerprint of C{request} over C{header_names} (see L{Fingerprint}).
    """
    return Fingerprint(header_names).of(request)


def _is_claim(value: object) -> bool:
    if value is None or isinstance(value, str | int | float):
        return True
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _int_or_none(value: object) -> bool:
    return value is None or type(value) is int


def encode_record(record: SessionRecord) -> bytes:
    """
    The record as compact JSON (what is sealed, in a cookie or in the state store).
    """
    data: dict[str, Any] = {
        "v": _VERSION,
        "s": record.subject,
        "p": record.passport,
        "g": record.groups,
        "i": record.issued_at,
        "e": record.expires_at,
        "f": record.fingerprint.hex(),
    }
    if record.access_token is not None:
        data["t"] = record.access_token
    if record.access_token_expires_at is not None:
        data["x"] = record.access_token_expires_at
    for key, value in (
        ("r", record.refresh_token),
        ("d", record.id_token),
        ("o", record.idp_session),
    ):
        if value is not None:
            data[key] = value
    return json.dumps(data, separators=(",", ":")).encode("ascii")


def decode_record(plaintext: bytes) -> SessionRecord | None:
    """
    The record L{encode_record} made, or L{None} for anything else (never raises).
    """
    data = open_record(plaintext, _VERSION)
    if data is None:
        return None
    subject, passport, groups = data.get("s"), data.get("p"), data.get("g")
    issued_at, expires_at, fingerprint = data.get("i"), data.get("e"), data.get("f")
    token, token_expires_at = data.get("t"), data.get("x")
    refresh, id_token, idp_session = data.get("r"), data.get("d"), data.get("o")
    if not (
        isinstance(subject, str)
        and subject
        and isinstance(passport, dict)
        and isinstance(groups, list)
        and type(issued_at) is int
        and type(expires_at) is int
        and isinstance(fingerprint, str)
        and len(fingerprint) == 2 * _FINGERPRINT_SIZE
        and (token is None or isinstance(token, str))
        and _int_or_none(token_expires_at)
        and all(v is None or isinstance(v, str) for v in (refresh, id_token, idp_session))
        and all(isinstance(group, str) for group in groups)
        and all(_is_claim(value) for value in passport.values())
    ):
        return None
    try:
        digest = bytes.fromhex(fingerprint)
    except ValueError:
        return None
    return SessionRecord(
        subject,
        passport,
        tuple(groups),
        issued_at,
        expires_at,
        digest,
        token,
        token_expires_at,
        refresh,
        id_token,
        idp_session,
    )


class SessionCookie:
    """
    Reads, writes and clears the session cookie of one C{Gateway.spec.session}.

    On a secure request the cookie is C{__Host-<cookieName>} (its chunks
    C{__Host-<cookieName>.<n>}) unless C{session.hostPrefix} is false, and the
    unprefixed name is not read there: it is exactly what a page on a sibling subdomain
    can set for the parent domain. A cookie carried ambiguously (twice, or as a single
    cookie and as chunks) is no session (L{read_unambiguous}), and is logged.

    @ivar cookie_name: The session cookie's name as configured.
    @ivar host_prefix: C{session.hostPrefix}.
    @ivar sealer: The sealer over the session key (the login-state cookies share it).
    """

    def __init__(self, spec: SessionSpec, clock: IReactorTime) -> None:
        """
        @param spec: The session block.
        @param clock: The time source.
        @raise ValueError: The key is not 32 bytes.
        """
        self.cookie_name = spec.cookie_name
        self.host_prefix = spec.host_prefix
        self.sealer = Sealer(spec.key)
        self._clock = clock
        self._ttl = int(spec.ttl)
        self._name = spec.cookie_name.encode("ascii")
        self._names = CookieName.of(self._name, spec.host_prefix)
        self._chunk_prefix = self._name + b"."
        self._login_prefix = login_cookie_prefix(spec.cookie_name).encode("ascii")
        self._fingerprint = Fingerprint(spec.fingerprint_headers)
        self._opened: dict[bytes, SessionRecord] = {}
        self._ambiguity = AmbiguityLog(clock, "session")

    def sealed_value(self, request: Request) -> bytes | None:
        """
        The sealed value the request's session cookie carries, under the name for this
        request (L{CookieName.for_request}), single or chunked.

        @return: The value; L{None} when there is none, or when it is ambiguous (logged).
        """
        if not request.received_cookies:
            return None
        name, _ = self._names.for_request(request)
        try:
            return read_unambiguous(request, name)
        except AmbiguousCookieError as e:
            self._ambiguity.ambiguous(e.name)
            return None

    def carried_values(self, request: Request) -> list[bytes]:
        """
        Every value the request carries for the single (unchunked) session cookie
        under the name for this request: all of them when it is carried more than once
        (a logout ends every session they name: the requester holds them all).
        """
        if not request.received_cookies:
            return []
        name, _ = self._names.for_request(request)
        return cookie_values(request, name)

    def carried(self, request: Request) -> bool:
        """
        Whether the request carries the session cookie (single, or its first chunk)
        under the name for this request, whatever its value.
        """
        cookies = request.received_cookies
        if not cookies:
            return False
        name, _ = self._names.for_request(request)
        return name in cookies or name + b".0" in cookies

    def write_value(self, request: Request, value: str, max_age: int) -> None:
        """
        Set the session cookie to C{value} (chunked when it must be) under the name for
        this request; the cookies of the other form and stale chunks are cleared, and on
        a secure request the unprefixed ones (of a gateway before the C{__Host-} prefix)
        too.
        """
        name, secure = self._names.for_request(request)
        write_chunked(request, name, value, max_age=max_age, secure=secure)
        if secure:
            self._clear_unprefixed(request)

    def _clear_unprefixed(self, request: Request) -> None:
        if not self._names.prefixed:
            return
        # Only the host-only cookie of the gateway's own, set before it used the prefix,
        # is gone with this; one tossed for the parent domain stays, and is ignored.
        cookies = request.received_cookies
        plain = self._names.plain
        if plain in cookies:
            clear_cookie(request, plain, secure=True)
        for chunk in sorted(carried_chunks(cookies, plain)):
            clear_cookie(request, chunk, secure=True)

    def read(self, request: Request) -> SessionRecord | None:
        """
        The session the request carries.

        @return: The record, or L{None} when the cookie is missing, incomplete, cannot be
            opened or decoded, is of another version, has expired, or was issued to a
            browser with another fingerprint. Never raises.
        """
        sealed = self.sealed_value(request)
        if sealed is None:
            return None
        opened = self._opened
        record = opened.get(sealed)
        if record is None:
            plaintext = self.sealer.unseal(sealed, SESSION_AAD)
            if plaintext is None:
                return None
            record = decode_record(plaintext)
            if record is None:
                return None
            # A browser sends the same sealed value with every request: open it once.
            # Only authentic values get here; expiry and fingerprint are checked below
            # on every request all the same. Large sessions are not kept (they would
            # make the memory bound a matter of what IdP accounts carry).
            if len(sealed) <= MAX_OPENED_SIZE:
                if len(opened) >= MAX_OPENED:
                    opened.clear()
                opened[sealed] = record
        if record.expires_at <= self._clock.seconds():
            return None
        if not hmac.compare_digest(record.fingerprint, self._fingerprint.of(request)):
            return None
        return record

    def write(self, request: Request, record: SessionRecord) -> None:
        """
        Set the session cookie to C{record}, living until the record expires.

        @raise SessionTooLargeError: The sealed record needs more than
            L{MAX_SESSION_CHUNKS} cookies: the browser would send them back with every
            request past the gateway's request-header budget (a 431 for everything,
            the logout included, for the session's whole life).
        """
        sealed = self.sealer.seal(encode_record(record), SESSION_AAD)
        if len(sealed) > MAX_SESSION_CHUNKS * MAX_CHUNK:
            raise SessionTooLargeError(
                f"the sealed session is {len(sealed)} characters, over "
                f"{MAX_SESSION_CHUNKS} cookies of {MAX_CHUNK}"
            )
        max_age = max(0, record.expires_at - int(self._clock.seconds()))
        self.write_value(request, sealed, max_age)

    def clear(self, request: Request) -> None:
        """
        Clear the session cookie and every chunk of it the request carried, under the
        name for this request (and, on a secure request, the unprefixed ones it carried).
        """
        name, secure = self._names.for_request(request)
        clear_chunked(request, name, secure=secure)
        if secure:
            self._clear_unprefixed(request)

    def new_record(
        self,
        request: Request,
        subject: str,
        passport: Mapping[str, ClaimValue],
        groups: Sequence[str],
        access_token: str | None = None,
        access_token_expires_at: int | None = None,
        *,
        refresh_token: str | None = None,
        id_token: str | None = None,
        idp_session: str | None = None,
    ) -> SessionRecord:
        """
        A session beginning now, for the browser that sent C{request}, lasting the
        configured ttl.
        """
        now = int(self._clock.seconds())
        return SessionRecord(
            subject,
            passport,
            tuple(groups),
            now,
            now + self._ttl,
            self._fingerprint.of(request),
            access_token,
            access_token_expires_at,
            refresh_token,
            id_token,
            idp_session,
        )

    @property
    def name(self) -> bytes:
        """
        The session cookie's name as configured, as bytes.
        """
        return self._name

    @property
    def names(self) -> CookieName:
        """
        The session cookie's names, plain and on secure requests.
        """
        return self._names

    def fingerprint(self, request: Request) -> bytes:
        """
        The fingerprint of C{request} over the configured headers.
        """
        return self._fingerprint.of(request)

    def is_gateway_cookie(self, name: bytes) -> bool:
        """
        Whether a cookie name is the gateway's own: the session cookie, one of its chunks
        (C{<name>.<digits>}), or a login-state cookie, each with or without the
        C{__Host-} prefix. These never reach a backend.
        """
        if name.startswith(HOST_PREFIX) and not self._name.startswith(HOST_PREFIX):
            name = name[len(HOST_PREFIX) :]
        if name == self._name:
            return True
        if not name.startswith(self._chunk_prefix):
            return False
        return name[len(self._chunk_prefix) :].isdigit() or name.startswith(self._login_prefix)
