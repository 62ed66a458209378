"""
A blocking TLS client for tests of the gateway's TLS listener, run in a thread
(L{handshake}): what the server chose (certificate, version, suite, ALPN), session
resumption, and a plain HTTP/1.1 exchange over the connection.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import attrs
from twisted.internet.threads import deferToThread


@attrs.frozen
class Handshake:
    """
    What one TLS connection to the gateway negotiated.

    @ivar certificate: The leaf the server presented (DER).
    @ivar version: C{"TLSv1.2"} or C{"TLSv1.3"}.
    @ivar cipher: The suite's OpenSSL name.
    @ivar alpn: The protocol ALPN selected, or L{None}.
    @ivar session: The session, to resume on another connection.
    @ivar reused: Whether this connection resumed the session it was given.
    @ivar compression: The compression in use, or L{None}.
    @ivar response: What the server answered C{request} with (until it closed).
    """

    certificate: bytes
    version: str | None
    cipher: str | None
    alpn: str | None
    session: Any
    reused: bool
    compression: str | None
    response: bytes


def client_context(
    ca_pem: bytes | None = None,
    *,
    alpn: list[str] | None = None,
    max_version: ssl.TLSVersion | None = None,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    """
    A client context: verifying against C{ca_pem} (else verifying nothing), offering
    C{alpn}, at most C{max_version}, with TLS 1.2 C{ciphers} only.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca_pem is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    if max_version is not None:
        context.maximum_version = max_version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    return context


def handshake_now(
    port: int,
    server_name: str | None = "localhost",
    context: ssl.SSLContext | None = None,
    *,
    session: Any = None,
    request: bytes = b"",
) -> Handshake:
    """
    Connect to 127.0.0.1:C{port} (blocking), with SNI C{server_name} (L{None}: none),
    send C{request} (by default a GET of C{/} that closes the connection) and read until
    the server closes.

    @raise ssl.SSLError: The handshake fails.
    """
    context = context or client_context()
    if server_name is None:
        context.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name, session=session) as tls,
    ):
        # TLS 1.3 sends its session tickets after the handshake: reading the answer
        # to a request (one that closes the connection) brings them in.
        tls.sendall(request or get_request("/"))
        response = b""
        try:
            while chunk := tls.recv(65536):
                response += chunk
        except (ssl.SSLError, OSError):
            if request:
                raise
        certificate = tls.getpeercert(binary_form=True) or b""
        cipher = tls.cipher()
        return Handshake(
            certificate=certificate,
            version=tls.version(),
            cipher=cipher[0] if cipher else None,
            alpn=tls.selected_alpn_protocol(),
            session=tls.session,
            reused=bool(tls.session_reused),
            compression=tls.compression(),
            response=response,
        )


def handshake(
    port: int,
    server_name: str | None = "localhost",
    context: ssl.SSLContext | None = None,
    *,
    session: Any = None,
    request: bytes = b"",
) -> Any:
    """
    L{handshake_now} in a thread: a Deferred firing with its L{Handshake}.
    """
    return deferToThread(
        handshake_now, port, server_name, context, session=session, request=request
    )


def get_request(path: str, host: str = "localhost") -> bytes:
    """
    A GET for C{path} that closes the connection after the response.
    """
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
