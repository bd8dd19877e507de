"""TLS for the local cluster and tests: the CA and serving certificates of `hami_control.certs` (the
same code the `hami-control certs` bootstrap uses), and `ssl.SSLContext`s built from PEM bytes."""

from __future__ import annotations

import os
import ssl
import tempfile

from hami_control.certs import generate_ca, generate_serving_cert

__all__ = [
    "client_ssl_context",
    "generate_ca",
    "generate_serving_cert",
    "server_ssl_context",
]


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
