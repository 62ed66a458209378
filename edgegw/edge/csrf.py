"""
Cross-origin request protection with the semantics of Go's C{net/http.CrossOriginProtection}
(Go 1.25).

Safe methods pass. A C{Sec-Fetch-Site} of C{same-origin} or C{none} passes; any other value is
refused. Without C{Sec-Fetch-Site}, a request without C{Origin} passes (it is same-origin or
not from a browser), and so does one whose C{Origin} host equals the C{Host}. A refused request
still passes when its C{Origin} is a trusted origin or a bypass pattern matches it directly.

The caller answers a refusal: by default 403 with the reason plus C{"\\n"} as C{text/plain}.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from edgegw.config.origins import URLError, parse_url, validate_trusted_origin
from edgegw.routing.hosts import normalise_host
from edgegw.routing.mux import Mux
from edgegw.routing.pattern import Pattern

__all__ = ["ORIGIN_MISMATCH", "SEC_FETCH_SITE_CROSS", "CrossOriginProtection"]

SEC_FETCH_SITE_CROSS = "cross-origin request detected from Sec-Fetch-Site header"
"""
The denial reason when C{Sec-Fetch-Site} says the request is cross-origin.
"""

ORIGIN_MISMATCH = (
    "cross-origin request detected, and/or browser is out of date: "
    "Sec-Fetch-Site is missing, and Origin does not match Host"
)
"""
The denial reason when C{Sec-Fetch-Site} is missing and C{Origin} does not match C{Host}.
"""

_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_SAME_SITE_VALUES = frozenset(("same-origin", "none"))


class CrossOriginProtection:
    """
    Decides whether a request passes cross-origin checks.
    """

    def __init__(
        self, trusted_origins: Iterable[str] = (), bypass_patterns: Iterable[str] = ()
    ) -> None:
        """
        @param trusted_origins: Origins whose requests always pass, as
            C{scheme://host[:port]}.
        @param bypass_patterns: Mux patterns whose direct matches always pass.
        @raise edgegw.config.origins.TrustedOriginError: For an invalid trusted origin.
        @raise edgegw.routing.pattern.PatternError: For an invalid bypass pattern.
        @raise edgegw.routing.mux.ConflictError: For bypass patterns that conflict.
        """
        self._trusted: set[str] = set()
        self._bypass: Mux[None] = Mux()
        self._has_bypass = False
        for origin in trusted_origins:
            self.add_trusted_origin(origin)
        for pattern in bypass_patterns:
            self.add_bypass_pattern(pattern)

    @property
    def trusted_origins(self) -> frozenset[str]:
        """
        The trusted origins.
        """
        return frozenset(self._trusted)

    @property
    def bypass_patterns(self) -> list[Pattern]:
        """
        The bypass patterns, in the order they were added.
        """
        return self._bypass.patterns()

    def add_trusted_origin(self, origin: str) -> None:
        """
        Let every request whose C{Origin} header equals C{origin} exactly pass.

        @raise edgegw.config.origins.TrustedOriginError: When C{origin} is not
            C{scheme://host[:port]}.
        """
        validate_trusted_origin(origin)
        self._trusted.add(origin)

    def add_bypass_pattern(self, pattern: str) -> None:
        """
        Let every request that C{pattern} matches directly pass. Patterns have the syntax
        and precedence of the mux; a request the mux would redirect (an unclean path, or
        C{/x} when only C{/x/} is a pattern) is not a direct match.

        @raise edgegw.routing.pattern.PatternError: When C{pattern} does not parse.
        @raise edgegw.routing.mux.ConflictError: When it conflicts with another bypass pattern.
        """
        self._bypass.register(pattern, None)
        self._has_bypass = True

    def check(
        self,
        method: str,
        host: str,
        target_path: str,
        sec_fetch_site: str | None,
        origin: str | None,
    ) -> str | None:
        """
        Apply the cross-origin checks to a request.

        @param method: The request method.
        @param host: The C{Host} header, port included, as the edge normalised it
            (L{normalise_host}); C{""} when absent.
        @param target_path: The escaped request path exactly as on the request line (not
            cleaned), without the query.
        @param sec_fetch_site: The first C{Sec-Fetch-Site} value, or L{None}.
        @param origin: The first C{Origin} value, or L{None}.
        @return: L{None} when the request may proceed, else the denial reason
            (L{SEC_FETCH_SITE_CROSS} or L{ORIGIN_MISMATCH}).
        """
        if method in _SAFE_METHODS:
            return None
        if sec_fetch_site:
            if sec_fetch_site in _SAME_SITE_VALUES:
                return None
            if self._exempt(method, host, target_path, origin):
                return None
            return SEC_FETCH_SITE_CROSS
        if not origin:
            return None
        if host and _same_host(origin, host):
            return None
        if self._exempt(method, host, target_path, origin):
            return None
        return ORIGIN_MISMATCH

    def _exempt(self, method: str, host: str, target_path: str, origin: str | None) -> bool:
        if origin and origin in self._trusted:
            return True
        return self._has_bypass and self._bypass.matches_directly(method, host, target_path)


def _same_host(origin: str, host: str) -> bool:
    """
    Whether the host of C{origin} is C{host}: as written, or once normalised as the edge
    normalises C{Host} (a browser on C{http://example.com./} sends that spelling in both).
    """
    found = _origin_host(origin)
    if found is None:
        return False
    if found == host:
        return True
    normal = normalise_host(found.encode("utf-8", "surrogateescape"))
    return normal is not None and normal.decode("ascii") == host


# A subset of what Go's url.Parse accepts, whose host is the authority as written.
_SIMPLE_ORIGIN = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*://([A-Za-z0-9\-._~!$&'()*+,;=]+(?::[0-9]*)?)"
)


def _origin_host(origin: str) -> str | None:
    """
    The host (with port) that Go's C{url.Parse} finds in an C{Origin} value, or L{None}
    when it does not parse.
    """
    simple = _SIMPLE_ORIGIN.fullmatch(origin)
    if simple is not None:
        return simple.group(1)
    try:
        return parse_url(origin).host
    except URLError:
        return None
