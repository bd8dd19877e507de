"""checkov, a maintained manifest scanner (PyPI `checkov`, its Kubernetes checks), over the install as
`kubectl kustomize` renders it: the base (daemonset/), the cert-manager overlay, the DRA overlay and the
base with each optional component: monitoring (PodMonitors and the Grafana dashboard ConfigMap) and
fragmentation (hami-control's fragmentation policy flags, the scheduler ConfigMap with weight 11).

Every finding is either fixed in daemonset/ or listed in `SKIPS` below with why it stays; the test fails
on any finding not listed (a new manifest, or a change, that a check flags) and on a listed one that no
longer occurs (so the list never outlives its reasons). checkov runs from its own virtualenv, .venv-scan
(hack/setup.sh; hack/scan-requirements.txt says why not .venv), once for all five renderings and a
manifest it must flag (so a scanner that silently checks nothing cannot pass). About 5 s.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KUBECTL

REPO = Path(__file__).resolve().parents[2]
RENDERED = {
    "base": REPO / "daemonset",
    "cert-manager": REPO / "daemonset" / "overlays" / "cert-manager",
    "dra": REPO / "daemonset" / "overlays" / "dra",
}
"""What is scanned: the install as `kubectl kustomize` renders each (tests/unit/test_manifests.py
validates the same three), and `COMPONENTS`."""
MONITORING = REPO / "daemonset" / "components" / "monitoring"
FRAGMENTATION = REPO / "daemonset" / "components" / "fragmentation"
COMPONENTS = {"monitoring": MONITORING, "fragmentation": FRAGMENTATION}
"""The optional components: monitoring (PodMonitors, the dashboard ConfigMap) and fragmentation (a patched
hami-control Deployment, a replaced scheduler ConfigMap). A kustomize Component does not render alone:
each is scanned as a user adds it, the base with `components: [.../<name>]` (the kustomization
tests/unit/test_manifests.py renders for it too), as `<name>.yaml`."""
CHECKOV = REPO / ".venv-scan" / "bin" / "checkov"

_DIGEST = (
    "the images are the user's build (docs/install.md: `kustomize edit set image` sets the registry and "
    "tag, or a digest, of what they pushed); the shipped tag is the release's, never :latest"
)
_PULL = (
    "released tags are never rebuilt, so IfNotPresent pulls what Always would, and a node whose registry "
    "is unreachable can still restart the daemon (hami-node is node-critical)"
)
_TOKEN = "it calls the Kubernetes API (docs/install.md, Security: what its RBAC grants and why)"
_ROOT = (
    "root without capabilities, unprivileged: it writes into root-owned host directories (kubelet's "
    "device-plugins socket directory, mode 0750, and /usr/local/vgpu), docs/install.md, Security"
)
_NETWORK_POLICY = (
    "no NetworkPolicy ships: the webhook's callers are the API server, which many clusters run on the "
    "host network where no pod selector reaches it, and kubelet probes the health ports; a policy that "
    "admits them is cluster-specific"
)

SKIPS: dict[tuple[str, str], str] = {
    # CKV_K8S_43: image by digest.
    ("CKV_K8S_43", "DaemonSet.hami-system.hami-node"): _DIGEST,
    ("CKV_K8S_43", "DaemonSet.hami-system.hami-node-dra"): _DIGEST,
    ("CKV_K8S_43", "Deployment.hami-system.hami-control"): _DIGEST + "; kube-scheduler: pinned",
    ("CKV_K8S_43", "Job.hami-system.hami-certs"): _DIGEST,
    ("CKV_K8S_43", "CronJob.hami-system.hami-certs-renew"): _DIGEST,
    # CKV_K8S_15: imagePullPolicy Always.
    ("CKV_K8S_15", "DaemonSet.hami-system.hami-node"): _PULL,
    ("CKV_K8S_15", "DaemonSet.hami-system.hami-node-dra"): _PULL,
    ("CKV_K8S_15", "Deployment.hami-system.hami-control"): _PULL,
    ("CKV_K8S_15", "Job.hami-system.hami-certs"): _PULL,
    ("CKV_K8S_15", "CronJob.hami-system.hami-certs-renew"): _PULL,
    # CKV_K8S_38: the service-account token mounted.
    ("CKV_K8S_38", "DaemonSet.hami-system.hami-node"): _TOKEN,
    ("CKV_K8S_38", "DaemonSet.hami-system.hami-node-dra"): _TOKEN,
    ("CKV_K8S_38", "Deployment.hami-system.hami-control"): _TOKEN,
    ("CKV_K8S_38", "Job.hami-system.hami-certs"): _TOKEN,
    ("CKV_K8S_38", "CronJob.hami-system.hami-certs-renew"): _TOKEN,
    # CKV_K8S_23 (root) and CKV_K8S_40 (high UID): the node daemon and its HAMi-core installer.
    ("CKV_K8S_23", "DaemonSet.hami-system.hami-node"): _ROOT,
    ("CKV_K8S_23", "DaemonSet.hami-system.hami-node-dra"): _ROOT,
    ("CKV_K8S_40", "DaemonSet.hami-system.hami-node"): _ROOT,
    ("CKV_K8S_40", "DaemonSet.hami-system.hami-node-dra"): _ROOT,
    # CKV2_K8S_6: a NetworkPolicy per pod.
    ("CKV2_K8S_6", "Pod.hami-system.hami-node"): _NETWORK_POLICY,
    ("CKV2_K8S_6", "Pod.hami-system.hami-node-dra"): _NETWORK_POLICY,
    ("CKV2_K8S_6", "Pod.hami-system.hami-control"): _NETWORK_POLICY,
    ("CKV2_K8S_6", "Pod.hami-system.hami-certs"): _NETWORK_POLICY,
    # The rest, one each.
    ("CKV_K8S_11", "Deployment.hami-system.hami-control"): (
        "no CPU limit on the webhook, the extender and kube-scheduler: they sit in the admission and "
        "scheduling path of every GPU pod, and CFS throttling under a limit stalls a burst for whole "
        "100 ms periods; their requests guarantee their share, their memory is limited"
    ),
    ("CKV_K8S_115", "Deployment.hami-system.hami-control"): (
        "kube-scheduler's --bind-address stays 0.0.0.0: kubelet probes its /healthz and /readyz on the pod's "
        "IP; the port serves only authenticated requests besides those two paths"
    ),
    ("CKV_K8S_155", "ClusterRole.default.hami-certs"): (
        "get and patch of the one MutatingWebhookConfiguration hami-webhook (resourceNames), to write its "
        "caBundle: what the certs Job exists for (docs/install.md, Security)"
    ),
}
"""(check, resource) -> why the finding stays. A resource is `Kind.namespace.name` (checkov's, its
label suffix cut for the Pod-level checks)."""


def _resource(finding: dict[str, Any]) -> str:
    return ".".join(str(finding["resource"]).split(".")[:3])


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """checkov's JSON report (passed and failed checks) over base.yaml, cert-manager.yaml, dra.yaml,
    monitoring.yaml, fragmentation.yaml and flagged.yaml."""
    if not CHECKOV.exists():
        if os.environ.get("HAMI_REQUIRE_CHECKOV") == "1":
            pytest.fail(f"{CHECKOV} is required here (HAMI_REQUIRE_CHECKOV=1); run hack/setup.sh")
        pytest.skip(f"{CHECKOV} is not installed (hack/setup.sh installs it)")
    if not os.path.exists(KUBECTL):
        if os.environ.get("HAMI_REQUIRE_KUBECTL") == "1":
            pytest.fail("kubectl is required here (HAMI_REQUIRE_KUBECTL=1) but is not installed")
        pytest.skip("kubectl is not installed (hack/setup.sh installs it when run as root)")
    root = tmp_path_factory.mktemp("scan")
    with_components: dict[str, Path] = {}
    for name, component in COMPONENTS.items():
        with_component = with_components[name] = tmp_path_factory.mktemp(f"with-{name}")
        (with_component / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{os.path.relpath(RENDERED['base'], with_component)}]\n"
            f"components: [{os.path.relpath(component, with_component)}]\n"
        )
    for name, directory in {**RENDERED, **with_components}.items():
        render = subprocess.run(
            [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
        )
        assert render.returncode == 0, f"kubectl kustomize {directory} failed: {render.stderr}"
        (root / f"{name}.yaml").write_text(render.stdout)
    (root / "flagged.yaml").write_text(FLAGGED)
    result = subprocess.run(
        [str(CHECKOV), "--directory", str(root), "--framework", "kubernetes", "--skip-download",
         "--compact", "--output", "json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "LOG_LEVEL": "ERROR"},
    )  # fmt: skip
    assert result.returncode in (0, 1), f"checkov failed ({result.returncode}): {result.stderr[-2000:]}"
    yield json.loads(result.stdout)


@pytest.fixture(scope="module")
def scan(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """checkov's failed checks by file."""
    by_file: dict[str, list[dict[str, Any]]] = {}
    for finding in report["results"]["failed_checks"]:
        by_file.setdefault(Path(finding["file_path"]).name, []).append(finding)
    return by_file


FLAGGED = """
apiVersion: v1
kind: Pod
metadata: {name: flagged, namespace: default}
spec:
  containers:
    - name: main
      image: busybox:latest
      securityContext: {privileged: true}
"""


def test_checkov_flags_a_privileged_pod_on_latest(scan: dict[str, list[dict[str, Any]]]) -> None:
    checks = {f["check_id"] for f in scan["flagged.yaml"]}
    assert {"CKV_K8S_16", "CKV_K8S_14"} <= checks, checks  # privileged; image tag latest


def test_checkov_finds_nothing_in_the_install_but_the_justified_skips(
    scan: dict[str, list[dict[str, Any]]],
) -> None:
    found: dict[tuple[str, str], str] = {}
    for name in ("base.yaml", "cert-manager.yaml", "dra.yaml", *(f"{c}.yaml" for c in COMPONENTS)):
        for finding in scan.get(name, []):
            found[(finding["check_id"], _resource(finding))] = f"{name}: {finding['check_name']}"
    new = {key: found[key] for key in sorted(found.keys() - SKIPS.keys())}
    assert not new, f"new checkov findings (fix them in daemonset/, or add them to SKIPS with why): {new}"
    stale = sorted(SKIPS.keys() - found.keys())
    assert not stale, f"skips checkov no longer reports (remove them from SKIPS): {stale}"
    assert all(len(why) > 40 for why in SKIPS.values())


def test_checkov_checks_what_the_monitoring_component_adds(report: dict[str, Any]) -> None:
    """The component's ConfigMap (the dashboard) is checked in monitoring.yaml. Its PodMonitors are a
    custom resource no checkov Kubernetes check applies to (checkov checks built-in kinds); they are
    validated against the Prometheus Operator's CRD schema in tests/unit/test_manifests.py instead."""
    results = report["results"]
    checked = {
        (Path(c["file_path"]).name, _resource(c))
        for c in [*results["passed_checks"], *results["failed_checks"]]
    }
    assert ("monitoring.yaml", "ConfigMap.hami-system.hami-dashboard") in checked
    assert ("monitoring.yaml", "DaemonSet.hami-system.hami-node") in checked  # the install it is added to
    assert not {r for f, r in checked if r.startswith("PodMonitor.")}


def test_checkov_checks_what_the_fragmentation_component_changes(report: dict[str, Any]) -> None:
    """The component's two objects, the Deployment with the policy flags and the replaced scheduler
    ConfigMap (a hashed name: checkov's resource carries it), are checked in fragmentation.yaml."""
    results = report["results"]
    checked = {
        (Path(c["file_path"]).name, _resource(c))
        for c in [*results["passed_checks"], *results["failed_checks"]]
    }
    assert ("fragmentation.yaml", "Deployment.hami-system.hami-control") in checked
    assert any(
        f == "fragmentation.yaml" and r.startswith("ConfigMap.hami-system.hami-scheduler-config-")
        for f, r in checked
    ), sorted(r for f, r in checked if f == "fragmentation.yaml")
