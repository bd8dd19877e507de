"""A tiny certificate authority for the local cluster and tests: a CA, serving certificates signed by
it (EC P-256), and `ssl.SSLContext`s built from PEM bytes."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "client_ssl_context",
    "generate_ca",
    "generate_serving_cert",
    "server_ssl_context",
]

_CLOCK_SKEW = datetime.timedelta(minutes=5)


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    if days < 1:
        raise ValueError(f"valid_days must be at least 1, got {days}")
    now = datetime.datetime.now(datetime.UTC)
    return now - _CLOCK_SKEW, now + datetime.timedelta(days=days)


def generate_ca(common_name: str, *, valid_days: int = 3650) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its private key, both PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(valid_days)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _private_key_pem(key)


def generate_serving_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    *,
    common_name: str | None = None,
    valid_days: int = 365,
) -> tuple[bytes, bytes]:
    """A certificate for a TLS server (and client, so it can also serve mTLS), signed by the CA, with
    the given DNS and IP subject alternative names. Returns (cert PEM, key PEM)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    try:
        ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    except ValueError as err:
        raise ValueError(f"ip_addresses: {err}") from None
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("ca_key_pem must hold the EC private key made by generate_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    cn = common_name or (dns_names[0] if dns_names else str(ips[0]))
    not_before, not_after = _validity(valid_days)
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt_names += [x509.IPAddress(ip) for ip in ips]
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(min(not_after, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _private_key_pem(key)


def _load_cert_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """The stdlib loads certificate chains only from files: write them to a private temporary
    directory (0700, files 0600) for the duration of the call."""
    with tempfile.TemporaryDirectory(prefix="hami-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_path, key_path)


def server_ssl_context(
    cert_pem: bytes, key_pem: bytes, *, client_ca_pem: bytes | None = None
) -> ssl.SSLContext:
    """A server-side context serving `cert_pem`; with `client_ca_pem`, client certificates signed by
    that CA are required (mTLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_cert_chain(context, cert_pem, key_pem)
    if client_ca_pem is not None:
        context.load_verify_locations(cadata=client_ca_pem.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(
    ca_pem: bytes | None, *, cert_pem: bytes | None = None, key_pem: bytes | None = None
) -> ssl.SSLContext:
    """A client-side context trusting `ca_pem` (or the system roots when None), checking hostnames;
    with `cert_pem`/`key_pem`, it presents that client certificate."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode("ascii") if ca_pem is not None else None
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_pem is not None or key_pem is not None:
        if cert_pem is None or key_pem is None:
            raise ValueError("a client certificate needs both cert_pem and key_pem")
        _load_cert_chain(context, cert_pem, key_pem)
    return context
