"""hami_node.devices: the node's GPUs and their health, the virtual devices kubelet sees, the inventory
the scheduler sees (HAMi's getAPIDevices values), and change notification."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hami_api.annotations import encode_node_register
from hami_api.types import GPUInfo
from hami_node.config import FilterDevices, NodeConfig, OperatingMode
from hami_node.devices import (
    REPORTED_UNHEALTHY,
    DeviceState,
    GPUStatus,
    InventoryPublisher,
    filter_gpus,
    gpu_type,
    inventory_entry,
)
from hami_node.gpu import PhysicalGPU
from tests.builders import physical_gpu

TIMEOUT = 5.0
A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
B = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
C = "GPU-3d8e1f2a-1111-2222-3333-444455556666"


GPUS = (physical_gpu(A, 0, numa_node=0), physical_gpu(B, 1, numa_node=1), physical_gpu(C, 2, numa_node=None))


def state_with(gpus: Sequence[PhysicalGPU] = GPUS, **config: object) -> DeviceState:
    state = DeviceState(NodeConfig(node_name="node-a", **config))  # type: ignore[arg-type]
    state.set_gpus(gpus, at=0.0)
    return state


def health(state: DeviceState) -> list[tuple[str, bool, str | None]]:
    return [(g.uuid, g.healthy, g.reason) for g in state.gpus()]


# --- GPUs, filtering ----------------------------------------------------------------------------------


def test_filter_by_uuid_and_index() -> None:
    assert filter_gpus(GPUS, FilterDevices(uuids=(B,))) == (GPUS[0], GPUS[2])
    assert filter_gpus(GPUS, FilterDevices(indexes=(0, 2))) == (GPUS[1],)
    assert filter_gpus(GPUS, FilterDevices()) == GPUS


def test_set_gpus_applies_the_filter_and_bumps_the_version_only_on_change() -> None:
    state = DeviceState(NodeConfig(node_name="n", filter_devices=FilterDevices(uuids=(C,))))
    listed_before = state.listed
    assert not listed_before
    assert state.version == 0
    assert state.set_gpus(GPUS, at=1.0)
    assert state.listed
    assert [g.uuid for g in state.gpus()] == [A, B]
    version = state.version
    assert not state.set_gpus(GPUS, at=2.0)  # the same listing: no change
    assert state.version == version
    assert state.set_gpus(GPUS[:1], at=3.0)  # B vanished
    assert [g.uuid for g in state.gpus()] == [A]
    assert state.version == version + 1


def test_an_empty_first_listing_is_a_change() -> None:
    state = DeviceState(NodeConfig(node_name="n"))
    assert state.set_gpus([], at=0.0)
    assert state.listed and state.gpus() == ()


def test_a_gpu_listed_unhealthy_gets_a_fault_and_keeps_faults_across_listings() -> None:
    state = state_with()
    state.mark_unhealthy(A, "Xid 79", at=5.0)
    state.set_gpus(
        [physical_gpu(A, 0), physical_gpu(B, 1, healthy=False), physical_gpu(C, 2, numa_node=None)], at=6.0
    )
    assert health(state) == [(A, False, "Xid 79"), (B, False, REPORTED_UNHEALTHY), (C, True, None)]
    status = state.gpu(B)
    assert status is not None and status.fault_at == 6.0


# --- health --------------------------------------------------------------------------------------------


def test_mark_unhealthy_one_all_and_unknown() -> None:
    state = state_with()
    v0 = state.version
    assert state.mark_unhealthy(B, "Xid 48", at=1.0) == (B,)
    assert state.version == v0 + 1
    assert state.mark_unhealthy("GPU-not-here", "Xid 79", at=1.0) == ()
    assert state.version == v0 + 1
    assert state.mark_unhealthy(None, "Xid 79", at=2.0) == (A, C)  # B already faulty
    assert health(state) == [(A, False, "Xid 79"), (B, False, "Xid 48"), (C, False, "Xid 79")]
    b = state.gpu(B)
    assert b is not None and b.fault_at == 2.0  # the quiet period starts again, the reason stays


def test_repeated_fault_restarts_the_quiet_period_without_a_change() -> None:
    state = state_with()
    state.mark_unhealthy(A, "Xid 79", at=1.0)
    version = state.version
    assert state.mark_unhealthy(A, "Xid 94", at=9.0) == ()
    state.note_fault(A, at=12.0)
    status = state.gpu(A)
    assert status is not None and (status.fault, status.fault_at) == ("Xid 79", 12.0)
    assert state.version == version


def test_mark_healthy() -> None:
    state = state_with()
    state.mark_unhealthy(A, "Xid 79", at=1.0)
    assert state.mark_healthy(A)
    assert not state.mark_healthy(A)
    assert not state.mark_healthy("GPU-not-here")
    assert all(g.healthy for g in state.gpus())


def test_fencing_hides_every_gpu_and_keeps_their_own_faults() -> None:
    state = state_with()
    state.mark_unhealthy(B, "Xid 79", at=1.0)
    v = state.version
    assert state.fence("NVML is failing")
    assert not state.fence("still failing")  # recorded, no change notification
    assert state.version == v + 1
    reason = state.fenced
    assert reason == "still failing"
    assert health(state) == [
        (A, False, "NVML failing: still failing"),
        (B, False, "NVML failing: still failing"),
        (C, False, "NVML failing: still failing"),
    ]
    assert all(not d.healthy for d in state.virtual_devices())
    assert all(not g.health for g in state.inventory())
    assert state.unfence()
    assert not state.unfence()
    assert state.fenced is None
    assert health(state) == [(A, True, None), (B, False, "Xid 79"), (C, True, None)]


# --- virtual devices and inventory -----------------------------------------------------------------------


def test_virtual_devices_split_count_times_gpus_with_health() -> None:
    state = state_with(device_split_count=3)
    state.mark_unhealthy(B, "Xid 79", at=1.0)
    devices = state.virtual_devices()
    assert [d.id for d in devices] == [f"{u}-{i}" for u in (A, B, C) for i in range(3)]
    assert [d.healthy for d in devices] == [True] * 3 + [False] * 3 + [True] * 3
    assert all(d.numa_node is None for d in devices)


def test_virtual_devices_carry_numa_when_enabled() -> None:
    state = state_with(device_split_count=2, enable_numa_topology=True)
    assert [d.numa_node for d in state.virtual_devices()] == [0, 0, 1, 1, None, None]


def test_gpu_type_prefix() -> None:
    assert gpu_type("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"
    assert gpu_type("Tesla V100-PCIE-32GB") == "NVIDIA-Tesla V100-PCIE-32GB"
    assert gpu_type("NVIDIA-H20") == "NVIDIA-H20"


def test_inventory_values_as_hami_computes_them() -> None:
    config = NodeConfig(
        node_name="n",
        device_split_count=7,
        device_memory_scaling=1.3,
        device_cores_scaling=1.5,
        operating_mode=OperatingMode.MPS,
    )
    status = GPUStatus(
        PhysicalGPU(
            index=3,
            uuid=A,
            model="Tesla V100-PCIE-16GB",
            memory_mib=15109,
            minor=3,
            numa_node=None,
            pci_bus_id="00000000:03:00.0",
        )
    )
    assert inventory_entry(status, config) == GPUInfo(
        id=A,
        index=3,
        count=7,
        devmem=19641,  # 15109 x 1.3 = 19641.7, truncated
        devcore=150,
        type="NVIDIA-Tesla V100-PCIE-16GB",
        numa=0,
        mode="mps",
        health=True,
    )


def test_inventory_preconfigured_memory_for_gpus_without_a_memory_size() -> None:
    config = NodeConfig(node_name="n", preconfigured_device_memory=98304)
    status = GPUStatus(physical_gpu(A, 0, memory_mib=0))
    assert inventory_entry(status, config).devmem == 98304
    assert inventory_entry(GPUStatus(physical_gpu(A, 0)), config).devmem == 81920


def test_inventory_of_the_state_with_health_in_hamis_json() -> None:
    state = state_with()
    state.mark_unhealthy(B, "Xid 79", at=1.0)
    inventory = state.inventory()
    assert [(g.id, g.index, g.numa, g.health) for g in inventory] == [
        (A, 0, 0, True),
        (B, 1, 1, False),
        (C, 2, 0, True),
    ]
    assert encode_node_register(inventory[:2]) == (
        f'[{{"id":"{A}","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB",'
        f'"mode":"hami-core","health":true}},'
        f'{{"id":"{B}","index":1,"count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB",'
        f'"numa":1,"mode":"hami-core"}}]'
    )


# --- change notification ------------------------------------------------------------------------------


def test_wait_for_change_wakes_on_a_change_from_another_thread() -> None:
    state = state_with()
    version = state.version
    started = threading.Event()
    results: list[int] = []

    def waiter() -> None:
        started.set()
        results.append(state.wait_for_change(version, TIMEOUT))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(TIMEOUT)
    state.mark_unhealthy(A, "Xid 79", at=1.0)
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert results == [version + 1]


def test_wait_for_change_returns_when_cancelled_and_woken() -> None:
    state = state_with()
    cancel = threading.Event()
    done = threading.Event()

    def waiter() -> None:
        state.wait_for_change(state.version, None, cancel.is_set)
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    cancel.set()
    state.wake()
    assert done.wait(TIMEOUT)
    thread.join(TIMEOUT)
    assert state.wait_for_change(state.version, 0.0) == state.version  # timeout: no change


def test_wait_for_change_returns_at_once_when_already_changed() -> None:
    state = state_with()
    assert state.wait_for_change(state.version - 1, None) == state.version


class RecordingSink:
    def __init__(self, fail_first: bool = False) -> None:
        self.published: list[tuple[GPUInfo, ...]] = []
        self.fail_first = fail_first
        self.failed = threading.Event()

    def publish(self, gpus: Sequence[GPUInfo]) -> None:
        if self.fail_first:
            self.fail_first = False
            self.failed.set()
            raise RuntimeError("API server down")
        self.published.append(tuple(gpus))


def test_publisher_publishes_at_start_and_on_every_inventory_change() -> None:
    state = state_with()
    sink = RecordingSink()
    publisher = InventoryPublisher(state, sink)
    publisher.start()
    try:
        assert publisher.wait_published(0, TIMEOUT)
        assert [g.health for g in sink.published[0]] == [True, True, True]
        state.mark_unhealthy(B, "Xid 79", at=1.0)
        assert publisher.wait_published(1, TIMEOUT)
        assert [g.health for g in sink.published[1]] == [True, False, True]
        state.fence("NVML failing")
        assert publisher.wait_published(2, TIMEOUT)
        assert [g.health for g in sink.published[2]] == [False, False, False]
        state.fence("NVML failing differently")  # no change
        state.unfence()
        assert publisher.wait_published(3, TIMEOUT)
        assert [g.health for g in sink.published[3]] == [True, False, True]
    finally:
        publisher.stop()
    assert len(sink.published) == 4


def test_publisher_waits_for_the_first_listing_and_survives_a_failing_sink() -> None:
    state = DeviceState(NodeConfig(node_name="n"))
    sink = RecordingSink(fail_first=True)
    publisher = InventoryPublisher(state, sink)
    publisher.start()
    try:
        assert not publisher.wait_published(0, 0.05)  # nothing known yet: nothing published
        state.set_gpus(GPUS, at=0.0)
        assert sink.failed.wait(TIMEOUT)  # the sink failed this one; the next change goes out
        state.mark_unhealthy(A, "Xid 79", at=1.0)
        assert publisher.wait_published(0, TIMEOUT)
        assert [g.health for g in sink.published[-1]] == [False, True, True]
    finally:
        publisher.stop()


def test_publisher_publishes_an_empty_inventory_when_fenced_before_any_listing() -> None:
    state = DeviceState(NodeConfig(node_name="n"))
    sink = RecordingSink()
    publisher = InventoryPublisher(state, sink)
    publisher.start()
    try:
        state.fence("no GPU driver on this node")
        assert publisher.wait_published(0, TIMEOUT)
        assert sink.published == [()]
    finally:
        publisher.stop()
