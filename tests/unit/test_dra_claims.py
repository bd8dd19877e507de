"""hami_node.dra.claims, the pure core of NodePrepareResources: a claim's allocation results -> HAMi-core's
limits under the index each container sees its GPUs at -> one CDI spec per claim, valid for a CDI
runtime. Claim status parsing is checked with hypothesis."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_api import dra
from hami_node.config import load_config
from hami_node.devices import GPUStatus
from hami_node.dra.claims import (
    DEVICE_ORDER_ENV,
    ClaimError,
    ClaimGpu,
    ClaimPlan,
    ClaimRef,
    ContainerUse,
    PreparedClaim,
    Share,
    allocation_shares,
    assign_indices,
    cdi_device_name,
    check_claim,
    claim_gpus,
    claim_spec,
    container_uses,
    gpu_limits,
    gpu_order,
    is_pod_private,
    prepare_claim,
    reserved_pods,
)
from tests.builders import claim_refs, container, dra_result, physical_gpu, pod, resource_claim
from tests.cdi_util import spec_problems

MIB = 1 << 20
CONFIG = load_config(["--node-name", "n1", "--mode", "dra", "--hook-path", "/usr/local"], {}, lambda p: "")
UID = "11111111-1111-4111-8111-111111111111"
REF = ClaimRef("default", "claim", UID)


def gpus(*buses: str) -> dict[str, ClaimGpu]:
    """GPUs hami-gpu-0.. with these PCI bus ids (minor = position), 80 GiB each."""
    return {
        dra.device_name(i): ClaimGpu(dra.device_name(i), f"GPU-{i}", i, bus, 81920)
        for i, bus in enumerate(buses)
    }


FOUR = gpus("00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0")
ORDER = {name: gpu_order(gpu) for name, gpu in FOUR.items()}


def shares_of(*results: Mapping[str, Any]) -> tuple[Share, ...]:
    return allocation_shares(resource_claim(results=results), "default/claim", driver=dra.DRIVER, pool="n1")


# --- reading the claim ---------------------------------------------------------------------------------


def test_a_share_carries_its_request_device_share_id_and_consumed_capacity() -> None:
    (share,) = shares_of(dra_result("hami-gpu-1", share_id="s-1", memory="4000Mi", cores="30"))
    assert share == Share("gpu", "hami-gpu-1", "s-1", 4000 * MIB, 30)


def test_a_result_without_consumed_capacity_is_a_whole_gpu() -> None:
    assert shares_of(dra_result("hami-gpu-0")) == (Share("gpu", "hami-gpu-0"),)


def test_only_our_driver_on_our_pool_counts_and_sub_requests_name_their_request() -> None:
    shares = shares_of(
        dra_result("gpu-0", driver="gpu.nvidia.com"),
        dra_result("hami-gpu-2", request="gpu/a100", memory="1Gi", cores="10"),
    )
    assert shares == (Share("gpu", "hami-gpu-2", None, 1024 * MIB, 10),)


def test_driver_qualified_capacity_names_are_read_too() -> None:
    result = dra_result("hami-gpu-0")
    result["consumedCapacity"] = {dra.qualified("memory"): "2Gi", dra.qualified("cores"): "5"}
    assert shares_of(result) == (Share("gpu", "hami-gpu-0", None, 2048 * MIB, 5),)


def test_a_claim_allocated_elsewhere_names_the_pools() -> None:
    with pytest.raises(
        ClaimError, match=r"claim default/claim has no device of driver .* pool n1 \(pools n2\)"
    ):
        shares_of(dra_result("hami-gpu-0", pool="n2"))


@pytest.mark.parametrize(
    ("memory", "cores", "error"),
    [
        ("512Ki", "10", r"consumedCapacity.memory: 512Ki is less than 1Mi; HAMi-core reads a 0 MiB limit"),
        ("1Gi", "101", r"consumedCapacity.cores: expected 0..100, got 101"),
        ("1Gi", "-1", r"consumedCapacity.cores: expected 0..100, got -1"),
        ("lots", "10", r"consumedCapacity.memory: .*lots"),
    ],
)
def test_bad_consumed_capacity_is_a_claim_error_naming_the_field(memory: str, cores: str, error: str) -> None:
    with pytest.raises(ClaimError, match=r"results\[0\]\." + error):
        shares_of(dra_result("hami-gpu-0", memory=memory, cores=cores))


def test_kubelet_gets_an_error_for_a_claim_not_allocated_or_replaced() -> None:
    with pytest.raises(ClaimError, match=r"^claim default/claim is not allocated$"):
        check_claim(resource_claim(uid=UID), REF)
    with pytest.raises(ClaimError, match=r"^claim default/claim got replaced: its UID is 'other', kubelet"):
        check_claim(resource_claim(uid="other", results=[dra_result("hami-gpu-0")]), REF)
    check_claim(resource_claim(uid=UID, results=[dra_result("hami-gpu-0")]), REF)


def test_a_template_claim_is_pod_private_and_names_its_reserved_pods() -> None:
    claim = resource_claim(owner_pod=("p", "pod-uid"), reserved_for=[("p", "pod-uid")], results=[])
    assert is_pod_private(claim)
    assert reserved_pods(claim) == (("p", "pod-uid"),)
    assert not is_pod_private(resource_claim())


@given(
    mib=st.integers(min_value=1, max_value=1 << 24),
    cores=st.integers(min_value=0, max_value=100),
    unit=st.sampled_from(["Mi", "bytes", "Ki"]),
)
def test_any_consumed_capacity_becomes_the_same_limits(mib: int, cores: int, unit: str) -> None:
    memory = {"Mi": f"{mib}Mi", "Ki": f"{mib * 1024}Ki", "bytes": str(mib * MIB)}[unit]
    shares = shares_of(dra_result("hami-gpu-0", share_id="s", memory=memory, cores=str(cores)))
    big = {"hami-gpu-0": ClaimGpu("hami-gpu-0", "GPU-0", 0, "0:1:0.0", 1 << 24)}
    claim = prepare_claim(REF, "n1", shares, big, {"hami-gpu-0": 0}, sole=True, private=False)
    (device,) = claim_spec(claim, CONFIG, ())["devices"]
    assert device["containerEdits"]["env"] == [
        f"CUDA_DEVICE_MEMORY_LIMIT_0={mib}m",
        f"CUDA_DEVICE_SM_LIMIT_0={cores}",
        f"CUDA_DEVICE_SM_LIMIT={cores}",
    ]


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=8), c),
        max_leaves=12,
    )
)
def test_a_malformed_status_is_a_claim_error_never_a_crash(status: object) -> None:
    claim = {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": status}}}}
    with contextlib.suppress(ClaimError):
        allocation_shares(claim, "default/claim", driver=dra.DRIVER, pool="n1")


# --- limits --------------------------------------------------------------------------------------------


def test_a_claims_shares_of_one_gpu_add_up_capped_at_the_gpu() -> None:
    gpu = FOUR["hami-gpu-0"]
    assert gpu_limits(
        [Share("a", "hami-gpu-0", "1", 1000 * MIB, 30), Share("b", "hami-gpu-0", "2", 500 * MIB, 20)], gpu
    ) == (1500, 50)
    assert gpu_limits(
        [Share("a", "hami-gpu-0", "1", 81920 * MIB, 80), Share("b", "hami-gpu-0", "2", MIB, 80)], gpu
    ) == (81920, 100)
    assert gpu_limits([Share("a", "hami-gpu-0")], gpu) == (81920, 100)


def test_gpu_order_is_the_pci_bus_order_then_minor() -> None:
    a = ClaimGpu("hami-gpu-9", "GPU-9", 9, "00000000:0A:00.0", 1)
    b = ClaimGpu("hami-gpu-1", "GPU-1", 1, "00000000:47:00.0", 1)
    c = ClaimGpu("hami-gpu-0", "GPU-0", 0, "0001:01:00.0", 1)
    odd = ClaimGpu("hami-gpu-5", "GPU-5", 5, "weird", 1)
    assert sorted([odd, c, b, a], key=gpu_order) == [a, b, c, odd]


def test_claim_gpus_name_devices_by_minor_and_take_the_advertised_memory() -> None:
    listed = [
        GPUStatus(physical_gpu("GPU-a", 0, minor=3, memory_mib=1024)),
        GPUStatus(physical_gpu("GPU-b", 1)),
    ]
    scaled = load_config(
        ["--node-name", "n1", "--mode", "dra", "--device-memory-scaling", "2"], {}, lambda p: ""
    )
    found = claim_gpus(listed, scaled)
    assert list(found) == ["hami-gpu-3", "hami-gpu-1"]
    assert found["hami-gpu-3"] == ClaimGpu("hami-gpu-3", "GPU-a", 3, "00000000:00:00.0", 2048)


# --- indices -------------------------------------------------------------------------------------------


def plan(
    key: str, *devices: str | tuple[str, str], private: bool = False, fixed: Mapping[str, int] | None = None
) -> ClaimPlan:
    pairs = tuple(("gpu", d) if isinstance(d, str) else d for d in devices)
    return ClaimPlan(key, pairs, private, fixed)


def uses(*claims: tuple[str, str | None], ctr: str = "main") -> ContainerUse:
    return ContainerUse("default/p", ctr, claims)


def test_a_claims_gpus_are_numbered_in_pci_order_not_result_order() -> None:
    found = assign_indices({"a": plan("ns/a", "hami-gpu-3", "hami-gpu-1")}, [uses(("a", None))], ORDER)
    assert found.errors == {}
    assert found.indices["a"] == {"hami-gpu-1": 0, "hami-gpu-3": 1}
    assert found.sole["a"] is False


def test_without_a_container_a_claim_keeps_its_own_indices_and_one_gpu_is_sole() -> None:
    found = assign_indices({"a": plan("ns/a", "hami-gpu-2")}, [], ORDER)
    assert found.indices == {"a": {"hami-gpu-2": 0}} and found.sole == {"a": True}


def test_two_pod_private_claims_in_one_container_get_indices_that_agree() -> None:
    plans = {"a": plan("ns/a", "hami-gpu-3", private=True), "b": plan("ns/b", "hami-gpu-0", private=True)}
    found = assign_indices(plans, [uses(("a", None), ("b", None))], ORDER)
    assert found.errors == {}
    assert found.indices == {"a": {"hami-gpu-3": 1}, "b": {"hami-gpu-0": 0}}
    assert found.sole == {"a": False, "b": False}


def test_two_shared_claims_in_one_container_are_a_clear_error_for_each() -> None:
    plans = {"a": plan("ns/a", "hami-gpu-3"), "b": plan("ns/b", "hami-gpu-0")}
    found = assign_indices(plans, [uses(("a", None), ("b", None), ctr="train")], ORDER)
    assert set(found.errors) == {"a", "b"} and found.indices == {}
    message = found.errors["a"]
    assert message.startswith("container 'train' of pod default/p uses ns/a, ns/b: the GPU indices")
    assert "give the container one claim with all its GPUs" in message


def test_a_shared_claim_first_in_pci_order_combines_with_a_private_one() -> None:
    plans = {"a": plan("ns/a", "hami-gpu-0"), "b": plan("ns/b", "hami-gpu-3", private=True)}
    found = assign_indices(plans, [uses(("a", None), ("b", None))], ORDER)
    assert found.errors == {}
    assert found.indices == {"a": {"hami-gpu-0": 0}, "b": {"hami-gpu-3": 1}}


def test_a_container_naming_one_request_of_a_two_gpu_shared_claim_is_an_error() -> None:
    plans = {"a": plan("ns/a", ("x", "hami-gpu-0"), ("y", "hami-gpu-3"))}
    found = assign_indices(plans, [uses(("a", "y"))], ORDER)
    assert "container 'main' of pod default/p uses ns/a (request 'y')" in found.errors["a"]


def test_shares_of_one_gpu_from_two_claims_in_one_container_are_an_error() -> None:
    plans = {"a": plan("ns/a", "hami-gpu-1", private=True), "b": plan("ns/b", "hami-gpu-1", private=True)}
    found = assign_indices(plans, [uses(("a", None), ("b", None))], ORDER)
    assert found.errors["a"] == found.errors["b"]
    assert (
        "gets GPU hami-gpu-1 from claims ns/a and ns/b; HAMi-core has one limit per GPU" in found.errors["a"]
    )


def test_a_private_claim_combined_differently_in_two_containers_is_an_error() -> None:
    plans = {
        "a": plan("ns/a", "hami-gpu-3", private=True),
        "b": plan("ns/b", "hami-gpu-0", private=True),
    }
    found = assign_indices(
        plans, [uses(("a", None), ("b", None), ctr="one"), uses(("a", None), ctr="two")], ORDER
    )
    assert set(found.errors) == {"a"}  # b is right in the only container naming it
    assert found.errors["a"].startswith("container 'two' of pod default/p uses ns/a: the GPU indices")


def test_a_prepared_claim_keeps_its_indices_and_a_new_claim_must_agree() -> None:
    fixed = plan("ns/old", "hami-gpu-3", fixed={"hami-gpu-3": 0})
    agree = assign_indices(
        {"old": fixed, "new": plan("ns/new", "hami-gpu-0", private=True)}, [uses(("new", None))], ORDER
    )
    assert agree.errors == {} and "old" not in agree.indices
    clash = assign_indices(
        {"old": fixed, "new": plan("ns/new", "hami-gpu-0", private=True)},
        [uses(("old", None), ("new", None))],
        ORDER,
    )
    assert set(clash.errors) == {"new"}  # the prepared claim is not being prepared: only the new one fails


def test_container_uses_resolve_template_and_named_claims_of_init_and_app_containers() -> None:
    p = pod(
        "p",
        container("app", resources=claim_refs("gen", ("named", "gpu"))),
        init=[container("init", resources=claim_refs("named"))],
        namespace="default",
        resourceClaims=[
            {"name": "gen", "resourceClaimTemplateName": "t"},
            {"name": "named", "resourceClaimName": "shared"},
        ],
        claim_statuses={"gen": "p-gen-x7k2q"},
    )
    found = container_uses(p, {"p-gen-x7k2q": "u-gen", "shared": "u-shared"})
    assert [(u.container, u.claims) for u in found] == [
        ("init", (("u-shared", None),)),
        ("app", (("u-gen", None), ("u-shared", "gpu"))),
    ]
    assert container_uses(p, {}) == ()


# --- the prepared claim and its CDI spec ---------------------------------------------------------------


def prepared(*results: Mapping[str, Any], sole: bool = True) -> PreparedClaim:
    shares = shares_of(*results)
    indices = {d: i for i, d in enumerate(sorted({s.device for s in shares}, key=lambda d: ORDER[d]))}
    return prepare_claim(REF, "n1", shares, FOUR, indices, sole=sole, private=False)


def test_a_prepared_device_names_its_cdi_device_by_claim_device_and_share() -> None:
    claim = prepared(dra_result("hami-gpu-2", share_id="5c7a", memory="4000Mi", cores="30"))
    (device,) = claim.devices
    assert device.cdi_name == cdi_device_name(UID, "hami-gpu-2", "5c7a") == f"{UID}-hami-gpu-2-5c7a"
    assert device.cdi_id == f"k8s.gpu.hami.io/claim={UID}-hami-gpu-2-5c7a"
    assert (device.gpu, device.minor, device.index, device.memory_mib, device.cores) == (
        "GPU-2",
        2,
        0,
        4000,
        30,
    )
    assert prepared(dra_result("hami-gpu-0")).devices[0].cdi_name == f"{UID}-hami-gpu-0-whole"


def test_a_device_not_on_this_node_is_a_claim_error() -> None:
    shares = shares_of(dra_result("hami-gpu-7"))
    with pytest.raises(ClaimError, match="device hami-gpu-7 of pool n1 is not one of this node's GPUs"):
        prepare_claim(REF, "n1", shares, FOUR, {"hami-gpu-7": 0}, sole=True, private=False)


def test_the_claim_spec_carries_limits_per_device_and_hami_core_per_claim() -> None:
    claim = prepared(
        dra_result("hami-gpu-3", share_id="s3", memory="8Gi", cores="50"),
        dra_result("hami-gpu-1", share_id="s1", memory="4000Mi", cores="30"),
        sole=False,
    )
    spec = claim_spec(claim, CONFIG, ("/dev/nvidiactl", "/dev/nvidia-uvm"))
    assert spec_problems(spec) == []
    assert spec["kind"] == "k8s.gpu.hami.io/claim" and spec["cdiVersion"] == "0.5.0"
    assert [(d["name"], d["containerEdits"]) for d in spec["devices"]] == [
        (f"{UID}-hami-gpu-3-s3", {
            "env": ["CUDA_DEVICE_MEMORY_LIMIT_1=8192m", "CUDA_DEVICE_SM_LIMIT_1=50"],
            "deviceNodes": [{"path": "/dev/nvidia3"}],
        }),
        (f"{UID}-hami-gpu-1-s1", {
            "env": ["CUDA_DEVICE_MEMORY_LIMIT_0=4000m", "CUDA_DEVICE_SM_LIMIT_0=30"],
            "deviceNodes": [{"path": "/dev/nvidia1"}],
        }),
    ]  # fmt: skip
    claim_dir = f"/usr/local/vgpu/claims/{UID}"
    common = spec["containerEdits"]
    assert common["env"] == [
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE={claim_dir}/{UID}.cache",
        "NVIDIA_VISIBLE_DEVICES=void",
        DEVICE_ORDER_ENV,
        "LIBCUDA_LOG_LEVEL=1",
    ]
    assert common["deviceNodes"] == [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    assert common["mounts"] == [
        {"hostPath": "/usr/local/vgpu/libvgpu.so", "containerPath": "/usr/local/vgpu/libvgpu.so",
         "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": claim_dir, "containerPath": claim_dir, "options": ["rw", "nosuid", "nodev", "bind"]},
        {"hostPath": "/tmp/vgpulock", "containerPath": "/tmp/vgpulock",
         "options": ["rw", "nosuid", "nodev", "bind"]},
        {"hostPath": "/usr/local/vgpu/ld.so.preload", "containerPath": "/etc/ld.so.preload",
         "options": ["ro", "nosuid", "nodev", "bind"]},
    ]  # fmt: skip


def test_a_whole_gpu_gets_all_its_memory_and_cores_and_the_default_sm_limit() -> None:
    spec = claim_spec(prepared(dra_result("hami-gpu-0")), CONFIG, ())
    assert spec["devices"][0]["containerEdits"]["env"] == [
        "CUDA_DEVICE_MEMORY_LIMIT_0=81920m",
        "CUDA_DEVICE_SM_LIMIT_0=100",
        "CUDA_DEVICE_SM_LIMIT=100",
    ]
    assert "deviceNodes" not in spec["containerEdits"]
    assert spec_problems(spec) == []


def test_the_spec_follows_the_node_settings_shared_with_the_device_plugin() -> None:
    config = load_config(
        ["--node-name", "n1", "--mode", "dra", "--hook-path", "/opt/hami", "--device-memory-scaling", "1.5",
         "--disable-core-limit", "--libcuda-log-level", "3"], {}, lambda p: "",
    )  # fmt: skip
    spec = claim_spec(prepared(dra_result("hami-gpu-0")), config, (), license_present=True)
    env = spec["containerEdits"]["env"]
    assert env[0] == f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/opt/hami/vgpu/claims/{UID}/{UID}.cache"
    assert env[3:] == [
        "CUDA_OVERSUBSCRIBE=true",
        "LIBCUDA_LOG_LEVEL=3",
        "GPU_CORE_UTILIZATION_POLICY=disable",
    ]
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert paths[-2:] == ["/tmp/license", "/usr/bin/vgpuvalidator"]


def sequence_of(devices: Sequence[Any]) -> list[str]:
    return [d.device for d in devices]


def test_two_shares_of_one_gpu_in_a_claim_give_one_summed_limit_on_both_cdi_devices() -> None:
    claim = prepared(
        dra_result("hami-gpu-1", request="a", share_id="s1", memory="1Gi", cores="10"),
        dra_result("hami-gpu-1", request="b", share_id="s2", memory="2Gi", cores="20"),
    )
    assert sequence_of(claim.devices) == ["hami-gpu-1", "hami-gpu-1"]
    assert {(d.memory_mib, d.cores, d.share_id) for d in claim.devices} == {
        (3072, 30, "s1"),
        (3072, 30, "s2"),
    }
    spec = claim_spec(claim, CONFIG, ())
    assert spec_problems(spec) == []
    assert spec["devices"][0]["containerEdits"] == spec["devices"][1]["containerEdits"]
