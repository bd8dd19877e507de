"""`kubectl hami` with the other vendors (issue 26, hami_control/status): `top` lists every vendor's devices
with a VENDOR column and per-vendor node totals, and the inventories hami-control leaves out; `explain`
fits a vendor pod with the extender's vendor path and says HAMi's vendor reasons in words, and names a
running pod's vendor devices; `quota` shows the vendors' per-resource limits against their usage; the
vendor of a device is told from its Type as HAMi hands devices to requests; the CLI's vendor flags are
hami-control's. Hygon DCU (a legacy inventory) stands for the vendors, AMD for a Type that is not the
common word."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_control.config import ControlConfig
from hami_control.status.cli import Failure, build_parser, with_devices
from hami_control.status.explain import build_explanation, explanation_dict, render_explanation
from hami_control.status.quotas import build_quota, quota_dict, render_quota
from hami_control.status.snapshot import Snapshot
from hami_control.status.top import build_top, render_top, top_dict
from hami_control.status.vendors import NVIDIA_FAMILY, UNKNOWN_FAMILY, VendorFamilies
from tests.builders import (
    Json,
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    gpu_pod,
    node,
    pod,
    resource_quota,
)

CONFIG = ControlConfig()
DCU_REGISTER = "hami.io/node-dcu-register"
AMD_REGISTER = "hami.io/node-amd-register"
MI300 = "AMD_Instinct_MI300X_VF"


def dcu_node(name: str, devices: int = 2, mem: int = 16384, register: str | None = None) -> Json:
    """Node `name` with `devices` Hygon DCUs `<name>-dcu<i>` (index i, 4 slots, `mem` MiB), no NVIDIA GPU."""
    text = register
    if text is None:
        text = "".join(f"{name}-dcu{i},4,{mem},100,DCU,0,true,{i},hami-core:" for i in range(devices))
    return node(name, annotations={DCU_REGISTER: text}, allocatable={"hygon.com/dcunum": str(devices * 4)})


def dcu_limits(count: int = 1, mem: int = 4000, cores: int = 30) -> dict[str, str]:
    return {"hygon.com/dcunum": str(count), "hygon.com/dcumem": str(mem), "hygon.com/dcucores": str(cores)}


def dcu_pod(name: str, namespace: str = "ml", *, count: int = 1, mem: int = 4000, **extra: Any) -> Json:
    """A pod of `namespace` whose container `c` asks `count` DCUs of `mem` MiB and 30 % each."""
    return pod(
        name,
        container("c", limits=dcu_limits(count, mem)),
        namespace=namespace,
        uid=f"uid-{name}",
        scheduler_name="hami-scheduler",
        **extra,
    )


def running_dcu_pod(name: str, where: str, *slices: tuple[str, int, int], namespace: str = "ml") -> Json:
    """A DCU pod hami-control bound to `where`, holding `slices` (device, MiB, cores), Running."""
    text = "".join(f"{uuid},DCU,{mem},{cores}:" for uuid, mem, cores in slices) + ";"
    annotations = {ann.VGPU_NODE: where, "hami.io/dcu-devices-allocated": text, ann.BIND_PHASE: "success"}
    mem = slices[0][1] if slices else 0
    return dcu_pod(
        name, namespace, count=len(slices), mem=mem, annotations=annotations, node_name=where, phase="Running"
    )


def nvidia_node(name: str) -> Json:
    return node(name, [gpu_info(0, id=f"{name}-g0", devmem=81920, type="NVIDIA A100")])


def mixed_node(name: str) -> Json:
    """An NVIDIA A100 and one DCU on one node."""
    both = nvidia_node(name)
    both["metadata"]["annotations"][DCU_REGISTER] = f"{name}-dcu0,4,16384,100,DCU,0,true,0,hami-core:"
    both["status"]["allocatable"]["hygon.com/dcunum"] = "4"
    both["status"]["capacity"]["hygon.com/dcunum"] = "4"
    return both


snapshot = functools.partial(Snapshot.of, CONFIG)


# --- which vendor a device is -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_type", "family"),
    [
        ("DCU", "hygon"),
        ("MLU", "cambricon"),
        (MI300, "amd"),  # AMD keeps its product Type: the common word `AMD` is in it
        ("GCU", "enflame"),
        ("Enflame", "enflame"),
        ("XPU", "kunlun"),
        ("kunlun", "kunlun"),
        ("Metax-SGPU", "metax"),
        ("Z100", UNKNOWN_FAMILY),  # no vendor's common word: no request of HAMi's is handed it
    ],
)
def test_a_devices_vendor_is_the_vendor_whose_common_word_its_type_contains(
    device_type: str, family: str
) -> None:
    assert VendorFamilies(CONFIG.registry.vendors).of_type(device_type) == family


def test_a_slices_vendor_is_nvidia_for_nvidias_slices_and_else_from_its_type() -> None:
    families = VendorFamilies(CONFIG.registry.vendors)
    assert (families.of_slice("NVIDIA"), families.of_slice("DCU")) == (NVIDIA_FAMILY, "hygon")


def test_ascend_chips_are_one_vendor_and_the_exact_common_word_wins() -> None:
    families = VendorFamilies(CONFIG.with_settings(enable_ascend=True).registry.vendors)
    assert {families.of_type(t) for t in ("Ascend910B4", "Ascend910B4-1", "Ascend310P")} == {"ascend"}
    assert VendorFamilies(CONFIG.registry.vendors).of_type("Ascend910B4") == UNKNOWN_FAMILY  # Ascend off


# --- top --------------------------------------------------------------------------------------------------


def test_top_lists_a_dcu_nodes_devices_with_their_vendor_usage_and_pods() -> None:
    nodes = [dcu_node("dcu-1"), nvidia_node("gpu-a"), node("cpu-1")]
    pods = [running_dcu_pod("train", "dcu-1", ("dcu-1-dcu0", 12000, 30))]
    top = build_top(snapshot(nodes, pods))
    rows = [
        (n.name, g.uuid, g.vendor, g.model, g.slices_used, g.memory_used, g.cores_used)
        for n in top.nodes
        for g in n.gpus
    ]
    assert rows == [
        ("dcu-1", "dcu-1-dcu0", "hygon", "DCU", 1, 12000, 30),
        ("dcu-1", "dcu-1-dcu1", "hygon", "DCU", 0, 0, 0),
        ("gpu-a", "gpu-a-g0", "nvidia", "NVIDIA A100", 0, 0, 0),
    ]
    assert [p.ref for p in top.nodes[0].gpus[0].pods] == ["ml/train"]
    lines = render_top(top).splitlines()
    header = "NODE GPU UUID MODEL SLICES MEMORY (MiB) CORES (%) HEALTH VENDOR PODS"
    assert lines[0].split() == header.split()
    assert lines[1].split()[-2:] == ["hygon", "ml/train"]
    assert lines[3].split()[-2:] == ["nvidia", "-"]


def test_top_json_gives_each_device_its_vendor_and_each_node_its_vendors_totals() -> None:
    pods = [running_dcu_pod("train", "m", ("m-dcu0", 6000, 20))]
    data = top_dict(build_top(snapshot([mixed_node("m")], pods)))
    (entry,) = data["nodes"]
    assert [(g["uuid"], g["vendor"]) for g in entry["gpus"]] == [("m-g0", "nvidia"), ("m-dcu0", "hygon")]
    assert entry["vendors"] == [
        {
            "vendor": "nvidia",
            "devices": 1,
            "slices": {"used": 0, "total": 10},
            "memoryMiB": {"used": 0, "total": 81920},
            "cores": {"used": 0, "total": 100},
        },
        {
            "vendor": "hygon",
            "devices": 1,
            "slices": {"used": 1, "total": 4},
            "memoryMiB": {"used": 6000, "total": 16384},
            "cores": {"used": 20, "total": 100},
        },
    ]
    assert entry["counted"] is True and "vendorProblems" not in entry
    assert json.loads(json.dumps(data)) == data


def test_top_names_a_vendor_whose_type_is_its_product() -> None:
    text = ann.encode_node_register([gpu_info(0, id="amd-0", count=4, devmem=65536, type=MI300)])
    amd = node("amd-1", annotations={AMD_REGISTER: text}, allocatable={"amd.com/gpu": "4"})
    ((gpu,),) = [n.gpus for n in build_top(snapshot([amd], [])).nodes]
    assert (gpu.uuid, gpu.vendor, gpu.model) == ("amd-0", "amd", MI300)


def test_top_says_which_vendor_inventory_it_leaves_out_and_why() -> None:
    bad = dcu_node("dcu-bad", register="d0,4,lots,100,DCU,0,true:")
    gone = dcu_node("dcu-gone")
    gone["status"]["allocatable"] = {"cpu": "8"}
    top = build_top(snapshot([bad, gone], []))
    lines = render_top(top).splitlines()
    assert lines[0].startswith("dcu-bad: devices not counted: hygon: hami.io/node-dcu-register: device 0: ")
    assert lines[1].startswith("dcu-gone: devices not counted: hygon: status.allocatable['hygon.com/dcunum']")
    entry = top_dict(top)["nodes"][0]
    assert entry["counted"] is False and entry["gpus"] == [] and len(entry["vendorProblems"]) == 1


def test_top_namespace_keeps_the_vendor_devices_holding_its_pods() -> None:
    nodes = [mixed_node("m")]
    nvidia = gpu_pod(
        "inf",
        gpumem=1000,
        namespace="ai",
        uid="uid-inf",
        node_name="m",
        phase="Running",
        annotations=allocation_annotations("m", allocation([("m-g0", 1000, 10)]), bind_phase="success"),
    )
    pods = [running_dcu_pod("train", "m", ("m-dcu0", 6000, 20)), nvidia]
    top = build_top(snapshot(nodes, pods), namespace="ml")
    assert [(g.uuid, g.vendor) for n in top.nodes for g in n.gpus] == [("m-dcu0", "hygon")]


# --- explain ----------------------------------------------------------------------------------------------


def test_explain_fits_a_dcu_pod_with_the_vendor_path_and_names_the_dcu_it_would_get() -> None:
    nodes = [dcu_node("dcu-1"), nvidia_node("gpu-a"), node("cpu-1")]
    pods = [running_dcu_pod("train", "dcu-1", ("dcu-1-dcu0", 14000, 30))]
    pending = dcu_pod("small", mem=4000)
    explanation = build_explanation(snapshot(nodes, [*pods, pending]), pending)
    (verdict,) = explanation.verdicts
    assert (verdict.node, verdict.fits, verdict.gpus) == ("dcu-1", True, ("DCU 1 (dcu-1-dcu1)",))
    assert explanation.asks == ("container c: 1 DCU device (hygon) with 4000 MiB and a core request of 30",)
    assert explanation.without_gpus == ("cpu-1", "gpu-a")
    assert "finds 1 node(s) that fit its devices now (dcu-1)" in explanation.summary
    text = render_explanation(explanation)
    assert "2 node(s) without HAMi devices of the kinds it asks: cpu-1, gpu-a" in text


def test_explain_gives_hamis_vendor_reason_and_a_sentence_for_it() -> None:
    nodes = [dcu_node("dcu-1")]
    pods = [running_dcu_pod("train", "dcu-1", ("dcu-1-dcu0", 14000, 30))]
    pending = dcu_pod("big", mem=17000)
    explanation = build_explanation(snapshot(nodes, [*pods, pending]), pending)
    (verdict,) = explanation.verdicts
    assert (verdict.fits, verdict.reason, verdict.unresolvable) == (
        False,
        "2/2 CardInsufficientMemory",
        False,
    )
    assert verdict.sentences == (
        "2 of 2 DCU devices have less free memory than the 17000 MiB asked "
        "(the most free on one device: 16384 MiB)",
    )
    assert explanation.summary.startswith("No node has room for its devices now")


def test_explain_a_dcu_pod_asking_more_devices_than_a_node_has_can_never_fit_there() -> None:
    pending = dcu_pod("many", count=3)
    explanation = build_explanation(snapshot([dcu_node("dcu-1")], [pending]), pending)
    (verdict,) = explanation.verdicts
    assert (verdict.reason, verdict.unresolvable) == ("NodeInsufficientDevice", True)
    assert verdict.sentences == ("the node has 2 DCU devices, fewer than the 3 the container asks",)
    assert explanation.summary.startswith("No node can ever fit its devices")


def test_explain_gives_a_left_out_dcu_inventory_as_the_reason() -> None:
    bad = dcu_node("dcu-bad", register="d0,4,lots,100,DCU,0,true:")
    pending = dcu_pod("p")
    (verdict,) = build_explanation(snapshot([bad], [pending]), pending).verdicts
    assert verdict.reason.startswith("hygon: hami.io/node-dcu-register: device 0: devmem 'lots'")
    assert verdict.unresolvable
    assert verdict.sentences == (
        "its hygon devices are left out until their device plugin publishes a usable inventory",
    )


def test_explain_a_pod_asking_a_gpu_and_a_dcu_says_what_each_node_lacks() -> None:
    both = pod(
        "both",
        container("gpu", gpus=1, gpumem=1000),
        container("dcu", limits=dcu_limits()),
        namespace="ml",
        uid="uid-both",
        scheduler_name="hami-scheduler",
    )
    nodes = [dcu_node("dcu-1"), nvidia_node("gpu-a"), mixed_node("m")]
    explanation = build_explanation(snapshot(nodes, [both]), both)
    verdicts = {v.node: v for v in explanation.verdicts}
    assert verdicts["m"].fits and verdicts["m"].gpus == ("GPU 0 (m-g0)", "DCU 0 (m-dcu0)")
    assert verdicts["dcu-1"].sentences == ("the node has no NVIDIA GPU hami-control counts",)
    assert (verdicts["gpu-a"].reason, verdicts["gpu-a"].sentences) == (
        "NodeInsufficientDevice",
        ("the node has no DCU devices hami-control counts",),
    )
    assert explanation.asks == (
        "container gpu: 1 GPU with 1000 MiB and 0% of the cores",
        "container dcu: 1 DCU device (hygon) with 4000 MiB and a core request of 30",
    )


def test_explain_a_running_dcu_pod_names_its_devices_and_their_vendor() -> None:
    running = running_dcu_pod("train", "dcu-1", ("dcu-1-dcu1", 12000, 30))
    explanation = build_explanation(snapshot([dcu_node("dcu-1")], [running]), running)
    assert explanation.summary == "Running on node dcu-1 with 1 device share(s)."
    (placement,) = explanation.placements
    assert (placement.vendor, placement.uuid, placement.index, placement.model) == (
        "hygon",
        "dcu-1-dcu1",
        1,
        "DCU",
    )
    text = render_explanation(explanation)
    assert "  c: hygon device 1 dcu-1-dcu1 (DCU): 12000 MiB, core request 30" in text
    assert explanation_dict(explanation)["gpus"][0]["vendor"] == "hygon"


# --- quota ------------------------------------------------------------------------------------------------


def test_quota_shows_a_vendors_limits_against_its_usage_with_the_vendor() -> None:
    pods = [running_dcu_pod("train", "dcu-1", ("dcu-1-dcu0", 12000, 30)), dcu_pod("waiting", mem=8000)]
    quotas = [
        resource_quota(
            {"limits.hygon.com/dcumem": "20000", "limits.hygon.com/dcucores": "100"}, namespace="ml"
        )
    ]
    rows = build_quota(snapshot([dcu_node("dcu-1")], pods, quotas))
    table = {(r.namespace, r.resource): (r.vendor, r.unit, r.used, r.hard, r.quotas) for r in rows}
    assert table == {  # no NVIDIA row: the namespace has no NVIDIA limit or usage
        ("ml", "limits.hygon.com/dcumem"): ("hygon", "MiB", 12000 + 8000, 20000, ("gpu",)),
        ("ml", "limits.hygon.com/dcucores"): ("hygon", "", 30 + 30, 100, ("gpu",)),
    }
    lines = render_quota(rows).splitlines()
    assert lines[0].split() == ["NAMESPACE", "RESOURCE", "USED", "HARD", "QUOTA", "VENDOR"]
    assert lines[2].split() == ["ml", "limits.hygon.com/dcucores", "60", "100", "######....", "gpu", "hygon"]
    resource = quota_dict(rows)["namespaces"][0]["resources"][0]
    assert resource == {
        "key": "limits.hygon.com/dcumem",
        "vendor": "hygon",
        "unit": "MiB",
        "used": 20000,
        "hard": 20000,
        "quotas": ["gpu"],
    }


def test_quota_of_a_namespace_with_nothing_still_answers_nvidias_rows() -> None:
    rows = build_quota(snapshot([dcu_node("dcu-1")], []), "empty")
    assert [(r.resource, r.vendor, r.used, r.hard) for r in rows] == [
        ("limits.nvidia.com/gpumem", "nvidia", 0, None),
        ("limits.nvidia.com/gpucores", "nvidia", 0, None),
    ]


# --- the CLI's vendor flags -------------------------------------------------------------------------------


def parsed(*flags: str) -> argparse.Namespace:
    return build_parser("kubectl hami").parse_args(["top", *flags])


def test_the_vendor_flags_turn_vendors_on_as_hami_controls_do() -> None:
    assert with_devices(CONFIG, parsed()) is CONFIG
    families = {v.names.family for v in with_devices(CONFIG, parsed("--enable-ascend")).registry.vendors}
    assert "ascend" in families and "ascend" not in {v.names.family for v in CONFIG.registry.vendors}


def test_a_device_config_file_keeps_only_its_vendors_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    given = tmp_path / "device-config.yaml"
    given.write_text("hygon:\n  resourceCountName: hygon.com/dcunum\n", encoding="utf-8")
    config = with_devices(CONFIG, parsed("--device-config-file", str(given)))
    assert {v.names.family for v in config.registry.others} == {"hygon"}
    given.write_text("hygon:\n  resourceCountNam: x\n", encoding="utf-8")
    with pytest.raises(Failure, match="resourceCountNam"):
        with_devices(CONFIG, parsed("--device-config-file", str(given)))
    with pytest.raises(Failure, match="cannot be read"):
        with_devices(CONFIG, parsed("--device-config-file", str(tmp_path / "missing.yaml")))
