"""Links between a node's GPUs in `hami-sim up --inventory FILE` (`hami_sim.cluster.spec`): the forms
that carry them, the errors naming the entry and field, the inventory they give, cluster.json."""

from __future__ import annotations

import pytest

from hami_node.gpu import GPULink, TopologyLevel
from hami_node.gpu.inventory import DEFAULT_NVLINKS, LinkGroup, parse_inventory_text, render_inventory
from hami_sim.cluster.spec import (
    ClusterSpec,
    GPUSpec,
    NodeSpec,
    SpecError,
    node_inventory,
    parse_inventory_spec,
)

LINKS = [{"gpus": [1, 2], "nvlinks": 4}, {"gpus": [0, 1], "pcie": "single-switch"}]


def test_links_in_the_count_form_and_in_the_gpus_form() -> None:
    nodes = parse_inventory_spec(
        {
            "a": {"count": 4, "model": "NVIDIA A100-SXM4-80GB", "links": LINKS},
            "b": {"gpus": ["NVIDIA A100-SXM4-40GB", {"model": "NVIDIA L4", "memory": 23034}], "links": [
                {"gpus": [0, 1], "nvlinks": [2, 0]}
            ]},
            "c": {"count": 2},
        },
        "inv.yaml",
    )  # fmt: skip
    a, b, c = nodes
    assert a.links == (LinkGroup((1, 2), nvlinks=4), LinkGroup((0, 1), level=TopologyLevel.SINGLE_SWITCH))
    assert b.links == (LinkGroup((0, 1), nvlinks=2, reverse_nvlinks=0),)
    assert [g.memory_mib for g in b.gpus] == [40960, 23034]
    assert c.links is None

    inventory = node_inventory(a)
    uuids = [g.uuid for g in inventory.gpus]
    assert inventory.link(uuids[1], uuids[2]) == GPULink(TopologyLevel.SYSTEM, 4)  # NUMA 0 and 1
    assert inventory.link(uuids[0], uuids[1]) == GPULink(TopologyLevel.SINGLE_SWITCH, 0)
    assert inventory.link(uuids[2], uuids[3]) == GPULink(
        TopologyLevel.NUMA_NODE, 0
    )  # given links: only those
    # The file hami-node reads back is valid and the same.
    assert parse_inventory_text(render_inventory(inventory)) == inventory
    mixed = node_inventory(b)
    assert mixed.link(mixed.gpus[0].uuid, mixed.gpus[1].uuid).nvlinks == 2
    assert mixed.link(mixed.gpus[1].uuid, mixed.gpus[0].uuid).nvlinks == 0


def test_without_links_gpus_of_one_model_are_all_nvlinked() -> None:
    (node,) = parse_inventory_spec({"a": {"count": 3}}, "inv.yaml")
    inventory = node_inventory(node)
    uuids = [g.uuid for g in inventory.gpus]
    assert all(inventory.link(x, y).nvlinks == DEFAULT_NVLINKS for x in uuids for y in uuids if x != y)
    assert parse_inventory_text(render_inventory(inventory)) == inventory


def pair(**link: object) -> dict[str, object]:
    """Two GPUs with one links entry."""
    return {"count": 2, "links": [link]}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (pair(gpus=[0, 2], nvlinks=1), "inv.yaml: n1: links[0].gpus[1]: no GPU with index 2"),
        (pair(gpus=[0, 1], nvlinks=40), "inv.yaml: n1: links[0].nvlinks: expected an integer from 0 to 18"),
        (pair(gpus=[0, 1], pcie="nvlink"), "n1: links[0].pcie: unknown topology level 'nvlink'"),
        (pair(gpus=[0, 1]), "n1: links[0]: sets neither nvlinks nor pcie"),
        ({"count": 2, "links": {"gpus": [0, 1]}}, "n1: links: expected a list"),
        ({"gpus": ["Tesla T4"], "count": 2}, "n1: unknown key 'count' (expected gpus, links, nvidia, mode)"),
        ({"gpus": "Tesla T4"}, "n1.gpus: expected a list of GPUs"),
        ({"gpus": ["Tesla T4", {"model": "X", "memory": "lots"}]}, "n1.gpus[1].memory: expected a positive"),
        (
            {"count": 2, "linkz": []},
            "n1: unknown key 'linkz' (expected count, model, memory, mig, links, nvidia, mode)",
        ),
    ],
)
def test_bad_links_name_the_node_entry_and_field(value: object, error: str) -> None:
    with pytest.raises(SpecError) as failed:
        parse_inventory_spec({"n1": value}, "inv.yaml")
    assert error in str(failed.value)


def test_links_survive_cluster_json_and_are_checked_in_code() -> None:
    a100 = GPUSpec("NVIDIA A100-SXM4-80GB")
    spec = ClusterSpec(
        (
            NodeSpec("n1", (a100,) * 3, (LinkGroup((0, 1), nvlinks=4, reverse_nvlinks=0),)),
            NodeSpec("n2", (a100,) * 2),
        )
    )
    again = ClusterSpec.from_data(spec.to_data())
    assert again.nodes == spec.nodes
    with pytest.raises(SpecError, match=r"node n1: links\[0\]: no GPU with index 3"):
        NodeSpec("n1", (a100,) * 3, (LinkGroup((0, 3), nvlinks=4),))


def test_node_cpu_and_memory_per_node_survive_cluster_json_and_need_the_per_process_mode() -> None:
    gpu = (GPUSpec("Tesla T4"),)
    spec = ClusterSpec((NodeSpec("a", gpu, cpu="12", memory="48Gi"), NodeSpec("b", gpu)))
    again = ClusterSpec.from_data(spec.to_data())
    assert [(n.cpu, n.memory) for n in again.nodes] == [("12", "48Gi"), (None, None)]
    with pytest.raises(SpecError, match="node a: a CPU or memory size per node needs the per-process mode"):
        ClusterSpec((NodeSpec("a", gpu, cpu="12"),), scale=True)
