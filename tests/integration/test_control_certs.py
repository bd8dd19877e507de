"""`hami-control certs` as a process against the local API server: it creates the TLS Secret and sets
the caBundle of the MutatingWebhookConfiguration, a second run changes nothing, a webhook configuration
that does not exist is a one-line error, and bad flags exit 2 without a traceback."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.conftest import ApiServerHandle
from tests.control_process_util import control_env

FLAGS = ("--namespace", "hami-system", "--service", "hami-webhook", "--service", "hami-scheduler-extender")


def certs(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hami_control.main", "certs", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=control_env(),
        check=False,
    )


def webhook_config(api_client: Any) -> None:
    client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name="hami-webhook"),
            webhooks=[
                client.V1MutatingWebhook(
                    name=f"vgpu{i}.hami.io",
                    admission_review_versions=["v1"],
                    side_effects="None",
                    client_config=client.AdmissionregistrationV1WebhookClientConfig(
                        service=client.AdmissionregistrationV1ServiceReference(
                            namespace="hami-system", name="hami-webhook", path="/webhook", port=443
                        )
                    ),
                )
                for i in range(2)
            ],
        )
    )


def test_certs_creates_the_secret_and_the_ca_bundle_then_keeps_them(
    apiserver: ApiServerHandle, api_client: Any, core_v1: Any
) -> None:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="hami-system")))
    webhook_config(api_client)
    first = certs(apiserver.kubeconfig, *FLAGS, "--webhook-config", "hami-webhook")
    assert first.returncode == 0, first.stderr
    assert "created Secret hami-system/hami-tls" in first.stdout
    assert "set the caBundle of 2 webhook(s)" in first.stdout
    secret = core_v1.read_namespaced_secret("hami-tls", "hami-system")
    assert secret.type == "kubernetes.io/tls"
    assert set(secret.data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    configs = client.AdmissionregistrationV1Api(api_client).read_mutating_webhook_configuration(
        "hami-webhook"
    )
    for webhook in configs.webhooks:
        assert base64.b64decode(webhook.client_config.ca_bundle) == base64.b64decode(secret.data["ca.crt"])

    second = certs(apiserver.kubeconfig, *FLAGS, "--webhook-config", "hami-webhook")
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    assert core_v1.read_namespaced_secret("hami-tls", "hami-system").metadata.resource_version == (
        secret.metadata.resource_version
    )


def test_certs_errors_are_one_line(apiserver: ApiServerHandle, core_v1: Any, tmp_path: Path) -> None:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="hami-system")))
    missing = certs(apiserver.kubeconfig, *FLAGS, "--webhook-config", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "404" in missing.stderr, missing.stderr
    no_service = certs(apiserver.kubeconfig)
    assert no_service.returncode == 2 and "--service" in no_service.stderr
    bad_kubeconfig = certs(tmp_path / "absent", *FLAGS)
    assert bad_kubeconfig.returncode == 2 and "Traceback" not in bad_kubeconfig.stderr
    assert "no such file" in bad_kubeconfig.stderr
