"""The node's metrics in process: the per-GPU and per-container families (HAMi's names and labels, ours),
the daemon-health instruments, and the fake backend's simulated containers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_kube.errors import KubeApiError
from hami_node.config import load_config
from hami_node.devices import GPUStatus
from hami_node.dra.claims import ClaimRef
from hami_node.gpu.backend import GPUFailed, GPUNotFound, GPUUsage
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import generate_inventory
from hami_node.main import CountedPreparer
from hami_node.monitor.exporter import ContainerCollector, GPUCollector, NodeMetrics
from hami_node.monitor.feedback import FieldWrite
from hami_node.monitor.region import (
    MAX_DEVICES,
    DeviceMemory,
    DeviceUtil,
    ProcSlot,
    RegionField,
    SharedRegion,
    encode,
)
from hami_node.monitor.regions import RegionScanner, apply_writes, read_region
from hami_node.monitor.simulate import MIB, ContainerSimulator, SimulatedDevice, usage_fraction
from hami_node.ports import PodName
from tests.builders import physical_gpu

GPU_A = "GPU-0b3c1d2e-1111-2222-3333-444455556666"
GPU_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"


def samples(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def gpu_status(index: int, uuid: str, healthy: bool = True) -> GPUStatus:
    info = physical_gpu(uuid, index, model="Tesla T4", memory_mib=15360, pci_bus_id=f"0000:0{index}:00.0")
    return GPUStatus(info, fault=None if healthy else "Xid 79")


class Pods:
    def __init__(self, pods: dict[str, PodName]) -> None:
        self.pods = pods

    def pod_name(self, uid: str) -> PodName | None:
        return self.pods.get(uid)


def usage(uuid: str) -> GPUUsage:
    if uuid == GPU_B:
        raise GPUFailed(uuid, "lost")
    return GPUUsage(3 * 2**30, 15360 * MIB, 42, 7)


def test_per_gpu_families_carry_hami_s_names_labels_and_zone_and_ours_the_rest() -> None:
    metrics = NodeMetrics("node-1")
    gpus = [gpu_status(0, GPU_A), gpu_status(1, GPU_B, False)]
    metrics.add_collector(GPUCollector("node-1", lambda: gpus, usage, legacy=True))
    metrics.watch_daemon(gpus=lambda: gpus)
    metrics.xid(GPU_B, 79)
    content_type, body = metrics.render()
    assert content_type.startswith("text/plain")
    got = samples(body)
    labels = {"node": "node-1", "device_index": "0", "device_uuid": GPU_A, "device_type": "NVIDIA-Tesla T4"}
    assert got["hami_host_gpu_memory_used_bytes"] == [({**labels, "zone": "vGPU"}, 3 * 2**30)]
    assert got["hami_host_gpu_utilization_ratio"] == [({**labels, "zone": "vGPU"}, 42)]
    mc = {k: v for k, v in labels.items() if k != "node"}
    assert got["hami_host_gpu_memory_controller_utilization_ratio"] == [({**mc, "zone": "vGPU"}, 7)]
    legacy = {"nodeid": "node-1", "deviceidx": "0", "deviceuuid": GPU_A, "devicetype": "NVIDIA-Tesla T4"}
    assert got["HostGPUMemoryUsage"] == [({**legacy, "zone": "vGPU"}, 3 * 2**30)]
    assert got["HostCoreUtilization"] == [({**legacy, "zone": "vGPU"}, 42)]
    # The GPU whose usage cannot be read: health and total (from the inventory) only.
    b = {"node": "node-1", "device_index": "1", "device_uuid": GPU_B, "device_type": "NVIDIA-Tesla T4"}
    assert got["hami_node_gpu_healthy"] == [(labels, 1.0), (b, 0.0)]
    assert got["hami_node_gpu_memory_total_bytes"] == [(labels, 15360 * MIB), (b, 15360 * MIB)]
    assert got["hami_node_gpu_xid_errors_total"] == [
        ({"node": "node-1", "device_uuid": GPU_A, "xid": "79"}, 0.0),
        ({"node": "node-1", "device_uuid": GPU_B, "xid": "79"}, 1.0),
    ]


def test_legacy_names_are_left_out_when_turned_off() -> None:
    metrics = NodeMetrics("n")
    metrics.add_collector(GPUCollector("n", lambda: [gpu_status(0, GPU_A)], usage, legacy=False))
    got = samples(metrics.render()[1])
    assert "hami_host_gpu_memory_used_bytes" in got and "HostGPUMemoryUsage" not in got


def container_region(total: int, limit: int, sm: int, last_kernel: int) -> SharedRegion:
    """One process using `total` bytes (100 context, 20 module, the rest data, at least 130) and `sm` %."""
    proc = ProcSlot(
        pid=1,
        used=(DeviceMemory(context=100, module=20, data=max(total - 130, 0), offset=0, total=total),)
        + (DeviceMemory(),) * (MAX_DEVICES - 1),
        device_util=(DeviceUtil(sm=sm),) + (DeviceUtil(),) * (MAX_DEVICES - 1),
        status=1,
    )
    return SharedRegion(
        device_num=1,
        uuids=(GPU_A,) + ("",) * (MAX_DEVICES - 1),
        limit=(limit,) + (0,) * (MAX_DEVICES - 1),
        procs=(proc,),
        last_kernel_time=last_kernel,
    )


def put(root: Path, name: str, region: SharedRegion) -> None:
    (root / name).mkdir()
    (root / name / "x.cache").write_bytes(encode(region))


def test_per_container_families_are_hami_s_with_its_labels_for_known_pods_only(tmp_path: Path) -> None:
    put(tmp_path, "uid-1_main", container_region(1000, 4000, 25, last_kernel=1_000))
    put(tmp_path, "uid-1_gone", container_region(500, 600, 3, 0))  # not a container of the pod
    put(tmp_path, "uid-9_main", container_region(500, 600, 3, 0))  # not a pod on this node
    pods = Pods({"uid-1": PodName("ns", "pod-1", ("main", "side"))})
    scanner = RegionScanner(tmp_path)
    metrics = NodeMetrics("n")
    metrics.add_collector(ContainerCollector(scanner.scan, pods, legacy=True, clock=lambda: 1_030.0))
    got = samples(metrics.render()[1])
    labels = {
        "namespace": "ns",
        "pod": "pod-1",
        "container": "main",
        "vdevice_index": "0",
        "device_uuid": GPU_A,
    }
    z = {**labels, "zone": "vGPU"}
    assert got["hami_vgpu_memory_used_bytes"] == [(z, 1000)]
    assert got["hami_vgpu_memory_limit_bytes"] == [(z, 4000)]
    assert got["hami_container_device_memory_bytes"] == [(z, 1000)]
    assert got["hami_container_device_utilization_ratio"] == [(z, 25)]
    assert got["hami_container_last_kernel_elapsed_seconds"] == [(z, 30)]
    assert got["hami_vgpu_memory_context_bytes"] == [(z, 100)]
    assert got["hami_vgpu_memory_module_bytes"] == [(z, 20)]
    assert got["hami_vgpu_memory_buffer_bytes"] == [(z, 870)]
    legacy = {
        "podnamespace": "ns",
        "podname": "pod-1",
        "ctrname": "main",
        "vdeviceid": "0",
        "deviceuuid": GPU_A,
    }
    lz = {**legacy, "zone": "vGPU"}
    assert got["vGPU_device_memory_usage_in_bytes"] == [(lz, 1000)]
    assert got["vGPU_device_memory_limit_in_bytes"] == [(lz, 4000)]
    assert got["Device_utilization_desc_of_container"] == [(lz, 25)]
    assert got["Device_last_kernel_of_container"] == [(lz, 30)]
    desc = {**lz, "context": "100", "module": "20", "data": "870", "offset": "10"}
    assert got["Device_memory_desc_of_container"] == [(desc, 1000)]
    assert got["hami_node_shared_regions"] == [({"state": "decoded"}, 3), ({"state": "refused"}, 0)]


def test_no_last_kernel_sample_before_the_first_kernel(tmp_path: Path) -> None:
    put(tmp_path, "uid-1_main", container_region(1000, 4000, 0, last_kernel=0))
    metrics = NodeMetrics("n")
    pods = Pods({"uid-1": PodName("ns", "p", ("main",))})
    metrics.add_collector(ContainerCollector(RegionScanner(tmp_path).scan, pods, legacy=True))
    got = samples(metrics.render()[1])
    assert "hami_container_last_kernel_elapsed_seconds" not in got and "hami_vgpu_memory_used_bytes" in got


def test_daemon_health_instruments() -> None:
    metrics = NodeMetrics("n")
    metrics.allocate_done(0.004, True)
    metrics.allocate_done(0.2, False)
    metrics.registration(True)
    metrics.list_and_watch_sent()
    metrics.list_and_watch_sent()
    metrics.api_error("patch", 409)
    got = samples(metrics.render()[1])
    counts = {d["result"]: v for d, v in got["hami_node_allocate_duration_seconds_count"]}
    assert counts == {"success": 1, "failure": 1}
    assert dict((d["result"], v) for d, v in got["hami_node_registrations_total"]) == {
        "success": 1,
        "failure": 0,
    }
    assert got["hami_node_list_and_watch_updates_total"] == [({}, 2)]
    assert got["hami_node_kube_api_errors_total"] == [({"verb": "patch", "code": "409"}, 1)]


def test_every_counter_and_histogram_starts_at_zero_for_each_label_set_known_at_start_up() -> None:
    got = samples(NodeMetrics("n").render()[1])
    counts = {d["result"]: v for d, v in got["hami_node_allocate_duration_seconds_count"]}
    assert counts == {"success": 0, "failure": 0}
    assert dict((d["result"], v) for d, v in got["hami_node_registrations_total"]) == {
        "success": 0,
        "failure": 0,
    }
    writes = {d["field"]: v for d, v in got["hami_node_priority_feedback_writes_total"]}
    assert writes == {"recent_kernel": 0, "utilization_switch": 0}
    assert got["hami_node_list_and_watch_updates_total"] == [({}, 0)]
    assert got["hami_node_stale_container_dirs_removed_total"] == [({}, 0)]
    # No GPU given yet, no Xid seen, not in DRA mode: no series of those.
    assert "hami_node_gpu_xid_errors_total" not in got
    assert "hami_node_dra_prepare_claims_total" not in got


def test_the_first_xid_of_a_code_puts_that_code_on_every_gpu_at_zero_so_the_next_gpu_s_first_counts() -> None:
    metrics = NodeMetrics("n")
    metrics.watch_daemon(gpus=lambda: [gpu_status(0, GPU_A), gpu_status(1, GPU_B)])
    metrics.xid(GPU_B, 79)

    def xids() -> dict[tuple[str, str], float]:
        got = samples(metrics.render()[1])
        return {(d["device_uuid"], d["xid"]): v for d, v in got["hami_node_gpu_xid_errors_total"]}

    assert xids() == {(GPU_A, "79"): 0, (GPU_B, "79"): 1}
    metrics.xid(GPU_A, 79)
    metrics.xid(GPU_A, 48)
    assert xids() == {(GPU_A, "79"): 1, (GPU_B, "79"): 1, (GPU_A, "48"): 1, (GPU_B, "48"): 0}


def test_daemon_state_gauges_say_fenced_and_registered_with_kubelet_at_each_scrape() -> None:
    metrics = NodeMetrics("n")
    fenced: list[str | None] = [None]
    registered = [False]
    metrics.watch_daemon(fenced=lambda: fenced[0], registered=lambda: registered[0])

    def state() -> tuple[float, float]:
        got = samples(metrics.render()[1])
        return got["hami_node_fenced"][0][1], got["hami_node_kubelet_registered"][0][1]

    assert state() == (0, 0)
    fenced[0], registered[0] = "NVML: driver not loaded", True
    assert state() == (1, 1)


def test_dra_prepare_claims_are_counted_by_result_from_zero_in_dra_mode() -> None:
    metrics = NodeMetrics("n")
    metrics.watch_daemon(dra=True)

    def prepared() -> dict[str, float]:
        got = samples(metrics.render()[1])
        return {d["result"]: v for d, v in got["hami_node_dra_prepare_claims_total"]}

    assert prepared() == {"success": 0, "failure": 0}
    metrics.claims_prepared(2, 1)
    metrics.claims_prepared(0, 1)
    assert prepared() == {"success": 2, "failure": 2}


class _Claims:
    """A claim source that cannot find a claim, or fails as a bug would (`error`)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def get_resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise self.error

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise self.error


def test_the_daemon_s_dra_preparer_counts_each_claim_it_answered_with_an_error_and_a_call_that_raised(
    tmp_path: Path,
) -> None:
    config = load_config(
        ["--node-name", "n1", "--mode", "dra", "--kubelet-plugins-dir", str(tmp_path / "plugins"),
         "--cdi-spec-dir", str(tmp_path / "cdi"), "--hook-path", str(tmp_path / "hook")],
        {},
        lambda p: "",
    )  # fmt: skip
    counted: list[tuple[int, int]] = []
    refs = [ClaimRef("default", "a", "aaaaaaaa-0000-4000-8000-000000000001")]
    missing = CountedPreparer(config, tuple, _Claims(KubeApiError(404, "NotFound", "not found")))
    missing.counted = lambda ok, failed: counted.append((ok, failed))
    assert missing.prepare(refs)[refs[0].uid].error
    broken = CountedPreparer(config, tuple, _Claims(RuntimeError("bug")))
    broken.counted = missing.counted
    with pytest.raises(RuntimeError):
        broken.prepare(refs * 2)
    assert counted == [(0, 1), (0, 1)]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_simulated_container_usage_stays_within_its_limits_and_moves_slowly(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000.0)
    sim = ContainerSimulator(clock=clock)
    path = tmp_path / "c.cache"
    devices = [SimulatedDevice(GPU_A, 4000 * MIB, 30), SimulatedDevice(GPU_B, 2000 * MIB, 0)]
    sim.add("uid-1", path, devices, priority=0)
    initial = read_region(path)
    assert (initial.device_num, initial.uuids[:2], initial.priority) == (2, (GPU_A, GPU_B), 0)
    assert (initial.utilization_switch, initial.recent_kernel, initial.procs) == (1, 2, ())

    totals = sim.tick(lambda uid: True)
    region = read_region(path)
    for i, d in enumerate(devices):
        used = region.memory(i).total
        assert 0.2 * d.memory_limit_bytes - MIB <= used <= 0.8 * d.memory_limit_bytes
        assert used % MIB == 0
    assert region.sm_util(0) <= 30 and region.last_kernel_time == int(clock.now)
    assert totals == {
        GPU_A: (region.memory(0).total, region.sm_util(0)),
        GPU_B: (region.memory(1).total, region.sm_util(1)),
    }

    again = sim.tick(lambda uid: True)
    assert again == totals  # same time, same values: deterministic
    clock.now += 60
    later = sim.tick(lambda uid: True)
    assert later != totals
    fraction = usage_fraction(clock.now, 0.0)
    assert 0.2 <= fraction <= 0.8


def test_a_blocked_simulated_container_launches_nothing_and_keeps_the_feedback_fields(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000.0)
    sim = ContainerSimulator(clock=clock)
    path = tmp_path / "c.cache"
    sim.add("uid-1", path, [SimulatedDevice(GPU_A, 4000 * MIB, 30)], priority=1)
    sim.tick(lambda uid: True)
    apply_writes(
        path,
        [
            FieldWrite(str(path), RegionField.RECENT_KERNEL, -1),
            FieldWrite(str(path), RegionField.UTILIZATION_SWITCH, 0),
        ],
    )
    clock.now += 5
    totals = sim.tick(lambda uid: True)
    region = read_region(path)
    assert (region.recent_kernel, region.utilization_switch) == (-1, 0)
    assert region.sm_util(0) == 0 and totals[GPU_A][1] == 0
    assert region.last_kernel_time == 1_700_000_000


def test_a_container_of_a_pod_that_left_is_no_longer_written_nor_counted(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000.0)
    sim = ContainerSimulator(clock=clock, forget_after_s=60)
    path = tmp_path / "c.cache"
    sim.add("uid-1", path, [SimulatedDevice(GPU_A, 4000 * MIB, 30)], priority=1)
    before = path.read_bytes()
    assert sim.tick(lambda uid: False) == {}
    assert path.read_bytes() == before
    clock.now += 61
    sim.tick(lambda uid: False)
    assert sim.simulated() == []


def test_fake_backend_usage_is_what_the_simulator_set_within_the_gpu() -> None:
    inventory = generate_inventory(2, seed="usage")
    backend = FakeBackend(inventory, watch=False)
    backend.init()
    try:
        a, b = (g.uuid for g in inventory.gpus)
        total = inventory.gpus[0].memory_mib * MIB
        assert backend.usage(a) == GPUUsage(0, total, 0, 0)
        backend.set_usage({a: (2 * 2**30, 150)})
        assert backend.usage(a) == GPUUsage(2 * 2**30, total, 100, 0)
        assert backend.usage(b).memory_used_bytes == 0
        with pytest.raises(GPUNotFound):
            backend.usage("GPU-nope")
    finally:
        backend.shutdown()
