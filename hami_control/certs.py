"""Certificates for the webhook and extender: a small CA and serving certificates (EC P-256), and
`hami-control certs`, the bootstrap a Job runs at install (and a CronJob daily) so no one has to bring
certificates: it keeps a CA and a serving certificate for the webhook and extender Services in one
Secret, and patches the CA into the MutatingWebhookConfiguration's caBundle.

Idempotent: a run changes nothing when the Secret holds a CA and a serving certificate that chains to
it, names every Service DNS name and is valid beyond the renewal margin (30 days). Otherwise it issues a
new serving certificate from the kept CA (a new CA only when the CA itself is missing, unreadable or near
its own end), so rotating the serving certificate never invalidates the caBundle already published.
`hami-control serve` reloads the mounted files when the Secret changes (server.CertificateReloader).

The plan (`plan_secret`) is pure; `bootstrap` does the reads and writes through hami_kube's KubeApi.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hami_api.settings import (
    DNS_SUBDOMAIN,
    ConfigError,
    Invalid,
    parse_int,
    parse_path,
    parse_text,
)
from hami_api.settings_loader import Setting, SettingsLoader, dataclass_defaults
from hami_control.config import KubeSettings, credentials_env
from hami_kube.client import KubeApi, PatchType
from hami_kube.errors import KubeApiError

log = logging.getLogger(__name__)

_CLOCK_SKEW = datetime.timedelta(minutes=5)


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _validity(days: int, now: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    if days < 1:
        raise ValueError(f"valid_days must be at least 1, got {days}")
    now = now or datetime.datetime.now(datetime.UTC)
    return now - _CLOCK_SKEW, now + datetime.timedelta(days=days)


def generate_ca(
    common_name: str, *, valid_days: int = 3650, now: datetime.datetime | None = None
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its private key, both PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(valid_days, now)
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
    now: datetime.datetime | None = None,
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
    not_before, not_after = _validity(valid_days, now)
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


# --- the bootstrap (`hami-control certs`) ------------------------------------------------------------------

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"


@dataclass(frozen=True, slots=True)
class CertOptions:
    namespace: str = "hami-system"
    secret: str = "hami-tls"
    services: tuple[str, ...] = ()
    webhook_configs: tuple[str, ...] = ()
    valid_days: int = 365
    ca_valid_days: int = 3650
    renew_before_days: int = 30


def service_dns_names(services: Sequence[str], namespace: str) -> list[str]:
    """Every name a client may use for the Services: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local."""
    names: list[str] = []
    for service in services:
        names += [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
        names.append(f"{service}.{namespace}.svc.cluster.local")
    return names


@dataclass(frozen=True, slots=True)
class SecretPlan:
    """What the Secret must hold (PEM bytes by key) and why it changes; `data` None: keep it as it is."""

    data: dict[str, bytes] | None
    reason: str
    ca: bytes


def _load(pem: bytes | None) -> x509.Certificate | None:
    if not pem:
        return None
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None


def _ca_usable(cert: x509.Certificate | None, key_pem: bytes | None, until: datetime.datetime) -> str:
    """ "" when the CA can sign for the coming period, else why not."""
    if cert is None:
        return "no readable CA certificate"
    if not key_pem:
        return "no CA key"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return "the CA key does not parse"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return "the CA key does not match the CA certificate"
    if cert.not_valid_after_utc <= until:
        return f"the CA expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return ""


def _serving_problem(
    cert: x509.Certificate | None,
    key_pem: bytes | None,
    ca: x509.Certificate,
    names: Sequence[str],
    until: datetime.datetime,
) -> str:
    if cert is None or not key_pem:
        return "no serving certificate"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return "the serving key does not parse"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return "the serving key does not match its certificate"
    if cert.issuer != ca.subject:
        return "the serving certificate is not signed by the CA"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the serving certificate does not verify against the CA"
    try:
        sans = set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName
            )
        )
    except x509.ExtensionNotFound:
        sans = set()
    missing = [n for n in names if n not in sans]
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    if cert.not_valid_after_utc <= until:
        return f"the serving certificate expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return ""


def plan_secret(
    current: Mapping[str, bytes] | None, options: CertOptions, now: datetime.datetime
) -> SecretPlan:
    """Decide what the Secret must hold (see the module docstring). Pure apart from key generation."""
    current = current or {}
    names = service_dns_names(options.services, options.namespace)
    renew_by = now + datetime.timedelta(days=options.renew_before_days)
    ca_cert_pem, ca_key_pem = current.get(CA_CERT), current.get(CA_KEY)
    ca = _load(ca_cert_pem)
    ca_problem = _ca_usable(ca, ca_key_pem, renew_by)
    if ca_problem:
        ca_cert_pem, ca_key_pem = generate_ca("hami-webhook-ca", valid_days=options.ca_valid_days, now=now)
        ca = _load(ca_cert_pem)
    assert ca is not None and ca_cert_pem is not None and ca_key_pem is not None
    problem = ca_problem or _serving_problem(
        _load(current.get(TLS_CERT)), current.get(TLS_KEY), ca, names, renew_by
    )
    if not problem:
        return SecretPlan(None, "certificates valid", ca_cert_pem)
    cert_pem, key_pem = generate_serving_cert(
        ca_cert_pem, ca_key_pem, names, common_name=names[0], valid_days=options.valid_days, now=now
    )
    data = {CA_CERT: ca_cert_pem, CA_KEY: ca_key_pem, TLS_CERT: cert_pem, TLS_KEY: key_pem}
    return SecretPlan(data, problem, ca_cert_pem)


def _decoded(secret: Mapping[str, object] | None) -> dict[str, bytes] | None:
    if secret is None:
        return None
    data = secret.get("data")
    out: dict[str, bytes] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(key, str) and isinstance(value, str):
                try:
                    out[key] = base64.b64decode(value, validate=True)
                except ValueError:
                    continue
    return out


async def bootstrap(api: KubeApi, options: CertOptions, now: datetime.datetime | None = None) -> list[str]:
    """Make the Secret and the webhook configurations right; returns what it did, one line per change.
    Raises KubeApiError."""
    now = now or datetime.datetime.now(datetime.UTC)
    done: list[str] = []
    path = f"/api/v1/namespaces/{options.namespace}/secrets/{options.secret}"
    try:
        secret: dict[str, Any] | None = await api.get(path)
    except KubeApiError as err:
        if err.status != 404:
            raise
        secret = None
    plan = plan_secret(_decoded(secret), options, now)
    if plan.data is not None:
        encoded = {k: base64.b64encode(v).decode("ascii") for k, v in plan.data.items()}
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": options.secret,
                "namespace": options.namespace,
                "labels": {"app.kubernetes.io/managed-by": "hami-control-certs"},
            },
            "data": encoded,
        }
        if secret is None:
            await api.request("POST", f"/api/v1/namespaces/{options.namespace}/secrets", body)
            done.append(f"created Secret {options.namespace}/{options.secret} ({plan.reason})")
        else:
            body["metadata"]["resourceVersion"] = (secret.get("metadata") or {}).get("resourceVersion")
            await api.request("PUT", path, body)
            done.append(f"renewed Secret {options.namespace}/{options.secret} ({plan.reason})")
    bundle = base64.b64encode(plan.ca).decode("ascii")
    for name in options.webhook_configs:
        config_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
        config = await api.get(config_path)
        patch = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            for i, webhook in enumerate(config.get("webhooks") or [])
            if (webhook.get("clientConfig") or {}).get("caBundle") != bundle
        ]
        if patch:
            await api.patch(config_path, patch, PatchType.JSON)
            done.append(f"set the caBundle of {len(patch)} webhook(s) in MutatingWebhookConfiguration {name}")
    return done


# --- the command line --------------------------------------------------------------------------------------

_object_name = parse_text("a lowercase DNS subdomain such as hami-system", DNS_SUBDOMAIN, 253)


def _object_names(value: object) -> tuple[str, ...]:
    """Names from a repeated flag (joined with ","), each a lowercase DNS subdomain."""
    expected = "lowercase DNS subdomains such as hami-webhook"
    if not isinstance(value, str):
        raise Invalid(expected)
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",")))
    if not all(DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253 for name in names):
        raise Invalid(expected)
    return names


_SETTINGS = (
    Setting("kubeconfig", "--kubeconfig", "", "", parse_path, "kubeconfig file", "FILE",
            default_text="$KUBECONFIG, else the in-cluster service account"),
    Setting("namespace", "--namespace", "POD_NAMESPACE", "", _object_name,
            "namespace of the Secret and Services", "NAMESPACE"),
    Setting("secret", "--secret", "", "", _object_name, "Secret to keep", "NAME"),
    Setting("services", "--service", "", "", _object_names,
            "a Service the certificate names; repeat for more", "NAME", repeatable=True,
            default_text="none; at least one is required"),
    Setting("webhook_configs", "--webhook-config", "", "", _object_names,
            "a MutatingWebhookConfiguration whose caBundle to set; repeat for more", "NAME", repeatable=True,
            default_text="none"),
    Setting("valid_days", "--valid-days", "", "", parse_int(1), "days a serving certificate is valid",
            "DAYS"),
    Setting("ca_valid_days", "--ca-valid-days", "", "", parse_int(1), "days the CA is valid", "DAYS"),
    Setting("renew_before_days", "--renew-before-days", "", "", parse_int(1),
            "days before its end a certificate is renewed", "DAYS"),
)  # fmt: skip

_LOADER = SettingsLoader(
    _SETTINGS,
    prog="hami-control certs",
    description=(
        "Create or renew the TLS Secret of the webhook and extender Services (a CA and a serving "
        "certificate for every Service DNS name) and patch the CA into the MutatingWebhookConfiguration's "
        "caBundle. Idempotent: nothing changes while the certificates are valid beyond --renew-before-days."
    ),
    defaults=dataclass_defaults(CertOptions),
    file_setting=None,
)


def certs_options(argv: Sequence[str], env: Mapping[str, str]) -> tuple[CertOptions, KubeSettings]:
    """`hami-control certs`'s command line (and POD_NAMESPACE from `env`) as options, and its client's
    settings (the kubeconfig; None: $KUBECONFIG, else in-cluster, from what `env` sets). Raises
    `ConfigError` naming the flag and the value, and `HelpRequested` for --help."""
    given = _LOADER.load(argv, env).values_by_name()
    kubeconfig: Path | None = given.pop("kubeconfig", None)
    options = CertOptions(**given)
    if not options.services:
        raise ConfigError("configuration", "services", "name at least one Service with --service")
    if options.renew_before_days >= options.valid_days:
        raise ConfigError(
            "configuration",
            "renew_before_days",
            f"--renew-before-days ({options.renew_before_days}) must be below --valid-days "
            f"({options.valid_days})",
        )
    return options, KubeSettings(kubeconfig=kubeconfig, credentials_env=credentials_env(env))
