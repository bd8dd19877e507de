"""The fragmentation component through the local cluster, and what happens when hami-control is gone.

One small scale-mode cluster runs kube-scheduler's stand-in with the component's KubeSchedulerConfiguration
(daemonset/components/fragmentation/kube-scheduler-config.yaml: HAMi's entry, not ignorable, and the
second entry `cpu-filter`/`cpu-prioritize`, ignorable, at the same hami-control URL), hami-control with the
component's flags (read from its kustomization.yaml patch), and the webhook configuration as the install
ships it with the component: the base's `vgpu.hami.io` entry (failurePolicy Fail, matchConditions: pods
asking HAMi's resources) and the component's `cpu.hami.io` (failurePolicy Ignore, matchConditions: pods
asking none, no scheduler but the default one), each `service` reference turned into hami-control's URL.
The API server stand-in evaluates their CEL matchConditions as kube-apiserver does. Beside hami-scheduler
runs the cluster's own scheduler (the stand-in with profile `default-scheduler`, no extender), as in any
real cluster.

- Up: a CPU-only pod created plain (no label, no schedulerName) gets `hami-scheduler` from cpu.hami.io, is
  asked about by /cpu-filter (hami-control's filter count grows; HAMi's entry is not interested in it) and
  lands on the node /cpu-filter keeps for it; one in kube-system is left to default-scheduler; a GPU pod
  gets `hami-scheduler` from vgpu.hami.io and runs.
- hami-control killed (SIGKILL, its one replica: the URL refuses connections, as a Service without
  endpoints): a plain CPU-only pod is admitted unchanged (cpu.hami.io is Ignore; vgpu.hami.io's
  conditions are false for it, so its Fail never applies) and default-scheduler runs it; one steered
  before the outage still schedules (kube-scheduler skips the ignorable entry: schedule_one.go
  `findNodesThatPassExtenders`, `IsIgnorable`); creating a GPU pod is refused at admission (vgpu.hami.io's
  failurePolicy Fail); a GPU pod admitted before the outage stays Pending with kube-scheduler's
  `Post ".../filter"` error (HAMi's entry is not ignorable).
- hami-control started again: the pending GPU pod schedules and runs, and a new GPU pod is admitted and
  runs.

The pods "admitted before the outage" are created during it with what the webhook would have set (the
schedulerName) and the label `hami.io/webhook: ignore`, which keeps both entries away."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from hami_sim.apiserver.patch import json_patch
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.scheduler.config import load_configuration, scheduler_config
from hami_sim.tls import client_ssl_context
from tests.builders import container, pod
from tests.e2e.e2e_util import control_metrics, core_v1
from tests.waiting import wait_for

DAEMONSET = Path(__file__).resolve().parents[2] / "daemonset"
COMPONENT = DAEMONSET / "components" / "fragmentation"
BASE_WEBHOOK = DAEMONSET / "base" / "webhook" / "mutatingwebhookconfiguration.yaml"
NS = "default"
HAMI = "hami-scheduler"
IGNORE = {"hami.io/webhook": "ignore"}
A40 = GPUSpec("NVIDIA A100-SXM4-40GB", 40960)
NODES = (
    NodeSpec("fi-1", (A40,)),
    NodeSpec("fi-2", (A40,) * 2),
    NodeSpec("fi-3", (A40,) * 4),
)


def component_flags() -> list[str]:
    """The hami-control flags the component's kustomization adds (its JSON-patch `add` ops on args)."""
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    flags: list[str] = []
    for patch in kustomization["patches"]:
        for op in yaml.safe_load(patch["patch"]):
            if op["op"] == "add" and op["path"].endswith("/args/-"):
                flags.append(str(op["value"]))
    assert flags, "the component adds no hami-control flag"
    return flags


SCHEDULER_CONFIG = COMPONENT / "kube-scheduler-config.yaml"


def test_the_component_s_second_entry_is_ignorable_and_asked_about_every_pod() -> None:
    """What the kill test relies on, read the way the stand-in (and kube-scheduler) reads it."""
    config = scheduler_config(load_configuration(SCHEDULER_CONFIG))
    hami, cpu = config.extenders
    assert (cpu.filter_verb, cpu.prioritize_verb, cpu.bind_verb) == ("cpu-filter", "cpu-prioritize", "")
    assert cpu.url_prefix == hami.url_prefix and cpu.ignorable and not cpu.managed_resources
    assert hami.bind_verb == "bind" and not hami.ignorable
    assert config.percentage_of_nodes_to_score == 100


def shipped_webhooks(cluster: Cluster) -> list[dict[str, Any]]:
    """The webhook entries of the install with the component (the base's configuration, then the
    component's JSON-patch ops on it, as kustomize applies them), each service reference replaced by
    hami-control's URL on the same path, with the cluster's CA."""
    config = yaml.safe_load(BASE_WEBHOOK.read_text())
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    for patch in kustomization["patches"]:
        if patch["target"]["kind"] == "MutatingWebhookConfiguration":
            config = json_patch(config, yaml.safe_load(patch["patch"]))
    ca = base64.b64encode(cluster.ca_file.read_bytes()).decode()
    hooks: list[dict[str, Any]] = config["webhooks"]
    for hook in hooks:
        service = hook["clientConfig"].pop("service")
        hook["clientConfig"] = {"url": cluster.control_url + service["path"], "caBundle": ca}
    return hooks


def install_shipped_webhooks(cluster: Cluster) -> None:
    configurations = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    url = f"{cluster.apiserver_url}{configurations}/hami-webhook"
    with urllib3.PoolManager() as pool:
        stored = orjson.loads(pool.request("GET", url).data)
        stored["webhooks"] = shipped_webhooks(cluster)
        response = pool.request(
            "PUT", url, body=orjson.dumps(stored), headers={"Content-Type": "application/json"}
        )
    assert response.status == 200, response.data


DEFAULT_SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("fragmentation-install")
    spec = ClusterSpec(
        NODES,
        split=10,
        scale=True,
        node_cpu="16",
        node_memory="64Gi",
        scheduler_config=SCHEDULER_CONFIG,
        control_args=tuple(component_flags()),
    )
    with Cluster.up(spec, state / ".hami-sim") as running:
        install_shipped_webhooks(running)
        # The cluster's own scheduler (profile default-scheduler, no extender) beside hami-scheduler.
        config, log = state / "default-scheduler.yaml", state / "default-scheduler.log"
        config.write_text(DEFAULT_SCHEDULER_CONFIG)
        with log.open("wb") as out:
            default_scheduler = subprocess.Popen(
                [sys.executable, "-m", "hami_sim.main", "scheduler", "--kubeconfig", str(running.kubeconfig),
                 "--config", str(config), "--profile", "default-scheduler"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for(lambda: b"hami-sim scheduler ready" in log.read_bytes(), 30, "default-scheduler ready")
            yield running
        finally:
            default_scheduler.terminate()
            default_scheduler.wait(10)


def cpu_pod(name: str, **options: Any) -> dict[str, Any]:
    """A pod that asks no GPU, created plain unless told otherwise."""
    return pod(name, container(requests={"cpu": "2", "memory": "1Gi"}), **options)


def sharing_pod(name: str, **options: Any) -> dict[str, Any]:
    return pod(name, container(gpus=1, gpumem_percentage=50, requests={"cpu": "1"}), **options)


def running_in(core: Any, namespace: str, name: str, timeout: float = 30.0) -> Any:
    def ready() -> Any:
        got = core.read_namespaced_pod(name, namespace)
        return got if got.status.phase == "Running" else None

    return wait_for(ready, timeout, f"pod {namespace}/{name} Running")


def running(core: Any, name: str, timeout: float = 30.0) -> Any:
    return running_in(core, NS, name, timeout)


def filter_calls(cluster: Cluster) -> float:
    found = re.search(
        r"^hami_extender_filter_duration_seconds_count(?:\{\})? (\S+)$", control_metrics(cluster), re.M
    )
    assert found, "hami-control exports no filter count"
    return float(found.group(1))


def cpu_filter(cluster: Cluster, body: dict[str, Any]) -> list[str]:
    """What hami-control's /cpu-filter keeps for a pod among every node."""
    context = client_ssl_context(cluster.ca_file.read_bytes())
    args = {"Pod": body, "Nodes": None, "NodeNames": [n.name for n in NODES]}
    with urllib3.PoolManager(ssl_context=context) as pool:
        response = pool.request("POST", cluster.control_url + "/cpu-filter", body=orjson.dumps(args))
    assert response.status == 200, response.data
    answer = orjson.loads(response.data)
    assert not answer.get("Error"), answer
    return list(answer["NodeNames"])


def failed_scheduling(core: Any, name: str) -> list[str]:
    return [
        e.message
        for e in core.list_namespaced_event(NS).items
        if e.involved_object.name == name and e.reason == "FailedScheduling"
    ]


def test_cpu_only_pods_schedule_without_hami_control_and_gpu_pods_wait_for_it(cluster: Cluster) -> None:
    nodes = {n.name for n in NODES}
    with core_v1(cluster) as core:
        # Up: the plain CPU-only pod is steered to hami-scheduler, asked about, and lands where
        # /cpu-filter keeps it.
        body = cpu_pod("cpu-up")
        kept = cpu_filter(cluster, body)
        assert kept and set(kept) <= nodes
        if "--fragmentation-filter=one" in component_flags():
            assert len(kept) == 1  # the node of FGD's best score: hami-control decides
        before = filter_calls(cluster)
        core.create_namespaced_pod(NS, body)
        cpu_up = running(core, "cpu-up")
        assert cpu_up.spec.scheduler_name == HAMI  # set by cpu.hami.io
        assert cpu_up.spec.node_name in kept
        assert filter_calls(cluster) >= before + 1  # /cpu-filter: HAMi's /filter ignores CPU-only pods
        # kube-system is never steered (the entry's namespaceSelector): default-scheduler places it.
        core.create_namespaced_pod("kube-system", cpu_pod("sys-cpu"))
        assert running_in(core, "kube-system", "sys-cpu").spec.scheduler_name == "default-scheduler"
        core.create_namespaced_pod(NS, sharing_pod("gpu-up"))
        gpu_up = running(core, "gpu-up")
        assert gpu_up.spec.scheduler_name == HAMI  # set by vgpu.hami.io

        cluster.kill("hami-control")
        try:
            # Down: a plain CPU-only pod is admitted unchanged (cpu.hami.io is Ignore, vgpu.hami.io's
            # conditions are false for it) and default-scheduler runs it.
            core.create_namespaced_pod(NS, cpu_pod("cpu-down"))
            cpu_down = running(core, "cpu-down")
            assert (cpu_down.spec.scheduler_name, cpu_down.spec.node_name in nodes) == (
                "default-scheduler",
                True,
            )
            # One steered before the outage schedules too (the ignorable entry is skipped).
            core.create_namespaced_pod(NS, cpu_pod("cpu-steered", scheduler_name=HAMI, labels=IGNORE))
            assert running(core, "cpu-steered").spec.node_name in nodes
            # A GPU pod is refused at admission (failurePolicy Fail).
            with pytest.raises(ApiException) as refused:
                core.create_namespaced_pod(NS, sharing_pod("gpu-refused"))
            assert refused.value.status == 500
            message = orjson.loads(refused.value.body or "{}")["message"]
            assert message.startswith('Internal error occurred: failed calling webhook "vgpu.hami.io"')
            assert message.endswith("connection refused"), message
            # One admitted before the outage waits: HAMi's entry is not ignorable.
            core.create_namespaced_pod(NS, sharing_pod("gpu-waiting", scheduler_name=HAMI, labels=IGNORE))
            messages = wait_for(lambda: failed_scheduling(core, "gpu-waiting"), 30, "FailedScheduling")
            assert messages[0].startswith(f'Post "{cluster.control_url}/filter"'), messages
            assert core.read_namespaced_pod("gpu-waiting", NS).spec.node_name is None
        finally:
            cluster.start_component("hami-control")

        # Back: the waiting GPU pod is scheduled at its next try (backoff at most 10 s), a new one admitted,
        # and plain CPU-only pods are steered again.
        assert running(core, "gpu-waiting", timeout=45).spec.node_name in nodes
        core.create_namespaced_pod(NS, sharing_pod("gpu-back"))
        running(core, "gpu-back")
        core.create_namespaced_pod(NS, cpu_pod("cpu-back"))
        assert running(core, "cpu-back").spec.scheduler_name == HAMI
