"""The fragmentation component through the local cluster, and what happens when hami-control is gone.

One small scale-mode cluster runs kube-scheduler's stand-in with the component's KubeSchedulerConfiguration
(daemonset/components/fragmentation/kube-scheduler-config.yaml: HAMi's entry, not ignorable, and the
second entry `cpu-filter`/`cpu-prioritize`, ignorable, at the same hami-control URL) and hami-control
with the component's flags (read from its kustomization.yaml patch).

- Up: a CPU-only pod and a GPU pod schedule and run; the CPU-only pod was asked about (/cpu-filter
  called: hami-control's filter count grows by it, HAMi's entry is not interested in it) and lands on a
  node /cpu-filter keeps for it.
- hami-control killed (SIGKILL, its one replica: the URL refuses connections, as a Service without
  endpoints): a new CPU-only pod schedules and runs (kube-scheduler skips the ignorable entry:
  schedule_one.go `findNodesThatPassExtenders`, `IsIgnorable`); creating a GPU pod is refused at
  admission (the webhook's failurePolicy Fail); a GPU pod admitted before the outage stays Pending with
  kube-scheduler's `Post ".../filter"` error (HAMi's entry is not ignorable).
- hami-control started again: the pending GPU pod schedules and runs, and a new GPU pod is admitted and
  runs.

The local API server does not evaluate the webhook's CEL `matchConditions`, which in the shipped install
keep pods that ask no GPU away from the webhook (daemonset/base/webhook): the CPU-only pods here carry
`hami.io/webhook: ignore`, which does the same. The GPU pod "admitted before the outage" carries it too,
with the schedulerName the webhook would have set."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.scheduler.config import load_configuration, scheduler_config
from hami_sim.tls import client_ssl_context
from tests.builders import container, pod
from tests.e2e.e2e_util import control_metrics, core_v1
from tests.waiting import wait_for

COMPONENT = Path(__file__).resolve().parents[2] / "daemonset" / "components" / "fragmentation"
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
        yield running


def cpu_pod(name: str) -> dict[str, Any]:
    return pod(name, container(requests={"cpu": "2", "memory": "1Gi"}), scheduler_name=HAMI, labels=IGNORE)


def sharing_pod(name: str, **options: Any) -> dict[str, Any]:
    return pod(name, container(gpus=1, gpumem_percentage=50, requests={"cpu": "1"}), **options)


def running(core: Any, name: str, timeout: float = 30.0) -> Any:
    def ready() -> Any:
        got = core.read_namespaced_pod(name, NS)
        return got if got.status.phase == "Running" else None

    return wait_for(ready, timeout, f"pod {name} Running")


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
    with core_v1(cluster) as core:
        # Up: the CPU-only pod is asked about, and lands where /cpu-filter keeps it.
        body = cpu_pod("cpu-up")
        kept = cpu_filter(cluster, body)
        assert kept and set(kept) <= {n.name for n in NODES}
        if "--fragmentation-filter=one" in component_flags():
            assert len(kept) == 1  # the node of FGD's best score: hami-control decides
        before = filter_calls(cluster)
        core.create_namespaced_pod(NS, body)
        assert running(core, "cpu-up").spec.node_name in kept
        assert filter_calls(cluster) >= before + 1  # /cpu-filter: HAMi's /filter ignores CPU-only pods
        core.create_namespaced_pod(NS, sharing_pod("gpu-up"))
        gpu_up = running(core, "gpu-up")
        assert gpu_up.spec.scheduler_name == HAMI  # set by the webhook

        cluster.kill("hami-control")
        try:
            # Down: the CPU-only pod schedules (the ignorable entry is skipped) and runs.
            core.create_namespaced_pod(NS, cpu_pod("cpu-down"))
            assert running(core, "cpu-down").spec.node_name in {n.name for n in NODES}
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

        # Back: the waiting GPU pod is scheduled at its next try (backoff at most 10 s), a new one admitted.
        assert running(core, "gpu-waiting", timeout=45).spec.node_name in {n.name for n in NODES}
        core.create_namespaced_pod(NS, sharing_pod("gpu-back"))
        running(core, "gpu-back")
