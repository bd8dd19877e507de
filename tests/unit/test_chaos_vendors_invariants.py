"""The chaos checker's invariants for the other vendors (issue 26) on synthetic snapshots: nodes as the
device-plugin stand-ins publish them, pods with HAMi's annotations, the kubelet stand-in's files. A clean
mixed cluster has no violation; each vendor kind of violation is found with its vendor in the evidence;
the run's plan, schedule and report know the vendors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from hami_node.plugin.api import api_pb2
from hami_sim.chaos import cli
from hami_sim.chaos import decoding as D
from hami_sim.chaos.invariants import (
    NodeFiles,
    Snapshot,
    Violation,
    final_findings,
    findings,
    kubelet_device_disagreements,
    vendor_devices,
)
from hami_sim.chaos.report import ChaosReport, LostPod, ViolationSummary
from hami_sim.chaos.runner import ChaosOptions, plan, vendor_node_specs
from hami_sim.chaos.schedule import ALL_KINDS, EVERY_KIND, ScheduleSpec, build_schedule
from hami_sim.kubelet import checkpoint as kcp
from hami_sim.kubelet import runtime
from hami_sim.vendors import inventory as vinv
from hami_sim.vendors.table import device_spec
from tests.builders import container, node, pod

NOW = 1_800_000_000.0
Json = dict[str, Any]
Share = tuple[int, int, int]
"""(device index on its node, MiB, cores)."""


def vendor_node(key: str, name: str = "n1", count: int = 2, **fields: Any) -> tuple[Json, list[Any]]:
    """(the Node, its devices) as the stand-in of vendor `key` (`<vendor>[/<mode>]`) publishes them."""
    vendor, _, mode = key.partition("/")
    data: dict[str, Any] = {"vendor": vendor, "count": count, **fields}
    if mode:
        data["mode"] = mode
    spec = device_spec(data)
    devices = vinv.node_devices(name, spec)
    annotations, labels = vinv.node_metadata(spec, devices, datetime(2026, 8, 21, tzinfo=UTC))
    capacity = {r: str(len(ids)) for r, ids in vinv.advertised(spec, devices).items()}
    return node(name, annotations=annotations, labels=labels, capacity=capacity), list(devices)


DCU_NODE, DCUS = vendor_node("hygon")
ALLOCATED = "hami.io/dcu-devices-allocated"


def vendor_pod(
    name: str,
    *shares: Sequence[Share],
    devices: Sequence[Any] = DCUS,
    annotation: str = ALLOCATED,
    kind: str = "DCU",
    limits: Mapping[str, Any] | None = None,
    phase: str = "Running",
    node_name: str | None = "n1",
    more: Mapping[str, str] | None = None,
) -> Json:
    """A pod HAMi placed on n1: one container `c<i>` per `shares` entry, each asking its shares."""
    text = "".join(
        "".join(f"{devices[i].uuid},{kind},{mem},{cores}:" for i, mem, cores in entries) + ";"
        for entries in shares
    )
    annotations = {"hami.io/vgpu-node": "n1", annotation: text, "hami.io/bind-phase": "success"}
    annotations.update(more or {})
    containers = [
        container(f"c{i}", limits=limits or {"hygon.com/dcunum": str(max(len(e), 1))})
        for i, e in enumerate(shares)
    ]
    return pod(
        name,
        *containers,
        namespace="v",
        uid=f"uid-{name}",
        node_name=node_name,
        phase=phase,
        annotations=annotations,
    )


def entry(p: Json, ctr: str, resource: str, *ids: str) -> kcp.PodDeviceEntry:
    return kcp.PodDeviceEntry(
        p["metadata"]["uid"], ctr, resource, {-1: tuple(ids)}, api_pb2.ContainerAllocateResponse()
    )


def record(p: Json, ctr: str = "c0", env: Mapping[str, str] | None = None, paths: Sequence[str] = ()) -> Any:
    return runtime.ContainerRecord(
        p["metadata"]["uid"],
        "v",
        p["metadata"]["name"],
        ctr,
        env=tuple(f"{k}={v}" for k, v in (env or {}).items()),
        device_nodes=tuple({"path": x, "hostPath": x, "permissions": "rw"} for x in paths),
    )


def files(
    entries: Sequence[kcp.PodDeviceEntry] = (),
    records: Sequence[Any] = (),
    registered: Mapping[str, Sequence[str]] | None = None,
) -> NodeFiles:
    """The node's files as the kubelet stand-in writes them, read back by the checker's decoders."""
    raw = kcp.encode_checkpoint(entries, registered or {})
    return NodeFiles(
        device_entries=D.decode_device_checkpoint(raw),
        registered_devices=D.decode_registered_devices(raw),
        containers=D.decode_containers(runtime.encode_containers(records)),
    )


def check(
    *pods: Json, kubelet: NodeFiles | None = None, nodes: Sequence[Json] = (DCU_NODE,)
) -> list[Violation]:
    snapshot = Snapshot(pods=pods, nodes=nodes, kubelet={"n1": kubelet or NodeFiles()}, wall_time=NOW, at=3.0)
    return findings(snapshot, bind_timeout_s=300.0)


def kinds(violations: Sequence[Violation]) -> list[tuple[str, str]]:
    """(kind, subject) of each violation, sorted; every evidence is plain JSON and names a vendor."""
    for v in violations:
        json.dumps(v.evidence, allow_nan=False)
    return sorted(v.key for v in violations)


def dcu_card(index: int) -> list[str]:
    return ["/dev/kfd", "/dev/mkfd", f"/dev/dri/card{index}", f"/dev/dri/renderD{128 + index}"]


# --- clean --------------------------------------------------------------------------------------------------


def test_a_clean_vendor_node_has_no_violation() -> None:
    a = vendor_pod("a", [(0, 16000, 50)])
    b = vendor_pod("b", [(0, 16000, 50)], [(1, 32768, 100)])
    kubelet = files(
        [
            entry(a, "c0", "hygon.com/dcunum", f"{DCUS[1].uuid}-fake-0"),
            entry(b, "c0", "hygon.com/dcunum", f"{DCUS[0].uuid}-fake-2"),
            entry(b, "c1", "hygon.com/dcunum", f"{DCUS[1].uuid}-fake-3"),
        ],
        [record(a, paths=dcu_card(0)), record(b, paths=dcu_card(0)), record(b, "c1", paths=dcu_card(1))],
        registered={"hygon.com/dcunum": [f"{d.uuid}-fake-{j}" for d in DCUS for j in range(4)]},
    )
    assert kinds(check(a, b, kubelet=kubelet)) == []


def test_kubelet_ids_of_another_device_than_the_annotations_are_counted_not_a_violation() -> None:
    a = vendor_pod("a", [(0, 1000, 10)])
    kubelet = files(
        [entry(a, "c0", "hygon.com/dcunum", f"{DCUS[1].uuid}-fake-0")], [record(a, paths=dcu_card(0))]
    )
    snapshot = Snapshot(pods=[a], nodes=[DCU_NODE], kubelet={"n1": kubelet})
    assert kubelet_device_disagreements(snapshot, vendor_devices([DCU_NODE])) == 1
    assert kinds(check(a, kubelet=kubelet)) == []


# --- capacity -----------------------------------------------------------------------------------------------


def test_memory_held_past_a_dcus_is_an_overcommit_naming_the_vendor_and_the_pods() -> None:
    found = check(vendor_pod("a", [(0, 20000, 10)]), vendor_pod("b", [(0, 20000, 10)]))
    assert kinds(found) == [("vendor-memory-overcommit", f"n1/{DCUS[0].uuid}")]
    evidence = found[0].evidence
    assert (evidence["vendor"], evidence["held"]["mem"], evidence["inventory"]["devmem"]) == (
        "hygon",
        40000,
        32768,
    )
    assert [p["pod"] for p in evidence["pods"]] == ["v/a", "v/b"]


def test_an_exclusive_share_with_another_is_a_cores_overcommit() -> None:
    found = check(vendor_pod("a", [(0, 1000, 100)]), vendor_pod("b", [(0, 1000, 0)]))
    assert kinds(found) == [("vendor-cores-overcommit", f"n1/{DCUS[0].uuid}")]
    assert "exclusive" in found[0].message


def test_more_shares_than_a_device_has_is_a_slots_overcommit() -> None:
    pods = [vendor_pod(f"p{i}", [(0, 100, 0)]) for i in range(5)]  # a DCU is shared 4 ways
    assert kinds(check(*pods)) == [("vendor-slots-overcommit", f"n1/{DCUS[0].uuid}")]


def test_terminated_pods_and_pods_not_placed_by_hami_hold_nothing() -> None:
    done = vendor_pod("done", [(0, 30000, 100)], phase="Succeeded")
    other = vendor_pod("other", [(0, 30000, 100)])
    del other["metadata"]["annotations"]["hami.io/vgpu-node"]
    assert kinds(check(done, other, vendor_pod("a", [(0, 30000, 100)]))) == []


def test_an_init_containers_share_counts_once_beside_the_apps() -> None:
    p = vendor_pod("a", [(0, 20000, 50)], [(0, 20000, 50)])
    init, app = p["spec"]["containers"]
    p["spec"]["initContainers"], p["spec"]["containers"] = [init], [app]
    assert kinds(check(p)) == []  # at most 20000 MiB at once, not 40000


def test_a_device_that_left_its_inventory_is_still_held_to_what_it_had() -> None:
    pods = [vendor_pod("a", [(0, 20000, 10)]), vendor_pod("b", [(0, 20000, 10)])]
    snapshot = Snapshot(pods=pods, nodes=[node("n1")], kubelet={"n1": NodeFiles()})
    assert kinds(findings(snapshot, bind_timeout_s=300.0)) == [
        ("vendor-device-missing", "v/a"),
        ("vendor-device-missing", "v/b"),
    ]
    known = vendor_devices([DCU_NODE])
    assert ("vendor-memory-overcommit", f"n1/{DCUS[0].uuid}") in kinds(
        findings(snapshot, bind_timeout_s=300.0, known_devices=known)
    )


ENFLAME_NODE, ENFLAMES = vendor_node("enflame/drs", count=1)


def enflame_pod(name: str, size: int) -> Json:
    """A pod holding an S60 DRS profile of `size` slices (`<size>g.<6 x size... >gb` as the node offers)."""
    memory = {1: 6, 2: 12, 3: 24, 6: 48}[size] * 1024
    cores = -(-size * 100 // 6)
    return vendor_pod(
        name,
        [(0, memory, cores)],
        devices=ENFLAMES,
        annotation="hami.io/enflame-vgpu-devices-allocated",
        kind="Enflame",
        limits={"enflame.com/drs-gcu": str(size)},
    )


def test_enflame_shares_take_their_profiles_slices() -> None:
    pods = [enflame_pod("a", 2), enflame_pod("b", 2), enflame_pod("c", 2), enflame_pod("d", 1)]
    found = check(*pods, nodes=[ENFLAME_NODE])  # 42 of 48 GB, but 7 of 6 slices and 119 of 100 cores
    subject = f"n1/{ENFLAMES[0].uuid}"
    assert kinds(found) == [("vendor-cores-overcommit", subject), ("vendor-slots-overcommit", subject)]
    assert found[0].evidence["held"]["slots"] == 7


def test_an_enflame_containers_kubelet_ids_are_its_slices() -> None:
    p = enflame_pod("a", 3)
    kubelet = files(
        [entry(p, "c0", "enflame.com/drs-gcu", "GCU-x-0", "GCU-x-1")],
        [record(p, env={"ENFLAME_VISIBLE_DEVICES": "0"})],
    )
    found = check(p, kubelet=kubelet, nodes=[ENFLAME_NODE])
    assert kinds(found) == [("vendor-kubelet-mismatch", "v/a/c0/enflame.com/drs-gcu")]
    assert "holds 2 device IDs, its shares need 3" in found[0].message


NEURON_NODE, NEURONS = vendor_node("awsneuron")


def neuron_pod(name: str, mask: int) -> Json:
    return vendor_pod(
        name,
        [(0, 0, mask)],
        devices=NEURONS,
        annotation="hami.io/aws-neuron-devices-allocated",
        kind="AWSNeuron",
        limits={"aws.amazon.com/neuroncore": str(bin(mask).count("1"))},
    )


def test_aws_neuron_pods_on_distinct_cores_share_a_device_but_never_a_core() -> None:
    assert kinds(check(neuron_pod("a", 1), neuron_pod("b", 2), nodes=[NEURON_NODE])) == []
    found = check(neuron_pod("a", 1), neuron_pod("b", 3), nodes=[NEURON_NODE])
    assert kinds(found) == [("vendor-cores-overcommit", f"n1/{NEURONS[0].uuid}")]
    assert "0x1 is taken" in found[0].message
    found = check(neuron_pod("c", 4), nodes=[NEURON_NODE])
    assert kinds(found) == [("vendor-cores-overcommit", f"n1/{NEURONS[0].uuid}")]


def test_a_neuron_containers_cores_must_be_its_annotations_mask() -> None:
    p = neuron_pod("a", 2)
    kubelet = files(
        [entry(p, "c0", "aws.amazon.com/neuroncore", "n-core-1")],
        [record(p, env={"NEURON_RT_VISIBLE_CORES": "0"})],
    )
    found = check(p, kubelet=kubelet, nodes=[NEURON_NODE])
    assert kinds(found) == [("vendor-container-mismatch", "v/a/c0")]
    assert "mask 0x1, its pod's annotation 0x2" in found[0].message


AMD_NODE, AMDS = vendor_node("amd", count=1)


def amd_pod(name: str, cores: int, units: str, mem: int = 4096) -> Json:
    return vendor_pod(
        name,
        [(0, mem, cores)],
        devices=AMDS,
        annotation="hami.io/amd-devices-allocated",
        kind="AMD Instinct MI300X",
        limits={"amd.com/gpu": "1"},
        more={"hami.io/amd-cu-allocated": json.dumps({AMDS[0].uuid: units})},
    )


def test_amd_compute_units_are_held_by_one_pod_each() -> None:
    assert kinds(check(amd_pod("a", 4, "0-3"), amd_pod("b", 4, "4-7"), nodes=[AMD_NODE])) == []
    found = check(amd_pod("a", 4, "0-3"), amd_pod("b", 4, "3-6"), nodes=[AMD_NODE])
    assert kinds(found) == [("vendor-cores-overcommit", f"n1/{AMDS[0].uuid}/compute-units")]
    assert "[3] also held by v/a" in found[0].message


def test_an_amd_containers_memory_limit_and_cu_mask_are_its_annotations() -> None:
    p = amd_pod("a", 4, "0-3")
    env = {"HIP_DEVICE_MEMORY_LIMIT": "2048m", "HSA_CU_MASK": "0:0-2", "ROCR_VISIBLE_DEVICES": "GPU-x"}
    kubelet = files(
        [entry(p, "c0", "amd.com/gpu", f"{AMDS[0].bdf}#4")], [record(p, env=env, paths=dcu_card(0))]
    )
    found = check(p, kubelet=kubelet, nodes=[AMD_NODE])
    assert kinds(found) == [("vendor-container-mismatch", "v/a/c0")]
    assert "HSA_CU_MASK gives [3] compute units" in found[0].message
    assert "HIP_DEVICE_MEMORY_LIMIT=2048m" in found[0].message


# --- bound pods ---------------------------------------------------------------------------------------------


def test_a_bound_pods_device_missing_from_its_node_is_a_violation() -> None:
    p = vendor_pod("a", [(0, 1000, 10)], devices=[vinv.Device("DCU-nope", 0, "DCU-nope", 1, 1)])
    found = check(p)
    assert kinds(found) == [("vendor-device-missing", "v/a")]
    assert found[0].evidence["missing"] == ["DCU-nope"]


def test_a_pod_placed_on_one_node_and_bound_to_another_is_a_violation() -> None:
    p = vendor_pod("a", [(0, 1000, 10)])
    p["metadata"]["annotations"]["hami.io/vgpu-node"] = "n2"
    assert kinds(check(p)) == [("vendor-device-missing", "v/a")]


def test_a_bound_pod_asking_dcus_without_their_annotation_is_bound_without_allocation() -> None:
    p = pod(
        "a", container("c0", limits={"hygon.com/dcunum": "1"}), namespace="v", uid="uid-a", node_name="n1"
    )
    found = check(p)
    assert kinds(found) == [("bound-without-allocation", "v/a")]
    assert found[0].evidence["vendor"] == "hygon"
    assert kinds(check(p, nodes=[node("n1")])) == []  # a node without DCUs: not HAMi's to allocate


def test_an_undecodable_vendor_annotation_is_named() -> None:
    p = vendor_pod("a", [(0, 1000, 10)])
    p["metadata"]["annotations"][ALLOCATED] = "garbage"
    found = check(p)
    assert kinds(found) == [("annotation-undecodable", f"v/a/{ALLOCATED}")]
    assert found[0].evidence["vendor"] == "hygon"


# --- containers ---------------------------------------------------------------------------------------------


def test_a_dcu_container_given_another_card_than_its_annotation_is_a_mismatch() -> None:
    p = vendor_pod("a", [(0, 1000, 10)])
    kubelet = files(
        [entry(p, "c0", "hygon.com/dcunum", f"{DCUS[0].uuid}-fake-1")], [record(p, paths=dcu_card(1))]
    )
    found = check(p, kubelet=kubelet)
    assert kinds(found) == [("vendor-container-mismatch", "v/a/c0")]
    assert found[0].evidence["runtime"] == [DCUS[1].uuid]


@pytest.mark.parametrize(
    ("ids", "registered", "fragment"),
    [
        (("DCU-x-fake-0",), None, "name no device of n1"),
        (("{0}-fake-0", "{0}-fake-1"), None, "holds 2 device IDs, its shares need 1"),
        (("{0}-fake-9",), ["{0}-fake-0"], "the plugin did not register"),
    ],
)
def test_kubelets_device_ids_must_be_as_many_as_the_shares_registered_and_of_the_node(
    ids: tuple[str, ...], registered: list[str] | None, fragment: str
) -> None:
    p = vendor_pod("a", [(0, 1000, 10)])
    uuid = DCUS[0].uuid
    kubelet = files(
        [entry(p, "c0", "hygon.com/dcunum", *(i.format(uuid) for i in ids))],
        [record(p, paths=dcu_card(0))],
        registered={"hygon.com/dcunum": [r.format(uuid) for r in registered]} if registered else None,
    )
    found = check(p, kubelet=kubelet)
    assert kinds(found) == [("vendor-kubelet-mismatch", "v/a/c0/hygon.com/dcunum")]
    assert fragment in found[0].message


def test_an_ascend_containers_visible_devices_are_its_annotations() -> None:
    npu_node, npus = vendor_node("ascend", count=2)
    p = vendor_pod(
        "a",
        [(1, 8192, 0)],
        devices=npus,
        annotation="hami.io/Ascend910B4-devices-allocated",
        kind="Ascend910B4",
        limits={"huawei.com/Ascend910B4": "1"},
    )
    ids = (f"{npus[0].uuid}-2",)
    good = files(
        [entry(p, "c0", "huawei.com/Ascend910B4", *ids)], [record(p, env={"ASCEND_VISIBLE_DEVICES": "1"})]
    )
    assert kinds(check(p, kubelet=good, nodes=[npu_node])) == []
    bad = files(
        [entry(p, "c0", "huawei.com/Ascend910B4", *ids)], [record(p, env={"ASCEND_VISIBLE_DEVICES": "0"})]
    )
    assert kinds(check(p, kubelet=bad, nodes=[npu_node])) == [("vendor-container-mismatch", "v/a/c0")]


# --- bind phase, the end of a run ---------------------------------------------------------------------------

MLU_NODE, MLUS = vendor_node("cambricon")


def mlu_pod(assigned: str, bound_at: int = int(NOW) - 3600) -> Json:
    return vendor_pod(
        "m",
        [(0, 5120, 10)],
        devices=MLUS,
        annotation="hami.io/cambricon-mlu-devices-allocated",
        kind="MLU",
        limits={"cambricon.com/vmlu": "1"},
        more={
            "hami.io/bind-phase": "allocating",
            "hami.io/bind-time": str(bound_at),
            "CAMBRICON_DSMLU_ASSIGNED": assigned,
        },
    )


def test_a_cambricon_pod_its_plugin_assigned_is_allocated_though_its_bind_phase_stays_allocating() -> None:
    done = mlu_pod("true")
    assert kinds(check(done, nodes=[MLU_NODE])) == []
    assert kinds(final_findings(Snapshot(pods=[done], nodes=[MLU_NODE]))) == []
    waiting = mlu_pod("false")
    assert kinds(check(waiting, nodes=[MLU_NODE])) == [("bind-phase-stuck", "v/m")]
    assert kinds(final_findings(Snapshot(pods=[waiting], nodes=[MLU_NODE]))) == [("pod-in-bind-phase", "v/m")]


def test_a_vendor_pod_not_settled_names_its_vendor() -> None:
    p = pod("a", container("c0", limits={"hygon.com/dcunum": "1"}), namespace="v", phase="Pending")
    (found,) = final_findings(Snapshot(pods=[p]))
    assert (found.kind, found.evidence["vendor"]) == ("pod-not-settled", "hygon")


# --- the run: plan, schedule, report ------------------------------------------------------------------------


def test_a_run_with_vendors_adds_their_nodes_and_pods_asking_them() -> None:
    options = ChaosOptions(pods=300, nodes=2, gpus_per_node=2, vendors=("hygon", "metax/gpu"), vendor_nodes=2)
    spec, workload, schedule = plan(options)
    assert [n.name for n in spec.nodes][2:] == [
        "chaos-hygon-1",
        "chaos-hygon-2",
        "chaos-metax-gpu-1",
        "chaos-metax-gpu-2",
    ]
    assert {n.devices.count for n in spec.nodes if n.devices is not None} == {2}
    vendors = {p.vendor for p in workload.pods}
    assert vendors == {"nvidia", "hygon", "metax"}
    for p in workload.pods:
        limits = {k for c in p.body["spec"]["containers"] for k in c["resources"]["limits"]}
        if p.vendor == "hygon":
            assert limits <= {"hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"}, p
        elif p.vendor == "metax":
            assert limits == {"metax-tech.com/gpu"}, p
        else:
            assert all(k.startswith("nvidia.com/") for k in limits), p
    kills = {f.target for f in schedule if f.kind == "kill-vendor-plugin"}
    assert kills and kills <= {f"vendor/{n}" for n in spec.vendor_nodes}
    gpu_targets = {f.target for f in schedule if f.kind.startswith("gpu-") or f.kind == "kill-hami-node"}
    assert gpu_targets <= {"chaos-1", "chaos-2", "hami-node/chaos-1", "hami-node/chaos-2"}


def test_a_run_without_vendors_plans_what_it_planned_before() -> None:
    options = ChaosOptions(pods=200, nodes=6, seed=11, faults_per_kind=1)
    spec, workload, schedule = plan(options)
    assert {p.vendor for p in workload.pods} == {"nvidia"} and not spec.vendor_nodes
    assert {f.kind for f in schedule} == set(ALL_KINDS)
    nodes = tuple(n.name for n in spec.nodes)
    assert schedule == build_schedule(ScheduleSpec(11, 200, nodes, 4, dra=True, per_kind=1))


def test_a_schedule_kills_vendor_plugins_only_with_vendor_nodes() -> None:
    bare = build_schedule(ScheduleSpec(1, 400, ("a", "b"), 4, kinds=EVERY_KIND, per_kind=2))
    assert "kill-vendor-plugin" not in {f.kind for f in bare}
    mixed = build_schedule(
        ScheduleSpec(
            1, 400, ("a", "v"), 4, nvidia_nodes=("a",), vendor_nodes=("v",), kinds=EVERY_KIND, per_kind=3
        )
    )
    assert [f.target for f in mixed if f.kind == "kill-vendor-plugin"] == ["vendor/v"] * 3
    assert {f.target for f in mixed if f.kind.startswith("gpu-")} == {"a"}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"vendors": ("nope",)}, "vendor: expected nvidia or one of"),
        ({"vendors": ("metax/big",)}, "mode: expected one of gpu, sgpu for metax"),
        ({"vendors": ("hygon", "hygon")}, "'hygon' is listed twice"),
        ({"vendors": ("hygon",), "mode": "dra"}, "through the device plugin, not DRA"),
        ({"vendors": ("hygon",), "vendor_nodes": 0}, "vendor_nodes: invalid value 0"),
    ],
)
def test_bad_vendor_options_are_an_error_naming_them(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ChaosOptions(**options)


def test_vendor_nodes_are_made_as_hami_sim_ups_inventory_makes_them() -> None:
    (ascend,) = vendor_node_specs(ChaosOptions(vendors=("ascend",), gpus_per_node=3))
    assert (ascend.name, ascend.vendor, ascend.devices and ascend.devices.count, ascend.gpus) == (
        "chaos-ascend-1",
        "ascend",
        3,
        (),
    )


def test_the_report_counts_pods_and_violations_per_vendor() -> None:
    report = ChaosReport(1, "mixed", 2, 2, 10, vendors=["hygon"], vendor_nodes=1)
    report.add_violations(
        [
            ViolationSummary("vendor-memory-overcommit", "n/d", "m", {"vendor": "hygon"}, 1.0),
            ViolationSummary("gpu-memory-overcommit", "n/g", "m", {"node": "n"}, 2.0),
        ]
    )
    report.count_vendor("hygon", "created")
    report.count_vendor("hygon", "lost")
    report.lost.append(LostPod("v", "a", "Pending", "waiting", "hygon"))
    data = report.to_data()
    assert data["violations"]["byVendor"] == {"hygon": 1, "nvidia": 1}
    assert data["pods"]["byVendor"]["hygon"]["lost"] == 1
    assert data["pods"]["lostPods"][0]["vendor"] == "hygon"
    text = report.render_text()
    assert "+ 1 nodes of hygon" in text and "v/a (hygon): Pending: waiting" in text
    assert "hygon        created 1, lost 1" in text


def test_the_cli_takes_vendors_and_refuses_an_unknown_one_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["chaos", "--vendors", "hygon, metax/gpu", "--vendor-nodes", "2", "--vendor-share", "0.3"]
    )
    assert (args.vendors, args.vendor_nodes, args.vendor_share) == (("hygon", "metax/gpu"), 2, 0.3)
    assert "kill-vendor-plugin" in args.faults
    bad = parser.parse_args(["chaos", "--vendors", "hygon,tpu", "--no-progress"])
    assert cli.run(bad) == 2
    assert "--vendors: chaos-tpu-1: vendor: expected nvidia or one of" in capsys.readouterr().err
