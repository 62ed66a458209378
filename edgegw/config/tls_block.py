"""
C{Gateway.spec.tls} and C{Gateway.spec.redirectHTTP}: TLS on the gateway's listener, its
certificates read and checked at load (at start, at a reload and by C{edgegw check}),
and the plain-HTTP listener that redirects to it.

A certificate entry is refused, located at its field, when a file cannot be read, holds
no PEM certificate or private key (or an encrypted one), when the key is not the
certificate's, when the certificate (the first in the file, the leaf) has expired or is
not valid yet, or when it names no host. Only the leaf's dates are checked: a chain may
carry an expired cross-signature that clients skip (Let's Encrypt's did).
"""

from __future__ import annotations

import datetime
import os
import re

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from edgegw.config.addresses import endpoint_description
from edgegw.config.fields import Node
from edgegw.config.model import CertificateSpec, RedirectHttpSpec, TlsSpec

__all__ = ["MIN_VERSIONS", "certificate_names", "read_redirect_http", "read_tls"]

MIN_VERSIONS = ("1.2", "1.3")
"""The values of C{tls.minVersion}."""

# A DNS name a certificate can serve: letters, digits, "-" and "_" in labels of at most
# 63, optionally a leading "*." (a wildcard stands for exactly one label).
_HOST_NAME = re.compile(r"(\*\.)?([a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\Z")
_ENCODING = serialization.Encoding.DER
_PUBLIC_FORMAT = serialization.PublicFormat.SubjectPublicKeyInfo


def read_tls(node: Node | None, base_dir: str) -> TlsSpec | None:
    """
    The C{tls} block, its certificate files read and checked; L{None} when absent.

    @param base_dir: The directory of the YAML file, which relative paths start from.
    """
    if node is None:
        return None
    entries = node.nodes("certificates", required=True)
    certificates = []
    now = datetime.datetime.now(datetime.UTC)
    for entry in entries:
        certificate = _certificate(entry, base_dir, now)
        if certificate is not None:
            certificates.append(certificate)
    min_version = _min_version(node)
    http2 = node.boolean("http2", True)
    node.finish()
    return TlsSpec(certificates=tuple(certificates), min_version=min_version, http2=http2)


def _min_version(node: Node) -> str:
    """
    C{minVersion}: C{"1.2"} or C{"1.3"}, also written unquoted (YAML reads a number).
    """
    value = node.value("minVersion")
    if value is None:
        return "1.2"
    if isinstance(value, float) and not isinstance(value, bool):
        value = f"{value:g}"
    if not isinstance(value, str) or value not in MIN_VERSIONS:
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        node.error("minVersion", f'{shown} is not one of "1.2", "1.3"')
        return "1.2"
    return value


def _certificate(node: Node, base_dir: str, now: datetime.datetime) -> CertificateSpec | None:
    """
    One C{certificates} entry, read and checked; L{None} after an error (recorded).
    """
    cert_value = node.required_string("certFile")
    key_value = node.required_string("keyFile")
    node.finish()
    if not cert_value or not key_value:
        return None
    cert_file = os.path.normpath(os.path.join(base_dir, cert_value))
    key_file = os.path.normpath(os.path.join(base_dir, key_value))
    chain_pem = _read(node, "certFile", cert_file)
    key_pem = _read(node, "keyFile", key_file)
    if chain_pem is None or key_pem is None:
        return None
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        node.error(
            "certFile", f"{cert_file} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )
        return None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        node.error("keyFile", f"{key_file} is encrypted: the key must have no passphrase")
        return None
    except (ValueError, UnsupportedAlgorithm):
        node.error("keyFile", f"{key_file} holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
        return None
    leaf = chain[0]
    if leaf.public_key().public_bytes(_ENCODING, _PUBLIC_FORMAT) != key.public_key().public_bytes(
        _ENCODING, _PUBLIC_FORMAT
    ):
        node.error(
            "keyFile",
            f"the key in {key_file} does not match the certificate in {cert_file} (the "
            "first certificate of the file must be the one the key is for)",
        )
        return None
    names = certificate_names(leaf)
    shown = ", ".join(names) if names else "no host"
    if leaf.not_valid_after_utc < now:
        node.error(
            "certFile",
            f"the certificate in {cert_file} ({shown}) expired on "
            f"{_date(leaf.not_valid_after_utc)}",
        )
        return None
    if leaf.not_valid_before_utc > now:
        node.error(
            "certFile",
            f"the certificate in {cert_file} ({shown}) is not valid before "
            f"{_date(leaf.not_valid_before_utc)}",
        )
        return None
    if not names:
        node.error(
            "certFile",
            f"the certificate in {cert_file} names no host: no DNS name in its "
            "subjectAltName and no host name as its common name",
        )
        return None
    return CertificateSpec(
        cert_file=cert_file,
        key_file=key_file,
        names=names,
        chain_pem=chain_pem,
        key_pem=key_pem,
    )


def certificate_names(certificate: x509.Certificate) -> tuple[str, ...]:
    """
    The host names C{certificate} serves, lowercase, in its order: the DNS names of its
    subjectAltName; without one, its common name when that is a host name (RFC 6125:
    a subjectAltName, when present, is all that counts).
    """
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        candidates = [
            attribute.value
            for attribute in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            if isinstance(attribute.value, str)
        ]
    else:
        candidates = list(san.value.get_values_for_type(x509.DNSName))
    names: list[str] = []
    for candidate in candidates:
        name = candidate.lower().rstrip(".")
        if len(name) <= 253 and _HOST_NAME.match(name) and name not in names:
            names.append(name)
    return tuple(names)


def _read(node: Node, key: str, path: str) -> bytes | None:
    """
    The bytes of the file at C{path}; L{None} (an error at C{key}) when it cannot be read.
    """
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError as e:
        node.error(key, f"cannot read {path}: {e.strerror or e}")
        return None


def _date(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def read_redirect_http(node: Node | None, base_dir: str) -> RedirectHttpSpec | None:
    """
    The C{redirectHTTP} block; L{None} when absent.

    @param base_dir: The directory of the YAML file, which a relative C{acmeWebroot}
        starts from.
    """
    if node is None:
        return None
    listen = node.required_string("listen")
    if listen:
        try:
            description = endpoint_description(listen)
        except ValueError as e:
            node.error("listen", str(e))
        else:
            if description.startswith("ssl:"):
                node.error(
                    "listen", "the redirect listener speaks plain HTTP: not an ssl: endpoint"
                )
    webroot = node.string("acmeWebroot")
    acme_webroot = None
    if webroot is not None:
        acme_webroot = os.path.normpath(os.path.join(base_dir, webroot))
        if not webroot:
            node.error("acmeWebroot", "must not be empty")
        elif not os.path.isdir(acme_webroot):
            node.error("acmeWebroot", f"{acme_webroot} is not a directory")
    https_port = None
    if node.has("httpsPort"):
        https_port = node.integer("httpsPort", 443, minimum=1)
        if https_port > 65535:
            node.error("httpsPort", f"must be at most 65535, got {https_port}")
    node.finish()
    return RedirectHttpSpec(listen=listen, acme_webroot=acme_webroot, https_port=https_port)
