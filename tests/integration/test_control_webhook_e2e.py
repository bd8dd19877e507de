"""End to end: `hami-control` as a real process serving TLS, registered with the local API server as a
MutatingWebhookConfiguration (caBundle from a generated CA); pods created through the official client
come out mutated, quota denials reach the client as 403, and a burst cannot overshoot a quota."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.builders import admission_review, as_body, container, gpu_pod, pod, resource_quota
from tests.conftest import ApiServerHandle
from tests.control_process_util import ControlProcess, control_env, raw_pod, start_control
from tests.control_server_util import KeepAliveClient
from tests.waiting import wait_for


@pytest.fixture
def control(tmp_path: Path, apiserver: ApiServerHandle) -> Iterator[ControlProcess]:
    control = start_control(tmp_path, apiserver.kubeconfig)
    try:
        yield control
    finally:
        code = control.stop()
        print(control.log())
        assert code == 0, "hami-control did not stop cleanly on SIGTERM"


def register(api_client: client.ApiClient, control: ControlProcess) -> None:
    client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name="hami-webhook"),
            webhooks=[
                client.V1MutatingWebhook(
                    name="vgpu.hami.io",
                    admission_review_versions=["v1beta1"],
                    side_effects="None",
                    failure_policy="Fail",
                    timeout_seconds=10,
                    client_config=client.AdmissionregistrationV1WebhookClientConfig(
                        url=control.url("/webhook"), ca_bundle=base64.b64encode(control.ca.cert).decode()
                    ),
                    rules=[
                        client.V1RuleWithOperations(
                            operations=["CREATE"], api_groups=[""], api_versions=["v1"], resources=["pods"]
                        )
                    ],
                )
            ],
        )
    )


def create_namespace(core_v1: Any, name: str) -> None:
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))


def gpu_memory_quota(core_v1: Any, namespace: str, limit: str) -> None:
    core_v1.create_namespaced_resource_quota(namespace, resource_quota({"limits.nvidia.com/gpumem": limit}))


def wait_quota_seen(core_v1: Any, namespace: str) -> None:
    """hami-control watches ResourceQuotas: wait until a pod over the limit is refused (a probe pod that
    is admitted is deleted again)."""

    def refused() -> bool:
        try:
            core_v1.create_namespaced_pod(namespace, gpu_pod("probe", gpumem=999999999))
        except ApiException as err:
            return err.status == 403
        core_v1.delete_namespaced_pod("probe", namespace)
        return False

    wait_for(refused, 10, f"the quota of {namespace} to be enforced")


def test_gpu_pods_come_out_mutated(
    control: ControlProcess, api_client: client.ApiClient, core_v1: Any
) -> None:
    register(api_client, control)
    core_v1.create_namespaced_pod("default", gpu_pod("whole"))
    whole = raw_pod(core_v1, "default", "whole")
    assert whole["spec"]["schedulerName"] == "hami-scheduler"
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "100",
    }
    assert "env" not in whole["spec"]["containers"][0]

    core_v1.create_namespaced_pod(
        "default",
        gpu_pod("shared", gpus=None, gpumem=4000, priority=1, annotations={"hami.io/core-policy": "force"}),
    )
    shared = raw_pod(core_v1, "default", "shared")
    main = shared["spec"]["containers"][0]
    assert shared["spec"]["schedulerName"] == "hami-scheduler"
    assert main["resources"]["limits"] == {
        "nvidia.com/gpumem": "4k",  # kube-apiserver writes Go's canonical quantity back
        "nvidia.com/priority": "1",
        "nvidia.com/gpu": "1",
    }
    assert sorted((e["name"], e["value"]) for e in main["env"]) == [
        ("CUDA_TASK_PRIORITY", "1"),
        ("GPU_CORE_UTILIZATION_POLICY", "force"),
    ]

    # A pod without GPU resources passes untouched.
    core_v1.create_namespaced_pod("default", pod("plain", container(limits={"cpu": "1"})))
    plain = raw_pod(core_v1, "default", "plain")
    assert plain["spec"]["schedulerName"] == "default-scheduler"
    assert plain["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    assert "env" not in plain["spec"]["containers"][0]
    # One decision line per admission, in the process log.
    log = control.log()
    assert "pod=default/whole" in log and "allowed=true" in log
    assert log.count("webhook=decision") >= 3


def test_quota_denial_reaches_the_client_as_403(
    control: ControlProcess, api_client: client.ApiClient, core_v1: Any
) -> None:
    create_namespace(core_v1, "ai-team")
    gpu_memory_quota(core_v1, "ai-team", "40000")
    register(api_client, control)
    wait_quota_seen(core_v1, "ai-team")
    core_v1.create_namespaced_pod("ai-team", gpu_pod("big", gpus=2, gpumem=19000))
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("ai-team", gpu_pod("one-more", gpumem=4000))
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert (
        "namespace ai-team: GPU memory quota exceeded (used 38000 / limit 40000 MiB, this pod asks 4000)"
        in message
    )
    assert [p.metadata.name for p in core_v1.list_namespaced_pod("ai-team").items] == ["big"]
    # Other namespaces are not limited.
    core_v1.create_namespaced_pod("default", gpu_pod("free", gpumem=99999))


def test_a_burst_cannot_overshoot_the_quota(
    control: ControlProcess, apiserver: ApiServerHandle, api_client: client.ApiClient, core_v1: Any
) -> None:
    create_namespace(core_v1, "burst")
    gpu_memory_quota(core_v1, "burst", "40000")
    register(api_client, control)
    wait_quota_seen(core_v1, "burst")
    configuration = client.Configuration(host=apiserver.base_url)
    configuration.connection_pool_maxsize = 32

    def create(i: int) -> int:
        # generateName: the final name is chosen after admission, the hardest case for the assumed usage.
        body = gpu_pod(None, gpumem=4000, generate_name="job-")
        try:
            burst_api.create_namespaced_pod("burst", body)
        except ApiException as err:
            return err.status
        return 201

    with client.ApiClient(configuration) as burst_client:
        burst_api = client.CoreV1Api(burst_client)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            codes = list(pool.map(create, range(24)))
    assert sorted(codes) == [201] * 10 + [403] * 14
    pods = core_v1.list_namespaced_pod("burst").items
    assert len(pods) == 10
    # Once the watch has shown the admitted pods, their assumed usage is not counted twice: freeing one
    # pod's worth of quota admits exactly one more.
    core_v1.delete_namespaced_pod(pods[0].metadata.name, "burst")

    def admitted() -> bool:
        try:
            core_v1.create_namespaced_pod("burst", gpu_pod("after", gpumem=4000))
        except ApiException as err:
            assert err.status == 403
            return False
        return True

    wait_for(admitted, 10, "a pod to fit after one was deleted")
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod("burst", gpu_pod("over", gpumem=4000))
    assert err.value.status == 403


def test_start_up_errors_are_one_line_and_exit_2(tmp_path: Path, apiserver: ApiServerHandle) -> None:
    missing = subprocess.run(
        [
            sys.executable, "-m", "hami_control.main", "--tls-cert-file", str(tmp_path / "none.crt"),
            "--tls-key-file", str(tmp_path / "none.key"), "--kubeconfig", str(apiserver.kubeconfig),
        ],
        capture_output=True, text=True, timeout=60, env=control_env(), check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("hami-control: cannot read ")
    assert "Traceback" not in missing.stderr
    no_tls = subprocess.run(
        [sys.executable, "-m", "hami_control.main", "serve", "--kubeconfig", str(apiserver.kubeconfig)],
        capture_output=True, text=True, timeout=60, env=control_env(), check=False,
    )  # fmt: skip
    assert no_tls.returncode == 2
    assert "--tls-cert-file" in no_tls.stderr and "Traceback" not in no_tls.stderr


def review_gpu_pod(namespace: str, name: str, gpumem: int, *, dry_run: bool = False) -> bytes:
    """An AdmissionReview of a one-GPU pod asking `gpumem` MiB, sent straight to the webhook."""
    obj = gpu_pod(
        None, gpumem=gpumem, generate_name=f"{name}-", namespace=namespace, scheduler_name="default-scheduler"
    )
    return as_body(admission_review(obj, uid=f"{name}-{gpumem}", namespace=namespace, dry_run=dry_run))


def test_admitted_pods_count_before_the_watch_sees_them(control: ControlProcess, core_v1: Any) -> None:
    """Reviews straight to the webhook (no pod is ever stored, so the watch never shows one): the
    usage assumed at admission alone keeps a concurrent burst inside the quota; dry runs assume nothing."""
    create_namespace(core_v1, "assumed")
    gpu_memory_quota(core_v1, "assumed", "40000")

    def allowed(body: bytes) -> bool:
        with KeepAliveClient(control.port, control.ca.client_context()) as c:
            status, answer = c.request("POST", "/webhook", body, {"Content-Type": "application/json"})
        assert status == 200
        return bool(json.loads(answer)["response"]["allowed"])

    wait_for(lambda: not allowed(review_gpu_pod("assumed", "probe", 40001)), 10, "the quota to be seen")
    assert all(allowed(review_gpu_pod("assumed", f"dry-{i}", 4000, dry_run=True)) for i in range(12))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(allowed, [review_gpu_pod("assumed", f"job-{i}", 4000) for i in range(24)]))
    assert results.count(True) == 10
