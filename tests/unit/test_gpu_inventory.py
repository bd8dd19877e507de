"""The fake GPU inventory: parsing, every bad-field error, rendering, generating, round trips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_api.mig import MIG_MODELS, Placement
from hami_node.gpu import GPUEventKind, GPULink, PhysicalGPU, TopologyLevel
from hami_node.gpu.inventory import (
    DEFAULT_MEMORY_MIB,
    DEFAULT_MODEL,
    DEFAULT_NVLINKS,
    FAKE_DRIVER_VERSION,
    FakeEvent,
    FakeGpu,
    FakeMigInstance,
    Inventory,
    InventoryError,
    LinkGroup,
    NvmlMode,
    default_pci_bus_id,
    fake_gpu_uuid,
    generate_inventory,
    load_inventory,
    parse_inventory,
    parse_inventory_text,
    render_inventory,
    write_inventory,
)
from tests.builders import fake_gpu, fake_inventory

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fake-gpus.md"

MINIMAL = """
gpus:
  - uuid: GPU-0
    model: NVIDIA A100-SXM4-80GB
    memory: 81920
  - uuid: GPU-1
    model: NVIDIA A100-SXM4-80GB
    memory: 81920
    numa: 1
"""


# --- good input ------------------------------------------------------------------------------------


def test_minimal_file_gets_defaults() -> None:
    inventory = parse_inventory_text(MINIMAL, "gpus.yaml")
    assert inventory.nvml is NvmlMode.OK
    assert inventory.gpus == (
        FakeGpu("GPU-0", "NVIDIA A100-SXM4-80GB", 81920, 0, 0, None, "00000000:07:00.0"),
        FakeGpu("GPU-1", "NVIDIA A100-SXM4-80GB", 81920, 1, 1, 1, "00000000:0F:00.0"),
    )
    assert inventory.gpus[1].info() == PhysicalGPU(
        1,
        "GPU-1",
        "NVIDIA A100-SXM4-80GB",
        81920,
        1,
        1,
        "00000000:0F:00.0",
        driver_version=FAKE_DRIVER_VERSION,
    )


def test_json_file_and_bare_list() -> None:
    as_json = json.dumps(yaml.safe_load(MINIMAL))
    assert parse_inventory_text(as_json, "gpus.json") == parse_inventory_text(MINIMAL, "gpus.yaml")
    bare = json.dumps(yaml.safe_load(MINIMAL)["gpus"])
    assert parse_inventory_text(bare, "gpus.json") == parse_inventory_text(MINIMAL)


def test_explicit_index_orders_gpus_and_sets_minor_default() -> None:
    inventory = parse_inventory(fake_inventory(fake_gpu(0, index=1), fake_gpu(1, index=0, minor=7)))
    assert [(g.uuid, g.index, g.minor) for g in inventory.gpus] == [("GPU-1", 0, 7), ("GPU-0", 1, 1)]


def test_faults_topology_and_events_parse() -> None:
    inventory = parse_inventory(
        fake_inventory(
            fake_gpu(0, numa=0),
            fake_gpu(1, numa=0, lost=True),
            fake_gpu(2, numa=1, health=False, mig=True, model="NVIDIA A100-SXM4-40GB"),
            nvml="failing",
            links=[
                {"gpus": [0, "GPU-1"], "nvlinks": 4},
                {"gpus": [1, 2], "pcie": "Single_Switch", "nvlinks": [2, 0]},
                {"gpus": [2, 0, 1], "nvlinks": 0, "pcie": "system"},
            ],
            events=[
                {"id": "a", "gpu": 2, "kind": "xid", "xid": 79},
                {"id": 7, "kind": "ecc-double-bit"},
                {"id": "c", "gpu": "GPU-0", "kind": "device-lost"},
            ],
        )
    )
    assert inventory.nvml is NvmlMode.FAILING
    assert inventory.gpus[1].lost and not inventory.gpus[1].info().healthy
    assert not inventory.gpus[2].healthy and inventory.gpus[2].mig_enabled
    assert inventory.links == (
        LinkGroup((0, 1), nvlinks=4),
        LinkGroup((1, 2), nvlinks=2, level=TopologyLevel.SINGLE_SWITCH, reverse_nvlinks=0),
        LinkGroup((2, 0, 1), nvlinks=0, level=TopologyLevel.SYSTEM),
    )
    assert inventory.events == (
        FakeEvent("a", GPUEventKind.XID, "GPU-2", 79),
        FakeEvent("7", GPUEventKind.ECC_DOUBLE_BIT),
        FakeEvent("c", GPUEventKind.DEVICE_LOST, "GPU-0"),
    )


def test_links_each_field_from_the_last_entry_setting_it_then_numa_then_system() -> None:
    inventory = parse_inventory(
        fake_inventory(
            fake_gpu(0, numa=0),
            fake_gpu(1, numa=0),
            fake_gpu(2, numa=1),
            fake_gpu(3),
            links=[
                {"gpus": [0, 1, 2], "nvlinks": 12},
                {"gpus": [1, 2], "pcie": "host-bridge"},
                {"gpus": [0, 2], "nvlinks": 0},
            ],
        )
    )
    assert inventory.link("GPU-0", "GPU-1") == GPULink(TopologyLevel.NUMA_NODE, 12)
    assert inventory.link("GPU-2", "GPU-1") == GPULink(TopologyLevel.HOST_BRIDGE, 12)
    assert inventory.link("GPU-0", "GPU-2") == GPULink(TopologyLevel.SYSTEM, 0)
    assert inventory.link("GPU-0", "GPU-3") == GPULink(TopologyLevel.SYSTEM, 0)
    plain = parse_inventory(
        fake_inventory(
            fake_gpu(0, numa=0), fake_gpu(1, numa=0), fake_gpu(2, numa=1), fake_gpu(3), fake_gpu(4)
        )
    )
    assert plain.link("GPU-0", "GPU-1") == GPULink(TopologyLevel.NUMA_NODE, 0)
    assert plain.link("GPU-0", "GPU-2") == GPULink(TopologyLevel.SYSTEM, 0)
    assert plain.link("GPU-3", "GPU-4") == GPULink(TopologyLevel.SYSTEM, 0)  # unknown NUMA is not "the same"


def test_links_one_sided_nvlink_is_seen_from_the_first_gpu_only() -> None:
    inventory = parse_inventory(
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [1, 0], "nvlinks": [4, 0]}])
    )
    assert inventory.links == (LinkGroup((1, 0), nvlinks=4, reverse_nvlinks=0),)
    assert inventory.link("GPU-1", "GPU-0").nvlinks == 4
    assert inventory.link("GPU-0", "GPU-1").nvlinks == 0
    same = parse_inventory(
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": [3, 3]}])
    )
    assert same.links == (LinkGroup((0, 1), nvlinks=3),)


def test_topology_level_labels() -> None:
    assert [level.label for level in TopologyLevel] == [
        "same-board",
        "single-switch",
        "multi-switch",
        "host-bridge",
        "numa-node",
        "system",
    ]
    assert all(TopologyLevel.from_label(level.label) is level for level in TopologyLevel)
    assert min(TopologyLevel) is TopologyLevel.SAME_BOARD
    with pytest.raises(ValueError, match="unknown topology level 'pcie'"):
        TopologyLevel.from_label("pcie")


def test_every_yaml_example_in_the_docs_parses() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        data = yaml.safe_load(block)
        if "gpus" not in data:  # an events example: about the GPUs of the first example
            data = {**yaml.safe_load(blocks[0]), **data}
        parse_inventory(data, "docs/fake-gpus.md")


# --- bad input: every field ------------------------------------------------------------------------

BAD_GPU_FIELDS = [
    (fake_gpu(2, memory="80GB"), 'gpus[2].memory: expected a positive integer (MiB), got "80GB"'),
    (fake_gpu(2, memory=0), "gpus[2].memory: expected a positive integer (MiB), got 0"),
    (fake_gpu(2, memory=True), "gpus[2].memory: expected a positive integer (MiB), got true"),
    (fake_gpu(2, memory=1.5), "gpus[2].memory: expected a positive integer (MiB), got 1.5"),
    ({"uuid": "GPU-2", "model": "M"}, "gpus[2].memory: is required"),
    ({"model": "M", "memory": 1}, "gpus[2].uuid: is required"),
    (fake_gpu(2, uuid="abc"), 'gpus[2].uuid: expected "GPU-" followed by the GPU\'s id, got "abc"'),
    (fake_gpu(2, uuid="GPU-a b"), 'gpus[2].uuid: expected "GPU-" followed by the GPU\'s id, got "GPU-a b"'),
    (fake_gpu(2, uuid=5), "gpus[2].uuid: expected a non-empty string, got 5"),
    ({"uuid": "GPU-2", "memory": 1}, "gpus[2].model: is required"),
    (fake_gpu(2, model="  "), 'gpus[2].model: expected a non-empty string, got "  "'),
    (fake_gpu(2, index=-1), "gpus[2].index: expected an integer >= 0, got -1"),
    (fake_gpu(2, index="2"), 'gpus[2].index: expected an integer >= 0, got "2"'),
    (fake_gpu(2, minor=-3), "gpus[2].minor: expected an integer >= 0, got -3"),
    (fake_gpu(2, numa=-1), "gpus[2].numa: expected an integer >= 0 or null (unknown), got -1"),
    (fake_gpu(2, numa="0"), 'gpus[2].numa: expected an integer >= 0 or null (unknown), got "0"'),
    (fake_gpu(2, pci_bus_id=7), "gpus[2].pci_bus_id: expected a non-empty string, got 7"),
    (
        fake_gpu(2, mig="no"),
        'gpus[2].mig: expected true, false or a mapping (enabled, pending, devices), got "no"',
    ),
    (fake_gpu(2, health="yes"), 'gpus[2].health: expected true or false, got "yes"'),
    (fake_gpu(2, lost=1), "gpus[2].lost: expected true or false, got 1"),
    (fake_gpu(2, memroy=5), "gpus[2].memroy: unknown field"),
    ("GPU-2", 'gpus[2]: expected a mapping, got "GPU-2"'),
]


@pytest.mark.parametrize(("entry", "message"), BAD_GPU_FIELDS)
def test_bad_gpu_field_names_file_entry_and_field(entry: object, message: str) -> None:
    data = {"gpus": [fake_gpu(0), fake_gpu(1), entry]}
    with pytest.raises(InventoryError) as info:
        parse_inventory_text(yaml.safe_dump(data), "gpus.yaml")
    assert str(info.value).startswith(f"gpus.yaml: {message}")
    assert info.value.source == "gpus.yaml"


def test_the_example_message_exactly() -> None:
    data = {"gpus": [fake_gpu(0), fake_gpu(1), fake_gpu(2, memory="80GB")]}
    with pytest.raises(InventoryError) as info:
        parse_inventory_text(yaml.safe_dump(data), "gpus.yaml")
    assert str(info.value) == 'gpus.yaml: gpus[2].memory: expected a positive integer (MiB), got "80GB"'
    assert (info.value.where, info.value.reason) == (
        "gpus[2].memory",
        'expected a positive integer (MiB), got "80GB"',
    )


BAD_DOCUMENTS = [
    (fake_inventory(fake_gpu(0), fake_gpu(0)), 'gpus[1].uuid: "GPU-0" is already used by gpus[0]'),
    (fake_inventory(fake_gpu(0), fake_gpu(1, index=0)), "gpus[1].index: 0 is already used by gpus[0]"),
    (fake_inventory(fake_gpu(0, minor=1), fake_gpu(1)), "gpus[1].minor: 1 is already used by gpus[0]"),
    (
        fake_inventory(fake_gpu(0, pci_bus_id="0000:01:00.0"), fake_gpu(1, pci_bus_id="0000:01:00.0")),
        'gpus[1].pci_bus_id: "0000:01:00.0" is already used by gpus[0]',
    ),
    ({"gpus": "GPU-0"}, 'gpus: expected a list, got "GPU-0"'),
    ({"gpus": [], "extra": 1}, "extra: unknown field"),
    (fake_inventory(fake_gpu(0), nvml="broken"), 'nvml: expected one of ok, failing, absent, got "broken"'),
    (fake_inventory(fake_gpu(0), nvml=False), "nvml: expected one of ok, failing, absent, got false"),
    (
        fake_inventory(fake_gpu(0), links=[{"gpus": [0], "nvlinks": 2}]),
        "links[0].gpus: expected a list of at least 2",
    ),
    (
        fake_inventory(fake_gpu(0), links=[{"gpus": [0, 5], "nvlinks": 2}]),
        "links[0].gpus[1]: no GPU with index 5",
    ),
    (
        fake_inventory(fake_gpu(0), links=[{"gpus": [0, "GPU-x"], "nvlinks": 2}]),
        'links[0].gpus[1]: no GPU with uuid "GPU-x" in gpus',
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, "GPU-0"], "nvlinks": 2}]),
        'links[0].gpus[1]: GPU "GPU-0" is listed twice',
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "pcie": "nvlink"}]),
        "links[0].pcie: unknown topology level 'nvlink' (one of same-board, single-switch,",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "pcie": 3}]),
        "links[0].pcie: expected one of same-board,",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1]}]),
        "links[0]: sets neither nvlinks nor pcie",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": 19}]),
        "links[0].nvlinks: expected an integer from 0 to 18 (NVLinks between each pair), or [from the first",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": "4"}]),
        "links[0].nvlinks: expected an integer from 0 to 18 (NVLinks between each pair), or [from the first "
        'GPU, from the second] for an NVLink seen from one side only, got "4"',
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": [4, -1]}]),
        "links[0].nvlinks: expected an integer from 0 to 18",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": [4, 0, 0]}]),
        "links[0].nvlinks: expected an integer from 0 to 18",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), fake_gpu(2), links=[{"gpus": [0, 1, 2], "nvlinks": [4, 0]}]),
        "links[0].nvlinks: expected an integer from 0 to 18 (NVLinks between each pair), got [4, 0]",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": True}]),
        "links[0].nvlinks: expected an integer from 0 to 18",
    ),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), links=[{"gpus": [0, 1], "nvlinks": 2, "level": "nvlink"}]),
        "links[0].level: unknown field",
    ),
    (
        fake_inventory(fake_gpu(0), links=[{"gpus": [0, True], "nvlinks": 2}]),
        "links[0].gpus[1]: expected a GPU uuid",
    ),
    (fake_inventory(fake_gpu(0), fake_gpu(1), links={"gpus": [0, 1]}), "links: expected a list, got {"),
    (
        fake_inventory(fake_gpu(0), fake_gpu(1), topology=[{"gpus": [0, 1], "level": "nvlink"}]),
        "topology: replaced by links (entries of gpus and nvlinks and/or pcie; see docs/fake-gpus.md)",
    ),
    (
        fake_inventory(fake_gpu(0), events=[{"kind": "xid", "xid": 79}]),
        "events[0].id: expected a non-empty string",
    ),
    (
        fake_inventory(
            fake_gpu(0), events=[{"id": "a", "kind": "ecc-double-bit"}, {"id": "a", "kind": "ecc-double-bit"}]
        ),
        'events[1].id: "a" is already used by events[0]',
    ),
    (
        fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "boom"}]),
        "events[0].kind: expected one of xid, ecc-double-bit,",
    ),
    (fake_inventory(fake_gpu(0), events=[{"id": "a"}]), "events[0].kind: is required"),
    (fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "xid"}]), "events[0].xid: is required"),
    (
        fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "xid", "xid": "79"}]),
        'events[0].xid: expected a positive integer (the Xid code), got "79"',
    ),
    (
        fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "ecc-single-bit", "xid": 79}]),
        "events[0].xid: only allowed with kind xid, got 79",
    ),
    (
        fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "xid", "xid": 79, "gpu": 3}]),
        "events[0].gpu: no GPU with index 3",
    ),
    (
        fake_inventory(fake_gpu(0), events=[{"id": "a", "kind": "xid", "xid": 79, "at": 3}]),
        "events[0].at: unknown field",
    ),
    (fake_inventory(fake_gpu(0), events={"id": "a"}), 'events: expected a list, got {"id": "a"}'),
    (5, "whole file: expected a mapping, got 5"),
]


@pytest.mark.parametrize(("data", "message"), BAD_DOCUMENTS)
def test_bad_document_names_the_field(data: object, message: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory_text(yaml.safe_dump(data), "node.yaml")
    assert str(info.value).startswith(f"node.yaml: {message}"), str(info.value)


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory_text("gpus:\n  - uuid: GPU-0\n    model: [unclosed\n", "gpus.yaml")
    assert re.match(r"gpus\.yaml: line \d+, column \d+: not valid YAML: ", str(info.value))


def test_json_syntax_error_names_the_line() -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory_text('{"gpus": [\n  {"uuid": "GPU-0",}\n]}', "gpus.json")
    assert str(info.value).startswith("gpus.json: line 2, column 20: not valid JSON: ")


def test_empty_file() -> None:
    with pytest.raises(InventoryError, match=r"^gpus.yaml: whole file: is empty"):
        parse_inventory_text("# nothing\n", "gpus.yaml")


def test_load_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(InventoryError) as info:
        load_inventory(missing)
    assert str(info.value).startswith(f"{missing}: whole file: cannot be read: No such file")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - {uuid: GPU-0, model: M, memory: 80GB}\n")
    with pytest.raises(
        InventoryError, match=re.escape(f"{bad}: gpus[0].memory: expected a positive integer")
    ):
        load_inventory(bad)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InventoryError, match="is not UTF-8 text"):
        load_inventory(binary)


def test_long_values_are_shortened() -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(fake_inventory(fake_gpu(0, model="x" * 5000, memory="y" * 5000)), "gpus.yaml")
    assert len(str(info.value)) < 300 and "(5002 chars)" in str(info.value)


# --- generating and writing ------------------------------------------------------------------------


def test_generate_eight_a100s() -> None:
    inventory = generate_inventory(8, seed="node-1")
    assert len(inventory.gpus) == 8
    assert {g.model for g in inventory.gpus} == {DEFAULT_MODEL} == {"NVIDIA A100-SXM4-80GB"}
    assert {g.memory_mib for g in inventory.gpus} == {DEFAULT_MEMORY_MIB}
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.index for g in inventory.gpus] == [g.minor for g in inventory.gpus] == list(range(8))
    pattern = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    assert all(pattern.match(g.uuid) for g in inventory.gpus)
    assert inventory.link(inventory.gpus[0].uuid, inventory.gpus[7].uuid) == GPULink(
        TopologyLevel.SYSTEM, DEFAULT_NVLINKS
    )
    assert inventory.link(inventory.gpus[0].uuid, inventory.gpus[1].uuid) == GPULink(
        TopologyLevel.NUMA_NODE, DEFAULT_NVLINKS
    )
    assert generate_inventory(8, seed="node-1") == inventory  # deterministic
    other = generate_inventory(8, seed="node-2")
    assert not {g.uuid for g in other.gpus} & {g.uuid for g in inventory.gpus}
    assert fake_gpu_uuid("node-1", 3) == inventory.gpus[3].uuid


def test_generate_variants_and_bad_arguments() -> None:
    single = generate_inventory(1, "n", numa_nodes=0, nvlink=True)
    assert single.links == () and single.gpus[0].numa_node is None
    three = generate_inventory(3, "n", model="Tesla T4", memory_mib=15360, numa_nodes=2, nvlink=False)
    assert [g.numa_node for g in three.gpus] == [0, 0, 1] and three.links == ()
    assert len({default_pci_bus_id(i) for i in range(256)}) == 256
    for kwargs, message in [
        ({"count": -1}, "count"),
        ({"count": 1, "memory_mib": 0}, "memory_mib"),
        ({"count": 1, "numa_nodes": -1}, "numa_nodes"),
    ]:
        with pytest.raises(ValueError, match=message):
            generate_inventory(seed="n", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["node.yaml", "node.json"])
def test_write_then_load(tmp_path: Path, name: str) -> None:
    inventory = generate_inventory(8, seed="node-1")
    path = tmp_path / name
    write_inventory(path, inventory)
    assert load_inventory(path) == inventory
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp file left
    if name.endswith(".json"):
        json.loads(path.read_text())


# --- round trips -----------------------------------------------------------------------------------

_TEXT = st.text(
    alphabet=st.characters(
        whitelist_categories=("L", "N", "P", "S", "Zs"), blacklist_characters="\x85\ufeff"
    ),
    min_size=1,
    max_size=20,
).filter(lambda s: s == s.strip() and bool(s))
_UUID = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=36).map(lambda s: "GPU-" + s)


def _mig_layout(model: str) -> st.SearchStrategy[tuple[bool, tuple[FakeMigInstance, ...], bool | None]]:
    """(enabled, devices, pending) valid for the model: MIG only on a MIG model, devices one profile at
    distinct placements of it."""
    table = MIG_MODELS.get(model)
    if table is None:
        return st.just((False, (), None))

    @st.composite
    def layout(draw: st.DrawFn) -> tuple[bool, tuple[FakeMigInstance, ...], bool | None]:
        enabled = draw(st.booleans())
        pending = draw(st.none() | st.booleans())
        if not enabled:
            return False, (), pending if pending else None
        profile = draw(st.sampled_from(table.profiles))
        starts = draw(
            st.lists(st.sampled_from(profile.placements), unique=True, max_size=profile.instance_count)
        )
        kept: list[Placement] = []
        for placement in starts:
            if not any(placement.overlaps(k) for k in kept):
                kept.append(placement)
        return True, tuple(FakeMigInstance(profile.name, p.start) for p in kept), pending

    return layout()


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    count = draw(st.integers(0, 6))
    uuids = draw(st.lists(_UUID, min_size=count, max_size=count, unique=True))
    indices = draw(st.lists(st.integers(0, 64), min_size=count, max_size=count, unique=True))
    minors = draw(st.lists(st.integers(0, 255), min_size=count, max_size=count, unique=True))
    pcis = draw(st.lists(_TEXT, min_size=count, max_size=count, unique=True))
    models = [draw(_TEXT | st.sampled_from(sorted(MIG_MODELS))) for _ in range(count)]
    migs = [draw(_mig_layout(model)) for model in models]
    gpus = sorted(
        (
            FakeGpu(
                uuid=uuids[i],
                model=models[i],
                memory_mib=draw(st.integers(1, 2**40)),
                index=indices[i],
                minor=minors[i],
                numa_node=draw(st.none() | st.integers(0, 7)),
                pci_bus_id=pcis[i],
                mig_enabled=migs[i][0],
                healthy=draw(st.booleans()),
                lost=draw(st.booleans()),
                mig_devices=migs[i][1],
                mig_pending=migs[i][2],
            )
            for i in range(count)
        ),
        key=lambda g: g.index,
    )
    links: list[LinkGroup] = []
    events: list[FakeEvent] = []
    if count >= 2:
        for _ in range(draw(st.integers(0, 3))):
            members = tuple(draw(st.lists(st.sampled_from(indices), min_size=2, unique=True)))
            nvlinks = draw(st.none() | st.integers(0, 18))
            if nvlinks is None:
                level = draw(st.sampled_from(TopologyLevel))  # an entry sets at least one field
            else:
                level = draw(st.none() | st.sampled_from(TopologyLevel))
            reverse = None
            if nvlinks is not None and len(members) == 2:
                back = draw(st.none() | st.integers(0, 18))
                reverse = None if back == nvlinks else back
            links.append(LinkGroup(members, nvlinks, level, reverse))
    ids = draw(st.lists(_TEXT, max_size=4, unique=True))
    for event_id in ids:
        kind = draw(st.sampled_from(GPUEventKind))
        target = draw(st.none() | st.sampled_from(uuids)) if uuids else None
        xid = draw(st.integers(1, 200)) if kind is GPUEventKind.XID else None
        events.append(FakeEvent(event_id, kind, target, xid))
    return Inventory(tuple(gpus), draw(st.sampled_from(NvmlMode)), tuple(links), tuple(events))


@settings(max_examples=150, deadline=None)
@given(inventories(), st.sampled_from(["yaml", "json"]))
def test_generated_inventories_round_trip(inventory: Inventory, fmt: str) -> None:
    text = render_inventory(inventory, "json" if fmt == "json" else "yaml")
    assert parse_inventory_text(text, f"gen.{fmt}") == inventory


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 40), st.text(max_size=30))
def test_generated_node_inventories_round_trip(count: int, seed: str) -> None:
    inventory = generate_inventory(count, seed)
    assert parse_inventory_text(render_inventory(inventory)) == inventory
    assert len({g.uuid for g in inventory.gpus}) == count
