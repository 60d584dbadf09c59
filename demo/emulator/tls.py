"""Opt-in TLS: a throwaway self-signed CA and the server certificate it signs, kept in memory.

``cryptography`` is imported only when certificates are generated, so plain-HTTP emulators start without it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

from demo.emulator.common import is_loopback


@dataclass(frozen=True)
class ServerCertificates:
    """The TLS material of an HTTPS emulator (all PEM): a throwaway self-signed CA and the server certificate and key
    it signed (see ``generate_certificates``). Only the CA certificate is meant to leave the process (kubeconfig)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)
    hosts: tuple[str, ...] = ()  # the certificate's subject alternative names, e.g. ("127.0.0.1", "localhost")

    @property
    def ca_data(self) -> str:
        """The CA certificate as a kubeconfig's ``certificate-authority-data``: base64 of the PEM."""
        return base64.b64encode(self.ca_pem).decode("ascii")

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side ``ssl.SSLContext`` (TLS >= 1.2, ALPN ``http/1.1``) presenting the server certificate.

        ``ssl`` loads a certificate chain only from files: the certificate and key are written to a private
        temporary directory (mode 0700, files 0600) that is removed as soon as they are loaded.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # aiohttp speaks HTTP/1.1 only; Go clients then skip HTTP/2
        with tempfile.TemporaryDirectory(prefix="kube-emulator-tls-") as tmp:
            paths = []
            for filename, data in (("tls.crt", self.cert_pem), ("tls.key", self.key_pem)):
                path = os.path.join(tmp, filename)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                paths.append(path)
            context.load_cert_chain(*paths)
        return context


def generate_certificates(host: str = "127.0.0.1", *, days: int = 30) -> ServerCertificates:
    """A fresh self-signed CA and a server certificate it signs, for an HTTPS emulator on ``host``.

    Both use ECDSA P-256 keys (quick to generate) and SHA-256 signatures, in memory only. The server certificate's
    subject alternative names are ``IP:127.0.0.1``, ``DNS:localhost`` and ``host`` when it is another loopback IP
    address (``::1``, ``127.0.0.2`` ...); it is valid from five minutes ago for ``days`` days, for server auth only.
    Extensions follow what strict verifiers (Go's crypto/x509, OpenSSL's ``X509_STRICT``) require: CA basic
    constraints and key usage, subject/authority key identifiers.

    Raises:
        ValueError: ``host`` is not a loopback address (see ``serve``).
    """
    if not is_loopback(host):
        raise ValueError(f"the emulator listens on loopback only, not {host!r}")
    # imported here: plain-HTTP emulators (the demo starts one process per cluster) start without cryptography
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gShare demo"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"kube-emulator-ca@{int(now.timestamp())}")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    addresses = [ipaddress.ip_address("127.0.0.1")]
    if host != "localhost" and ipaddress.ip_address(host) not in addresses:
        addresses.append(ipaddress.ip_address(host))
    alt_names: list[x509.GeneralName] = [x509.DNSName("localhost"), *(x509.IPAddress(a) for a in addresses)]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gShare demo"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ServerCertificates(
        ca_pem=ca_cert.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        hosts=("localhost", *(str(a) for a in addresses)),
    )
