"""MIG partitions as hami-node publishes them (hami_node.dra.slices, NVIDIA/k8s-dra-driver-gpu's DynamicMIG
layout, KEP-4815), checked against NVIDIA's names and counters, the API server stand-in's validation
and the scheduler stand-in's allocator: profiles select partitions, placements exclude each other through
the memory-slice counters, freed claims give the counters back; and the instance behind a partition
(hami_node.dra.prepare: created at Prepare, idempotent, rolled back, destroyed at Unprepare) on the fake
backend.

Expected names and counter values are the notes' split example (A100-40GB: `gpu-0-mig-1g5gb-19-6`,
`gpu-0-mig-1g5gb-me-20-0`, `gpu-0-mig-3g20gb-9-4`, counters 98 SMs, 7 copy engines, 5 decoders,
40192Mi, memory-slice-0..7), from NVIDIA's partitions.go / mig.go at 22407113."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_api.mig import MIG_MODELS, Placement
from hami_node.dra.claims import ClaimError
from hami_node.dra.prepare import ensure_mig_devices, mig_env, mig_target, release_mig_devices
from hami_node.dra.slices import (
    MigGpu,
    counter_name,
    mig_counter_set,
    mig_device_class,
    mig_device_name,
    mig_partitions,
    mig_slice_specs,
    parse_mig_device_name,
    rfc1123,
)
from hami_node.gpu.fake import FakeBackend
from hami_sim.apiserver.resource_v1 import validate_resource_slice
from hami_sim.scheduler.dra.allocator import REASON_CANNOT_ALLOCATE, NodeAllocation, allocate

Json = dict[str, Any]
DRIVER = "gpu.nvidia.com"
A100 = MIG_MODELS["NVIDIA A100-SXM4-40GB"]
H100 = MIG_MODELS["NVIDIA H100 80GB HBM3"]


def mig_gpu(minor: int = 0, model: Any = A100) -> MigGpu:
    return MigGpu(minor, f"GPU-{minor:08d}-aaaa", model.name, "550.54.15", model.profiles)


def slices(*gpus: MigGpu) -> list[Json]:
    return [
        {"metadata": {"name": f"n1-{DRIVER}-{i}"}, "spec": spec}
        for i, spec in enumerate(mig_slice_specs("n1", DRIVER, gpus, 1))
    ]


def claim(name: str, profile: str) -> Json:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f"device.attributes['{DRIVER}'].profile == '{profile}'"
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }


def place(wanted: Sequence[Json], published: Sequence[Json], held: Sequence[Json] = ()) -> NodeAllocation:
    ids = itertools.count()
    return allocate(
        "n1", wanted, published, [mig_device_class(DRIVER)], held, share_id=lambda: f"s{next(ids)}"
    )


def allocated(wanted: Json, outcome: NodeAllocation) -> Json:
    assert outcome.allocations is not None, outcome.reason
    return {**wanted, "status": {"allocation": outcome.allocations[0]}}


def device_of(outcome: NodeAllocation) -> str:
    assert outcome.allocations is not None, outcome.reason
    return str(outcome.allocations[0]["devices"]["results"][0]["device"])


def test_a100_40gb_publishes_25_partitions_named_as_nvidia_names_them() -> None:
    names = [d["name"] for d in mig_partitions(mig_gpu())]
    assert len(names) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    assert {
        "gpu-0-mig-1g5gb-19-6",
        "gpu-0-mig-1g5gb-me-20-0",
        "gpu-0-mig-3g20gb-9-4",
        "gpu-0-mig-7g40gb-0-0",
    } <= set(names)
    assert names == sorted(names)


def test_a100_40gb_counter_set_holds_the_largest_profile_and_eight_memory_slices() -> None:
    counters = mig_counter_set(mig_gpu())["counters"]
    expected = {
        "multiprocessors": "98",
        "copy-engines": "7",
        "decoders": "5",
        "encoders": "0",
        "jpeg-engines": "1",
        "ofa-engines": "1",
        "memory": "40192Mi",
    } | {f"memory-slice-{i}": "1" for i in range(8)}
    assert {name: c["value"] for name, c in counters.items()} == expected


def test_a_partition_consumes_its_capacities_and_the_memory_slices_of_its_placement() -> None:
    device = next(d for d in mig_partitions(mig_gpu()) if d["name"] == "gpu-0-mig-3g20gb-9-4")
    consumed = device["consumesCounters"][0]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert sorted(k for k in consumed["counters"] if k.startswith("memory-slice")) == [
        f"memory-slice-{i}" for i in (4, 5, 6, 7)
    ]
    assert (device["capacity"]["memory"]["value"], device["capacity"]["multiprocessors"]["value"]) == (
        "19968Mi",
        "42",
    )
    assert device["attributes"]["type"] == {"string": "mig"}
    assert device["attributes"]["profile"] == {"string": "3g.20gb"}
    assert device["attributes"]["parentUUID"] == {"string": "GPU-00000000-aaaa"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("1g.5gb+me", "1g.5gb-me"), ("ABC_def.", "abc-def"), ("-x-", "x")],
)
def test_rfc1123_lowercases_replaces_and_trims_as_nvidias_to_rfc1123_compliant(
    name: str, expected: str
) -> None:
    assert rfc1123(name) == expected


def test_counter_names_are_the_capacity_names_in_dns_label_form() -> None:
    assert [counter_name(n) for n in ("copyEngines", "jpegEngines", "ofaEngines", "memory")] == [
        "copy-engines",
        "jpeg-engines",
        "ofa-engines",
        "memory",
    ]


def test_partition_names_parse_back_to_minor_profile_id_and_start() -> None:
    profile = A100.profile("1g.5gb+me")
    assert profile is not None
    name = mig_device_name(3, profile, 6)
    assert (name, parse_mig_device_name(name), parse_mig_device_name("gpu-3")) == (
        "gpu-3-mig-1g5gb-me-20-6",
        (3, 20, 6),
        None,
    )


def test_the_split_layout_is_one_counter_slice_then_one_device_slice_per_gpu() -> None:
    specs = mig_slice_specs("n1", DRIVER, [mig_gpu(0), mig_gpu(1, H100)], 4)
    assert [("sharedCounters" in s, "devices" in s) for s in specs] == [
        (True, False),
        (False, True),
        (False, True),
    ]
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {3}
    assert [c["name"] for c in specs[0]["sharedCounters"]] == ["gpu-0-counter-set", "gpu-1-counter-set"]


def test_no_mig_gpu_publishes_no_slice() -> None:
    assert mig_slice_specs("n1", DRIVER, [], 1) == []


@pytest.mark.parametrize("model", sorted(MIG_MODELS))
def test_every_published_slice_passes_the_api_servers_validation(model: str) -> None:
    for published in slices(mig_gpu(0, MIG_MODELS[model]), mig_gpu(1, MIG_MODELS[model])):
        assert validate_resource_slice(published) == []


def test_a_claim_for_1g_5gb_gets_a_1g_5gb_partition() -> None:
    outcome = place([claim("c", "1g.5gb")], slices(mig_gpu()))
    assert device_of(outcome).startswith("gpu-0-mig-1g5gb-19-")


def test_two_3g_20gb_claims_take_both_halves_and_a_third_is_refused() -> None:
    published = slices(mig_gpu())
    first = place([claim("a", "3g.20gb")], published)
    held = [allocated(claim("a", "3g.20gb"), first)]
    second = place([claim("b", "3g.20gb")], published, held)
    held.append(allocated(claim("b", "3g.20gb"), second))
    third = place([claim("c", "3g.20gb")], published, held)
    assert (device_of(first), device_of(second)) == ("gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4")
    assert (third.allocations, third.reason) == (None, REASON_CANNOT_ALLOCATE)


def test_deleting_a_claim_frees_its_memory_slices_for_the_next() -> None:
    published = slices(mig_gpu())
    a = allocated(claim("a", "3g.20gb"), place([claim("a", "3g.20gb")], published))
    b = allocated(claim("b", "3g.20gb"), place([claim("b", "3g.20gb")], published, [a]))
    again = place([claim("c", "3g.20gb")], published, [b])
    assert device_of(again) == "gpu-0-mig-3g20gb-9-0"


def test_a_7g_partition_is_refused_while_any_1g_partition_is_held() -> None:
    published = slices(mig_gpu())
    small = allocated(claim("a", "1g.5gb"), place([claim("a", "1g.5gb")], published))
    full = place([claim("b", "7g.40gb")], published, [small])
    assert full.allocations is None


def test_the_media_extension_profile_fits_once_per_gpu_through_the_jpeg_and_ofa_counters() -> None:
    """1g.5gb+me: 7 placements but 1 instance (its JPEG and OFA engine are the GPU's only ones)."""
    published = slices(mig_gpu())
    first = allocated(claim("a", "1g.5gb+me"), place([claim("a", "1g.5gb+me")], published))
    second = place([claim("b", "1g.5gb+me")], published, [first])
    assert second.allocations is None


def test_seven_1g_5gb_claims_fill_the_gpu_and_an_eighth_is_refused() -> None:
    published = slices(mig_gpu())
    held: list[Json] = []
    for i in range(7):
        wanted = claim(f"c{i}", "1g.5gb")
        held.append(allocated(wanted, place([wanted], published, held)))
    assert place([claim("c7", "1g.5gb")], published, held).allocations is None
    names = [str(c["status"]["allocation"]["devices"]["results"][0]["device"]) for c in held]
    starts = sorted(parsed[2] for parsed in map(parse_mig_device_name, names) if parsed is not None)
    assert starts == list(range(7))


def test_partitions_of_two_gpus_use_separate_counter_sets() -> None:
    published = slices(mig_gpu(0), mig_gpu(1))
    full0 = allocated(claim("a", "7g.40gb"), place([claim("a", "7g.40gb")], published))
    full1 = place([claim("b", "7g.40gb")], published, [full0])
    assert device_of(full1) == "gpu-1-mig-7g40gb-0-0"


def test_placements_come_from_the_profiles_possible_placements() -> None:
    profile = A100.profile("2g.10gb")
    assert profile is not None
    starts = sorted(
        int(d["name"].rsplit("-", 1)[1]) for d in mig_partitions(mig_gpu()) if "-2g10gb-" in d["name"]
    )
    assert starts == [p.start for p in profile.placements] == [0, 2, 4]
    assert Placement(2, 2).slices() == range(2, 4)


# --- Prepare / Unprepare: the instance behind a partition, on the fake backend ----------------------------


@pytest.fixture
def backend(tmp_path: Path) -> FakeBackend:
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(
        yaml.safe_dump({"gpus": [{"uuid": "GPU-a", "model": A100.name, "memory": 40960, "mig": True}]})
    )
    fake = FakeBackend(inventory, watch=False)
    fake.init()
    return fake


MINORS = {0: "GPU-a"}


def test_prepare_creates_the_partitions_instance_and_answers_its_mig_uuid(backend: FakeBackend) -> None:
    target = mig_target("gpu-0-mig-3g20gb-9-4", backend, MINORS)
    devices = ensure_mig_devices(backend, [target])
    assert (target.profile, target.placement) == ("3g.20gb", Placement(4, 4))
    assert [(d.profile, d.placement) for d in backend.mig_devices("GPU-a")] == [("3g.20gb", Placement(4, 4))]
    assert mig_env(devices) == {"NVIDIA_VISIBLE_DEVICES": devices[0].uuid}
    assert devices[0].uuid.startswith("MIG-")


def test_prepare_retried_takes_the_instance_it_already_created(backend: FakeBackend) -> None:
    target = mig_target("gpu-0-mig-1g5gb-19-6", backend, MINORS)
    first = ensure_mig_devices(backend, [target])
    again = ensure_mig_devices(backend, [target])
    assert (again, len(backend.mig_devices("GPU-a"))) == (first, 1)


def test_a_failed_create_destroys_the_instances_created_for_the_same_claim(backend: FakeBackend) -> None:
    ensure_mig_devices(backend, [mig_target("gpu-0-mig-1g5gb-19-0", backend, MINORS)])
    wanted = [
        mig_target("gpu-0-mig-1g5gb-19-6", backend, MINORS),
        mig_target("gpu-0-mig-2g10gb-14-0", backend, MINORS),
    ]
    with pytest.raises(ClaimError, match=r"gpu-0-mig-2g10gb-14-0 on GPU GPU-a"):
        ensure_mig_devices(backend, wanted)
    assert [(d.profile, d.placement) for d in backend.mig_devices("GPU-a")] == [("1g.5gb", Placement(0, 1))]


def test_unprepare_destroys_the_instance_and_a_second_unprepare_finds_nothing_to_do(
    backend: FakeBackend,
) -> None:
    (device,) = ensure_mig_devices(backend, [mig_target("gpu-0-mig-7g40gb-0-0", backend, MINORS)])
    held = [(device.parent_uuid, device.gpu_instance_id)]
    assert (release_mig_devices(backend, held), backend.mig_devices("GPU-a")) == ([], ())
    assert release_mig_devices(backend, held) == []


def test_unprepare_of_an_instance_in_use_reports_it_and_leaves_it(backend: FakeBackend) -> None:
    (device,) = ensure_mig_devices(backend, [mig_target("gpu-0-mig-1g5gb-19-3", backend, MINORS)])
    backend.set_mig_in_use("GPU-a", device.gpu_instance_id, True)
    errors = release_mig_devices(backend, [(device.parent_uuid, device.gpu_instance_id)])
    assert len(errors) == 1 and "GPU GPU-a" in errors[0]
    assert len(backend.mig_devices("GPU-a")) == 1


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu-0", "not a MIG partition"),
        ("gpu-5-mig-1g5gb-19-0", "no GPU with minor 5"),
        ("gpu-0-mig-1g5gb-19-7", "has no placement at 7"),
        ("gpu-0-mig-9g9gb-99-0", "no MIG profile with ID 99"),
    ],
)
def test_a_device_that_names_no_partition_of_this_node_is_a_clear_claim_error(
    backend: FakeBackend, device: str, message: str
) -> None:
    with pytest.raises(ClaimError, match=message):
        mig_target(device, backend, MINORS)
