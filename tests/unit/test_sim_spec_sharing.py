"""NVIDIA's sharing modes and HAMi's dynamic MIG per node in hami-sim's cluster spec
(`hami_sim.cluster.spec`): a node's `nvidia` (NVIDIA's config file v1, inline or a path), its `mode: mig`,
MIG devices present at start per GPU; the errors naming the entry and field; the fake inventory and the
hami-node command line they give; cluster.json; `with_mode`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.mig import mig_model
from hami_node.gpu.inventory import FakeMigInstance, parse_inventory_text, render_inventory
from hami_sim.cluster import Cluster
from hami_sim.cluster.spec import (
    ClusterSpec,
    GPUSpec,
    NodeSpec,
    SpecError,
    load_inventory_spec,
    node_inventory,
    parse_inventory_spec,
)

A100 = "NVIDIA A100-SXM4-40GB"
TIME_SLICING: dict[str, Any] = {
    "version": "v1",
    "sharing": {
        "timeSlicing": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}
    },
}
MIXED: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "mixed"}}
LAYOUT: list[dict[str, Any]] = [
    {"profile": "3g.20gb", "start": 0},
    {"profile": "2g.10gb", "start": 4},
    {"profile": "1g.5gb", "start": 6},
]


def test_a_nodes_nvidia_config_inline_and_mig_devices_give_nvidia_mode_and_the_inventory_layout() -> None:
    mig, ts, dyn = parse_inventory_spec(
        {
            "mig-a": {"count": 1, "model": A100, "mig": LAYOUT, "nvidia": MIXED},
            "ts-a": {"gpus": ["Tesla T4"], "nvidia": TIME_SLICING},
            "dyn-a": {"count": 2, "model": A100, "mig": True, "mode": "mig"},
        },
        "inv.yaml",
    )
    assert mig.nvidia_mode and ts.nvidia_mode and not dyn.nvidia_mode
    assert dyn.operating_mode == "mig" and mig.operating_mode == ts.operating_mode == "hami-core"
    assert mig.gpus[0].mig
    assert mig.gpus[0].mig_devices == tuple(
        FakeMigInstance(str(d["profile"]), int(d["start"])) for d in LAYOUT
    )
    inventory = parse_inventory_text(render_inventory(node_inventory(mig)), "gpus.yaml")
    (gpu,) = inventory.gpus
    assert gpu.mig_enabled and gpu.mig_devices == mig.gpus[0].mig_devices

    spec = ClusterSpec((mig, ts, dyn))
    assert spec.nvidia_mode_nodes == ("mig-a", "ts-a") and spec.hami_nodes == ("dyn-a",)
    assert "2 in NVIDIA's modes; 1 with HAMi's dynamic MIG" in spec.describe()
    assert ClusterSpec.from_data(spec.to_data()).nodes == spec.nodes


def test_a_nodes_nvidia_config_path_is_read_relative_to_the_inventory_file(tmp_path: Path) -> None:
    (tmp_path / "ts.yaml").write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                      "    - name: nvidia.com/gpu\n      replicas: 2\n")  # fmt: skip
    (tmp_path / "inv.yaml").write_text("ts-a: {count: 1, model: Tesla T4, nvidia: ts.yaml}\n")
    (node,) = load_inventory_spec(tmp_path / "inv.yaml")
    assert node.nvidia_config is not None and "replicas: 2" in node.nvidia_config
    assert node.nvidia_config_source == str(tmp_path / "ts.yaml")


def test_the_mig_mapping_form_is_the_fake_inventorys() -> None:
    (node,) = parse_inventory_spec({"n": {"gpus": [{"model": A100, "mig": {"devices": LAYOUT[:1]}}]}})
    assert node.gpus[0].mig_devices == (FakeMigInstance("3g.20gb", 0),)


T4 = {"count": 1, "model": "Tesla T4"}
ONE_A100 = {"count": 1, "model": A100}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            {**T4, "nvidia": {"version": "v1", "flags": {"migStrategy": "bogus"}}},
            "node n: nvidia line 3: flags.migStrategy: unknown MIG strategy: bogus (choose none, single, "
            "mixed)",
        ),
        ({**T4, "nvidia": {"version": "v2"}}, "node n: nvidia line 1: version: unknown version: v2"),
        ({**T4, "nvidia": 7}, "n.nvidia: expected NVIDIA's config file v1"),
        ({**T4, "nvidia": "ts.yaml"}, "n.nvidia: a path (ts.yaml) needs the inventory read from a file"),
        ({**T4, "mode": "mps"}, "n.mode: expected one of hami-core, mig, got 'mps'"),
        ({**T4, "mode": "mig"}, "node n: mode: mig needs GPUs in MIG mode"),
        (
            {**ONE_A100, "mig": True, "mode": "mig", "nvidia": MIXED},
            "NVIDIA's config file and HAMi's operating mode 'mig' would share the same GPUs two ways",
        ),
        ({**T4, "mig": True}, "mig: Tesla T4 is not a MIG-capable model"),
        (
            {**ONE_A100, "mig": [{"profile": "1g.5gb", "start": 6}, {"profile": "7g.40gb", "start": 0}]},
            "n.mig[1].start: 7g.40gb at {0,8} overlaps mig[0] at {6,1}",
        ),
        (
            {**ONE_A100, "mig": {"devices": [{"profile": "3g.20gb", "start": 2}]}},
            "n.mig.devices[0].start: 2 is not a placement of 3g.20gb on NVIDIA A100-SXM4-40GB (starts: 0, 4)",
        ),
        (
            {**ONE_A100, "mig": [{"profile": "9g.90gb", "start": 0}]},
            "n.mig[0].profile: '9g.90gb' is not a MIG profile of NVIDIA A100-SXM4-40GB",
        ),
        (
            {**ONE_A100, "mig": [{"profile": "1g.5gb", "start": c} for c in range(7)] + [{"profile": "1g.5gb",
             "start": 0}]},
            "n.mig[7].start: 1g.5gb at {0,1} overlaps mig[0] at {0,1}",
        ),
        ({**ONE_A100, "mig": [{"profile": "1g.5gb"}]}, "n.mig[0].start: expected an integer >= 0"),
        (
            {**ONE_A100, "mig": [{"profile": "1g.5gb", "start": 0, "size": 1}]},
            "n.mig[0]: unknown key 'size' (expected profile, start)",
        ),
        ({**ONE_A100, "mig": "yes"}, "n.mig: expected true, false or a list of MIG devices"),
    ],
)  # fmt: skip
def test_bad_sharing_entries_name_the_node_and_field(value: object, error: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_inventory_spec({"n": value}, "inv.yaml")
    assert error in str(raised.value)
    assert str(raised.value).startswith("inv.yaml: n")


def test_nvidia_config_on_a_dra_node_is_refused_and_mixed_mode_keeps_nvidia_and_mig_nodes_on_the_plugin() -> (
    None
):
    spec = ClusterSpec(
        (
            NodeSpec("a", (GPUSpec(A100),)),
            NodeSpec("ts", (GPUSpec("Tesla T4"),), nvidia_config="version: v1\n"),
            NodeSpec("dyn", (GPUSpec(A100, mig=True),), operating_mode="mig"),
            NodeSpec("b", (GPUSpec(A100),)),
        )
    )
    assert [n.mode for n in spec.with_mode("mixed").nodes] == [
        "device-plugin",
        "device-plugin",
        "device-plugin",
        "dra",
    ]
    with pytest.raises(SpecError, match="node ts: nvidia: NVIDIA's config file is for its device plugin"):
        spec.with_mode("dra")


def test_hami_node_gets_nvidias_config_file_without_split_count_and_mig_nodes_their_node_config(
    tmp_path: Path,
) -> None:
    spec = ClusterSpec(
        (
            NodeSpec("ts", (GPUSpec("Tesla T4"),), nvidia_config="version: v1\n"),
            NodeSpec("dyn", (GPUSpec(A100, mig=True),), operating_mode="mig"),
        )
    )
    cluster = Cluster(spec, tmp_path / "state", run_dir=tmp_path / "run")
    ts = list(cluster._hosted("ts").node_args)
    assert ts[ts.index("--config-file") + 1] == str(cluster.nvidia_config_path("ts"))
    assert "--device-split-count" not in ts
    dyn = list(cluster._hosted("dyn").node_args)
    assert dyn[dyn.index("--config-file") + 1] == str(cluster.node_config_path("dyn"))
    assert "--device-split-count" in dyn


@given(st.data())
def test_any_layout_of_real_placements_without_overlap_is_accepted_and_kept(data: st.DataObject) -> None:
    model = mig_model(A100)
    assert model is not None
    chosen: list[FakeMigInstance] = []
    taken: list[Any] = []
    for _ in range(data.draw(st.integers(0, 7))):
        profile = data.draw(st.sampled_from(model.profiles))
        placement = data.draw(st.sampled_from(profile.placements))
        same = sum(d.profile == profile.name for d in chosen)
        if any(placement.overlaps(t) for t in taken) or same >= profile.instance_count:
            continue
        chosen.append(FakeMigInstance(profile.name, placement.start))
        taken.append(placement)
    gpu = GPUSpec(A100, mig_devices=tuple(chosen))
    assert gpu.mig == bool(chosen) and gpu.mig_devices == tuple(chosen)
