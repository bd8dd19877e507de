"""HAMi's GPU pair scores from links (`hami_node.gpu.topology`), with HAMi v2.10's own Go test cases
(pkg/device/nvidia/calculate_score_test.go, links_test.go) transcribed as inputs and expected outputs,
and the node option that turns publishing them off."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import decode_pair_scores, encode_pair_scores
from hami_api.settings import ConfigError
from hami_api.types import GPUPairScore
from hami_node.config import load_config
from hami_node.gpu import GPULink, TopologyLevel
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import parse_inventory
from hami_node.gpu.topology import (
    LEVEL_SCORES,
    NO_LINK,
    AsymmetricPair,
    NvLinkPorts,
    bus_id_key,
    count_matching_links,
    gpu_pair_scores,
    link_entries,
    nvlink_count,
    nvlink_entry_score,
    pair_score,
    read_pair_scores,
)

L = TopologyLevel


def nv(count: int) -> GPULink:
    """Only an NVLink entry (HAMi's test devices list no PCIe entry)."""
    return GPULink(None, count)


# --- HAMi's values ---------------------------------------------------------------------------------


def test_level_scores_are_hamis() -> None:
    assert LEVEL_SCORES == {
        L.SYSTEM: 10,  # P2PLinkCrossCPU
        L.NUMA_NODE: 20,  # P2PLinkSameCPU
        L.HOST_BRIDGE: 30,  # P2PLinkHostBridge
        L.MULTI_SWITCH: 40,  # P2PLinkMultiSwitch
        L.SINGLE_SWITCH: 50,  # P2PLinkSingleSwitch
        L.SAME_BOARD: 60,  # P2PLinkSameBoard
    }


def test_a_pair_scores_its_pcie_level_plus_100_per_nvlink() -> None:
    assert pair_score(GPULink(L.NUMA_NODE, 4), GPULink(L.NUMA_NODE, 4)) == (420, False)
    assert pair_score(GPULink(L.SYSTEM, 0), GPULink(L.SYSTEM, 0)) == (10, False)
    assert pair_score(GPULink(L.SINGLE_SWITCH, 18), GPULink(L.SINGLE_SWITCH, 18)) == (1850, False)
    assert pair_score(NO_LINK, NO_LINK) == (0, False)


# Test_nvlinkCountToType: n -> the NVLink entry's type; here its score (0: no entry).
@pytest.mark.parametrize(
    ("count", "score"),
    [(-1, 0), (0, 0), *((n, 100 * n) for n in range(1, 19)), (19, 0), (100, 0)],
)
def test_nvlink_count_to_type_as_hamis_cases(count: int, score: int) -> None:
    assert nvlink_entry_score(count) == score
    assert link_entries(nv(count)) == (1 if score else 0)


# Test_calculateGPUPairScore_asymmetric: dev0 lists SameCPU + FourNVLINKLinks to dev1, dev1 only SameCPU.
def test_asymmetric_pair_as_hamis_case_scores_zero_and_is_flagged() -> None:
    dev0_to_dev1, dev1_to_dev0 = GPULink(L.NUMA_NODE, 4), GPULink(L.NUMA_NODE, 0)
    assert pair_score(dev0_to_dev1, dev1_to_dev0) == (0, True)
    assert pair_score(dev1_to_dev0, dev0_to_dev1) == (0, True)
    links = {("gpu0", "gpu1"): dev0_to_dev1, ("gpu1", "gpu0"): dev1_to_dev0}
    scores = gpu_pair_scores(["gpu0", "gpu1"], links)
    assert scores.scores == (GPUPairScore.of("gpu0", {"gpu1": 0}), GPUPairScore.of("gpu1", {"gpu0": 0}))
    assert scores.asymmetric == (AsymmetricPair("gpu0", "gpu1", 2, 1),)
    assert (
        str(scores.asymmetric[0]) == "gpu0 <-> gpu1: 2 link(s) from gpu0 to gpu1, 1 link(s) from gpu1 to gpu0"
    )


# Test_calculateGPUScore "nvlink test":
#       gpu_0 gpu_1 gpu_2 gpu_3
# gpu_0  N-A   NV1   NV1   NV2
# gpu_1  NV1   N-A   NV2   NV1
# gpu_2  NV1   NV2   N-A   NV2
# gpu_3  NV2   NV1   NV2   N-A
HAMI_MATRIX = [[0, 1, 1, 2], [1, 0, 2, 1], [1, 2, 0, 2], [2, 1, 2, 0]]


def test_calculate_gpu_score_as_hamis_nvlink_case() -> None:
    uuids = [f"gpu{i}" for i in range(4)]
    links = {(uuids[i], uuids[j]): nv(HAMI_MATRIX[i][j]) for i in range(4) for j in range(4) if i != j}
    scores = gpu_pair_scores(uuids, links)
    assert scores.asymmetric == ()
    assert [(s.uuid, s.as_dict()) for s in scores.scores] == [
        ("gpu0", {"gpu1": 100, "gpu2": 100, "gpu3": 200}),
        ("gpu1", {"gpu0": 100, "gpu2": 200, "gpu3": 100}),
        ("gpu2", {"gpu0": 100, "gpu1": 200, "gpu3": 200}),
        ("gpu3", {"gpu0": 200, "gpu1": 100, "gpu2": 200}),
    ]
    # The annotation HAMi's json.Marshal writes for it: map keys sorted, no spaces.
    assert encode_pair_scores(scores.scores) == (
        '[{"uuid":"gpu0","score":{"gpu1":100,"gpu2":100,"gpu3":200}},'
        '{"uuid":"gpu1","score":{"gpu0":100,"gpu2":200,"gpu3":100}},'
        '{"uuid":"gpu2","score":{"gpu0":100,"gpu1":200,"gpu3":200}},'
        '{"uuid":"gpu3","score":{"gpu0":200,"gpu1":100,"gpu2":200}}]'
    )


def test_one_gpu_and_no_gpu() -> None:
    assert encode_pair_scores(gpu_pair_scores(["GPU-a"], {}).scores) == '[{"uuid":"GPU-a","score":{}}]'
    assert gpu_pair_scores([], {}).scores == ()


def test_a_direction_missing_from_the_links_counts_as_no_link() -> None:
    scores = gpu_pair_scores(["a", "b"], {("a", "b"): GPULink(L.SYSTEM, 0)})
    assert [s.as_dict() for s in scores.scores] == [{"b": 0}, {"a": 0}]
    assert scores.asymmetric == (AsymmetricPair("a", "b", 1, 0),)


_LINKS = st.builds(GPULink, st.none() | st.sampled_from(TopologyLevel), st.integers(-1, 20))


@given(st.lists(st.lists(_LINKS, min_size=4, max_size=4), min_size=4, max_size=4))
def test_scores_follow_hamis_rule_for_any_links(matrix: list[list[GPULink]]) -> None:
    uuids = ["a", "b", "c", "d"]
    links = {(uuids[i], uuids[j]): matrix[i][j] for i in range(4) for j in range(4) if i != j}
    scores = gpu_pair_scores(uuids, links)
    table = {s.uuid: s.as_dict() for s in scores.scores}
    odd = {frozenset((p.gpu_a, p.gpu_b)) for p in scores.asymmetric}
    for (a, b), link in links.items():
        back = links[(b, a)]
        if link_entries(link) != link_entries(back):
            assert table[a][b] == table[b][a] == 0 and frozenset((a, b)) in odd
        else:
            level = 0 if link.level is None else LEVEL_SCORES[link.level]
            nvlinks = link.nvlinks if 1 <= link.nvlinks <= 18 else 0
            assert table[a][b] == level + 100 * nvlinks and frozenset((a, b)) not in odd
    text = encode_pair_scores(scores.scores)
    assert decode_pair_scores(text) == scores.scores
    assert json.loads(text) == [{"uuid": u, "score": table[u]} for u in uuids]


# --- the NVLink count (HAMi's GetNVLink) -------------------------------------------------------------


# Test_countMatchingLinks: (remote PCI infos, busID, count).
@pytest.mark.parametrize(
    ("remotes", "bus_id", "count"),
    [
        ([], "01:00.0", 0),
        (["00000000:01:00.0"], "0000:01:00.0", 1),
        (["00000000:01:00.0"], "0000:02:00.0", 0),
        (["00000000:01:00.0", "00000000:02:00.0", "00000000:01:00.0"], "0000:01:00.0", 2),
        (["00000000:0a:00.0"] * 3, "0000:0a:00.0", 3),
        (["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"], "0000:18:00.0", 0),
    ],
    ids=["empty", "single match", "no match", "multiple matches", "all match", "NVSwitch remote PCI"],
)
def test_count_matching_links_as_hamis_cases(remotes: list[str], bus_id: str, count: int) -> None:
    assert count_matching_links(remotes, bus_id) == count


def test_bus_ids_compare_as_hamis_busid() -> None:
    assert bus_id_key("00000000:2A:00.0") == bus_id_key("0000:2a:00.0") == "0000:2a:00.0"
    assert bus_id_key("00000001:90:00.0") == "0001:90:00.0"
    assert bus_id_key("0000") == "0000"


DEV2 = "00000000:2a:00.0"
SWITCH = "00000000:07:00.0"


def ports(enabled: int, remote: str = SWITCH, switch: int = 0) -> NvLinkPorts:
    return NvLinkPorts((remote,) * enabled, switch)


# Test_GetNVLink without its error cases (those are NVML failures: tests/unit/test_gpu_nvml.py).
@pytest.mark.parametrize(
    ("dev1", "dev2", "count"),
    [
        (ports(18, DEV2), ports(0), 18),  # direct_connect_18_links
        (ports(4, DEV2), ports(0), 4),  # direct_connect_partial
        (ports(18, switch=18), ports(18, switch=18), 18),  # nvswitch_full_mesh_18
        (ports(18, switch=18), ports(4, switch=4), 4),  # nvswitch_asymmetric
        (ports(18, switch=18), ports(0), 0),  # one_side_no_nvswitch
        (ports(0), ports(0), 0),  # no_nvlink_anywhere
        (ports(4, switch=4), ports(18, switch=18), 4),  # nvswitch_asymmetric_swapped
        (ports(0), ports(18, switch=18), 0),  # one_side_no_nvswitch_swapped
        (ports(19, DEV2), ports(0), 0),  # beyond HAMi's 18 link types, and no switch to fall back on
        (ports(19, DEV2, switch=19), ports(12, switch=12), 12),  # beyond 18 direct: the switch count
        (ports(18, switch=20), ports(19, switch=19), 0),  # beyond 18 through switches: no type
    ],
)
def test_get_nvlink_as_hamis_cases(dev1: NvLinkPorts, dev2: NvLinkPorts, count: int) -> None:
    assert nvlink_count(dev1, "00000000:2A:00.0", dev2) == count


# --- read from a backend -----------------------------------------------------------------------------


def test_read_pair_scores_from_the_fake_inventory() -> None:
    inventory = parse_inventory(
        {
            "gpus": [{"uuid": f"GPU-{i}", "model": "M", "memory": 1024, "numa": i // 2} for i in range(4)],
            "links": [
                {"gpus": [0, 1], "pcie": "single-switch"},
                {"gpus": [1, 2], "nvlinks": 4},
                {"gpus": [2, 3], "nvlinks": [2, 0]},
            ],
        }
    )
    backend = FakeBackend(inventory)
    backend.init()
    try:
        scores = read_pair_scores(backend, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"])
    finally:
        backend.shutdown()
    assert encode_pair_scores(scores.scores) == (
        '[{"uuid":"GPU-0","score":{"GPU-1":50,"GPU-2":10,"GPU-3":10}},'
        '{"uuid":"GPU-1","score":{"GPU-0":50,"GPU-2":410,"GPU-3":10}},'
        '{"uuid":"GPU-2","score":{"GPU-0":10,"GPU-1":410,"GPU-3":0}},'
        '{"uuid":"GPU-3","score":{"GPU-0":10,"GPU-1":10,"GPU-2":0}}]'
    )
    assert scores.asymmetric == (AsymmetricPair("GPU-2", "GPU-3", 2, 1),)


# --- the node option ---------------------------------------------------------------------------------


def read(path: object) -> str:
    assert str(path) == "/etc/hami/node.yaml"
    return "nodeName: node-a\nenableTopologyScore: false\n"


def option(argv: list[str], env: dict[str, str] | None = None) -> bool:
    return load_config(argv, env or {}, read).enable_topology_score


def test_topology_score_is_published_by_default_and_can_be_turned_off() -> None:
    assert option(["--node-name", "node-a"]) is True
    assert option(["--node-name", "node-a", "--enable-topology-score=false"]) is False
    assert option(["--node-name", "node-a", "--enable-topology-score"]) is True
    env = {"NODE_NAME": "node-a", "ENABLE_TOPOLOGY_SCORE": "false"}  # HAMi's variable
    assert option([], env) is False
    assert option([], {**env, "ENABLE_TOPOLOGY_SCORE": "true"}) is True
    assert option(["--config-file", "/etc/hami/node.yaml"]) is False


def test_a_bad_topology_score_value_names_the_variable_and_value() -> None:
    with pytest.raises(ConfigError) as info:
        option([], {"NODE_NAME": "node-a", "ENABLE_TOPOLOGY_SCORE": "maybe"})
    assert "ENABLE_TOPOLOGY_SCORE" in str(info.value) and '"maybe"' in str(info.value)
