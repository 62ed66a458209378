"""
C{Gateway.spec.redirectHTTP}: what the plain-HTTP listener answers. Every request gets a
308 to the same target over HTTPS, on the host its C{Host} names (read as the edge reads
it); nothing is proxied or served, but for ACME HTTP-01 challenges read from the
configured webroot (certbot's C{--webroot} layout).

The redirect names the host without the port the request came to, and the TLS
listener's port unless it is 443 (C{httpsPort} when set): a client that reached port 80
is sent to the HTTPS port, not to C{https://host:80}.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from typing import Final

from twisted.web.resource import Resource
from twisted.web.server import Request

from edgegw.edge.site import split_absolute_form
from edgegw.routing.hosts import normalise_host
from edgegw.stream.boundary import close_after_response
from edgegw.terminal.answers import TEXT_PLAIN

__all__ = ["ACME_PREFIX", "MAX_CHALLENGE_SIZE", "HttpsRedirect", "read_challenge"]

ACME_PREFIX: Final = b"/.well-known/acme-challenge/"
"""Where an ACME HTTP-01 challenge is asked for (RFC 8555 section 8.3)."""

MAX_CHALLENGE_SIZE: Final = 4096
"""The largest challenge file served (a key authorization is under 200 bytes)."""

# RFC 8555 section 8.3: a token is base64url without padding.
_TOKEN = re.compile(rb"[A-Za-z0-9_-]+\Z")
# What a request-target may hold here: visible ASCII, no fragment (as the edge).
_REFUSED_TARGET = re.compile(rb"[^\x21-\x7e]|#")
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a FIFO planted there opens at once (and is then refused as no file).
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def read_challenge(webroot: str, token: bytes) -> bytes | None:
    """
    The file C{<webroot>/.well-known/acme-challenge/<token>}, or L{None} when C{token}
    is not a token, or no such regular file of at most L{MAX_CHALLENGE_SIZE} bytes is
    there. Nothing below the webroot may be a symbolic link: each directory and the
    file are opened relative to the one before, without following one.
    """
    if not _TOKEN.match(token):
        return None
    opened: list[int] = []
    try:
        opened.append(os.open(webroot, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in (".well-known", "acme-challenge"):
            opened.append(os.open(name, _DIRECTORY_FLAGS, dir_fd=opened[-1]))
        opened.append(os.open(token, _FILE_FLAGS, dir_fd=opened[-1]))
        status = os.fstat(opened[-1])
        if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_CHALLENGE_SIZE:
            return None
        return os.read(opened[-1], MAX_CHALLENGE_SIZE)
    except OSError:
        return None
    finally:
        for descriptor in opened:
            os.close(descriptor)


class HttpsRedirect(Resource):
    """
    The redirect listener's one resource (see the module docstring).

    @ivar https_port: The port the redirects name (omitted when 443); L{None} until the
        TLS listener's port is known.
    @ivar acme_webroot: The directory challenges are read from; L{None}: none are.
    """

    isLeaf = True

    def __init__(self, https_port: int | None, acme_webroot: str | None = None) -> None:
        super().__init__()
        self.https_port = https_port
        self.acme_webroot = acme_webroot

    def render(self, request: Request) -> bytes:
        """
        A 308 to the HTTPS URL, a challenge, 404 for a challenge that is not there, or
        400 for a request with no valid host or target.
        """
        target = request.uri
        if _REFUSED_TARGET.search(target) is not None:
            return _plain(request, 400, b"bad request\n")
        if target[:1] != b"/":
            split = split_absolute_form(target)
            if split is None:
                return _plain(request, 400, b"bad request\n")
            authority, target = split
            hosts: Sequence[bytes] | None = [authority]
        else:
            hosts = request.requestHeaders.getRawHeaders(b"host")
        if not hosts or len(hosts) != 1 or not hosts[0]:
            return _plain(request, 400, b"bad request\n")
        host = normalise_host(hosts[0])
        if host is None:
            return _plain(request, 400, b"bad request\n")
        path = target.partition(b"?")[0]
        webroot = self.acme_webroot
        if (
            webroot is not None
            and path.startswith(ACME_PREFIX)
            and request.method in (b"GET", b"HEAD")
        ):
            challenge = read_challenge(webroot, path[len(ACME_PREFIX) :])
            if challenge is None:
                return _plain(request, 404, b"not found\n")
            request.responseHeaders.setRawHeaders(b"cache-control", [b"no-store"])
            return _plain(request, 200, challenge)
        location = b"https://" + _without_port(host)
        port = self.https_port
        if port is not None and port != 443:
            location += b":%d" % port
        request.setResponseCode(308)
        request.responseHeaders.setRawHeaders(b"location", [location + target])
        request.responseHeaders.setRawHeaders(b"content-length", [b"0"])
        return b""


def _without_port(host: bytes) -> bytes:
    """
    The host of a normalised C{host[:port]}.
    """
    if host[:1] == b"[":
        return host[: host.index(b"]") + 1]
    return host.partition(b":")[0]


def _plain(request: Request, status: int, body: bytes) -> bytes:
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [TEXT_PLAIN])
    request.responseHeaders.setRawHeaders(b"x-content-type-options", [b"nosniff"])
    if status == 400:
        close_after_response(request)
    return body
