"""
Certificates for tests that serve or reach TLS, made on the spot: a self-signed one
(L{make_certificate}), or leaves with the names and validity a test asks for, issued by a
test certificate authority through an intermediate (L{CertificateAuthority}).
"""

from __future__ import annotations

import datetime
import os
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import NameOID

KeyType = Literal["ec", "rsa"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _private_key(key_type: KeyType) -> CertificateIssuerPrivateKeyTypes:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as stream:
        stream.write(data)
    return path


def make_certificate(directory: str, hostname: str) -> tuple[str, str, bytes]:
    """
    A self-signed certificate for C{hostname}; returns key path, cert path, cert PEM.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path = os.path.join(directory, "key.pem")
    cert_path = os.path.join(directory, "cert.pem")
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    _write(key_path, _key_pem(key))
    _write(cert_path, cert_pem)
    return key_path, cert_path, cert_pem


def ca_certificate(
    subject: x509.Name,
    issuer: x509.Name,
    key: CertificateIssuerPrivateKeyTypes,
    signer: CertificateIssuerPrivateKeyTypes,
    now: datetime.datetime,
    days: int,
    since: datetime.timedelta = datetime.timedelta(days=2),
) -> x509.Certificate:
    """
    A CA certificate for C{subject}'s C{key}, signed by C{issuer}'s C{signer}, valid from
    C{since} before C{now} for C{days} after it.
    """
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - since)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(signer, hashes.SHA256())
    )


class CertificateAuthority:
    """
    A certificate authority for tests: a root, and an intermediate that issues the
    leaves, so that a served certificate file holds a real chain (leaf, intermediate)
    and a client trusting only the root verifies it.

    @ivar root_pem: The root certificate (PEM), what clients trust.
    """

    def __init__(self) -> None:
        now = _now()
        self._root_key = ec.generate_private_key(ec.SECP256R1())
        root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgegw test root")])
        self._root = ca_certificate(root_name, root_name, self._root_key, self._root_key, now, 365)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgegw test intermediate")])
        self._intermediate = ca_certificate(name, root_name, self._key, self._root_key, now, 365)
        self.root_pem = self._root.public_bytes(serialization.Encoding.PEM)

    def write_root(self, directory: str) -> str:
        """
        Write the root certificate to C{directory}/ca.pem; return its path.
        """
        return _write(os.path.join(directory, "ca.pem"), self.root_pem)

    def issue(
        self,
        directory: str,
        names: list[str],
        *,
        common_name: str | None = None,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
        key_type: KeyType = "ec",
        stem: str = "leaf",
    ) -> tuple[str, str, bytes]:
        """
        Issue a leaf for the DNS C{names} (none: no subjectAltName extension) and write
        C{<stem>.key} and C{<stem>.pem} (the leaf, then the intermediate) in C{directory}.

        @param common_name: The subject's CN (none by default).
        @param not_before: When it becomes valid (yesterday by default).
        @param not_after: When it expires (in 30 days by default).
        @return: The key's path, the certificate file's path, the leaf alone (PEM).
        """
        now = _now()
        key = _private_key(key_type)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._intermediate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - datetime.timedelta(days=1))
            .not_valid_after(not_after or now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        )
        if names:
            san = x509.SubjectAlternativeName([x509.DNSName(name) for name in names])
            builder = builder.add_extension(san, critical=False)
        leaf = builder.sign(self._key, hashes.SHA256())
        leaf_pem = leaf.public_bytes(serialization.Encoding.PEM)
        chain = leaf_pem + self._intermediate.public_bytes(serialization.Encoding.PEM)
        key_path = _write(os.path.join(directory, f"{stem}.key"), _key_pem(key))
        cert_path = _write(os.path.join(directory, f"{stem}.pem"), chain)
        return key_path, cert_path, leaf_pem
