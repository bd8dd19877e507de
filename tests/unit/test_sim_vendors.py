"""The vendor device-plugin stand-ins' tables and inventories (hami_sim.vendors.table, .inventory), checked
against hami-control's own reading of HAMi's wire: every vendor's Node, as its stand-in writes it, decodes
on the scheduler side (hami_control.devices) to the devices the stand-in serves, under the annotation
and resource names the control plane reads."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from hami_control.devices.base import Vendor
from hami_control.devices.config import load_device_config
from hami_control.devices.registry import RegistryOptions, build_registry
from hami_sim.vendors.inventory import (
    INSTANCE_TYPE_LABEL,
    advertised,
    go_time_string,
    handshake_value,
    node_devices,
    node_metadata,
)
from hami_sim.vendors.table import TABLES, DeviceSpec, Handshake, SpecError, device_spec, table_for
from tests.builders import node

NOW = datetime(2025, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
REGISTRY = build_registry(
    load_device_config(None, lambda p: p.read_text(encoding="utf-8")),
    RegistryOptions(enable_ascend=True, enable_iluvatar=True),
)
KEYS = sorted(TABLES)


def spec_of(key: str, count: int = 2) -> DeviceSpec:
    table = TABLES[key]
    return device_spec({"vendor": table.vendor, "mode": table.mode, "count": count})


def control_vendor(spec: DeviceSpec) -> Vendor:
    vendor = REGISTRY.get(spec.common_word)
    assert vendor is not None, spec.common_word
    return vendor


def vendor_node(name: str, spec: DeviceSpec) -> dict[str, Any]:
    """The Node as the kubelet stand-in (capacity of every registered resource) and the plugin
    stand-in (annotations, labels) leave it."""
    devices = node_devices(name, spec)
    annotations, labels = node_metadata(spec, devices, NOW)
    counts = {r: str(len(ids)) for r, ids in advertised(spec, devices).items()}
    return node(name, annotations=annotations, labels=labels, allocatable={"cpu": "8", **counts})


@pytest.mark.parametrize("key", KEYS)
def test_each_table_names_the_annotations_hami_controls_vendor_reads(key: str) -> None:
    spec = spec_of(key)
    table, names = spec.table, control_vendor(spec).names
    assert spec.name(table.to_allocate) == names.to_allocate or not table.to_allocate
    assert spec.name(table.allocated) in (names.allocated, f"huawei.com/{spec.common_word}")
    assert spec.name(table.register) == names.register
    assert spec.name(table.handshake) == names.handshake


@pytest.mark.parametrize("key", KEYS)
def test_each_vendors_node_decodes_on_the_scheduler_side_to_the_devices_its_stand_in_serves(key: str) -> None:
    spec = spec_of(key, count=2)
    vendor = control_vendor(spec)
    found = vendor.node_devices(vendor_node("n1", spec))
    assert found is not None
    assert [d.id for d in found] == [d.uuid for d in node_devices("n1", spec)]
    assert all(d.health for d in found)
    assert vendor.node_health(vendor_node("n1", spec), NOW.replace(tzinfo=None)).healthy


def test_the_cambricon_stand_in_does_not_register_the_count_resource_hami_names_pods_by() -> None:
    """Cambricon's dynamic-smlu plugin registers real-mlu-counts, vcore and vmemory, not `vmlu` (the
    count resource of HAMi's chart): hami-control's cache must not need it on the node."""
    spec = spec_of("cambricon")
    assert control_vendor(spec).names.count not in spec.resources
    assert control_vendor(spec).names.cores in spec.resources


@pytest.mark.parametrize(
    ("key", "resource", "first"),
    [
        ("hygon", "hygon.com/dcunum", "{id}-fake-0"),
        ("ascend", "huawei.com/Ascend910B4", "{id}-0"),
        ("cambricon", "cambricon.com/real-mlu-counts", "real-mlu-counts-{id}"),
        ("cambricon", "cambricon.com/mlu.smlu.vcore", "{id}-vcore-1"),
        ("cambricon", "cambricon.com/mlu.smlu.vmemory", "{id}-vmemory-1"),
        ("amd", "amd.com/gpu", "{bdf}#0"),
    ],
)
def test_listandwatch_ids_follow_each_plugins_id_form(key: str, resource: str, first: str) -> None:
    spec = spec_of(key, count=1)
    device = node_devices("n1", spec)[0]
    ids = advertised(spec, (device,))[resource]
    assert ids[0] == first.format(id=device.plugin_id, bdf=device.bdf)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("data", "counts"),
    [
        ({"vendor": "hygon", "count": 2}, {"hygon.com/dcunum": 8}),
        ({"vendor": "ascend", "model": "910B4", "count": 2}, {"huawei.com/Ascend910B4": 8}),
        ({"vendor": "ascend", "model": "910A"}, {"huawei.com/Ascend910A": 15}),
        (
            {"vendor": "cambricon", "memory": 4096},
            {
                "cambricon.com/real-mlu-counts": 1,
                "cambricon.com/mlu.smlu.vcore": 100,
                "cambricon.com/mlu.smlu.vmemory": 16,
            },
        ),
        (
            {"vendor": "mthreads"},
            {"mthreads.com/vgpu": 16, "mthreads.com/sgpu-core": 16, "mthreads.com/sgpu-memory": 96},
        ),
        ({"vendor": "awsneuron", "count": 2}, {"aws.amazon.com/neuron": 2, "aws.amazon.com/neuroncore": 4}),
        ({"vendor": "enflame"}, {"enflame.com/drs-gcu": 6}),
        ({"vendor": "enflame", "mode": "gcu", "count": 3}, {"enflame.com/gcu": 3}),
    ],
)
def test_each_resource_advertises_the_plugins_units_per_device(
    data: Mapping[str, Any], counts: Mapping[str, int]
) -> None:
    spec = device_spec(data)
    assert {r: len(ids) for r, ids in advertised(spec, node_devices("n", spec)).items()} == counts


def test_the_handshakes_say_reported_in_each_plugins_form() -> None:
    assert handshake_value(Handshake.GO_TIME, NOW) == "Reported 2025-03-04 05:06:07.89 +0000 UTC"
    assert handshake_value(Handshake.ASCEND, NOW) == "Reported_2025.03.04 05:06:08"
    assert handshake_value(Handshake.DOTTED, NOW) == "Reported_2025.03.04 05:06:07"
    assert go_time_string(NOW.replace(microsecond=0)) == "2025-03-04 05:06:07 +0000 UTC"


def test_the_hygon_inventory_is_dcu_vgpu_device_plugins_legacy_form() -> None:
    spec = device_spec({"vendor": "hygon", "count": 1, "memory": 16384})
    (device,) = node_devices("n1", spec)
    annotations, labels = node_metadata(spec, (device,), NOW)
    assert annotations["hami.io/node-dcu-register"] == f"{device.uuid},4,16384,100,DCU-Z100L,0,true,0,hami:"
    assert device.uuid.startswith("DCU-") and labels == {}


def test_the_ascend_inventory_carries_the_network_id_and_the_vnpu_core_switch() -> None:
    spec = device_spec({"vendor": "ascend", "model": "910B4", "count": 5})
    annotations, _ = node_metadata(spec, node_devices("n1", spec), NOW)
    assert annotations["hami-vnpu-core"] == "false"
    text = annotations["hami.io/node-register-Ascend910B4"]
    assert text.count('"custominfo":{"NetworkID":0}') == 4 and text.count('"custominfo":{"NetworkID":1}') == 1
    assert annotations["hami.io/node-handshake-Ascend910B4"] == "Reported_2025.03.04 05:06:08"


def test_the_aws_neuron_node_gets_the_instance_type_label_hami_reads() -> None:
    spec = device_spec({"vendor": "awsneuron", "model": "trn1.2xlarge"})
    annotations, labels = node_metadata(spec, node_devices("n1", spec), NOW)
    assert (annotations, labels) == ({}, {INSTANCE_TYPE_LABEL: "trn1.2xlarge"})


def test_device_ids_are_the_same_on_every_start_and_differ_between_nodes() -> None:
    spec = spec_of("ascend")
    assert node_devices("a", spec) == node_devices("a", spec)
    assert {d.uuid for d in node_devices("a", spec)}.isdisjoint(d.uuid for d in node_devices("b", spec))


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"vendor": "nvidia2"}, "vendor: expected nvidia or one of hygon, ascend"),
        ({"vendor": 3}, "vendor: expected a vendor name, got 3"),
        ({"vendor": "hygon", "colour": "red"}, "unknown key 'colour' (expected vendor, mode, model"),
        ({"vendor": "hygon", "count": 0}, "count: expected an integer >= 1, got 0"),
        ({"vendor": "hygon", "count": True}, "count: expected an integer >= 1, got True"),
        ({"vendor": "hygon", "count": 65}, "count: at most 64 devices on one node, got 65"),
        ({"vendor": "hygon", "memory": -1}, "memory: expected an integer >= 1, got -1"),
        (
            {"vendor": "hygon", "model": "Z200"},
            "model: 'Z200' is not a known hygon product (Z100L, Z100, K100)",
        ),
        ({"vendor": "ascend", "model": "920", "memory": 1024}, "model: ascend needs one of its chips"),
        ({"vendor": "metax", "mode": "vgpu"}, "mode: expected one of gpu, sgpu for metax, got 'vgpu'"),
        ({"vendor": "hygon", "mode": "x"}, "mode: the hygon plugin has no modes, got 'x'"),
        ({"vendor": "hygon", "model": ""}, "model: expected a model name, got ''"),
    ],
)
def test_a_bad_device_list_is_refused_naming_the_field(data: Mapping[str, Any], error: str) -> None:
    with pytest.raises(SpecError) as raised:
        device_spec(data)
    assert str(raised.value).startswith(error)


def test_a_device_list_takes_the_products_defaults_and_keeps_what_it_gives() -> None:
    assert device_spec({"vendor": "ascend", "model": "Ascend910B2"}) == DeviceSpec(
        "ascend", "910B2", 1, 65536, 24, 8
    )
    assert device_spec({"vendor": "hygon", "model": "Z300", "memory": 8192, "cores": 60}) == DeviceSpec(
        "hygon", "Z300", 1, 8192, 60, 1
    )
    assert device_spec({"vendor": "kunlun"}).mode == "vxpu"
    assert table_for("enflame").mode == "drs"
    assert device_spec({"vendor": "iluvatar", "model": "BI-V150"}).common_word == "BI-V150"
