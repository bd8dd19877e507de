"""`kubectl hami` / `hami-control status` models and output (hami_control/status), on small clusters built
from tests/builders.py: the top table (golden text), its filters and JSON/YAML schema, DRA devices, every
HAMi filter reason explained in words, running pods, and the quota table."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from hami_api import annotations as ann
from hami_api.types import MigPlacement, MigProfile
from hami_control.config import ControlConfig
from hami_control.fit import Reason
from hami_control.status.explain import build_explanation, explanation_dict, render_explanation
from hami_control.status.quotas import build_quota, quota_dict, render_quota
from hami_control.status.snapshot import Snapshot
from hami_control.status.table import bar
from hami_control.status.top import UnknownNode, build_top, render_top, top_dict
from tests.builders import (
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    gpu_pod,
    hami_gpu_device,
    node,
    pod,
    resource_claim,
    resource_quota,
    resource_slice,
)

CONFIG = ControlConfig()
A100 = "NVIDIA A100-SXM4-80GB"
A0, A1, T0 = "GPU-a0000000-0000-0000", "GPU-a1111111-1111-1111", "GPU-40000000-0000-0000"
Json = dict[str, Any]


def running(name: str, namespace: str, node_name: str, *slices: tuple[str, int, int], uid: str = "") -> Json:
    """A pod hami-control placed on `node_name` with one container holding `slices`, as the node daemon
    leaves it (allocated, bind phase success)."""
    mem = slices[0][1] if slices else 0
    cores = slices[0][2] if slices else 0
    return gpu_pod(
        name,
        gpus=len(slices),
        gpumem=mem,
        gpucores=cores,
        namespace=namespace,
        uid=uid or f"uid-{namespace}-{name}",
        node_name=node_name,
        phase="Running",
        annotations=allocation_annotations(node_name, allocation(list(slices)), bind_phase="success"),
    )


def small_cluster() -> tuple[list[Json], list[Json], list[Json]]:
    """Two A100s on gpu-a (two pods), a cordoned T4 on gpu-t4, a CPU node, a node whose plugin is gone."""
    nodes = [
        node(
            "gpu-a",
            [
                gpu_info(0, id=A0, devmem=81920, type=A100),
                gpu_info(1, id=A1, devmem=81920, type=A100, numa=1),
            ],
        ),
        node("gpu-t4", [gpu_info(0, id=T0, devmem=15360)], annotations={ann.DEVICE_CORDON: T0}),
        node("cpu-1"),
        node("gpu-gone", [gpu_info(0, id="GPU-g")], allocatable={"nvidia.com/gpu": "0"}),
    ]
    pods = [
        running("inference-a", "ai-team", "gpu-a", (A0, 8000, 25)),
        running("training", "default", "gpu-a", (A1, 40000, 30)),
        running("notebook", "ai-team", "gpu-a", (A1, 20480, 0)),
    ]
    quotas = [
        resource_quota(
            {"limits.nvidia.com/gpumem": "30000", "limits.nvidia.com/gpucores": "100"}, namespace="ai-team"
        )
    ]
    return nodes, pods, quotas


def snapshot_of(
    nodes: Sequence[Json], pods: Sequence[Json] = (), quotas: Sequence[Json] = (), **dra: Any
) -> Snapshot:
    return Snapshot.of(CONFIG, nodes, pods, quotas, **dra)


GOLDEN_TOP = """\
NODE    GPU  UUID        MODEL                  SLICES  MEMORY (MiB)            CORES (%)          HEALTH    VENDOR  PODS
gpu-a   0    ..000-0000  NVIDIA A100-SXM4-80GB  1/10    #......... 8000/81920   ##........ 25/100  ok        nvidia  ai-team/inference-a
gpu-a   1    ..111-1111  NVIDIA A100-SXM4-80GB  2/10    #######... 60480/81920  ###....... 30/100  ok        nvidia  ai-team/notebook, default/training
gpu-t4  0    ..000-0000  NVIDIA-Tesla T4        0/10    .......... 0/15360      .......... 0/100   cordoned  nvidia  -
gpu-gone: GPUs not counted: node unregistered: status.allocatable["nvidia.com/gpu"] is 0 (device plugin gone or every GPU unhealthy)"""  # noqa: E501

GOLDEN_WIDE_ROW = (
    "gpu-a   1    GPU-a1111111-1111-1111  NVIDIA A100-SXM4-80GB  2/10    hami-core  1     "
    "#######... 60480/81920  ###....... 30/100  ok        nvidia  "
    "ai-team/notebook (20480 MiB, 0%), default/training (40000 MiB, 30%)"
)


def test_top_prints_the_golden_table_of_a_small_cluster() -> None:
    assert render_top(build_top(snapshot_of(*small_cluster()))) == GOLDEN_TOP


def test_top_wide_adds_full_uuids_mode_numa_and_each_pods_share() -> None:
    text = render_top(build_top(snapshot_of(*small_cluster())), wide=True)
    assert GOLDEN_WIDE_ROW in text.splitlines()


def test_top_numbers_are_the_annotations_summed_per_gpu() -> None:
    top = build_top(snapshot_of(*small_cluster()))
    gpu = next(g for n in top.nodes for g in n.gpus if g.uuid == A1)
    assert (gpu.slices_used, gpu.memory_used, gpu.cores_used) == (2, 40000 + 20480, 30)
    assert [p.ref for p in gpu.pods] == ["ai-team/notebook", "default/training"]


def test_top_leaves_out_finished_pods() -> None:
    nodes, pods, _ = small_cluster()
    pods[0]["status"]["phase"] = "Succeeded"
    top = build_top(snapshot_of(nodes, pods))
    gpu = next(g for n in top.nodes for g in n.gpus if g.uuid == A0)
    assert (gpu.slices_used, gpu.memory_used, gpu.pods) == (0, 0, ())


def test_top_namespace_keeps_the_gpus_with_its_pods_and_only_its_pods() -> None:
    top = build_top(snapshot_of(*small_cluster()), namespace="default")
    rows = [(n.name, g.uuid, [p.ref for p in g.pods], g.memory_used) for n in top.nodes for g in n.gpus]
    assert rows == [("gpu-a", A1, ["default/training"], 60480)]


def test_top_namespace_without_gpu_pods_says_so() -> None:
    top = build_top(snapshot_of(*small_cluster()), namespace="empty")
    assert render_top(top) == "No HAMi GPUs found with pods of namespace empty."


def test_top_node_keeps_one_node_and_an_unknown_node_is_an_error_naming_it() -> None:
    snapshot = snapshot_of(*small_cluster())
    assert [n.name for n in build_top(snapshot, node="gpu-t4").nodes] == ["gpu-t4"]
    with pytest.raises(UnknownNode, match="'nope'"):
        build_top(snapshot, node="nope")


TOP_SCHEMA: Json = {
    "type": "object",
    "required": ["apiVersion", "kind", "nodes"],
    "properties": {
        "apiVersion": {"const": "hami.io/v1"},
        "kind": {"const": "GPUTop"},
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mode", "counted", "vendors", "gpus"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "mode": {"enum": ["device-plugin", "dra"]},
                    "counted": {"type": "boolean"},
                    "problem": {"type": "string"},
                    "vendorProblems": {"type": "array", "items": {"type": "string"}},
                    "vendors": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["vendor", "devices", "slices", "memoryMiB", "cores"],
                            "properties": {
                                "vendor": {"type": "string"},
                                "devices": {"type": "integer"},
                                "slices": {"$ref": "#/$defs/pair"},
                                "memoryMiB": {"$ref": "#/$defs/pair"},
                                "cores": {"$ref": "#/$defs/pair"},
                            },
                        },
                    },
                    "gpus": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": [
                                "uuid",
                                "vendor",
                                "index",
                                "model",
                                "mode",
                                "numa",
                                "health",
                                "slices",
                                "memoryMiB",
                                "cores",
                                "pods",
                            ],
                            "properties": {
                                "uuid": {"type": "string"},
                                "vendor": {"type": "string"},
                                "index": {"type": "integer"},
                                "model": {"type": "string"},
                                "mode": {"type": "string"},
                                "numa": {"type": "integer"},
                                "health": {"enum": ["ok", "unhealthy", "cordoned"]},
                                "slices": {"$ref": "#/$defs/pair"},
                                "memoryMiB": {"$ref": "#/$defs/pair"},
                                "cores": {"$ref": "#/$defs/pair"},
                                "pods": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["namespace", "name", "memoryMiB", "cores"],
                                        "properties": {
                                            "namespace": {"type": "string"},
                                            "name": {"type": "string"},
                                            "memoryMiB": {"type": "integer"},
                                            "cores": {"type": "integer"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "$defs": {
        "pair": {
            "type": "object",
            "additionalProperties": False,
            "required": ["used", "total"],
            "properties": {"used": {"type": "integer"}, "total": {"type": ["integer", "null"]}},
        }
    },
}


def test_top_json_and_yaml_follow_the_schema_and_carry_the_same_numbers() -> None:
    data = top_dict(build_top(snapshot_of(*small_cluster())))
    for text, load in ((json.dumps(data), json.loads), (yaml.safe_dump(data), yaml.safe_load)):
        loaded = load(text)
        jsonschema.validate(loaded, TOP_SCHEMA)
        assert loaded == data
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes["gpu-a"]["gpus"][1]["memoryMiB"] == {"used": 60480, "total": 81920}
    assert nodes["gpu-gone"]["counted"] is False and nodes["gpu-gone"]["gpus"] == []
    assert nodes["gpu-gone"]["problem"].startswith("node unregistered: status.allocatable")


def test_top_shows_dra_devices_with_their_claims_shares() -> None:
    slices = [
        resource_slice(
            "gpu-d",
            hami_gpu_device(0, uuid="GPU-d0"),
            hami_gpu_device(1, uuid="GPU-d1", taints=[{"key": "x", "effect": "NoSchedule"}]),
        )
    ]
    claims = [
        resource_claim(
            "a",
            results=[{"request": "gpu", "driver": "hami-core-gpu.project-hami.io", "pool": "gpu-d",
                      "device": "hami-gpu-0", "consumedCapacity": {"memory": "8000Mi", "cores": "25"}}],
            reserved_for=[("server", "u1")],
            node="gpu-d",
        ),
        resource_claim(
            "b",
            uid="u-b",
            results=[{"request": "gpu", "driver": "hami-core-gpu.project-hami.io", "pool": "gpu-d",
                      "device": "hami-gpu-0"}],
            node="gpu-d",
        ),
    ]  # fmt: skip
    top = build_top(snapshot_of([node("gpu-d")], slices=slices, claims=claims))
    (row,) = top.nodes
    assert row.mode == "dra"
    first, second = row.gpus
    assert (first.slices_used, first.slices_total, first.memory_used, first.cores_used) == (
        2,
        None,
        89920,
        125,
    )
    assert [p.ref for p in first.pods] == ["default/server"]
    assert (second.health, second.memory_used) == ("unhealthy", 0)
    assert "2/-" in render_top(top)
    jsonschema.validate(top_dict(top), TOP_SCHEMA)


def test_bar_fills_in_proportion_and_never_overflows() -> None:
    assert bar(0, 100) == ".........."
    assert bar(50, 100) == "#####....."
    assert bar(300, 100) == "##########"
    assert bar(5, 0) == ".........."


# --- explain ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    nodes: list[Json]
    pods: list[Json]
    pending: Json
    words: str
    quotas: tuple[Json, ...] = ()


def _pending(name: str = "p", *, annotations: Json | None = None, **ask: Any) -> Json:
    return gpu_pod(name, uid=f"uid-{name}", scheduler_name="hami-scheduler", annotations=annotations, **ask)


def _one_gpu(**fields: Any) -> list[Json]:
    return [node("n1", [gpu_info(0, id="GPU-0", **fields)])]


SCENARIOS: dict[Reason, Callable[[], Scenario]] = {
    Reason.CARD_TYPE_MISMATCH: lambda: Scenario(
        _one_gpu(),
        [],
        _pending(annotations={ann.USE_GPU_TYPE: "A100"}),
        "1 of 1 GPUs are of a type or mode the pod rules out",
    ),
    Reason.CARD_UUID_MISMATCH: lambda: Scenario(
        _one_gpu(),
        [],
        _pending(annotations={ann.USE_GPU_UUID: "GPU-other"}),
        "1 of 1 GPUs are not among the GPUs the pod allows",
    ),
    Reason.CARD_TIME_SLICING_EXHAUSTED: lambda: Scenario(
        _one_gpu(count=1),
        [running("a", "default", "n1", ("GPU-0", 1000, 0))],
        _pending(gpumem=1000),
        "1 of 1 GPUs have no free slice",
    ),
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED: lambda: Scenario(
        _one_gpu(),
        [running("a", "default", "n1", ("GPU-0", 1000, 100))],
        _pending(gpumem=1000),
        "1 of 1 GPUs have all their cores taken",
    ),
    Reason.CARD_INSUFFICIENT_MEMORY: lambda: Scenario(
        _one_gpu(),
        [running("a", "default", "n1", ("GPU-0", 10000, 10))],
        _pending(gpumem=8000),
        "1 of 1 GPUs have less free memory than the 8000 MiB asked (the most free on one GPU: 6000 MiB)",
    ),
    Reason.CARD_INSUFFICIENT_CORE: lambda: Scenario(
        _one_gpu(),
        [running("a", "default", "n1", ("GPU-0", 1000, 80))],
        _pending(gpumem=1000, gpucores=30),
        "1 of 1 GPUs have fewer free cores than the 30% asked (the most free on one GPU: 20%)",
    ),
    Reason.CARD_NOT_HEALTH: lambda: Scenario(
        _one_gpu(health=False), [], _pending(gpumem=1000), "1 of 1 GPUs are unhealthy"
    ),
    Reason.CARD_CORDONED: lambda: Scenario(
        [node("n1", [gpu_info(0, id="GPU-0")], annotations={ann.DEVICE_CORDON: "GPU-0"})],
        [],
        _pending(gpumem=1000),
        "1 of 1 GPUs are cordoned (hami.io/device-cordon)",
    ),
    Reason.NUMA_NOT_FIT: lambda: Scenario(
        [node("n1", [gpu_info(0, id="GPU-0", numa=0), gpu_info(1, id="GPU-1", numa=1)])],
        [],
        _pending(gpus=2, gpumem=1000, annotations={ann.NUMA_BIND: "true"}),
        "GPUs cannot be used together on one NUMA node (nvidia.com/numa-bind)",
    ),
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: lambda: Scenario(
        _one_gpu(),
        [running("a", "default", "n1", ("GPU-0", 1000, 0))],
        _pending(gpumem=1000, gpucores=100),
        "1 of 1 GPUs are in use, and the container wants a GPU to itself",
    ),
    Reason.NODE_INSUFFICIENT_DEVICE: lambda: Scenario(
        _one_gpu(),
        [],
        _pending(gpus=2, gpumem=1000),
        "the node has 1 GPUs, fewer than the 2 the container asks",
    ),
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: lambda: Scenario(
        [node("n1", [gpu_info(0, id="GPU-0"), gpu_info(1, id="GPU-1")])],
        [running("a", "default", "n1", ("GPU-0", 15000, 0))],
        _pending(gpus=2, gpumem=8000),
        "1 of 2 GPUs would take it, but the container asks for 2",
    ),
    Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: lambda: Scenario(
        _one_gpu(
            mode="mig",
            count=7,
            mig_profiles=(MigProfile("1g.5gb", 4864, 15, 1, (MigPlacement(6, 1),)),),
        ),
        [],
        _pending(gpumem=8000, annotations={ann.VGPU_MODE: "mig"}),
        "1 of 1 GPUs are in MIG mode and have no MIG profile with the 8000 MiB asked at a free placement",
    ),
    Reason.RESOURCE_QUOTA_NOT_FIT: lambda: Scenario(
        _one_gpu(),
        [],
        _pending(gpumem=8000),
        "1 of 1 GPUs would take namespace default over its GPU quota",
        (resource_quota({"limits.nvidia.com/gpumem": "4000"}, namespace="default"),),
    ),
}


def test_every_hami_reason_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(Reason)


@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_explain_gives_hamis_reason_and_a_sentence_for_it(reason: Reason) -> None:
    scenario = SCENARIOS[reason]()
    snapshot = snapshot_of(scenario.nodes, [*scenario.pods, scenario.pending], scenario.quotas)
    explanation = build_explanation(snapshot, scenario.pending)
    (verdict,) = explanation.verdicts
    assert not verdict.fits
    assert reason.value in verdict.reason
    assert any(scenario.words in sentence for sentence in verdict.sentences), verdict.sentences
    assert "No node" in explanation.summary
    assert scenario.words in render_explanation(explanation)


def test_explain_a_pending_pod_that_fits_somewhere_says_where_and_points_at_the_events() -> None:
    nodes, pods, quotas = small_cluster()
    pending = _pending("small", gpumem=70000)
    events: list[Json] = [
        {"type": "Warning", "reason": "FailedScheduling", "message": "0/4 nodes are available: node selector",
         "count": 3, "lastTimestamp": "2025-01-01T00:00:02Z"},
        {"type": "Normal", "reason": "Other", "message": "x", "lastTimestamp": "2025-01-01T00:00:03Z"},
    ]  # fmt: skip
    explanation = build_explanation(snapshot_of(nodes, [*pods, pending], quotas), pending, events)
    fits = {v.node: v for v in explanation.verdicts if v.fits}
    assert list(fits) == ["gpu-a"] and fits["gpu-a"].gpus == (f"GPU 0 ({A0})",)
    assert "finds 1 node(s) that fit its GPUs now (gpu-a)" in explanation.summary
    assert explanation.without_gpus == ("cpu-1",)
    text = render_explanation(explanation)
    assert "Warning FailedScheduling (x3): 0/4 nodes are available: node selector" in text
    assert text.index("FailedScheduling") < text.index("Normal Other")
    assert "gpu-gone  does not fit (node unregistered: " in text
    assert "gpu-t4    does not fit (1/1 CardCordoned)" in text


def test_explain_counts_the_quota_without_the_pod_itself() -> None:
    quota = resource_quota({"limits.nvidia.com/gpumem": "8000"}, namespace="default")
    pending = _pending(gpumem=8000)
    explanation = build_explanation(snapshot_of(_one_gpu(), [pending], [quota]), pending)
    assert [v.fits for v in explanation.verdicts] == [True]


def test_explain_a_pod_asking_no_gpu_and_one_of_another_scheduler() -> None:
    plain = pod("web", uid="u")
    explanation = build_explanation(snapshot_of(_one_gpu(), [plain]), plain)
    assert "asks no HAMi GPU" in explanation.summary
    assert "schedulerName is default-scheduler, not hami-scheduler" in explanation.notes[0]


def test_explain_a_pod_whose_request_does_not_parse_says_why() -> None:
    bad = pod("bad", container(gpus="lots"), uid="u", scheduler_name="hami-scheduler")
    explanation = build_explanation(snapshot_of(_one_gpu(), [bad]), bad)
    assert explanation.summary.startswith("hami-control cannot read its GPU request: pod default/bad")
    assert "lots" in explanation.summary


def test_explain_a_running_pod_names_its_node_and_gpus() -> None:
    nodes, pods, quotas = small_cluster()
    explanation = build_explanation(snapshot_of(nodes, pods, quotas), pods[1])
    assert explanation.summary == "Running on node gpu-a with 1 GPU share(s)."
    text = render_explanation(explanation)
    assert "Pod default/training: Running, on node gpu-a, bind phase success." in text
    assert f"main: GPU 1 {A1} (NVIDIA A100-SXM4-80GB): 40000 MiB, 30% of the cores" in text


def test_explain_a_bound_pod_waiting_for_the_node_daemon() -> None:
    waiting = gpu_pod(
        "w",
        gpumem=1000,
        uid="u",
        node_name="n1",
        annotations=allocation_annotations("n1", allocation([("GPU-0", 1000, 0)]), bind_phase="allocating"),
    )
    explanation = build_explanation(snapshot_of(_one_gpu(), [waiting]), waiting)
    assert "waits for hami-node on n1 to allocate them" in explanation.summary
    assert [p.uuid for p in explanation.placements] == ["GPU-0"]


def test_explain_json_and_yaml_carry_the_model() -> None:
    scenario = SCENARIOS[Reason.CARD_INSUFFICIENT_MEMORY]()
    snapshot = snapshot_of(scenario.nodes, [*scenario.pods, scenario.pending])
    data = explanation_dict(build_explanation(snapshot, scenario.pending))
    assert yaml.safe_load(yaml.safe_dump(data)) == json.loads(json.dumps(data)) == data
    assert data["kind"] == "PodExplanation" and data["pod"] == {"namespace": "default", "name": "p"}
    (verdict,) = data["nodes"]
    assert verdict["reason"] == "1/1 CardInsufficientMemory" and verdict["fits"] is False


# --- quota --------------------------------------------------------------------------------------------------


def test_quota_shows_hard_against_used_per_namespace() -> None:
    rows = build_quota(snapshot_of(*small_cluster()))
    table = {(r.namespace, r.resource): (r.used, r.hard, r.quotas) for r in rows}
    assert table == {
        ("ai-team", "limits.nvidia.com/gpumem"): (8000 + 20480, 30000, ("gpu",)),
        ("ai-team", "limits.nvidia.com/gpucores"): (25, 100, ("gpu",)),
        ("default", "limits.nvidia.com/gpumem"): (40000, None, ()),
        ("default", "limits.nvidia.com/gpucores"): (30, None, ()),
    }
    assert render_quota(rows).splitlines()[1] == (
        "ai-team    limits.nvidia.com/gpumem    28480 MiB  30000 MiB  #########.  gpu    nvidia"
    )
    data = quota_dict(rows)
    assert data["namespaces"][0]["resources"][0] == {
        "key": "limits.nvidia.com/gpumem",
        "vendor": "nvidia",
        "unit": "MiB",
        "used": 28480,
        "hard": 30000,
        "quotas": ["gpu"],
    }


def test_quota_of_one_namespace_and_of_none() -> None:
    snapshot = snapshot_of(*small_cluster())
    assert {r.namespace for r in build_quota(snapshot, "default")} == {"default"}
    assert (
        render_quota(build_quota(snapshot_of([node("cpu")]))) == "No namespace has a GPU quota or uses GPUs."
    )
