"""End to end on `hami-sim` (2 nodes x 4 fake A100s, split 10; hami-node recovers a GPU after a 3 s
quiet period): faults while pods are being scheduled, every pod created through the official client as
a user would, without a schedulerName.

- Restarts mid-burst: hami-control restarts while the first 15 of 30 pods are being scheduled, then
  one node's hami-node and the other node's kubelet stand-in while the other 15 are. No pod is lost
  (each of the 30 ends Running with bind-phase=success on the node hami-control chose, or rejected by
  kubelet for a reason the restart on its node explains, as a real kubelet does; replacements then
  run) and no GPU is given out twice over (per GPU: slots <= its split, memory and cores within what
  the node registered).
- An Xid on one GPU, injected through the node's fake inventory file: the GPU turns unhealthy in the
  node's register annotation and kubelet's allocatable, and recovers by itself after the quiet period.
  While it stays unhealthy (the same Xid, and the GPU failing its probe) no new pod lands on it: pods
  spread over the node's other GPUs, and a pod that asks for that GPU by UUID stays Pending with
  FailedScheduling. Once the GPU answers again it recovers, the waiting pod runs on it and new pods
  land on it again.
- Node usage counts the slices on an unhealthy GPU: pods pinned to one GPU hold most of its memory when
  an Xid makes it unhealthy. They keep running and hami-control keeps counting them (its /metrics)
  while the GPU is out and after it recovers, so no new pod lands on it while it is unhealthy and,
  after recovery, it is never given more memory than it has: a pod pinned to it that asks one MiB more
  than is left stays Pending with FailedScheduling naming CardInsufficientMemory.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from hami_api.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    USE_GPU_UUID,
    VGPU_NODE,
    decode_node_register,
    decode_pod_allocation,
)
from hami_api.types import GPUInfo
from hami_node.gpu.backend import GPUEventKind
from hami_node.gpu.inventory import FakeEvent, Inventory, load_inventory, write_inventory
from hami_sim.cluster import Cluster, ClusterSpec
from hami_sim.tls import client_ssl_context
from tests.builders import gpu_pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_for

SPLIT = 10
RECOVERY_S = 3
NODE_1, NODE_2 = "gpu-node-1", "gpu-node-2"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec.uniform(2, 4, split=SPLIT, node_args=("--health-recovery-seconds", str(RECOVERY_S)))
    with Cluster.up(spec, tmp_path_factory.mktemp("faults") / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def create(
    core: Any, names: Sequence[str], *, node: str | None = None, uuid: str | None = None, mem: int = 1000
) -> None:
    """One-GPU pods of `mem` MiB, on `node` (a node selector) and on GPU `uuid` (use-gpuuuid) if given."""
    for name in names:
        body = gpu_pod(
            name,
            gpumem=mem,
            annotations={USE_GPU_UUID: uuid} if uuid else None,
            node_selector={"kubernetes.io/hostname": node} if node else None,
        )
        core.create_namespaced_pod("default", body)


def pods_named(core: Any, names: Sequence[str]) -> dict[str, Any]:
    wanted = set(names)
    return {
        p.metadata.name: p for p in core.list_namespaced_pod("default").items if p.metadata.name in wanted
    }


def wait_running(core: Any, names: Sequence[str], timeout: float) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pods = pods_named(core, names)
        ok = len(pods) == len(names) and all(
            p.status.phase == "Running" and (p.metadata.annotations or {}).get(BIND_PHASE) == "success"
            for p in pods.values()
        )
        return pods if ok else None

    def state() -> str:
        pods = pods_named(core, names)
        return ", ".join(
            f"{n}: {p.status.phase}/{(p.metadata.annotations or {}).get(BIND_PHASE)}"
            for n, p in sorted(pods.items())
            if p.status.phase != "Running"
        ) + (f"; missing {sorted(set(names) - set(pods))}" if len(pods) != len(names) else "")

    return wait_for(done, timeout, f"{len(names)} pods Running with bind-phase=success", detail=state)


def delete_all(core: Any) -> None:
    for pod in core.list_namespaced_pod("default").items:
        core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod("default").items, 30, "every pod to go")


def slices(pod: Any) -> list[tuple[str, int, int]]:
    text = pod.metadata.annotations[DEVICES_ALLOCATED]
    allocation = decode_pod_allocation(text, DEVICES_ALLOCATED)
    return [(s.uuid, s.usedmem, s.usedcores) for c in allocation.containers for s in c.devices]


def registered(core: Any) -> dict[str, GPUInfo]:
    """Every node's GPUs by UUID, from hami-node's register annotation."""
    gpus: dict[str, GPUInfo] = {}
    for node in core.list_node().items:
        for gpu in decode_node_register((node.metadata.annotations or {}).get(NODE_REGISTER, "[]")):
            gpus[gpu.id] = gpu
    return gpus


def assert_within_limits(core: Any, pods: Sequence[Any]) -> None:
    gpus = registered(core)
    used: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for pod in pods:
        node = pod.spec.node_name
        assert pod.metadata.annotations[VGPU_NODE] == node, pod.metadata.name
        for uuid, mem, cores in slices(pod):
            assert uuid in gpus, (pod.metadata.name, uuid)
            assert gpus[uuid].id in {g.id for g in gpus.values()}
            used[uuid][0] += 1
            used[uuid][1] += mem
            used[uuid][2] += cores
    for uuid, (count, mem, cores) in used.items():
        gpu = gpus[uuid]
        assert count <= gpu.count and mem <= gpu.devmem and cores <= gpu.devcore, (uuid, count, mem, cores)


REJECTED = "UnexpectedAdmissionError"
"""kubelet's reason for a pod whose Allocate failed at admission. A pod bound to a node while that
node's device plugin is down (here: hami-node restarting) meets it: kubelet marks the plugin's devices
unhealthy when its ListAndWatch stream ends and rejects the pod, which ends Failed (real kubelet does
the same, and so does our stand-in). A pod whose GetPreferredAllocation or Allocate call is in flight
when the plugin goes away, or reaches its socket after it is gone, is rejected the same way with the
call's error. A controller would create a replacement; the test does."""

EXPECTED_REJECTIONS = {
    NODE_1: (
        "unhealthy devices",
        "endpoint nvidia.com/gpu has been stopped",
        "rpc error: code = Canceled",
        "rpc error: code = Unavailable",
    ),
    NODE_2: ("no healthy devices present",),
}
"""Per node, what the message of a pod kubelet rejected because of the restarts may say. NODE_1 (its
hami-node restarted): the pod was admitted while the plugin was down, the plugin went away between
its GetPreferredAllocation and its Allocate, the restart cancelled its call to the plugin, or the call
found no plugin socket. NODE_2 (its kubelet restarted): the pod, bound
while the kubelet was down, was admitted before hami-node registered again, as a real kubelet does
(kubernetes/kubernetes#133382, #125579)."""


def settled(core: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """Every pod Running with bind-phase=success or rejected by kubelet at admission; else None."""
    pods = pods_named(core, names)
    ok = len(pods) == len(names) and all(
        (p.status.phase == "Running" and (p.metadata.annotations or {}).get(BIND_PHASE) == "success")
        or (p.status.phase == "Failed" and p.status.reason == REJECTED)
        for p in pods.values()
    )
    return pods if ok else None


def test_restarts_mid_burst_lose_no_pod_and_double_book_no_gpu(cluster: Cluster, core: Any) -> None:
    first = [f"burst-{i:02d}" for i in range(15)]
    second = [f"burst-{i:02d}" for i in range(15, 30)]
    started = time.monotonic()
    create(core, first)
    cluster.restart("hami-control")  # while the first 15 are being filtered and bound
    create(core, second)  # the webhook answers again
    cluster.restart(f"hami-node/{NODE_1}")
    cluster.restart(f"kubelet/{NODE_2}")
    names = first + second
    try:
        pods = wait_for(lambda: settled(core, names), 60, "30 pods Running, or rejected by kubelet")
    except AssertionError:
        left = {n: (p.status.phase, p.status.reason) for n, p in pods_named(core, names).items()}
        raise AssertionError(f"not settled: {left}") from None
    rejected = sorted(n for n, p in pods.items() if p.status.phase == "Failed")
    print(
        f"\nfaults: 30 pods with three restarts settled after {time.monotonic() - started:.1f} s; "
        f"rejected by kubelet during the restarts: {[(n, pods[n].spec.node_name) for n in rejected]}"
    )
    for name in rejected:  # only for the reasons the restarts on that node explain
        pod = pods[name]
        causes = EXPECTED_REJECTIONS[pod.spec.node_name]
        assert any(cause in pod.status.message for cause in causes), (
            name,
            pod.spec.node_name,
            pod.status.message,
        )
    running = [p for p in pods.values() if p.status.phase == "Running"]
    assert_within_limits(core, running)
    for pod in running:  # the GPUs a pod holds are on the node it runs on
        node_gpus = {g.id for g in registered_on(core, pod.spec.node_name)}
        assert {uuid for uuid, _m, _c in slices(pod)} <= node_gpus, pod.metadata.name

    # Replacements for the rejected pods, and one more pod: the cluster schedules after the restarts.
    again = [f"again-{name}" for name in rejected] + ["after-restarts"]
    create(core, again)
    wait_running(core, again, 30)
    assert_within_limits(
        core, [p for p in pods_named(core, names + again).values() if p.status.phase == "Running"]
    )
    delete_all(core)


def registered_on(core: Any, node: str) -> tuple[GPUInfo, ...]:
    annotations = core.read_node(node).metadata.annotations or {}
    return decode_node_register(annotations.get(NODE_REGISTER, "[]"))


def gpu_health(core: Any, node: str, uuid: str) -> bool:
    (gpu,) = [g for g in registered_on(core, node) if g.id == uuid]
    return gpu.health


def allocatable_gpus(core: Any, node: str) -> int:
    return int(core.read_node(node).status.allocatable["nvidia.com/gpu"])


def test_an_xid_keeps_new_pods_off_the_gpu_until_it_recovers(cluster: Cluster, core: Any) -> None:
    path = cluster.inventory_path(NODE_1)
    healthy = load_inventory(path)
    sick = healthy.gpus[1].uuid
    full = allocatable_gpus(core, NODE_1)
    assert full == 4 * SPLIT and gpu_health(core, NODE_1, sick)

    def inventory(xids: Sequence[str], failing: bool) -> None:
        events = tuple(FakeEvent(i, GPUEventKind.XID, sick, 79) for i in xids)
        gpus = tuple(
            dataclasses.replace(g, healthy=not failing) if g.uuid == sick else g for g in healthy.gpus
        )
        write_inventory(path, dataclasses.replace(healthy, gpus=gpus, events=events))

    # An Xid alone: unhealthy at once (annotation and kubelet), healthy again after the quiet period.
    inventory(["xid-79-a"], failing=False)
    wait_for(
        lambda: not gpu_health(core, NODE_1, sick), 10, "the Xid to mark the GPU unhealthy", interval=0.05
    )
    marked = time.monotonic()
    wait_for(lambda: gpu_health(core, NODE_1, sick), 30, "the GPU to recover by itself")
    print(f"\nfaults: GPU unhealthy after its Xid for about {time.monotonic() - marked:.1f} s")
    wait_for(lambda: allocatable_gpus(core, NODE_1) == full, 10, "kubelet's allocatable back to full")

    # The Xid again, and this time the GPU fails its probe, so it stays unhealthy.
    inventory(["xid-79-a", "xid-79-b"], failing=True)
    wait_for(lambda: not gpu_health(core, NODE_1, sick), 10, "the second Xid to mark the GPU unhealthy")
    wait_for(lambda: allocatable_gpus(core, NODE_1) == full - SPLIT, 10, "kubelet's allocatable without it")
    spread = [f"while-sick-{i}" for i in range(6)]
    create(core, spread, node=NODE_1)
    create(core, ["pinned"], uuid=sick)
    pods = wait_running(core, spread, 60)
    on = {name: {u for u, _m, _c in slices(p)} for name, p in pods.items()}
    assert all(sick not in uuids for uuids in on.values()), on
    assert len(set().union(*on.values())) == 3  # spread over the three healthy GPUs

    def refused() -> bool:
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=pinned").items
        return any(e.reason == "FailedScheduling" for e in events)

    wait_for(refused, 30, "the pod pinned to the sick GPU to be found unschedulable")
    pinned = core.read_namespaced_pod("pinned", "default")
    assert pinned.status.phase == "Pending" and not pinned.spec.node_name
    # It stays unhealthy past the quiet period while it fails its probe (a check over a duration).
    held = time.monotonic() + RECOVERY_S + 1
    while time.monotonic() < held:
        assert not gpu_health(core, NODE_1, sick), "recovered while failing its probe"
        time.sleep(0.2)
    assert core.read_namespaced_pod("pinned", "default").status.phase == "Pending"

    # The GPU answers again: it recovers after the quiet period, and pods land on it again.
    inventory(["xid-79-a", "xid-79-b"], failing=False)
    wait_for(lambda: gpu_health(core, NODE_1, sick), 30, "the GPU to recover")
    wait_for(lambda: allocatable_gpus(core, NODE_1) == full, 10, "kubelet's allocatable back to full")
    pinned = wait_running(core, ["pinned"], 30)["pinned"]
    assert [u for u, _m, _c in slices(pinned)] == [sick]
    after = [f"after-recovery-{i}" for i in range(4)]
    create(core, after, node=NODE_1)
    pods = wait_running(core, after, 60)
    assert any(sick in {u for u, _m, _c in slices(p)} for p in pods.values())
    assert_within_limits(core, list(pods_named(core, [*spread, "pinned", *after]).values()))


def with_gpu_fault(base: Inventory, uuid: str, xids: Sequence[str], failing: bool) -> Inventory:
    """`base` with an Xid 79 on GPU `uuid` for each id in `xids`, the GPU failing its probe if `failing`."""
    events = tuple(FakeEvent(i, GPUEventKind.XID, uuid, 79) for i in xids)
    gpus = tuple(dataclasses.replace(g, healthy=not failing) if g.uuid == uuid else g for g in base.gpus)
    return dataclasses.replace(base, gpus=gpus, events=events)


def held_on(core: Any, uuid: str) -> tuple[int, int]:
    """(slices, MiB) that the pods holding an allocation hold on GPU `uuid`, from their annotations."""
    count = mem = 0
    for pod in core.list_namespaced_pod("default").items:
        if pod.status.phase in ("Succeeded", "Failed") or DEVICES_ALLOCATED not in (
            pod.metadata.annotations or {}
        ):
            continue
        for gpu, used, _cores in slices(pod):
            if gpu == uuid:
                count += 1
                mem += used
    return count, mem


def counted_by_control(cluster: Cluster, uuid: str) -> tuple[int, int]:
    """(slices, MiB) hami-control counts on GPU `uuid`: its hami_gpu_shared_count and
    hami_gpu_memory_allocated_bytes."""
    context = client_ssl_context(cluster.ca_file.read_bytes())
    with urllib3.PoolManager(ssl_context=context) as pool:
        response = pool.request("GET", cluster.control_url + "/metrics", timeout=10.0, retries=False)
    assert response.status == 200, response.status
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            if sample.labels.get("device_uuid") == uuid:
                values[sample.name] = sample.value
    return int(values["hami_gpu_shared_count"]), int(values["hami_gpu_memory_allocated_bytes"]) // 2**20


def wait_counted(cluster: Cluster, core: Any, uuid: str, what: str) -> None:
    """Wait until hami-control counts on GPU `uuid` exactly what the pods' annotations hold there."""

    def agree() -> bool:
        return counted_by_control(cluster, uuid) == held_on(core, uuid)

    def state() -> str:
        return (
            f"hami-control counts {counted_by_control(cluster, uuid)} (slices, MiB), "
            f"the pods hold {held_on(core, uuid)}"
        )

    wait_for(agree, 10, what, detail=state)


def failed_scheduling(core: Any, name: str) -> list[str]:
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e.message for e in events if e.reason == "FailedScheduling"]


@pytest.fixture
def own_pods(cluster: Cluster, core: Any) -> Iterator[list[str]]:
    """The names of the pods a test creates; afterwards they are deleted (and waited for) and NODE_1's
    inventory file is written back as it was, so later tests in the module find the cluster as before."""
    path = cluster.inventory_path(NODE_1)
    before = load_inventory(path)
    names: list[str] = []
    yield names
    for name in pods_named(core, names):
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_for(lambda: not pods_named(core, names), 30, f"the test's {len(names)} pods to go")
    write_inventory(path, before)
    health = {g.uuid: g.healthy for g in before.gpus}
    wait_for(
        lambda: {g.id: g.health for g in registered_on(core, NODE_1)} == health,
        30,
        f"{NODE_1}'s GPUs to be as healthy as its restored inventory says",
    )


def test_pods_on_a_gpu_stay_counted_through_its_xid_so_it_is_never_overcommitted_after_recovery(
    cluster: Cluster, core: Any, own_pods: list[str]
) -> None:
    path = cluster.inventory_path(NODE_1)
    base = load_inventory(path)
    full = allocatable_gpus(core, NODE_1)
    assert full == 4 * SPLIT
    # The GPU of NODE_1 holding the fewest slices (earlier tests of the module may have left pods).
    gpu = min(base.gpus, key=lambda g: (held_on(core, g.uuid)[0], g.index)).uuid
    devmem = registered(core)[gpu].devmem
    assert gpu_health(core, NODE_1, gpu)
    slots_held, mem_held = held_on(core, gpu)
    # Room for the four pinned pods that land on it below and a free slot when the fifth asks, so that
    # one is refused for its memory, not for the GPU's slots.
    assert slots_held + 4 < SPLIT, slots_held
    free = devmem - mem_held

    def create_own(names: Sequence[str], **options: Any) -> None:
        own_pods.extend(names)
        create(core, names, **options)

    # Before the Xid: three pods pinned to the GPU together take 90% of its free memory.
    placed = [f"counted-before-{i}" for i in range(3)]
    create_own(placed, uuid=gpu, mem=free * 3 // 10)
    pods = wait_running(core, placed, 30)
    assert all([u for u, _m, _c in slices(p)] == [gpu] for p in pods.values())
    wait_counted(cluster, core, gpu, "hami-control to count the pods placed on the GPU")
    left = devmem - held_on(core, gpu)[1]
    assert 0 < left <= free // 10 + 3, left

    # An Xid, and the GPU failing its probe: it stays unhealthy.
    write_inventory(path, with_gpu_fault(base, gpu, ["counted-xid-79-a"], failing=True))
    wait_for(lambda: not gpu_health(core, NODE_1, gpu), 10, "the Xid to mark the GPU unhealthy")
    wait_for(lambda: allocatable_gpus(core, NODE_1) == full - SPLIT, 10, "kubelet's allocatable without it")
    wait_counted(cluster, core, gpu, "hami-control to count the pods on the unhealthy GPU")
    pods = pods_named(core, placed)
    assert {n: p.status.phase for n, p in pods.items()} == dict.fromkeys(placed, "Running")

    # While it is unhealthy, new pods on NODE_1 land on the other GPUs; one pinned to it waits.
    while_sick = [f"counted-while-sick-{i}" for i in range(3)]
    create_own(while_sick, node=NODE_1, mem=1000)
    create_own(["counted-pinned-fits"], uuid=gpu, mem=left // 2)
    pods = wait_running(core, while_sick, 30)
    assert all(gpu not in {u for u, _m, _c in slices(p)} for p in pods.values())
    refusals = wait_for(
        lambda: failed_scheduling(core, "counted-pinned-fits"), 30, "the pinned pod's FailedScheduling"
    )
    assert all("CardNotHealth" in m for m in refusals), refusals
    waiting = core.read_namespaced_pod("counted-pinned-fits", "default")
    assert waiting.status.phase == "Pending" and not waiting.spec.node_name
    assert not gpu_health(core, NODE_1, gpu)  # still unhealthy when the pinned pod was refused

    # It answers again and recovers; the pods placed before the Xid are still running and counted.
    write_inventory(path, with_gpu_fault(base, gpu, ["counted-xid-79-a"], failing=False))
    wait_for(lambda: gpu_health(core, NODE_1, gpu), 30, "the GPU to recover")
    wait_for(lambda: allocatable_gpus(core, NODE_1) == full, 10, "kubelet's allocatable back to full")
    fits = wait_running(core, ["counted-pinned-fits"], 30)["counted-pinned-fits"]
    assert [u for u, _m, _c in slices(fits)] == [gpu]
    assert held_on(core, gpu)[1] <= devmem
    pods = pods_named(core, placed)
    assert {n: p.status.phase for n, p in pods.items()} == dict.fromkeys(placed, "Running")
    wait_counted(cluster, core, gpu, "hami-control to count the pods on the recovered GPU")

    # New pods that each ask one MiB more than the GPU has left: pinned to it, one waits; unpinned on
    # NODE_1, they run on the other GPUs.
    over = devmem - held_on(core, gpu)[1] + 1
    create_own(["counted-pinned-too-big"], uuid=gpu, mem=over)
    after = [f"counted-after-recovery-{i}" for i in range(3)]
    create_own(after, node=NODE_1, mem=over)
    pods = wait_running(core, after, 30)
    assert all(gpu not in {u for u, _m, _c in slices(p)} for p in pods.values())

    def insufficient_memory() -> list[str]:
        return [m for m in failed_scheduling(core, "counted-pinned-too-big") if "CardInsufficientMemory" in m]

    try:
        wait_for(insufficient_memory, 30, "FailedScheduling naming CardInsufficientMemory")
    except AssertionError as exc:
        pod = core.read_namespaced_pod("counted-pinned-too-big", "default")
        raise AssertionError(
            f"{exc}: the pod asking {over} MiB is {pod.status.phase} on node {pod.spec.node_name!r}, "
            f"the GPU's pods hold {held_on(core, gpu)[1]} of {devmem} MiB; FailedScheduling: "
            f"{failed_scheduling(core, 'counted-pinned-too-big')}"
        ) from None
    too_big = core.read_namespaced_pod("counted-pinned-too-big", "default")
    assert too_big.status.phase == "Pending" and not too_big.spec.node_name
    assert held_on(core, gpu)[1] <= devmem
    bound = [
        p
        for p in core.list_namespaced_pod("default").items
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed")
    ]
    assert_within_limits(core, bound)
