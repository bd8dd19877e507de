"""End to end through DRA on `hami-sim` (every component a real process, real protocols), on a mixed
cluster: `gpu-dp` serves its GPUs through the device plugin, `gpu-dra` through DRA (hami-node --mode
dra). Pods are created through the official client as a user would; those of the namespace labelled
`hami.io/dra=enabled` are translated to claims by the webhook, allocated by the scheduler stand-in
(no extender call), prepared by the kubelet stand-in through the node daemon's DRA plugin.

- The same pods get the same HAMi-core limits through DRA as through the device plugin (the env the
  kubelet stand-in's runtime recorded, from Allocate or from the claims' CDI specs).
- Restarts of hami-node, the kubelet stand-in and the scheduler lose nothing: running pods keep their
  claims and their env, a claim prepared again gets the same CDI devices, new pods still land, and no
  GPU is ever given more than it has.
- An Xid taints the device in its ResourceSlice, no new claim lands on it while it is tainted, and
  recovery removes the taint.
- The webhook's ResourceClaimTemplates never leak: one per namespace and size, however many pods come and
  go; the claims go with their pods.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kubernetes import client, config

from hami_api import dra
from hami_api.quantity import quantity_value
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import FakeEvent, load_inventory, write_inventory
from hami_sim.cluster import Cluster, ClusterSpec, GPUSpec, NodeSpec
from hami_sim.kubelet.config import CONTAINERS_FILE
from hami_sim.kubelet.runtime import read_containers
from tests.builders import container, gpu_pod, pod
from tests.e2e.e2e_util import control_metrics
from tests.waiting import wait_for

DP, DRA = "gpu-dp", "gpu-dra"
DRA_NS = "dra-team"
LIMIT_KEYS = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    a100 = GPUSpec("NVIDIA A100-SXM4-80GB")
    spec = ClusterSpec(
        nodes=(NodeSpec(DP, (a100,) * 4), NodeSpec(DRA, (a100,) * 4, mode="dra")),
        node_args=("--health-recovery-seconds", "3"),
    )
    with Cluster.up(spec, tmp_path_factory.mktemp("sim") / ".hami-sim") as running:
        yield running


@dataclasses.dataclass
class Apis:
    core: Any
    resource: Any


@pytest.fixture(scope="module")
def apis(cluster: Cluster) -> Iterator[Apis]:
    api_client = config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        core: Any = client.CoreV1Api(api_client)
        core.create_namespace({"metadata": {"name": DRA_NS, "labels": {"hami.io/dra": "enabled"}}})
        yield Apis(core, client.ResourceV1Api(api_client))
    finally:
        api_client.close()


@pytest.fixture
def clean(cluster: Cluster, apis: Apis) -> Iterator[None]:
    """Each test starts and ends with no pods (and so, once the controller is done, no claims), and with
    hami-control counting none: a pod created while hami-control still counts a deleted one may be
    refused by its filter, and then waits in the scheduler's unschedulable pool for the next cluster event
    (kube-scheduler's too: the deletions came before its attempt), up to 5 minutes."""
    yield
    for namespace in ("default", DRA_NS):
        apis.core.delete_collection_namespaced_pod(namespace)
    wait_for(
        lambda: not any(apis.core.list_namespaced_pod(ns).items for ns in ("default", DRA_NS)),
        60,
        "the deleted pods to go",
    )
    wait_for(
        lambda: not apis.resource.list_namespaced_resource_claim(DRA_NS).items,
        30,
        "the deleted pods' claims to go",
    )
    wait_for(lambda: 'pod="' not in control_metrics(cluster), 30, "hami-control to count no pod")


def create(apis: Apis, body: dict[str, Any], namespace: str) -> None:
    apis.core.create_namespaced_pod(namespace, body)


def wait_running(apis: Apis, namespace: str, names: Sequence[str], timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pods = {n: apis.core.read_namespaced_pod(n, namespace) for n in names}
        return pods if all(p.status.phase == "Running" for p in pods.values()) else None

    def state() -> str:
        return ", ".join(f"{n}: {apis.core.read_namespaced_pod(n, namespace).status.phase}" for n in names)

    pods: dict[str, Any] = wait_for(done, timeout, f"{names} Running in {namespace}", detail=state)
    return pods


def env_of(cluster: Cluster, pod_obj: Any, name: str) -> dict[str, str]:
    containers = read_containers(cluster.kubelet_dir(pod_obj.spec.node_name) / CONTAINERS_FILE)
    return containers.env(pod_obj.metadata.uid, name)


def limits(env: dict[str, str]) -> dict[int, tuple[str | None, str | None]]:
    """The HAMi-core limits an env sets, per GPU index: (memory, SM %). HAMi-core reads
    `CUDA_DEVICE_SM_LIMIT` (and `CUDA_DEVICE_MEMORY_LIMIT`) as the default of every GPU and the `_<i>`
    forms per GPU, so "SM_LIMIT=20" and "SM_LIMIT_0=20, SM_LIMIT_1=20" set the same on two GPUs."""
    indices = sorted(
        int(k.rsplit("_", 1)[1]) for k in env if k.startswith(LIMIT_KEYS) and k.rsplit("_", 1)[1].isdigit()
    )
    return {
        i: (
            env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", env.get("CUDA_DEVICE_MEMORY_LIMIT")),
            env.get(f"CUDA_DEVICE_SM_LIMIT_{i}", env.get("CUDA_DEVICE_SM_LIMIT")),
        )
        for i in indices
    }


def dra_slice(apis: Apis) -> Any:
    items = apis.resource.list_resource_slice(
        field_selector=f"spec.nodeName={DRA},spec.driver={dra.DRIVER}"
    ).items
    assert len(items) == 1, [i.metadata.name for i in items]
    return items[0]


def consumed_per_device(apis: Apis) -> dict[str, tuple[int, int, int]]:
    """Per device: (shares, bytes, cores) that the allocated claims consume."""
    used: dict[str, list[int]] = {}
    for claim in apis.resource.list_resource_claim_for_all_namespaces().items:
        allocation = claim.status.allocation if claim.status else None
        for result in allocation.devices.results if allocation else []:
            consumed = result.consumed_capacity or {}
            entry = used.setdefault(result.device, [0, 0, 0])
            entry[0] += 1
            entry[1] += quantity_value(consumed.get("memory", "0"))
            entry[2] += quantity_value(consumed.get("cores", "0"))
    return {k: (v[0], v[1], v[2]) for k, v in used.items()}


def assert_within_capacity(apis: Apis) -> None:
    devices = {d.name: d for d in dra_slice(apis).spec.devices}
    for name, (_shares, memory, cores) in consumed_per_device(apis).items():
        capacity = devices[name].capacity
        assert memory <= quantity_value(capacity["memory"].value), (name, memory)
        assert cores <= quantity_value(capacity["cores"].value), (name, cores)


ASKS: dict[str, dict[str, Any]] = {
    "slice": {"gpumem": 4000, "gpucores": 30},
    "memory-only": {"gpumem": 6000},
    "whole": {},
    "two-gpus": {"gpus": 2, "gpumem": 8000, "gpucores": 20},
}


@pytest.mark.usefixtures("clean")
def test_the_same_pods_get_the_same_limits_through_dra_as_through_the_device_plugin(
    cluster: Cluster, apis: Apis
) -> None:
    # `whole` first: with HAMi's default GPU policy (spread) the other pods may take one GPU each of the
    # node's four, and a whole GPU is left only if `whole` is placed before them (a flake seen in CI).
    for namespace in ("default", DRA_NS):
        create(apis, gpu_pod("whole", gpus=1), namespace)
        wait_running(apis, namespace, ["whole"])
    for name, ask in ASKS.items():
        if name == "whole":
            continue
        create(apis, gpu_pod(name, **{"gpus": 1, **ask}), "default")
        create(apis, gpu_pod(name, **{"gpus": 1, **ask}), DRA_NS)
    with_init = pod(
        "init",
        container("main", gpus=1, gpumem=3000, gpucores=10),
        init=[container("warm", gpus=1, gpumem=2000)],
    )
    create(apis, with_init, "default")
    create(apis, json.loads(json.dumps(with_init)), DRA_NS)
    names = [*ASKS, "init"]
    dp = wait_running(apis, "default", names)
    via_dra = wait_running(apis, DRA_NS, names)
    for name in names:
        assert dp[name].spec.node_name == DP and via_dra[name].spec.node_name == DRA, name
        assert via_dra[name].spec.resource_claims, f"{name} was not translated to claims"
        for ctr in [c.name for c in via_dra[name].spec.init_containers or []] + ["main"]:
            expected = limits(env_of(cluster, dp[name], ctr))
            got = limits(env_of(cluster, via_dra[name], ctr))
            assert expected, f"{name}/{ctr}: no limits through the device plugin"
            assert got == expected, (name, ctr)
    assert_within_capacity(apis)


def cdi_specs(cluster: Cluster) -> dict[str, bytes]:
    directory = cluster.kubelet_dir(DRA) / "cdi"
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*")) if p.is_file()}


@pytest.mark.usefixtures("clean")
def test_restarts_of_hami_node_kubelet_and_scheduler_lose_nothing_and_prepare_again_is_idempotent(
    cluster: Cluster, apis: Apis
) -> None:
    first = ["before-1", "before-2"]
    for name in first:
        create(apis, gpu_pod(name, gpus=1, gpumem=10000, gpucores=20), DRA_NS)
    pods = wait_running(apis, DRA_NS, first)
    envs = {n: env_of(cluster, p, "main") for n, p in pods.items()}
    specs = cdi_specs(cluster)
    assert len(specs) == 2, specs.keys()
    claims = {
        c.metadata.name: c.status.allocation
        for c in apis.resource.list_namespaced_resource_claim(DRA_NS).items
    }

    cluster.restart(f"hami-node/{DRA}")
    wait_for(lambda: dra_slice(apis).spec.devices, 30, "the slice published again")
    cluster.restart(f"kubelet/{DRA}")
    cluster.restart("scheduler")
    # The kubelet stand-in prepared the running pods' claims again: same specs, same env.
    wait_for(lambda: cdi_specs(cluster) == specs, 30, "the claims' CDI specs as they were")
    after = {
        c.metadata.name: c.status.allocation
        for c in apis.resource.list_namespaced_resource_claim(DRA_NS).items
    }
    assert after == claims
    for name in first:
        current = apis.core.read_namespaced_pod(name, DRA_NS)
        assert current.status.phase == "Running" and current.metadata.uid == pods[name].metadata.uid
        assert env_of(cluster, current, "main") == envs[name]
    later = ["after-1", "after-2", "after-3"]
    for name in later:
        create(apis, gpu_pod(name, gpus=1, gpumem=20000, gpucores=20), DRA_NS)
    wait_running(apis, DRA_NS, later)
    assert_within_capacity(apis)


def taints(apis: Apis) -> dict[str, list[str]]:
    return {
        d.name: [f"{t.key}={t.value}:{t.effect}" for t in d.taints or []]
        for d in dra_slice(apis).spec.devices
    }


@pytest.mark.usefixtures("clean")
def test_an_xid_taints_the_device_and_no_new_claim_lands_on_it_until_it_recovers(
    cluster: Cluster, apis: Apis
) -> None:
    path = cluster.inventory_path(DRA)
    healthy = load_inventory(path)
    sick = healthy.gpus[0]
    sick_device = dra.device_name(sick.minor)

    def inventory(failing: bool) -> None:
        events = (FakeEvent("dra-xid-79", GPUEventKind.XID, sick.uuid, 79),)
        gpus = tuple(
            dataclasses.replace(g, healthy=not failing) if g.uuid == sick.uuid else g for g in healthy.gpus
        )
        write_inventory(path, dataclasses.replace(healthy, gpus=gpus, events=events))

    inventory(failing=True)
    wait_for(lambda: taints(apis)[sick_device], 15, "the device tainted in its slice")
    assert all(t.endswith(":NoSchedule") and "unhealthy" in t for t in taints(apis)[sick_device])
    # As many whole GPUs asked as the node has, one of them tainted: all but one pod run, one waits.
    names = [f"whole-{i}" for i in range(len(healthy.gpus))]
    for name in names:
        create(apis, gpu_pod(name, gpus=1), DRA_NS)

    def all_but_one_running() -> list[Any] | None:
        pods = [apis.core.read_namespaced_pod(n, DRA_NS) for n in names]
        running = [p for p in pods if p.status.phase == "Running"]
        return running if len(running) == len(names) - 1 else None

    running = wait_for(all_but_one_running, 60, "all whole-GPU pods but one running")
    held = time.monotonic() + 3
    while time.monotonic() < held:  # the last one stays pending while the device is tainted
        assert all_but_one_running() is not None
        time.sleep(0.2)
    assert sick_device not in consumed_per_device(apis), consumed_per_device(apis)
    assert running

    inventory(failing=False)
    wait_for(lambda: not taints(apis)[sick_device], 30, "the taint removed after recovery")
    wait_running(apis, DRA_NS, names)
    assert consumed_per_device(apis)[sick_device][0] == 1


@pytest.mark.usefixtures("clean")
def test_the_webhooks_claim_templates_never_leak(cluster: Cluster, apis: Apis) -> None:
    def templates() -> set[str]:
        return {t.metadata.name for t in apis.resource.list_namespaced_resource_claim_template(DRA_NS).items}

    before = templates()
    sizes = [(2000, 10), (3000, 10)]
    for round_ in range(3):
        names = []
        for i in range(4):
            mem, cores = sizes[i % 2]
            name = f"leak-{round_}-{i}"
            create(apis, gpu_pod(name, gpus=1, gpumem=mem, gpucores=cores), DRA_NS)
            names.append(name)
        wait_running(apis, DRA_NS, names)
        apis.core.delete_collection_namespaced_pod(DRA_NS)
        wait_for(
            lambda: not apis.resource.list_namespaced_resource_claim(DRA_NS).items, 30, "the claims to go"
        )
    assert len(templates() - before) <= len(sizes)
    assert all(n.startswith("hami-gpu-") for n in templates() - before)
