"""
The TLS server side of C{Gateway.spec.tls}: one pyOpenSSL context per certificate, built
once when a configuration is loaded, and the choice among them by SNI.

Every context has the same settings (a connection keeps the first context's version
bounds and options when SNI switches it to another's certificate):

  - the lowest version C{minVersion}, the highest TLS 1.3;
  - Mozilla's "intermediate" suites with ECDHE only: on TLS 1.2 ECDHE-ECDSA or
    ECDHE-RSA with AES-128-GCM, AES-256-GCM or ChaCha20-Poly1305 (the client's order:
    it knows whether it has AES in hardware); on TLS 1.3 all of its suites;
  - no compression (CRIME), no renegotiation;
  - session resumption: a server-side session cache under one session id context, and
    session tickets (keys per process and per configuration: a reload or another worker
    process starts new sessions);
  - ALPN: C{h2} then C{http/1.1} (C{http2: true}), or C{http/1.1} alone, chosen in that
    order among what the client offers; a client without ALPN, or offering neither, gets
    no protocol, which is HTTP/1.1.

The certificate is chosen by the SNI name: a certificate naming it exactly, else one
with the wildcard for it (C{*.example.com} stands for exactly one label), the first
certificate in the configuration first; the first certificate for clients without SNI
or with a name none has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL.SSL import (
    NO_OVERLAPPING_PROTOCOLS,
    OP_NO_COMPRESSION,
    OP_NO_RENEGOTIATION,
    SESS_CACHE_SERVER,
    TLS1_2_VERSION,
    TLS1_3_VERSION,
    TLS_SERVER_METHOD,
    Connection,
    Context,
)
from twisted.internet.interfaces import IOpenSSLContextFactory
from zope.interface import implementer

from edgegw.config.model import CertificateSpec, TlsSpec

__all__ = [
    "CIPHERS_TLS12",
    "CertificateContextError",
    "ServerTLS",
    "alpn_protocols",
    "server_tls",
]

CIPHERS_TLS12: Final = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)
"""The TLS 1.2 suites, in Mozilla's "intermediate" order, without its DHE ones."""

SESSION_ID_CONTEXT: Final = b"edgegw"
"""What a session is resumed under: every context of the gateway shares it."""

_VERSIONS: Final = {"1.2": TLS1_2_VERSION, "1.3": TLS1_3_VERSION}


class CertificateContextError(ValueError):
    """
    OpenSSL refuses a certificate the configuration accepted (a key too small for its
    security level, say).

    @ivar index: The certificate's position in C{tls.certificates}.
    """

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def alpn_protocols(http2: bool) -> tuple[bytes, ...]:
    """
    The application protocols offered, in the server's order of preference.
    """
    return (b"h2", b"http/1.1") if http2 else (b"http/1.1",)


@implementer(IOpenSSLContextFactory)
class ServerTLS:
    """
    The server's TLS contexts for one configuration (see the module docstring).

    A C{TLSMemoryBIOFactory} asks L{getContext} for each connection (through
    L{ReloadableContext<edgegw.server.listen.ReloadableContext>} on the listener): the
    default context, whose SNI callback switches the connection to the certificate its
    client names.

    @ivar default: The first certificate's context.
    @ivar http2: Whether ALPN offers C{h2}.
    """

    def __init__(
        self,
        default: Context,
        exact: dict[bytes, Context],
        wildcards: dict[bytes, Context],
        http2: bool,
    ) -> None:
        """
        @param exact: The context for each name (lowercase, ASCII).
        @param wildcards: The context for each wildcard's parent name (C{example.com}
            for C{*.example.com}).
        """
        self.default = default
        self.http2 = http2
        self._exact = exact
        self._wildcards = wildcards

    def getContext(self) -> Context:
        """
        The default context (built once; shared by every connection).
        """
        return self.default

    def context_for(self, server_name: bytes | None) -> Context:
        """
        The context whose certificate serves C{server_name} (SNI), else the default.
        """
        if not server_name:
            return self.default
        name = server_name.lower()
        if name[-1:] == b".":
            name = name[:-1]
        context = self._exact.get(name)
        if context is None:
            context = self._wildcards.get(name.partition(b".")[2], self.default)
        return context

    def _servername(self, connection: Connection) -> None:
        context = self.context_for(connection.get_servername())
        if context is not self.default:
            connection.set_context(context)


def server_tls(spec: TlsSpec) -> ServerTLS:
    """
    Build the contexts of C{spec}'s certificates (read and checked at load).

    @raise CertificateContextError: OpenSSL refuses one of them.
    """
    offered = alpn_protocols(spec.http2)

    def select(connection: Connection, protocols: list[bytes]) -> bytes | object:
        for protocol in offered:
            if protocol in protocols:
                return protocol
        # The handshake goes on without ALPN: HTTP/1.1.
        return NO_OVERLAPPING_PROTOCOLS

    contexts = [
        _context(index, certificate, spec.min_version, select)
        for index, certificate in enumerate(spec.certificates)
    ]
    exact: dict[bytes, Context] = {}
    wildcards: dict[bytes, Context] = {}
    for certificate, context in zip(spec.certificates, contexts, strict=True):
        for name in certificate.names:
            encoded = name.encode("ascii")
            if encoded.startswith(b"*."):
                wildcards.setdefault(encoded[2:], context)
            else:
                exact.setdefault(encoded, context)
    tls = ServerTLS(contexts[0], exact, wildcards, spec.http2)
    if len(contexts) > 1:
        # Called on the context a connection starts with, before ALPN: the one
        # switched to supplies the certificate and the ALPN choice.
        contexts[0].set_tlsext_servername_callback(tls._servername)
    return tls


def _context(index: int, certificate: CertificateSpec, min_version: str, select: object) -> Context:
    """
    The context serving C{certificate}.

    @raise CertificateContextError: OpenSSL refuses it.
    """
    context = Context(TLS_SERVER_METHOD)
    context.set_min_proto_version(_VERSIONS[min_version])
    context.set_options(OP_NO_COMPRESSION | OP_NO_RENEGOTIATION)
    context.set_cipher_list(CIPHERS_TLS12.encode("ascii"))
    context.set_session_id(SESSION_ID_CONTEXT)
    context.set_session_cache_mode(SESS_CACHE_SERVER)
    context.set_alpn_select_callback(select)  # type: ignore[arg-type]
    try:
        chain: Sequence[x509.Certificate] = x509.load_pem_x509_certificates(certificate.chain_pem)
        key = serialization.load_pem_private_key(certificate.key_pem, password=None)
        context.use_certificate(chain[0])
        for extra in chain[1:]:
            context.add_extra_chain_cert(extra)
        context.use_privatekey(key)  # type: ignore[arg-type]
        context.check_privatekey()
    except Exception as e:
        raise CertificateContextError(
            index, f"OpenSSL refuses the certificate in {certificate.cert_file}: {e}"
        ) from None
    return context
