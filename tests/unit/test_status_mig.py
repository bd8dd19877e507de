"""`kubectl hami top` and `explain` with NVIDIA's own sharing modes (issue 27, hami_control/status): a GPU in
HAMi's dynamic MIG mode lists its instances (profile, placement as memory slices, pod, MIG UUID once
hami-node recorded it) under a memory-slice map, in the table, `-o wide`, and JSON/YAML; a node in
NVIDIA's modes (no register; NVIDIA's resources and GPU feature discovery's labels on the Node) lists
each resource's allocated/allocatable from the requests of the pods bound there; `explain` names a MIG
pod's profile and placement per container and the MIG device a pending pod would get. Snapshots are
built from Node and Pod JSON (tests/builders.py), as in test_status.py."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from hami_api import annotations as ann
from hami_api.mig_alloc import MIG_ALLOCATIONS, MigAllocation, encode_mig_allocations
from hami_api.types import GPUInfo, MigPlacement, MigProfile
from hami_control.config import ControlConfig
from hami_control.status.explain import build_explanation, explanation_dict, render_explanation
from hami_control.status.nvidia_modes import (
    PLUGIN_MODE,
    is_nvidia_resource,
    memory_slices,
    placement_text,
    pod_request,
    slice_map,
)
from hami_control.status.snapshot import Snapshot
from hami_control.status.top import build_top, render_top, top_dict
from tests.builders import (
    Json,
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    gpu_pod,
    node,
    pod,
)

CONFIG = ControlConfig()
A100_40 = "NVIDIA A100-SXM4-40GB"
M0 = "GPU-m0000000-0000-0000"
MIG_UUID = "MIG-11111111-2222-3333-4444-555555555555"
# A100-SXM4-40GB's profiles as NVML lists them (shared notes reference/mig-timeslicing.md section 5), the
# three this file needs: 1g.5gb at slices 0..6, 3g.20gb at 0 and 4, 7g.40gb at 0.
A100_40_PROFILES = (
    MigProfile("1g.5gb", 4864, 14, 1, tuple(MigPlacement(i, 1) for i in range(7))),
    MigProfile("3g.20gb", 19968, 42, 3, (MigPlacement(0, 4), MigPlacement(4, 4))),
    MigProfile("7g.40gb", 40192, 100, 7, (MigPlacement(0, 8),)),
)


def mig_gpu(uuid: str = M0, index: int = 0) -> GPUInfo:
    """An A100-SXM4-40GB in HAMi's dynamic MIG mode (register `mode: mig`, 7 slots, its profiles)."""
    return gpu_info(
        index, id=uuid, devmem=40960, type=A100_40, mode="mig", count=7, mig_profiles=A100_40_PROFILES
    )


def mig_running_pod(name: str, namespace: str, memory: int, cores: int, *migs: MigAllocation) -> Json:
    """A pod bound to mig-a holding one slice of M0 (`memory` MiB, `cores` %) and the MIG reservations
    `migs` (`hami.io/vgpu-mig-allocations`), Running, its container named `worker`."""
    annotations = allocation_annotations("mig-a", allocation([(M0, memory, cores)]), bind_phase="success")
    annotations[MIG_ALLOCATIONS] = encode_mig_allocations(migs)
    obj = gpu_pod(
        name,
        gpus=1,
        gpumem=memory,
        namespace=namespace,
        uid=f"uid-{name}",
        node_name="mig-a",
        phase="Running",
        annotations=annotations,
    )
    obj["spec"]["containers"][0]["name"] = "worker"
    return obj


def mig_cluster() -> tuple[list[Json], list[Json]]:
    """mig-a: one MIG A100-40GB with a created 3g.20gb at [0-3] (ml/train) and a reserved, not yet
    created 1g.5gb at [6] (ml/infer)."""
    nodes = [node("mig-a", [mig_gpu()])]
    pods = [
        mig_running_pod(
            "train", "ml", 19968, 42, MigAllocation(0, 0, M0, "3g.20gb", MigPlacement(0, 4), MIG_UUID, 1, 0)
        ),
        mig_running_pod("infer", "ml", 4864, 14, MigAllocation(0, 0, M0, "1g.5gb", MigPlacement(6, 1))),
    ]
    return nodes, pods


def time_sliced_node(name: str = "ts-1", allocatable: str = "4", capacity: str | None = None) -> Json:
    """A T4 time-sliced 4 ways with `renameByDefault` (`nvidia.com/gpu.shared`), GFD's labels on it."""
    labels = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/gpu.memory": "15360",
        "nvidia.com/mig.capable": "false",
    }
    res = {"nvidia.com/gpu.shared": allocatable}
    cap = {"nvidia.com/gpu.shared": capacity} if capacity is not None else None
    return node(name, labels=labels, allocatable=res, capacity=cap)


def mixed_mig_node(name: str = "mixed-1") -> Json:
    """A mixed-strategy node: two 1g.5gb and one 3g.20gb MIG devices, GFD's MIG labels on it."""
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig-1g.5gb.count": "2",
        "nvidia.com/mig-1g.5gb.replicas": "1",
        "nvidia.com/mig-1g.5gb.product": "A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/mig-1g.5gb.sharing-strategy": "none",
        "nvidia.com/mig-3g.20gb.count": "1",
        "nvidia.com/mig-3g.20gb.replicas": "1",
        "nvidia.com/mig-3g.20gb.product": "A100-SXM4-40GB-MIG-3g.20gb",
        "nvidia.com/mig-3g.20gb.sharing-strategy": "none",
    }
    return node(
        name, labels=labels, allocatable={"nvidia.com/mig-1g.5gb": "2", "nvidia.com/mig-3g.20gb": "1"}
    )


def plugin_pod(name: str, where: str, resource: str, count: int = 1, **extra: Any) -> Json:
    """A pod bound to `where` whose container asks `count` of NVIDIA's `resource` (kube-scheduler alone)."""
    return pod(
        name,
        container("c", limits={resource: str(count)}),
        uid=f"uid-{name}",
        node_name=where,
        phase=extra.pop("phase", "Running"),
        **extra,
    )


def snapshot_of(nodes: list[Json], pods: list[Json]) -> Snapshot:
    return Snapshot.of(CONFIG, nodes, pods)


# --- pieces ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "size", "text"), [(0, 2, "[0-1]"), (6, 1, "[6]"), (4, 4, "[4-7]"), (0, 8, "[0-7]")]
)
def test_placement_text_names_the_memory_slices_covered(start: int, size: int, text: str) -> None:
    assert placement_text(MigPlacement(start, size)) == text


def test_slice_map_marks_each_placements_slices_and_leaves_out_slices_past_the_gpu() -> None:
    assert slice_map(8, [MigPlacement(0, 4), MigPlacement(6, 1)]) == "####..#."
    assert slice_map(4, [MigPlacement(2, 4)]) == "..##"


@pytest.mark.parametrize(
    ("model", "profiles", "slices"),
    [
        (A100_40, A100_40_PROFILES, 8),
        ("NVIDIA-NVIDIA A100-SXM4-40GB", (), 8),  # hami-node's `NVIDIA-` prefix
        ("NVIDIA A30", (), 4),
        ("Unknown GPU", (MigProfile("2g.10gb", 9000, 28, 2, (MigPlacement(0, 2), MigPlacement(2, 2))),), 4),
        ("Unknown GPU", (), 8),
    ],
)
def test_memory_slices_come_from_the_model_else_the_widest_placement_else_eight(
    model: str, profiles: tuple[MigProfile, ...], slices: int
) -> None:
    info = gpu_info(0, type=model, mode="mig", mig_profiles=profiles)
    assert memory_slices(info) == slices


@pytest.mark.parametrize(
    ("name", "nvidia"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("nvidia.com/mig-1g.10gb+me.shared", True),
        ("nvidia.com/gpumem", False),
        ("nvidia.com/gpucores", False),
        ("hygon.com/dcunum", False),
    ],
)
def test_is_nvidia_resource_knows_nvidias_names_and_not_hamis(name: str, nvidia: bool) -> None:
    assert is_nvidia_resource(name) is nvidia


def test_pod_request_is_the_larger_of_the_containers_sum_and_the_largest_init_container() -> None:
    res = "nvidia.com/gpu.shared"
    two = pod(
        "p",
        container("a", limits={res: "1"}),
        container("b", requests={res: "1"}, limits={res: "1"}),
        init=[container("i", limits={res: "3"})],
    )
    assert pod_request(two, res) == 3
    two["spec"]["initContainers"][0]["resources"]["limits"][res] = "1"
    assert pod_request(two, res) == 2


# --- top: HAMi's dynamic MIG ----------------------------------------------------------------------------

GOLDEN_MIG = """\
NODE   GPU  UUID        MODEL                  SLICES  MEMORY (MiB)            CORES (%)          HEALTH  VENDOR  PODS
mig-a  0    ..000-0000  NVIDIA A100-SXM4-40GB  2/7     ######.... 24832/40960  ######.... 56/100  ok      nvidia  ml/infer, ml/train

MIG instances (HAMi's dynamic MIG):
NODE   GPU  MEMORY SLICES  PROFILE  PLACEMENT  POD       MIG UUID
mig-a  0    ####..#. 5/8   3g.20gb  [0-3]      ml/train  ..55555555
mig-a  0                   1g.5gb   [6]        ml/infer  (not created yet)"""  # noqa: E501

GOLDEN_MIG_WIDE = """\
MIG instances (HAMi's dynamic MIG):
NODE   GPU  MEMORY SLICES  PROFILE  PLACEMENT  INSTANCE MAP  CONTAINER  GI  CI  POD       MIG UUID
mig-a  0    ####..#. 5/8   3g.20gb  [0-3]      ####....      worker     1   0   ml/train  MIG-11111111-2222-3333-4444-555555555555
mig-a  0                   1g.5gb   [6]        ......#.      worker     -   -   ml/infer  (not created yet)"""  # noqa: E501


def test_top_lists_a_mig_gpus_instances_under_its_memory_slice_map() -> None:
    assert render_top(build_top(snapshot_of(*mig_cluster()))) == GOLDEN_MIG


def test_top_wide_adds_each_instances_map_container_instance_ids_and_full_mig_uuid() -> None:
    text = render_top(build_top(snapshot_of(*mig_cluster())), wide=True)
    assert text.endswith(GOLDEN_MIG_WIDE)


def test_top_shows_a_mig_gpu_without_instances_as_all_slices_free() -> None:
    text = render_top(build_top(snapshot_of([node("mig-a", [mig_gpu()])], [])))
    assert "mig-a  0    ........ 0/8   -        -          -    -" in text.splitlines()


def test_top_leaves_out_the_instances_of_finished_pods() -> None:
    nodes, pods = mig_cluster()
    pods[0]["status"]["phase"] = "Succeeded"
    gpu = build_top(snapshot_of(nodes, pods)).nodes[0].gpus[0]
    assert [(i.ref, i.slices) for i in gpu.mig] == [("ml/infer", "[6]")]
    assert (gpu.mig_map, gpu.mig_used) == ("......#.", 1)


def test_top_names_a_container_the_pod_spec_lacks_by_its_index() -> None:
    nodes, pods = mig_cluster()
    pods[1]["metadata"]["annotations"][MIG_ALLOCATIONS] = encode_mig_allocations(
        [MigAllocation(3, 0, M0, "1g.5gb", MigPlacement(6, 1))]
    )
    gpu = build_top(snapshot_of(nodes, pods)).nodes[0].gpus[0]
    assert [i.container for i in gpu.mig] == ["worker", "#3"]


def test_top_namespace_keeps_only_the_namespaces_instances() -> None:
    nodes, pods = mig_cluster()
    pods.append(
        mig_running_pod("other", "default", 4864, 14, MigAllocation(0, 0, M0, "1g.5gb", MigPlacement(5, 1)))
    )
    gpu = build_top(snapshot_of(nodes, pods), namespace="default").nodes[0].gpus[0]
    assert [(i.ref, i.slices) for i in gpu.mig] == [("default/other", "[5]")]
    assert gpu.mig_map == "####.##."  # the map stays the GPU's whole use


def test_top_json_carries_the_instances_with_placement_and_runtime_identity() -> None:
    data = top_dict(build_top(snapshot_of(*mig_cluster())))
    mig = data["nodes"][0]["gpus"][0]["mig"]
    assert mig == {
        "memorySlices": {"used": 5, "total": 8},
        "map": "####..#.",
        "instances": [
            {
                "namespace": "ml",
                "pod": "train",
                "container": "worker",
                "profile": "3g.20gb",
                "placement": {"start": 0, "size": 4},
                "slices": "[0-3]",
                "migUUID": MIG_UUID,
                "gpuInstanceID": 1,
                "computeInstanceID": 0,
            },
            {
                "namespace": "ml",
                "pod": "infer",
                "container": "worker",
                "profile": "1g.5gb",
                "placement": {"start": 6, "size": 1},
                "slices": "[6]",
            },
        ],
    }


def test_top_json_leaves_mig_out_of_gpus_not_in_mig_mode() -> None:
    data = top_dict(build_top(snapshot_of([node("n1", [gpu_info(0)])], [])))
    assert "mig" not in data["nodes"][0]["gpus"][0]


# --- top: NVIDIA's modes --------------------------------------------------------------------------------

GOLDEN_PLUGIN = """\
NVIDIA device plugin resources (kube-scheduler alone):
NODE     RESOURCE                ALLOCATED  PRODUCT                     DEVICES  REPLICAS  SHARING       MIG STRATEGY  PODS
mixed-1  nvidia.com/mig-1g.5gb   1/2        A100-SXM4-40GB-MIG-1g.5gb   2        1         none          mixed         default/m1
mixed-1  nvidia.com/mig-3g.20gb  0/1        A100-SXM4-40GB-MIG-3g.20gb  1        1         none          mixed         -
ts-1     nvidia.com/gpu.shared   3/4        Tesla-T4                    1        4         time-slicing  none          default/t0, default/t1, default/t2"""  # noqa: E501


def plugin_cluster() -> tuple[list[Json], list[Json]]:
    """A time-sliced T4 x4 with three pods (and a finished one), a mixed MIG node with one pod."""
    pods = [plugin_pod(f"t{i}", "ts-1", "nvidia.com/gpu.shared") for i in range(3)]
    pods.append(plugin_pod("done", "ts-1", "nvidia.com/gpu.shared", phase="Succeeded"))
    pods.append(plugin_pod("m1", "mixed-1", "nvidia.com/mig-1g.5gb"))
    return [time_sliced_node(), mixed_mig_node()], pods


def test_top_prints_the_golden_table_of_nodes_in_nvidias_modes() -> None:
    assert render_top(build_top(snapshot_of(*plugin_cluster()))) == GOLDEN_PLUGIN


def test_top_lists_nodes_in_nvidias_modes_with_allocated_over_allocatable_and_gfds_labels() -> None:
    text = render_top(build_top(snapshot_of(*plugin_cluster())))
    lines = text.splitlines()
    assert lines[0] == "NVIDIA device plugin resources (kube-scheduler alone):"
    rows = {tuple(line.split()[:3]) for line in lines[2:]}
    assert rows == {
        ("mixed-1", "nvidia.com/mig-1g.5gb", "1/2"),
        ("mixed-1", "nvidia.com/mig-3g.20gb", "0/1"),
        ("ts-1", "nvidia.com/gpu.shared", "3/4"),
    }
    ts = next(line for line in lines if line.startswith("ts-1"))
    assert ts.split()[3:8] == ["Tesla-T4", "1", "4", "time-slicing", "none"]
    assert ts.endswith("default/t0, default/t1, default/t2")
    mixed = next(line for line in lines if "mig-1g.5gb" in line)
    assert mixed.split()[3:8] == ["A100-SXM4-40GB-MIG-1g.5gb", "2", "1", "none", "mixed"]


def test_top_says_how_many_of_a_resources_devices_are_unhealthy() -> None:
    nodes = [time_sliced_node(allocatable="4", capacity="8")]
    text = render_top(build_top(snapshot_of(nodes, [])))
    assert "nvidia.com/gpu.shared  0/4 (4 unhealthy)" in text


def test_top_does_not_take_a_hami_node_for_a_node_in_nvidias_modes() -> None:
    top = build_top(snapshot_of([node("hami", [gpu_info(0)])], []))
    assert [(n.name, n.mode, n.nvidia) for n in top.nodes] == [("hami", "device-plugin", None)]


def test_top_namespace_keeps_the_nvidia_resources_its_pods_request() -> None:
    nodes, pods = plugin_cluster()
    pods.append(plugin_pod("x", "ts-1", "nvidia.com/gpu.shared", namespace="team"))
    top = build_top(snapshot_of(nodes, pods), namespace="team")
    assert [(n.name, n.mode) for n in top.nodes] == [("ts-1", PLUGIN_MODE)]
    resource = top.nodes[0].nvidia.resources[0] if top.nodes[0].nvidia is not None else None
    assert resource is not None
    assert ([p.ref for p in resource.pods], resource.allocated) == (["team/x"], 4)


def test_top_wide_adds_the_memory_label_capacity_and_each_pods_count() -> None:
    text = render_top(build_top(snapshot_of(*plugin_cluster())), wide=True)
    ts = next(line for line in text.splitlines() if line.startswith("ts-1"))
    assert ts.split()[3:6] == ["Tesla-T4", "15360", "4"]
    assert ts.endswith("default/t0 (1), default/t1 (1), default/t2 (1)")


def test_top_json_carries_a_plugin_nodes_resources_and_strategy() -> None:
    data = top_dict(build_top(snapshot_of(*plugin_cluster())))
    ts = next(n for n in data["nodes"] if n["name"] == "ts-1")
    assert (ts["mode"], ts["gpus"]) == (PLUGIN_MODE, [])
    assert ts["nvidia"] == {
        "migStrategy": "none",
        "migCapable": False,
        "resources": [
            {
                "name": "nvidia.com/gpu.shared",
                "capacity": 4,
                "allocatable": 4,
                "allocated": 3,
                "product": "Tesla-T4",
                "count": 1,
                "replicas": 4,
                "sharingStrategy": "time-slicing",
                "memoryMiB": 15360,
                "pods": [{"namespace": "default", "name": f"t{i}", "count": 1} for i in range(3)],
            }
        ],
    }


MODES_SCHEMA: Json = {
    "type": "object",
    "required": ["apiVersion", "kind", "nodes"],
    "properties": {
        "kind": {"const": "GPUTop"},
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mode", "gpus"],
                "properties": {
                    "mode": {"enum": ["device-plugin", "dra", PLUGIN_MODE]},
                    "gpus": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "mig": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["memorySlices", "map", "instances"],
                                    "properties": {
                                        "memorySlices": {"type": "object"},
                                        "map": {"type": "string", "pattern": "^[#.]+$"},
                                        "instances": {
                                            "type": "array",
                                            "items": {
                                                "type": "object",
                                                "required": [
                                                    "namespace",
                                                    "pod",
                                                    "container",
                                                    "profile",
                                                    "placement",
                                                    "slices",
                                                ],
                                            },
                                        },
                                    },
                                }
                            },
                        },
                    },
                    "nvidia": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["migStrategy", "migCapable", "resources"],
                        "properties": {
                            "migStrategy": {"type": "string"},
                            "migCapable": {"type": ["boolean", "null"]},
                            "resources": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["name", "capacity", "allocatable", "allocated", "pods"],
                                    "properties": {
                                        "name": {"type": "string"},
                                        "capacity": {"type": "integer"},
                                        "allocatable": {"type": "integer"},
                                        "allocated": {"type": "integer"},
                                        "product": {"type": ["string", "null"]},
                                        "count": {"type": ["integer", "null"]},
                                        "replicas": {"type": ["integer", "null"]},
                                        "sharingStrategy": {"type": ["string", "null"]},
                                        "memoryMiB": {"type": ["integer", "null"]},
                                        "pods": {"type": "array"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_top_json_and_yaml_of_mig_and_plugin_nodes_follow_the_schema_and_agree() -> None:
    nodes, pods = mig_cluster()
    more_nodes, more_pods = plugin_cluster()
    data = top_dict(build_top(snapshot_of(nodes + more_nodes, pods + more_pods)))
    for loaded in (json.loads(json.dumps(data)), yaml.safe_load(yaml.safe_dump(data, sort_keys=False))):
        jsonschema.validate(loaded, MODES_SCHEMA)
        assert loaded == data


# --- explain ----------------------------------------------------------------------------------------------


def test_explain_names_a_running_mig_pods_profile_placement_and_mig_device() -> None:
    nodes, pods = mig_cluster()
    text = render_explanation(build_explanation(snapshot_of(nodes, pods), pods[0]))
    assert (
        "    MIG 3g.20gb at slices [0-3], MIG-11111111-2222-3333-4444-555555555555 "
        "(GPU instance 1, compute instance 0)"
    ) in text.splitlines()


def test_explain_says_a_reserved_mig_device_is_not_created_yet() -> None:
    nodes, pods = mig_cluster()
    explanation = build_explanation(snapshot_of(nodes, pods), pods[1])
    assert "    MIG 1g.5gb at slices [6], not created yet" in render_explanation(explanation).splitlines()
    assert explanation_dict(explanation)["gpus"][0]["mig"] == {
        "profile": "1g.5gb",
        "placement": {"start": 6, "size": 1},
        "slices": "[6]",
        "migUUID": None,
        "gpuInstanceID": None,
        "computeInstanceID": None,
    }


def test_explain_names_the_mig_profile_and_placement_a_pending_pod_would_get() -> None:
    """HAMi's selectMigCandidate: the smallest profile with the memory (1g.5gb for 4000 MiB), at the highest
    free start for 1g. profiles (mig_topology.go orderedMigPlacements): slice 5, as 6 is taken."""
    nodes, pods = mig_cluster()
    pending = gpu_pod(
        "new", gpus=1, gpumem=4000, namespace="ml", uid="uid-new", annotations={ann.VGPU_MODE: "mig"}
    )
    verdict = build_explanation(snapshot_of(nodes, pods), pending).verdicts[0]
    assert verdict.fits
    assert verdict.gpus == (f"GPU 0 ({M0}) as MIG 1g.5gb at slices [5]",)


def test_explain_gives_card_mig_topology_infeasible_in_words_when_no_placement_is_free() -> None:
    nodes, pods = mig_cluster()
    pending = gpu_pod(
        "big", gpus=1, gpumem=8000, namespace="ml", uid="uid-big", annotations={ann.VGPU_MODE: "mig"}
    )
    verdict = build_explanation(snapshot_of(nodes, pods), pending).verdicts[0]
    assert (verdict.fits, verdict.reason) == (False, "1/1 CardMigTopologyInfeasible")
    assert verdict.sentences == (
        "1 of 1 GPUs are in MIG mode and have no MIG profile with the 8000 MiB asked at a free placement",
    )
