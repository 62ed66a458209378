"""
Cookie plumbing for the gateway's own cookies: reading, setting, clearing and chunking.

Every cookie the gateway sets is C{Path=/; HttpOnly; SameSite=Lax}, and C{Secure} when
the browser reached the gateway over https. A value longer than one cookie can hold is
split into C{<name>.0}, C{<name>.1}, ... and read back as the contiguous run from C{.0}.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

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
