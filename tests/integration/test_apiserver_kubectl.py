"""Real kubectl (discovery, OpenAPI validation, Tables, patch flavours, watch) against the stand-in."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.apiserver_util import bind, http
from tests.builders import gpu_pod, node, pod
from tests.conftest import KUBECTL, ApiServerHandle

pytestmark = pytest.mark.kubectl

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: from-file
  labels: {app: demo}
spec:
  containers:
  - name: main
    image: busybox:1.36
    resources:
      limits: {nvidia.com/gpu: "1", nvidia.com/gpumem: "4000"}
"""


def test_get_nodes_looks_like_kube(kubectl: Kubectl, core_v1: Any) -> None:
    core_v1.create_node(node("gpu-1", labels={"node-role.kubernetes.io/worker": ""}))
    core_v1.create_node(node("gpu-2", ready=False))
    lines = kubectl("get", "nodes").stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert lines[1].split()[:3] == ["gpu-1", "Ready", "worker"]
    assert lines[2].split()[:3] == ["gpu-2", "NotReady", "<none>"]
    wide = kubectl("get", "nodes", "-o", "wide").stdout.splitlines()[0].split()
    assert wide[:6] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP"]


def test_get_pods_output_formats(kubectl: Kubectl, core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p", labels={"app": "x"}))
    bind(core_v1, "default", "p", "n1")
    lines = kubectl("get", "pods").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:4] == ["p", "0/1", "Pending", "0"]
    wide = kubectl("get", "pods", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:7] == ["IP", "NODE"]
    assert wide[1].split()[6] == "n1"
    as_json = json.loads(kubectl("get", "pod", "p", "-o", "json").stdout)
    assert as_json["spec"]["nodeName"] == "n1"
    assert "nodeName: n1" in kubectl("get", "pod", "p", "-o", "yaml").stdout
    listed = json.loads(kubectl("get", "pods", "-A", "-l", "app=x", "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["p"]
    selected = kubectl("get", "pods", "--field-selector", "spec.nodeName=n2").stderr
    assert "No resources found" in selected
    assert "from-nowhere" in kubectl("get", "pod", "from-nowhere", check=False).stderr
    assert kubectl("get", "ns").stdout.splitlines()[0].split() == ["NAME", "STATUS", "AGE"]

    leases: Any = client.CoordinationV1Api(core_v1.api_client)
    leases.create_namespaced_lease(
        "kube-node-lease",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="n1"), spec=client.V1LeaseSpec(holder_identity="n1")
        ),
    )
    lease_lines = kubectl("get", "leases", "-A").stdout.splitlines()
    assert lease_lines[0].split() == ["NAMESPACE", "NAME", "HOLDER", "AGE"]
    assert lease_lines[1].split()[:3] == ["kube-node-lease", "n1", "n1"]


def test_describe(kubectl: Kubectl, core_v1: Any) -> None:
    core_v1.create_node(node("gpu-1", allocatable={"cpu": "8", "nvidia.com/gpu": "4"}))
    created = core_v1.create_namespaced_pod("default", gpu_pod("p", gpus=1))
    bind(core_v1, "default", "p", "gpu-1")
    core_v1.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="p.1"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name="p", namespace="default", uid=created.metadata.uid, api_version="v1"
            ),
            reason="Scheduled",
            message="Successfully assigned default/p to gpu-1",
            type="Normal",
        ),
    )
    described = kubectl("describe", "pod", "p").stdout
    assert "Node:             gpu-1" in described
    assert "Successfully assigned default/p to gpu-1" in described
    events = kubectl("get", "events").stdout.splitlines()
    assert events[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[1].split()[1:4] == ["Normal", "Scheduled", "pod/p"]
    assert "nvidia.com/gpu:  1" in described
    node_text = kubectl("describe", "node", "gpu-1").stdout
    assert "Non-terminated Pods:          (1 in total)" in node_text
    assert "nvidia.com/gpu" in node_text


def test_annotate_label_patch(kubectl: Kubectl, core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    kubectl("annotate", "pod", "p", "hami.io/a=1")
    kubectl("label", "pod", "p", "tier=gpu")
    kubectl("patch", "pod", "p", "--type=merge", "-p", '{"metadata":{"annotations":{"m":"1"}}}')
    kubectl(
        "patch",
        "pod",
        "p",
        "--type=json",
        "-p",
        '[{"op":"add","path":"/metadata/annotations/j","value":"2"}]',
    )
    kubectl("patch", "pod", "p", "-p", '{"metadata":{"annotations":{"s":"3"}}}')
    current = core_v1.read_namespaced_pod("p", "default")
    assert current.metadata.annotations == {"hami.io/a": "1", "m": "1", "j": "2", "s": "3"}
    assert current.metadata.labels == {"tier": "gpu"}
    kubectl("annotate", "pod", "p", "hami.io/a-")
    assert "hami.io/a" not in core_v1.read_namespaced_pod("p", "default").metadata.annotations
    kubectl("label", "node", "--all", "x=y")  # no nodes: a no-op, not an error


def test_create_from_file_with_validation_and_delete(kubectl: Kubectl, core_v1: Any) -> None:
    created = kubectl("create", "-f", "-", stdin=POD_YAML)
    assert created.stdout.strip() == "pod/from-file created"
    # Stored as Go's Quantity writes them back: "4000" is "4k".
    assert core_v1.read_namespaced_pod("from-file", "default").spec.containers[0].resources.requests == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "4k",
    }
    duplicate = kubectl("create", "-f", "-", stdin=POD_YAML, check=False)
    assert duplicate.returncode != 0 and "AlreadyExists" in duplicate.stderr
    assert kubectl("delete", "pod", "from-file").stdout.strip() == 'pod "from-file" deleted'
    assert core_v1.list_namespaced_pod("default").items == []


def test_delete_of_a_bound_pod_is_graceful_and_force_deletes_at_once(kubectl: Kubectl, core_v1: Any) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    bind(core_v1, "default", "p", "n1")
    assert kubectl("delete", "pod", "p", "--wait=false").stdout.strip() == 'pod "p" deleted'
    marked = core_v1.read_namespaced_pod("p", "default")
    assert marked.metadata.deletion_grace_period_seconds == 30
    assert kubectl("get", "pod", "p", "--no-headers").stdout.split()[2] == "Terminating"
    forced = kubectl("delete", "pod", "p", "--grace-period=0", "--force")
    assert 'pod "p" force deleted' in forced.stdout
    assert core_v1.list_namespaced_pod("default").items == []


def test_api_resources(kubectl: Kubectl) -> None:
    names = {line.split()[0] for line in kubectl("api-resources", "--no-headers").stdout.splitlines()}
    assert {
        "pods",
        "nodes",
        "namespaces",
        "events",
        "resourcequotas",
        "leases",
        "mutatingwebhookconfigurations",
    } <= names
    assert kubectl("version", "-o", "json").returncode == 0


def test_get_watch(apiserver: ApiServerHandle, core_v1: Any, tmp_path: object) -> None:
    core_v1.create_namespaced_pod("default", pod("p"))
    process = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "get", "pods", "-w", "--request-timeout=20s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert lines.get(timeout=20).split()[:3] == ["NAME", "READY", "STATUS"]
        assert lines.get(timeout=20).split()[:3] == ["p", "0/1", "Pending"]
        core_v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
        assert lines.get(timeout=20).split()[:3] == ["p", "0/1", "Running"]
        core_v1.create_namespaced_pod("default", pod("q"))
        assert lines.get(timeout=20).split()[0] == "q"
    finally:
        process.terminate()
        process.wait(timeout=10)
        reader.join(timeout=10)
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        process.stderr.close()


PROTOBUF = "Content-Type: application/vnd.kubernetes.protobuf"


@pytest.mark.parametrize(
    "command",
    [
        ["namespace", "{name}"],
        ["configmap", "{name}", "--from-literal=policy=binpack", "--from-file=blob={blob}"],
        ["secret", "generic", "{name}", "--from-literal=token=s3cr3t"],
        [
            "secret",
            "docker-registry",
            "{name}",
            "--docker-server=r.io",
            "--docker-username=u",
            "--docker-password=p",
        ],
        [
            "quota",
            "{name}",
            "--hard=nvidia.com/gpu=2,limits.nvidia.com/gpumem=16000,requests.cpu=1.5,pods=10",
        ],
    ],
    ids=["namespace", "configmap", "secret-generic", "secret-docker-registry", "quota"],
)
def test_kubectl_create_sends_protobuf_and_the_server_stores_what_json_would_give(
    kubectl: Kubectl, apiserver: ApiServerHandle, command: list[str], tmp_path: Any
) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)))
    by_protobuf = [part.format(name="by-protobuf", blob=blob) for part in command]
    by_json = [part.format(name="by-json", blob=blob) for part in command]
    created = kubectl("create", *by_protobuf, "-v=8")
    assert PROTOBUF in created.stderr  # kubectl's typed client really sent protobuf
    manifest = kubectl("create", *by_json, "--dry-run=client", "-o", "json").stdout
    assert PROTOBUF not in kubectl("create", "-f", "-", "-v=8", stdin=manifest).stderr

    kind = json.loads(manifest)["kind"]
    plural = {"Namespace": "namespaces", "ConfigMap": "configmaps", "Secret": "secrets",
              "ResourceQuota": "resourcequotas"}[kind]  # fmt: skip
    stored = {}
    for name in ("by-protobuf", "by-json"):
        path = (
            f"/api/v1/{plural}/{name}"
            if kind == "Namespace"
            else f"/api/v1/namespaces/default/{plural}/{name}"
        )
        status, body = http(apiserver.base_url, "GET", path)
        assert status == 200, body
        meta = body["metadata"]
        for key in ("name", "uid", "resourceVersion", "creationTimestamp"):
            meta.pop(key)
        meta.get("labels", {}).pop("kubernetes.io/metadata.name", None)
        stored[name] = body
    assert stored["by-protobuf"] == stored["by-json"]
    if kind == "ResourceQuota":
        hard = stored["by-protobuf"]["spec"]["hard"]
        assert hard == {
            "nvidia.com/gpu": "2",
            "limits.nvidia.com/gpumem": "16k",
            "requests.cpu": "1500m",
            "pods": "10",
        }
