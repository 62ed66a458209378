"""
Cookie plumbing for the gateway's own cookies: reading, setting, clearing and chunking.

Every cookie the gateway sets is C{Path=/; HttpOnly; SameSite=Lax} (never a C{Domain}),
and C{Secure} when the browser reached the gateway over https; its name then carries the
C{__Host-} prefix (L{CookieName}), which a browser accepts only from the host itself: a
page on a sibling subdomain cannot set one for the parent domain ("cookie tossing"). A
value longer than one cookie can hold is split into C{<name>.0}, C{<name>.1}, ... and
read back as the contiguous run from C{.0}.

A cookie of the gateway's that a request carries more than once (or as a single cookie
and as chunks) is ambiguous, as a tossed one beside the browser's own would be: no value
is read from it (L{read_unambiguous}).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.server import Request

MAX_CHUNK = 3800
MAX_CHUNKS = 64

_SET_COOKIE = b"Set-Cookie"
_FORWARDED_PROTO = b"X-Forwarded-Proto"
_ATTRIBUTES = b"; Path=/; Max-Age=%d; HttpOnly; SameSite=Lax"
_SECURE = b"; Secure"
# RFC 6265 cookie-name (an RFC 7230 token). A name that the browser sent and that is not
# one is never written back into a Set-Cookie header.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_WHITESPACE = b" \t"
_COOKIE = b"Cookie"
_NO_NAMES: frozenset[bytes] = frozenset()

HOST_PREFIX = b"__Host-"
"""
The prefix of the gateway's cookie names on secure requests (RFC 6265bis, 4.1.3.2): a
browser stores such a cookie only when it is C{Secure}, C{Path=/}, without C{Domain}, set
by a secure origin.
"""

AMBIGUITY_LOG_INTERVAL = 10.0
"""The shortest time between two log lines about ambiguous cookies (a flood of tossed
cookies must not flood the log); the ones in between are counted in the next."""

_log = Logger(namespace="edgegw.identity")


def is_https(request: Request) -> bool:
    """
    Whether the browser reached the gateway over https: a TLS transport, or a trusted
    proxy's C{X-Forwarded-Proto} whose first item is C{https}.

    The forwarded layer has already removed C{X-Forwarded-Proto} when the peer is not a
    trusted proxy.
    """
    if request.isSecure():
        return True
    proto = request.requestHeaders.getRawHeaders(_FORWARDED_PROTO)
    if not proto:
        return False
    return proto[0].split(b",", 1)[0].strip(_WHITESPACE).lower() == b"https"


def _name_bytes(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("ascii")


@attrs.frozen
class CookieName:
    """
    A cookie name of the gateway's (or a prefix of names: the login-state cookies) as
    configured, and as used on a secure request.

    @ivar plain: The name as configured: used over plain http, and on every request
        with C{session.hostPrefix: false}.
    @ivar secure: The name on a secure request (L{is_https}): C{__Host-} and the plain
        name, unless the prefix is off or the configured name already has it.
    """

    plain: bytes
    secure: bytes

    @classmethod
    def of(cls, name: str | bytes, host_prefix: bool) -> CookieName:
        """
        The names of C{name}, the secure one with the C{__Host-} prefix when
        C{host_prefix}.
        """
        plain = _name_bytes(name)
        prefixed = host_prefix and not plain.startswith(HOST_PREFIX)
        return cls(plain, HOST_PREFIX + plain if prefixed else plain)

    @property
    def prefixed(self) -> bool:
        """
        Whether the secure name differs from the plain one.
        """
        return self.secure != self.plain

    def for_request(self, request: Request) -> tuple[bytes, bool]:
        """
        The name C{request} carries the cookie under, and whether the request is secure
        (the cookie's C{Secure} attribute).
        """
        if is_https(request):
            return self.secure, True
        return self.plain, False


class AmbiguousCookieError(Exception):
    """
    The request carried one of the gateway's cookies more than once, or both as a
    single cookie and as chunks: which is the browser's own is unknown.

    @ivar name: The cookie's name (the single cookie's for a chunked value).
    """

    def __init__(self, name: bytes) -> None:
        super().__init__(name)
        self.name = name


def duplicated_names(request: Request) -> frozenset[bytes]:
    """
    The cookie names that C{request}'s C{Cookie} header lines carry more than once, as
    Twisted parses them into C{received_cookies} (where the last one wins).

    A request whose every C{;}-separated pair made its own entry in C{received_cookies}
    carries no name twice: that is all it costs (a count of C{;}), and the lines are
    parsed again only otherwise.
    """
    lines = request.requestHeaders.getRawHeaders(_COOKIE)
    if not lines:
        return _NO_NAMES
    pairs = 0
    for line in lines:
        pairs += line.count(b";") + 1
    if pairs == len(request.received_cookies):
        return _NO_NAMES
    seen: set[bytes] = set()
    twice: set[bytes] = set()
    for line in lines:
        if not line:
            continue
        for pair in line.split(b";"):
            # As Twisted's parseCookies: leading whitespace off, the name up to "=".
            name, equals, _ = pair.lstrip().partition(b"=")
            if not equals:
                continue
            if name in seen:
                twice.add(name)
            else:
                seen.add(name)
    return frozenset(twice) if twice else _NO_NAMES


def cookie_values(request: Request, name: bytes) -> list[bytes]:
    """
    Every value the request's C{Cookie} header lines carry for C{name}, in order (one,
    unless the cookie is carried more than once), parsed as Twisted parses them.
    """
    if name not in duplicated_names(request):
        value = request.received_cookies.get(name)
        return [] if value is None else [value]
    values = []
    for line in request.requestHeaders.getRawHeaders(_COOKIE) or ():
        for pair in line.split(b";"):
            carried, equals, value = pair.lstrip().partition(b"=")
            if equals and carried == name:
                values.append(value)
    return values


def _is_chunk_of(carried: bytes, prefix: bytes) -> bool:
    return carried.startswith(prefix) and carried[len(prefix) :].isdigit()


def read_unambiguous(request: Request, name: bytes) -> bytes | None:
    """
    L{read_chunked} for the request's cookie C{name}, refusing an ambiguous one.

    @return: The value, or L{None} when neither form is present.
    @raise AmbiguousCookieError: C{name}, or one of its chunks C{<name>.<digits>}, is
        carried more than once, or C{name} and C{<name>.0} are both carried.
    """
    cookies = request.received_cookies
    value = read_chunked(cookies, name)
    if value is None:
        return None
    duplicated = duplicated_names(request)
    if duplicated:
        prefix = name + b"."
        for carried in duplicated:
            if carried == name or _is_chunk_of(carried, prefix):
                raise AmbiguousCookieError(name)
    if name in cookies and name + b".0" in cookies:
        raise AmbiguousCookieError(name)
    return value


class AmbiguityLog:
    """
    Logs ambiguous cookies (L{AmbiguousCookieError}) at most once per
    L{AMBIGUITY_LOG_INTERVAL}, saying how many were not logged since.
    """

    def __init__(self, clock: IReactorTime, what: str) -> None:
        """
        @param clock: The time source.
        @param what: What the cookie is, for the log line (C{"session"}).
        """
        self._clock = clock
        self._what = what
        self._next = 0.0
        self._unlogged = 0

    def ambiguous(self, name: bytes) -> None:
        """
        Note one request that carried the cookie C{name} ambiguously.
        """
        now = self._clock.seconds()
        if now < self._next:
            self._unlogged += 1
            return
        self._next = now + AMBIGUITY_LOG_INTERVAL
        more, self._unlogged = self._unlogged, 0
        _log.warn(
            "ambiguous {what} cookie: {name} came more than once in one request (a cookie"
            " tossed from a sibling domain?); none of them was used"
            " ({more} more such requests since the last report)",
            what=self._what,
            name=name.decode("latin-1"),
            more=more,
        )


def set_cookie(
    request: Request, name: str | bytes, value: str, *, max_age: int, secure: bool
) -> None:
    """
    Add a C{Set-Cookie} header line (other C{Set-Cookie} lines are kept):
    C{name=value; Path=/; Max-Age=N; HttpOnly; SameSite=Lax}, then C{; Secure} when
    C{secure}.
    """
    line = _name_bytes(name) + b"=" + value.encode("ascii") + _ATTRIBUTES % max_age
    if secure:
        line += _SECURE
    request.responseHeaders.addRawHeader(_SET_COOKIE, line)


def clear_cookie(request: Request, name: str | bytes, *, secure: bool) -> None:
    """
    Tell the browser to drop the cookie C{name}: an empty value with C{Max-Age=0} and the
    attributes of L{set_cookie}.
    """
    set_cookie(request, name, "", max_age=0, secure=secure)


def carried_chunks(cookies: Mapping[bytes, bytes], name: str | bytes) -> Iterator[bytes]:
    """
    The names C{<name>.<digits>} among the cookies the request carried.
    """
    prefix = _name_bytes(name) + b"."
    for carried in cookies:
        if carried.startswith(prefix) and carried[len(prefix) :].isdigit():
            yield carried


def read_chunked(cookies: Mapping[bytes, bytes], name: str | bytes) -> bytes | None:
    """
    A possibly chunked cookie value: the cookie C{name} itself when present, else the
    contiguous run C{<name>.0}, C{<name>.1}, ... (at most L{MAX_CHUNKS}) concatenated.

    @return: The value, or L{None} when neither form is present.
    """
    plain = _name_bytes(name)
    single = cookies.get(plain)
    if single is not None:
        return single
    first = cookies.get(plain + b".0")
    if first is None:
        return None
    parts = [first]
    prefix = plain + b"."
    for index in range(1, MAX_CHUNKS):
        part = cookies.get(prefix + b"%d" % index)
        if part is None:
            break
        parts.append(part)
    return b"".join(parts)


def write_chunked(
    request: Request, name: str | bytes, value: str, *, max_age: int, secure: bool
) -> None:
    """
    Set a value that may be too long for one cookie: the single cookie C{name} when it
    fits in L{MAX_CHUNK} characters, else the chunks C{<name>.0..N-1}. The cookies of the
    other form, and stale higher chunks, that the browser sent are cleared.

    @raise ValueError: The value needs more than L{MAX_CHUNKS} chunks; it could never be
        read back.
    """
    plain = _name_bytes(name)
    cookies = request.received_cookies
    if len(value) <= MAX_CHUNK:
        set_cookie(request, plain, value, max_age=max_age, secure=secure)
        written: set[bytes] = set()
    else:
        count = -(-len(value) // MAX_CHUNK)
        if count > MAX_CHUNKS:
            raise ValueError(f"a cookie value of {len(value)} characters is too long")
        prefix = plain + b"."
        written = {prefix + b"%d" % index for index in range(count)}
        for index in range(count):
            chunk = value[index * MAX_CHUNK : (index + 1) * MAX_CHUNK]
            set_cookie(request, prefix + b"%d" % index, chunk, max_age=max_age, secure=secure)
        if plain in cookies:
            clear_cookie(request, plain, secure=secure)
    for stale in sorted(carried_chunks(cookies, plain)):
        if stale not in written:
            clear_cookie(request, stale, secure=secure)


def clear_chunked(request: Request, name: str | bytes, *, secure: bool) -> None:
    """
    Clear a possibly chunked cookie: C{name} itself and every C{<name>.<digits>} the
    request carried.
    """
    plain = _name_bytes(name)
    clear_cookie(request, plain, secure=secure)
    for chunk in sorted(carried_chunks(request.received_cookies, plain)):
        clear_cookie(request, chunk, secure=secure)


def is_token(name: bytes) -> bool:
    """
    Whether C{name} is a valid cookie name, safe to write back in a C{Set-Cookie} line.
    """
    return _TOKEN.fullmatch(name) is not None


def without_cookies(values: list[bytes], drop: Callable[[bytes], bool]) -> bytes | None:
    """
    Rebuild a forwarded C{Cookie} header without the gateway's own cookies.

    @param values: The raw inbound C{Cookie} header lines.
    @param drop: Says, for a cookie name (surrounding whitespace removed), whether the
        pair is left out.
    @return: The other pairs, byte for byte and in order, joined by C{; }; L{None} when
        none is left.
    """
    kept = []
    for line in values:
        for pair in line.split(b";"):
            pair = pair.strip(_WHITESPACE)
            if not pair:
                continue
            if not drop(pair.split(b"=", 1)[0].rstrip(_WHITESPACE)):
                kept.append(pair)
    return b"; ".join(kept) if kept else None


def set_cookie_name(value: bytes) -> bytes:
    """
    The name a browser gives the cookie of a C{Set-Cookie} value: up to the first C{=},
    trimmed; for a nameless cookie (C{=gw_session=x}, or no C{=} at all), which browsers
    send back as its bare value (RFC 6265bis), the name that value would be read as.
    """
    pair = value.partition(b";")[0]
    name, equals, rest = pair.partition(b"=")
    name = name.strip(b" \t")
    if name and equals:
        return name
    bare = rest if equals else pair
    return bare.partition(b"=")[0].strip(b" \t")
