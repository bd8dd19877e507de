"""The vendor registry (hami_control/devices/registry.py) and the per-node pod fit of the vendors other
than NVIDIA (hami_control/devices/podfit.py): HAMi's InitDevicesWithConfig order and gates, and its
scoreNode / fitInDevices walk (pkg/scheduler/score.go, v2.10.0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hami_api.annotations import encode_pod_allocation
from hami_api.settings import ConfigError
from hami_api.types import GPUInfo, GPUPolicy
from hami_control.devices import hygon
from hami_control.devices.base import DeviceRequest, FitContext
from hami_control.devices.config import load_device_config, parse_device_config
from hami_control.devices.podfit import VendorFit, VendorUnfit, fit_vendor_pod, sort_devices
from hami_control.devices.registry import ENTRIES, RegistryOptions, build_registry, registry_for
from hami_control.usage import GPUUsage


def _read(text: str) -> Any:
    return lambda _path: text


def dcu(index: int, *, used: int = 0, usedmem: int = 0, usedcores: int = 0, mem: int = 16384) -> GPUUsage:
    info = GPUInfo(f"dcu-{index}", index=index, count=10, devmem=mem, devcore=100, type="DCU", health=True)
    return GPUUsage(info, used=used, usedmem=usedmem, usedcores=usedcores)


HYGON = hygon.Hygon(hygon.names())
VENDORS = {"DCU": HYGON}


def test_without_a_file_every_vendor_but_ascend_and_iluvatar_is_on_in_hamis_order() -> None:
    registry = build_registry(load_device_config(None, _read("")))
    words = [v.names.common_word for v in registry]
    assert words[:3] == ["NVIDIA", "MLU", "DCU"]
    assert [key for key, _ in registry.left_out] == ["vnpus", "iluvatars"]
    assert all("off (--enable-" in why for _, why in registry.left_out)


def test_enable_ascend_and_iluvatar_add_one_vendor_per_chip() -> None:
    options = RegistryOptions(enable_ascend=True, enable_iluvatar=True)
    registry = build_registry(load_device_config(None, _read("")), options)
    words = {v.names.common_word for v in registry}
    assert {"Ascend910A", "Ascend910B4", "Ascend910B4-1", "Ascend310P", "Ascend910C"} <= words
    assert {"MR-V100", "MR-V50", "BI-V150", "BI-V100"} <= words
    assert registry.left_out == ()


def test_a_file_without_a_vendors_section_leaves_that_vendor_out_and_says_so() -> None:
    config = load_device_config(Path("/etc/hami/device-config.yaml"), _read("hygon:\n  memoryFactor: 2\n"))
    registry = build_registry(config)
    assert [v.names.common_word for v in registry] == ["NVIDIA", "DCU"]
    assert registry.get("DCU") is not None
    assert registry.get("DCU").names.memory_factor == 2  # type: ignore[union-attr]
    assert registry.get("DCU").names.count == "hygon.com/dcunum"  # type: ignore[union-attr]  # chart default
    left = dict(registry.left_out)
    assert left["cambricon"] == "off (no cambricon: section in /etc/hami/device-config.yaml)"


def test_a_bad_value_in_a_vendor_section_names_file_key_and_line() -> None:
    config = load_device_config(Path("dc.yaml"), _read("nvidia: {}\nhygon:\n  memoryFactor: two\n"))
    with pytest.raises(ConfigError) as err:
        build_registry(config)
    text = str(err.value)
    assert "dc.yaml" in text and "hygon.memoryFactor" in text and "line 3" in text and "two" in text


def test_an_unknown_top_level_key_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        parse_device_config("hygn:\n  memoryFactor: 1\n", "dc.yaml")
    assert "hygn" in str(err.value) and 'did you mean "hygon"' in str(err.value)


def test_the_nvidia_section_of_a_hami_file_is_accepted_as_it_is() -> None:
    text = "nvidia:\n  resourceCountName: nvidia.com/gpu\n  deviceSplitCount: 10\n  libCudaLogLevel: 1\n"
    registry = build_registry(load_device_config(Path("dc.yaml"), _read(text)))
    assert [v.names.common_word for v in registry] == ["NVIDIA"]


def test_the_table_lists_every_vendor_module_of_hami_v2_10() -> None:
    assert [e.key for e in ENTRIES] == [
        "cambricon", "hygon", "enflame", "mthreads", "metax", "kunlun", "awsneuron", "amd", "vastai",
        "biren", "vnpus", "iluvatars",
    ]  # fmt: skip


def test_container_requests_name_each_vendor_a_container_asks() -> None:
    registry = registry_for([HYGON])
    pod = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"hygon.com/dcunum": "1"}}},
                {"name": "b"},
            ]
        }
    }
    assert registry.pod_requests(pod) == ({"DCU": DeviceRequest(1, "DCU", 0, 100, 100)}, {})
    assert "hygon.com/dcumem" in registry.resources()


# --- the per-node walk --------------------------------------------------------------------------------


def _pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}}}


def test_one_container_takes_the_least_used_device_under_spread() -> None:
    devices = [dcu(0, used=1, usedmem=4000, usedcores=50), dcu(1)]
    request = DeviceRequest(1, "DCU", 1000, 0, 10)
    result = fit_vendor_pod(devices, [{"DCU": request}], inits=0, vendors=VENDORS, context=FitContext(_pod()))
    assert isinstance(result, VendorFit)
    assert encode_pod_allocation(result.allocations["DCU"]) == "dcu-1,DCU,1000,10:;"


def test_binpack_puts_the_container_on_the_busiest_device_that_fits() -> None:
    devices = [dcu(0, used=1, usedmem=4000, usedcores=50), dcu(1)]
    request = DeviceRequest(1, "DCU", 1000, 0, 10)
    context = FitContext(_pod(), policy=(GPUPolicy.BINPACK,))
    result = fit_vendor_pod(devices, [{"DCU": request}], inits=0, vendors=VENDORS, context=context)
    assert isinstance(result, VendorFit)
    assert result.allocations["DCU"].containers[0].uuids == ("dcu-0",)


def test_regular_containers_add_up_on_the_node_and_init_containers_do_not() -> None:
    devices = [dcu(0, mem=10000)]
    half = DeviceRequest(1, "DCU", 6000, 0, 10)
    init_then_app = fit_vendor_pod(
        devices, [{"DCU": half}, {"DCU": half}], inits=1, vendors=VENDORS, context=FitContext(_pod())
    )
    assert isinstance(init_then_app, VendorFit)
    assert encode_pod_allocation(init_then_app.allocations["DCU"]) == "dcu-0,DCU,6000,10:;dcu-0,DCU,6000,10:;"
    two_apps = fit_vendor_pod(
        devices, [{"DCU": half}, {"DCU": half}], inits=0, vendors=VENDORS, context=FitContext(_pod())
    )
    assert two_apps == VendorUnfit("1/1 CardInsufficientMemory", 1)


def test_a_container_without_devices_gets_an_empty_entry_so_indexes_follow_containers() -> None:
    request = DeviceRequest(1, "DCU", 1000, 0, 10)
    result = fit_vendor_pod(
        [dcu(0)], [{}, {"DCU": request}], inits=0, vendors=VENDORS, context=FitContext(_pod())
    )
    assert isinstance(result, VendorFit)
    assert encode_pod_allocation(result.allocations["DCU"]) == ";dcu-0,DCU,1000,10:;"


def test_more_devices_than_the_node_has_of_the_type_is_node_insufficient_device() -> None:
    request = DeviceRequest(3, "DCU", 1000, 0, 10)
    result = fit_vendor_pod(
        [dcu(0), dcu(1)], [{"DCU": request}], inits=0, vendors=VENDORS, context=FitContext(_pod())
    )
    assert result == VendorUnfit("NodeInsufficientDevice", 0)


def test_the_chain_policy_sorts_by_its_keys_then_the_device_index() -> None:
    devices = [dcu(1), dcu(0)]
    scores = {"dcu-0": 1.0, "dcu-1": 1.0}
    ranked = sort_devices(devices, scores, (GPUPolicy.BINPACK, GPUPolicy.NUMA))
    assert [d.id for d in ranked] == ["dcu-0", "dcu-1"]
    assert [d.id for d in sort_devices(devices, scores, (GPUPolicy.SPREAD,))] == ["dcu-1", "dcu-0"]  # stable
