"""
The projection stage: strip client-sent identity headers, inject the trusted ones.

Inbound C{X-User-*} headers are removed on every route, always, so that a client can never
pose as someone to a backend. When a principal is present, the stage then sets the
subject header, the groups header and one header per projected claim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from twisted.logger import Logger

from edgegw.header_names import USER_PREFIX, canonical_name
from edgegw.identity.principal import ClaimValue, Principal
from edgegw.seam import RAW_DICT_WRITABLE, raw_fields
from edgegw.terminal.exchange import Exchange, Handler, Stage

SUBJECT_HEADER = b"X-User-Id"
# Kept readable in header values; everything else that could split a list or a header
# (",", CR, LF, "%", non-ASCII) is percent-encoded.
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in ",%")


_CLAIM_HEADERS: dict[str, bytes] = {}
# RFC 9110 token: what a header name may be made of.
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_log = Logger(namespace="edgegw.projection")


# Setting the projected headers straight into the request's header dict (names in
# Twisted's canonical form and values already safe: see encode_value) saves
# Headers.setRawHeaders' per-value sanitising, about a microsecond a request; a Twisted
# whose Headers is built otherwise gets setRawHeaders.
_DIRECT = RAW_DICT_WRITABLE


def header_case(name: str) -> str:
    """
    C{given_name} -> C{Given-Name}: C{_} becomes C{-} and each word is capitalised.
    """
    return "-".join(
        part[:1].upper() + part[1:].lower() for part in name.replace("_", "-").split("-")
    )


def claim_header(claim: str) -> bytes:
    """
    The default header for a passport claim: C{X-User-} plus the claim in header case.
    """
    header = _CLAIM_HEADERS.get(claim)
    if header is None:
        header = ("X-User-" + header_case(claim)).encode("ascii", "replace")
        if len(_CLAIM_HEADERS) < 1024:  # claim names come from the IdP: bound the memo
            _CLAIM_HEADERS[claim] = header
    return header


def encode_value(value: str) -> str:
    """
    One header list item: printable ASCII stays, C{,}, C{%}, CR, LF and non-ASCII are
    percent-encoded.
    """
    if value.isascii() and value.isprintable() and "," not in value and "%" not in value:
        return value  # the common case: nothing to encode
    return quote(value, safe=_SAFE)


def render_claim(value: ClaimValue) -> str | None:
    """
    A claim's header value, or L{None} when it has none (null).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(encode_value(str(item)) for item in value)
    return encode_value(str(value))


def strip_user_headers(exchange: Exchange, projected: frozenset[bytes] = frozenset()) -> None:
    """
    Remove every inbound C{X-User-*} header, and every header named in C{projected}
    (lowercased identity header names outside C{X-User-*} that some route projects).
    """
    headers = exchange.request.requestHeaders
    # Twisted's dict of canonical names itself, not its generator (-0.2 µs).
    names = raw_fields(headers) if _DIRECT else [name for name, _ in headers.getAllRawHeaders()]
    doomed = []
    for name in names:
        lower = name.lower()
        if lower.startswith(USER_PREFIX) or lower in projected:
            doomed.append(name)
    for name in doomed:
        headers.removeHeader(name)


def projection(
    groups_header: bytes,
    claims: Mapping[str, str] | None,
    projected: frozenset[bytes] = frozenset(),
) -> Stage:
    """
    Make the projection stage for one route.

    @param groups_header: The groups header name (already resolved from the route's
        access block or C{identity.groups.as}).
    @param claims: The explicit claim-to-header map, or L{None} for every passport claim
        under its default header name.
    @param projected: Lowercased identity header names outside C{X-User-*} that any
        route projects: stripped from every inbound request, like C{X-User-*}.
    """
    explicit = (
        tuple((claim, header.encode("ascii")) for claim, header in claims.items())
        if claims is not None
        else None
    )

    # A claim never takes over the subject or groups header (an IdP's "id" claim, or an
    # asserted one, would otherwise replace X-User-Id after it is set).
    reserved = frozenset({SUBJECT_HEADER.lower(), groups_header.lower()})

    def render(principal: Principal) -> list[tuple[bytes, bytes]]:
        headers = [(SUBJECT_HEADER, encode_value(principal.subject).encode("ascii"))]
        if principal.groups:
            value = ",".join(encode_value(group) for group in principal.groups)
            headers.append((groups_header, value.encode("ascii")))
        passport = principal.passport
        pairs = (
            explicit
            if explicit is not None
            else tuple((claim, claim_header(claim)) for claim in passport)
        )
        for claim, header in pairs:
            rendered = render_claim(passport.get(claim))
            if rendered is None:
                continue
            if header.lower() in reserved:
                _log.warn(
                    "claim {claim!r} would overwrite the {header} header; not projected",
                    claim=claim,
                    header=header.decode("ascii", "replace"),
                )
                continue
            if not _HEADER_NAME.fullmatch(header):
                # A claim whose name cannot be a header name (a namespaced URL claim,
                # non-ASCII): left out, not a failed request; an explicit
                # projection.session.claims mapping can give it a name.
                _log.warn("claim {claim!r} has no usable header name; not projected", claim=claim)
                continue
            headers.append((header, rendered.encode("ascii")))
        if _DIRECT:
            return [(canonical_name(name), value) for name, value in headers]
        return headers

    # The key in Principal.memo: one session's headers are rendered once per projection
    # shape (routes that project alike share it), then only set on each request.
    key = ("projection", groups_header, explicit)

    async def project(exchange: Exchange, next: Handler) -> None:
        strip_user_headers(exchange, projected)
        principal = exchange.principal
        if principal is not None:
            headers = principal.memo.get(key)
            if headers is None:
                headers = principal.memo[key] = render(principal)
            if _DIRECT:
                raw = raw_fields(exchange.request.requestHeaders)
                for name, value in headers:
                    raw[name] = [value]
            else:
                set_header = exchange.request.requestHeaders.setRawHeaders
                for name, value in headers:
                    set_header(name, [value])
        await next(exchange)

    return project


def groups_header_name(route_header: str | None, groups_as: str) -> bytes:
    """
    The groups header for a route: its own C{projection.session.groups.header}, else
    C{X-User-} plus C{identity.groups.as} in header case.
    """
    if route_header:
        return route_header.encode("ascii")
    return ("X-User-" + header_case(groups_as)).encode("ascii")
