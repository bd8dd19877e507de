"""The chaos checker's own decoders of the other vendors' wire formats (issue 26): every inventory the
device-plugin stand-ins write reads back as their devices (hami_sim.vendors serves as the oracle here, and
only here: the checker never imports it), each format decodes what HAMi's encoder writes
(decode(encode(x)), hypothesis), Go's quirks are kept (case-insensitive JSON keys, integers only,
`AsInt64` capacities), and no text makes a decoder raise anything but the checker's `DecodeError`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api.annotations import encode_pod_allocation
from hami_api.types import ContainerAllocation, GPUSlice, PodAllocation
from hami_sim.chaos import decoding as D
from hami_sim.vendors import inventory as vinv
from hami_sim.vendors.table import TABLES, device_spec
from tests.builders import node

NOW = datetime(2026, 8, 21, 12, 0, 0, tzinfo=UTC)

_TOKEN = st.characters(exclude_characters=",:;", categories=("L", "N", "P", "S", "Zs"))
token = st.text(_TOKEN, min_size=1, max_size=16)
maybe_token = st.text(_TOKEN, max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
nonneg32 = st.integers(0, 2**31 - 1)


def stand_in_node(key: str, count: int = 3, name: str = "n1") -> tuple[Any, dict[str, Any]]:
    """(the stand-in's devices, its Node) for a vendor table key, as its plugin publishes them."""
    vendor, _, mode = key.partition("/")
    data: dict[str, Any] = {"vendor": vendor, "count": count}
    if mode:
        data["mode"] = mode
    spec = device_spec(data)
    devices = vinv.node_devices(name, spec)
    annotations, labels = vinv.node_metadata(spec, devices, NOW)
    capacity = {r: str(len(ids)) for r, ids in vinv.advertised(spec, devices).items()}
    return devices, node(name, annotations=annotations, labels=labels, capacity=capacity)


# --- inventories --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(TABLES))
def test_every_vendor_node_the_stand_ins_publish_decodes_to_their_devices(key: str) -> None:
    devices, obj = stand_in_node(key)
    read = D.node_devices(obj)
    assert read.errors == {}
    assert [(d.id, d.index) for d in read.devices] == [(d.uuid, d.index) for d in devices]
    assert {d.vendor for d in read.devices} == {key.partition("/")[0]}


@pytest.mark.parametrize(
    ("key", "count", "devmem", "devcore"),
    [
        ("hygon", 4, 32768, 100),
        ("ascend", 4, 32768, 20),
        ("cambricon", 100, 24576, 100),
        ("iluvatar", 10, 32768, 100),
        ("metax/sgpu", 16, 65536, 100),
        ("metax/gpu", 1, 65536, 100),
        ("mthreads", 100, 49152, 16),
        ("enflame/drs", 6, 49152, 100),
        ("enflame/gcu", 1, 100, 100),
        ("kunlun/vxpu", 4, 98304, 100),
        ("kunlun/xpu", 100, 98304, 100),
        ("awsneuron", 2, 0, 3),
        ("amd", 10, 196608, 304),
        ("vastai", 1, 16384, 100),
        ("biren", 1, 32768, 100),
    ],
)
def test_a_vendor_device_has_the_count_memory_and_cores_hamis_scheduler_reads(
    key: str, count: int, devmem: int, devcore: int
) -> None:
    _, obj = stand_in_node(key, count=1)
    (device,) = D.node_devices(obj).devices
    assert (device.count, device.devmem, device.devcore) == (count, devmem, devcore)


def test_enflame_devices_carry_the_nodes_profiles_with_their_cores() -> None:
    _, obj = stand_in_node("enflame/drs", count=1)
    (device,) = D.node_devices(obj).devices
    assert [(p.size, p.memory_gb, p.core_percent) for p in device.profiles] == [
        (1, 6, 17),
        (2, 12, 34),
        (3, 24, 50),
        (6, 48, 100),
    ]


def test_an_amd_device_keeps_its_pci_address_and_a_neuron_device_its_cores_per_device() -> None:
    amd, obj = stand_in_node("amd", count=1)
    assert D.node_devices(obj).devices[0].bdf == amd[0].bdf
    _, obj = stand_in_node("awsneuron", count=2)
    assert [d.cores_per for d in D.node_devices(obj).devices] == [2, 2]


def test_capacities_are_read_as_go_reads_them_exact_integers_only() -> None:
    half = node("n1", capacity={"metax-tech.com/gpu": "1500m", "enflame.com/gcu": "2"})
    assert [d.id for d in D.node_devices(half).devices] == ["n1-GCU-0", "n1-GCU-1"]
    cambricon = node(
        "n1", capacity={"cambricon.com/mlu.smlu.vcore": "250", "cambricon.com/mlu.smlu.vmemory": "288"}
    )
    # ceil(250 / 100) cards, each 288 x 256 x 100 / 250 MiB (Go's integer division)
    assert [(d.id, d.devmem) for d in D.node_devices(cambricon).devices] == [
        ("n1-cambricon-mlu-0", 29491),
        ("n1-cambricon-mlu-1", 29491),
        ("n1-cambricon-mlu-2", 29491),
    ]


def test_a_bad_capacity_names_the_node_and_the_resource() -> None:
    read = D.node_devices(node("n1", capacity={"kunlunxin.com/xpu": "lots"}))
    assert read.devices == ()
    assert "status.capacity[kunlunxin.com/xpu]" in read.errors["status.capacity"]


def test_an_undecodable_inventory_is_named_and_contributes_nothing() -> None:
    obj = node("n1", annotations={"hami.io/node-dcu-register": "DCU-1,4,1024,100,DCU,0,maybe:"})
    read = D.node_devices(obj)
    assert read.devices == ()
    assert "health" in read.errors["hami.io/node-dcu-register"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("DCU-1,4,1024,100,DCU,0,true", "no device separator"),
        ("DCU-1:", "is not 'id,count"),
        ("DCU-1,4,1024,100,DCU,0,true,1:", "has 8 fields"),
        ("DCU-1,4x,1024,100,DCU,0,true:", "count"),
        ("DCU-1,4,99999999999,100,DCU,0,true:", "devmem: 99999999999 is out of range"),
        ("DCU-1,4,1024,100,DCU,0,true,-1,hami:", "index: -1 is negative"),
    ],
)
def test_a_bad_legacy_inventory_is_an_error_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment):
        D.decode_legacy_inventory(text, "hami.io/node-dcu-register", D.FAMILIES["DCU"])


def test_device_info_json_matches_keys_as_go_does_case_insensitively_the_last_one_winning() -> None:
    text = '[{"ID":"a","Count":2,"DEVMEM":10,"devMem":20,"de\u212avmem":1,"devcore":5,"health":true,"x":[1]}]'
    (device,) = D.decode_device_info_json(text, "k", D.FAMILIES["AMD"])
    assert (device.id, device.count, device.devmem, device.devcore, device.health) == ("a", 2, 20, 5, True)
    (kelvin,) = D.decode_device_info_json('[{"\u212aount":3}]', "k", D.FAMILIES["AMD"])
    assert kelvin.count == 0  # only "K" folds to k when it spells a field: "count" has no k


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"id":"a"}', "expected a JSON array"),
        ("[null]", r"k\[0\]: null device"),
        ('[{"count":1.0}]', r"k\[0\].count: expected an integer"),
        ('[{"count":2147483648}]', "out of range"),
        ('[{"index":-1}]', "out of range"),
        ('[{"id":5}]', "expected a string"),
        ('[{"health":"true"}]', "expected a boolean"),
        ('[{"count":NaN}]', "not JSON"),
        ('[{"custominfo":[]}]', "expected an object"),
    ],
)
def test_a_bad_device_info_json_is_an_error_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment):
        D.decode_device_info_json(text, "k", D.FAMILIES["AMD"])


def test_biren_and_vastai_devices_have_100_cores_whatever_their_inventory_says() -> None:
    text = json.dumps([{"id": "b0", "count": 1, "devmem": 1024, "devcore": 7, "health": True}])
    read = D.node_devices(node("n1", annotations={"hami.io/node-biren-register": text}))
    assert [d.devcore for d in read.devices] == [100]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"devices":[{"index":"0","capacity":6}]}', "no valid DRS profile"),
        ('{"devices":[{"index":"0"}],"profiles":{"1g.6gb":"0"}}', "is not a capacity"),
        ('{"devices":[{"index":"0","capacity":0}],"profiles":{"1g.6gb":"0"}}', "is not positive"),
        ('{"devices":[{"index":0,"capacity":6}],"profiles":{"1g.6gb":"0"}}', "expected a string"),
        ('{"devices":{},"profiles":{"1g.6gb":"0"}}', "expected an array"),
        ('{"profiles":{"1g.6gb":1}}', "expected a string"),
    ],
)
def test_a_bad_enflame_capacity_is_an_error_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment):
        D.decode_enflame_drs(text, "enflame.com/gcu-drs-capacity", "n1")


def test_an_enflame_device_index_that_is_no_number_is_its_position_and_a_string_capacity_counts() -> None:
    text = '{"devices":[{"index":"x","capacity":"3"},{"index":"7","capacity":6.9}],"profiles":{"1g.6gb":"0"}}'
    devices = D.decode_enflame_drs(text, "enflame.com/gcu-drs-capacity", "n1")
    assert [(d.id, d.count, d.devmem) for d in devices] == [
        ("n1-enflame-drs-0", 3, 6144),
        ("n1-enflame-drs-7", 6, 6144),
    ]


def test_enflame_s_visible_devices_name_minors_which_default_to_the_index() -> None:
    text = (
        '{"devices":[{"index":"0","minor":" 4 ","capacity":6},{"index":"1","capacity":6}],'
        '"profiles":{"1g.6gb":"0"}}'
    )
    devices = D.decode_enflame_drs(text, "enflame.com/gcu-drs-capacity", "n1")
    assert [d.minor for d in devices] == ["4", "1"]
    family = D.FAMILIES["Enflame"]
    named = D.runtime_devices(family, {"ENFLAME_VISIBLE_DEVICES": "4,1,0"}, [], list(devices))
    assert named == ["n1-enflame-drs-0", "n1-enflame-drs-1", "?0"]


# --- decode(encode(x)) --------------------------------------------------------------------------------------

legacy_device = st.tuples(
    st.text(_TOKEN, max_size=12),
    int32,
    int32,
    int32,
    maybe_token,
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.one_of(st.none(), st.tuples(st.integers(0, 2**63 - 1), maybe_token)),
)


@given(st.lists(legacy_device, max_size=6))
def test_a_legacy_inventory_decodes_as_hamis_encode_node_devices_writes_it(devices: list[Any]) -> None:
    def entry(d: Any) -> str:
        ident, count, mem, core, kind, numa, health, extra = d
        tail = f",{extra[0]},{extra[1]}" if extra else ""
        return f"{ident},{count},{mem},{core},{kind},{numa},{str(health).lower()}{tail}:"

    text = "".join(entry(d) for d in devices) or ":"
    decoded = D.decode_legacy_inventory(text, "hami.io/node-dcu-register", D.FAMILIES["DCU"])
    assert [(x.id, x.count, x.devmem, x.devcore, x.type, x.health, x.index) for x in decoded] == [
        (i, c, m, k, t, h, e[0] if e else 0) for i, c, m, k, t, _, h, e in devices
    ]


device_info = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=12),
        "index": st.integers(0, 2**64 - 1),
        "count": int32,
        "devmem": int32,
        "devcore": int32,
        "type": st.text(max_size=8),
        "numa": st.integers(-(2**63), 2**63 - 1),
        "mode": st.text(max_size=8),
        "health": st.booleans(),
        "devicevendor": st.text(max_size=8),
    },
)


@given(st.lists(st.tuples(device_info, st.randoms(use_true_random=False)), max_size=5))
def test_device_info_json_decodes_as_go_marshals_it_whatever_the_keys_case(items: list[Any]) -> None:
    def recased(info: Mapping[str, Any], rng: Any) -> dict[str, Any]:
        return {"".join(c.upper() if rng.random() < 0.5 else c for c in k): v for k, v in info.items()}

    text = json.dumps([recased(vinv.go_device_info(info), rng) for info, rng in items])
    decoded = D.decode_device_info_json(text, "hami.io/node-amd-register", D.FAMILIES["AMD"])
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in decoded] == [
        (
            i.get("id", ""),
            i.get("index", 0),
            i.get("count", 0),
            i.get("devmem", 0),
            i.get("devcore", 0),
            i.get("type", ""),
            i.get("health", False),
        )
        for i, _ in items
    ]


metax_device = st.fixed_dictionaries(
    {"uuid": st.text(max_size=12)},
    optional={
        "totalDevCount": int32,
        "totalVRam": int32,
        "totalCompute": int32,
        "healthy": st.booleans(),
        "bdf": st.text(max_size=8),
        "numa": int32,
        "linkZone": int32,
    },
)


@given(st.lists(metax_device, max_size=5))
def test_metax_sgpu_inventory_decodes_as_its_plugin_marshals_it(devices: list[dict[str, Any]]) -> None:
    decoded = D.decode_metax_sgpu(json.dumps(devices), "metax-tech.com/node-gpu-devices")
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.health) for d in decoded] == [
        (
            d["uuid"],
            i,
            d.get("totalDevCount", 0),
            d.get("totalVRam", 0),
            d.get("totalCompute", 0),
            d.get("healthy", False),
        )
        for i, d in enumerate(devices)
    ]


profile = st.tuples(st.integers(1, 16), st.integers(1, 256))


@given(st.lists(profile, min_size=1, max_size=5), st.lists(st.integers(1, 64), max_size=5))
def test_enflame_capacity_decodes_to_devices_of_the_largest_profile(
    profiles: list[tuple[int, int]], capacities: list[int]
) -> None:
    text = json.dumps(
        {
            "devices": [{"index": str(i), "minor": str(i), "capacity": c} for i, c in enumerate(capacities)],
            "profiles": {f"{s}g.{m}gb": str(i) for i, (s, m) in enumerate(profiles)},
        }
    )
    decoded = D.decode_enflame_drs(text, "enflame.com/gcu-drs-capacity", "n1")
    biggest = max(m for _, m in profiles)
    assert [(d.id, d.count, d.devmem) for d in decoded] == [
        (f"n1-enflame-drs-{i}", c, biggest * 1024) for i, c in enumerate(capacities)
    ]


vendor_slice = st.builds(D.VendorSlice, token, token, nonneg32, nonneg32)
vendor_allocation = st.lists(st.lists(vendor_slice, max_size=3).map(tuple), max_size=4).map(tuple)


@given(vendor_allocation)
def test_a_vendor_allocation_decodes_as_hami_api_encodes_it(allocation: D.VendorAllocation) -> None:
    encoded = encode_pod_allocation(
        PodAllocation(
            tuple(
                ContainerAllocation(tuple(GPUSlice(s.id, s.mem, s.cores, s.type) for s in slices))
                for slices in allocation
            )
        )
    )
    assert encoded == D.encode_vendor_allocation(allocation)
    assert D.decode_vendor_allocation(encoded, "hami.io/dcu-devices-allocated") == allocation


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("d,DCU,1,2:", "does not end with ';'"),
        ("d,DCU,1,2;", "does not end with ':'"),
        ("d,DCU,1:;", "is not '<id>,<type>,<MiB>,<cores>'"),
        ("d,DCU,-1,2:;", "must not be negative"),
        ("d,DCU,1,2147483648:;", "out of range"),
        (",DCU,1,2:;", "is not '<id>"),
    ],
)
def test_a_bad_vendor_allocation_is_an_error_naming_the_annotation(text: str, fragment: str) -> None:
    with pytest.raises(D.DecodeError, match=fragment) as caught:
        D.decode_vendor_allocation(text, "hami.io/dcu-devices-allocated")
    assert "hami.io/dcu-devices-allocated" in str(caught.value)


# --- anything else is the checker's own error ---------------------------------------------------------------

json_text = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
).map(json.dumps)
any_text = st.one_of(st.text(max_size=80), json_text)


def _only_decode_errors(decode: Any, text: str) -> None:
    with contextlib.suppress(D.DecodeError):
        decode(text)


@given(any_text)
def test_arbitrary_text_never_raises_but_the_checkers_decode_error(text: str) -> None:
    family = D.FAMILIES["DCU"]
    _only_decode_errors(lambda t: D.decode_legacy_inventory(t, "k", family), text)
    _only_decode_errors(lambda t: D.decode_device_info_json(t, "k", family), text)
    _only_decode_errors(lambda t: D.decode_metax_sgpu(t, "k"), text)
    _only_decode_errors(lambda t: D.decode_enflame_drs(t, "k", "n1"), text)
    _only_decode_errors(lambda t: D.decode_vendor_allocation(t, "k"), text)
    _only_decode_errors(D.decode_amd_cu_allocated, text)
    _only_decode_errors(D.decode_hsa_cu_mask, text)


inventory_keys = st.sampled_from(
    [
        "hami.io/node-dcu-register",
        "hami.io/node-MR-V100-register",
        "hami.io/node-register-Ascend910B4",
        "hami.io/node-amd-register",
        "hami.io/node-biren-register",
        "hami.io/node-va-register",
        "hami.io/node-register-xpu",
        "metax-tech.com/node-gpu-devices",
        "enflame.com/gcu-drs-capacity",
    ]
)
capacity_keys = st.sampled_from(
    [
        "cambricon.com/mlu.smlu.vcore",
        "cambricon.com/mlu.smlu.vmemory",
        "metax-tech.com/gpu",
        "mthreads.com/sgpu-core",
        "mthreads.com/sgpu-memory",
        "enflame.com/gcu",
        "kunlunxin.com/xpu",
        "aws.amazon.com/neuron",
        "aws.amazon.com/neuroncore",
    ]
)
small_quantity = st.one_of(
    st.integers(-3, 40).map(str), st.sampled_from(["1k", "0.5", "100m", "-1", "x", ""]), st.integers(0, 9)
)


@given(
    st.dictionaries(inventory_keys, any_text, max_size=3),
    st.dictionaries(capacity_keys, small_quantity, max_size=4),
)
def test_a_node_of_anything_never_raises_its_bad_sources_are_named(
    annotations: dict[str, str], capacity: dict[str, Any]
) -> None:
    read = D.node_devices(node("n1", annotations=annotations, capacity=capacity))
    assert set(read.errors) <= {*annotations, "status.capacity"}


def test_a_kubelet_device_id_names_an_inventory_device_by_its_familys_scheme() -> None:
    dcu = D.VendorDevice("DCU", "hygon", "DCU-001", 0, 4, 1024, 100, "DCU")
    amd = D.VendorDevice("AMD", "amd", "abc", 0, 10, 1024, 304, "AMD", bdf="0000:17:00.0")
    assert D.device_of_kubelet_id(D.FAMILIES["DCU"], "DCU-001-fake-3", [dcu]) == "DCU-001"
    assert D.device_of_kubelet_id(D.FAMILIES["DCU"], "DCU-002-fake-3", [dcu]) is None
    assert D.device_of_kubelet_id(D.FAMILIES["AMD"], "0000:17:00.0#9", [amd]) == "abc"
    assert D.device_of_kubelet_id(D.FAMILIES["Mthreads"], "MT-x-1", [dcu]) is None


@pytest.mark.parametrize(
    ("annotation", "word", "vendor"),
    [
        ("hami.io/dcu-devices-allocated", "DCU", "hygon"),
        ("hami.io/Ascend910B4-1-devices-allocated", "Ascend910B4-1", "ascend"),
        ("hami.io/BI-V150-devices-allocated", "BI-V150", "iluvatar"),
        ("hami.io/kunlun-allocated", "kunlun", "kunlun"),
        ("hami.io/Biren-devices-allocated", "Biren", "biren"),
    ],
)
def test_a_pod_annotation_names_its_family(annotation: str, word: str, vendor: str) -> None:
    family = D.family_of_allocated(annotation)
    assert family is not None and (family.word, family.vendor) == (word, vendor)


def test_nvidias_and_unknown_annotations_are_no_vendor_family() -> None:
    assert D.family_of_allocated("hami.io/vgpu-devices-allocated") is None
    assert D.family_of_allocated("hami.io/Foo-devices-allocated") is None
    assert D.family_of_resource("huawei.com/Ascend910B4-memory") is None
    family = D.family_of_resource("huawei.com/Ascend910B4")
    assert family is not None and family.allocated == "hami.io/Ascend910B4-devices-allocated"
