"""hami_control.certs: what the TLS Secret must hold (new, kept, renewed, CA rotated) for the
`hami-control certs` bootstrap, and its command line."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509

from hami_api.settings import ConfigError, HelpRequested
from hami_control.certs import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertOptions,
    certs_options,
    generate_ca,
    generate_serving_cert,
    plan_secret,
    service_dns_names,
)

NOW = datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)
OPTIONS = CertOptions(
    "hami-system", "hami-tls", ("hami-webhook", "hami-scheduler-extender"), ("hami-webhook",)
)
DAY = datetime.timedelta(days=1)


def sans(pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem)
    return list(
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    )


def test_service_dns_names_cover_every_form() -> None:
    assert service_dns_names(["hami-webhook"], "hami-system") == [
        "hami-webhook",
        "hami-webhook.hami-system",
        "hami-webhook.hami-system.svc",
        "hami-webhook.hami-system.svc.cluster.local",
    ]


def test_an_empty_secret_gets_a_ca_and_a_certificate_for_every_service_name() -> None:
    plan = plan_secret(None, OPTIONS, NOW)
    assert plan.data is not None and plan.reason == "no readable CA certificate"
    assert set(plan.data) == {CA_CERT, CA_KEY, TLS_CERT, TLS_KEY}
    assert sans(plan.data[TLS_CERT]) == service_dns_names(OPTIONS.services, OPTIONS.namespace)
    assert plan.ca == plan.data[CA_CERT]


def test_a_valid_secret_is_kept_as_it_is() -> None:
    first = plan_secret(None, OPTIONS, NOW)
    assert first.data is not None
    again = plan_secret(first.data, OPTIONS, NOW + 300 * DAY)
    assert again.data is None and again.reason == "certificates valid" and again.ca == first.data[CA_CERT]


@pytest.mark.parametrize(
    ("when", "reason"),
    [(NOW + 340 * DAY, "the serving certificate expires"), (NOW + 3640 * DAY, "the CA expires")],
)
def test_near_expiry_renews(when: datetime.datetime, reason: str) -> None:
    first = plan_secret(None, OPTIONS, NOW)
    assert first.data is not None
    renewed = plan_secret(first.data, OPTIONS, when)
    assert renewed.data is not None and renewed.reason.startswith(reason)
    same_ca = renewed.data[CA_CERT] == first.data[CA_CERT]
    assert same_ca == (reason == "the serving certificate expires")  # the CA is kept unless it is the problem


def test_a_new_service_name_reissues_from_the_kept_ca() -> None:
    first = plan_secret(None, OPTIONS, NOW)
    assert first.data is not None
    more = CertOptions("hami-system", "hami-tls", (*OPTIONS.services, "hami-metrics"))
    plan = plan_secret(first.data, more, NOW)
    assert plan.data is not None and "hami-metrics" in plan.reason
    assert plan.data[CA_CERT] == first.data[CA_CERT]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({CA_KEY: b"garbage"}, "the CA key does not parse"),
        ({TLS_KEY: b""}, "no serving certificate"),
        (
            {TLS_CERT: b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"},
            "no serving certificate",
        ),
    ],
)
def test_broken_contents_are_replaced(change: dict[str, bytes], reason: str) -> None:
    first = plan_secret(None, OPTIONS, NOW)
    assert first.data is not None
    plan = plan_secret({**first.data, **change}, OPTIONS, NOW)
    assert plan.data is not None and plan.reason == reason


def test_a_certificate_from_another_ca_is_replaced() -> None:
    first = plan_secret(None, OPTIONS, NOW)
    assert first.data is not None
    other_ca, other_key = generate_ca("other", now=NOW)
    names = service_dns_names(OPTIONS.services, OPTIONS.namespace)
    cert, key = generate_serving_cert(other_ca, other_key, names, now=NOW)
    plan = plan_secret({**first.data, TLS_CERT: cert, TLS_KEY: key}, OPTIONS, NOW)
    assert plan.data is not None and "not signed by the CA" in plan.reason


# --- the command line ------------------------------------------------------------------------------------


def test_certs_command_line_and_defaults() -> None:
    options, kube = certs_options(["--service", "hami-webhook"], {})
    assert options == CertOptions("hami-system", "hami-tls", ("hami-webhook",))
    assert kube.kubeconfig is None and kube.environ == {}
    options, kube = certs_options(
        [
            "--kubeconfig", "/k", "--namespace=gpu", "--secret", "tls", "--service", "a",
            "--service=b", "--webhook-config", "w", "--valid-days", "90", "--ca-valid-days", "900",
            "--renew-before-days", "10",
        ],
        {"POD_NAMESPACE": "ignored"},
    )  # fmt: skip
    assert options == CertOptions("gpu", "tls", ("a", "b"), ("w",), 90, 900, 10)
    assert kube.kubeconfig == Path("/k")
    assert certs_options(["--service", "a"], {"POD_NAMESPACE": "from-pod"})[0].namespace == "from-pod"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "configuration: name at least one Service with --service"),
        (
            ["--service", "a", "--valid-days", "0"],
            {},
            'command line --valid-days: expected an integer >= 1, got "0"',
        ),
        (
            ["--service", "a", "--renew-before-days", "365"],
            {},
            "configuration: --renew-before-days (365) must be below --valid-days (365)",
        ),
        (
            ["--service", "Web_Hook"],
            {},
            'command line --service: expected lowercase DNS subdomains such as hami-webhook, got "Web_Hook"',
        ),
        (
            ["--service", "a"],
            {"POD_NAMESPACE": "Bad"},
            'environment POD_NAMESPACE: expected a lowercase DNS subdomain such as hami-system, got "Bad"',
        ),
        (["--servic", "a"], {}, "command line: unrecognized arguments: --servic a"),
    ],
)
def test_certs_command_line_errors_name_the_flag_and_the_value(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        certs_options(argv, env)
    assert str(info.value) == message


def test_certs_help_is_returned() -> None:
    with pytest.raises(HelpRequested) as info:
        certs_options(["--help"], {})
    text = " ".join(info.value.text.split())
    assert text.startswith("usage: hami-control certs")
    assert (
        "--namespace NAMESPACE namespace of the Secret and Services (env POD_NAMESPACE; default hami-system)"
        in text
    )
