"""
The security layer: static security response headers and cross-origin (CSRF) protection.

It covers every response, the raw auth endpoints included; a route cannot opt out.
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.config.model import SecuritySpec
from edgegw.edge.csrf import CrossOriginProtection
from edgegw.stream.response_headers import ResponseHeaders, encode_fixed


def security_headers(spec: SecuritySpec) -> tuple[tuple[bytes, bytes], ...]:
    """
    The response headers to set on every response, computed once at load.

    An empty string omits a header; Content-Security-Policy is sent only when set.
    """
    headers = spec.headers
    # Replaces Twisted's "TwistedWeb/<version>": the exact server version is nobody's
    # business but the operator's.
    out: list[tuple[bytes, bytes]] = [(b"Server", b"edgegw")]
    for name, value in (
        (b"X-Frame-Options", headers.frame_options),
        (b"X-Content-Type-Options", headers.content_type_options),
        (b"Referrer-Policy", headers.referrer_policy),
        (b"Content-Security-Policy", headers.content_security_policy or ""),
    ):
        if value:
            out.append((name, value.encode("latin-1")))
    hsts = headers.hsts
    if hsts.enabled:
        value = f"max-age={hsts.max_age}"
        if hsts.include_subdomains:
            value += "; includeSubDomains"
        if hsts.preload:
            value += "; preload"
        out.append((b"Strict-Transport-Security", value.encode("ascii")))
    return tuple(out)


class SecurityLayer:
    """
    Applies the security headers and the CSRF check to one request.

    @ivar encoded_slashes: C{security.encodedSlashes}, for the edge's path check (which
        runs before this layer, so that CSRF bypass patterns match the path the routes
        see).
    """

    def __init__(self, spec: SecuritySpec, csrf_exempt: frozenset[str] = frozenset()) -> None:
        """
        @param csrf_exempt: Exact paths whose POSTs the CSRF check never refuses: the
            gateway's server-to-server endpoints (back-channel logout), which carry no
            ambient credential and authenticate what they are sent.
        """
        self.csrf_exempt = csrf_exempt
        self.encoded_slashes = spec.encoded_slashes
        self.headers = security_headers(spec)
        self.fixed = encode_fixed(self.headers)
        csrf = spec.csrf
        self.csrf: CrossOriginProtection | None = (
            CrossOriginProtection(csrf.trusted_origins, csrf.bypass_patterns)
            if csrf.enabled
            else None
        )

    def apply(self, request: Request, method: str, host: str, path: str) -> bytes | None:
        """
        Set the security headers (unless the request's headers carry them as their
        pre-encoded L{fixed} block); return the 403 body when CSRF protection denies.
        """
        response_headers = request.responseHeaders
        if not isinstance(response_headers, ResponseHeaders):
            for name, value in self.headers:
                response_headers.setRawHeaders(name, [value])
        csrf = self.csrf
        if csrf is None or method in ("GET", "HEAD", "OPTIONS") or path in self.csrf_exempt:
            return None
        request_headers = request.requestHeaders
        site = request_headers.getRawHeaders(b"sec-fetch-site")
        origin = request_headers.getRawHeaders(b"origin")
        reason = csrf.check(
            method,
            host,
            path,
            site[0].decode("latin-1") if site else None,
            origin[0].decode("latin-1") if origin else None,
        )
        if reason is None:
            return None
        return reason.encode("utf-8") + b"\n"
