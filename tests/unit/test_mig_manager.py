"""hami_node.mig_manager: HAMi v2.10's dynamic MIG on the node, on the fake backend's A100-40GB.

Transcribed: HAMi pkg/device-plugin/nvidiadevice/nvinternal/plugin/mig_startup_test.go
`TestActiveMigGPUUUIDs` (all four pods). HAMi's register_test.go has no migProfiles case; the register's
values are checked against register.go's discoverMigProfiles arithmetic instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_api.mig import A100_SXM4_40GB, A100_SXM4_80GB, H100_80GB, H200_141GB, Placement
from hami_api.mig_alloc import MIG_ALLOCATIONS, AllowedMigProfiles, MigAllocation, decode_mig_allocations
from hami_api.types import MigPlacement
from hami_node.allocation import VISIBLE_DEVICES_ENV, mig_container_response
from hami_node.config import load_config
from hami_node.gpu.fake import FakeBackend
from hami_node.mig_manager import (
    MigAllocateError,
    MigKey,
    MigManager,
    MigReconciler,
    active_mig_gpu_uuids,
    active_mig_keys,
    allowlist_entry_for,
    container_mig_allocations,
    discover_registrations,
    prime_from_pods,
    register_mig,
    resolve_profile,
    with_runtime_identity,
)

A100 = "NVIDIA A100-SXM4-40GB"
CHART = (  # HAMi v2.10 charts/hami/templates/scheduler/device-configmap.yaml, in order
    AllowedMigProfiles(("A30",), ("1g.6gb", "2g.12gb", "4g.24gb")),
    AllowedMigProfiles(
        ("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"), ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")
    ),
    AllowedMigProfiles(
        ("A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"), ("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb")
    ),
    AllowedMigProfiles(("H100-PCIE-80GB", "H100-SXM5-80GB"), ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")),
    AllowedMigProfiles(("H100-PCIE-94GB", "H100-SXM5-94GB"), ("1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb")),
    AllowedMigProfiles(("H200 NVL", "H200-SXM5"), ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")),
)


def mig_pod(annotation: str, phase: str = "Running", deleting: bool = False, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "namespace": "ns",
        "name": meta.pop("name", "p"),
        "annotations": {MIG_ALLOCATIONS: annotation},
    }
    metadata.update(meta)
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "c0"}, {"name": "c1"}]},
        "status": {"phase": phase},
    }


def one(gpu: str, profile: str, start: int, size: int, *, container: int = 0, device: int = 0) -> str:
    return json.dumps(
        [
            {
                "containerIndex": container,
                "deviceIndex": device,
                "gpuUUID": gpu,
                "profile": profile,
                "placement": {"start": start, "size": size},
            }
        ]
    )


@pytest.fixture
def backend(tmp_path: Path) -> FakeBackend:
    path = tmp_path / "inv.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"uuid": "GPU-a", "model": A100, "memory": 40960, "mig": True},
                    {"uuid": "GPU-off", "model": A100, "memory": 40960},
                ]
            }
        )
    )
    b = FakeBackend(path, watch=False)
    b.init()
    return b


# --- HAMi's tests -----------------------------------------------------------------------------------


def test_active_mig_gpu_uuids_keeps_running_and_pending_pods_only() -> None:
    """HAMi mig_startup_test.go TestActiveMigGPUUUIDs."""
    pods = [
        mig_pod(one("GPU-live", "1g.5gb", 6, 1), "Running"),
        mig_pod(one("GPU-pending", "2g.10gb", 0, 2), "Pending"),
        mig_pod(one("GPU-complete", "1g.5gb", 0, 1), "Succeeded"),
        mig_pod(one("GPU-deleting", "1g.5gb", 0, 1), "Running", deleting=True),
    ]
    assert active_mig_gpu_uuids(pods) == {"GPU-live", "GPU-pending"}


def test_active_mig_keys_refuses_an_undecodable_annotation_naming_the_pod() -> None:
    with pytest.raises(MigAllocateError, match="decode MIG allocations for pod ns/p"):
        active_mig_keys([mig_pod("[{")])


# --- the register -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "models"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),  # HAMi's substring match
        ("NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),  # token match: A100 + 80GB
        ("NVIDIA H100 80GB HBM3", "H100-PCIE-80GB"),  # HAMi matches nothing here
        ("NVIDIA H200", "H200 NVL"),  # nor here
        ("NVIDIA A30", "A30"),
    ],
)
def test_allowlist_matches_real_nvml_names(name: str, models: str) -> None:
    entry = allowlist_entry_for(CHART, name)
    assert entry is not None and models in entry.models


def test_allowlist_token_match_does_not_take_another_memory_size() -> None:
    assert allowlist_entry_for(CHART[4:5], "NVIDIA H100 80GB HBM3") is None


def test_register_of_an_a100_40gb_has_hamis_core_and_count() -> None:
    reg = register_mig(A100_SXM4_40GB.profiles, A100, CHART)
    assert reg is not None and reg.count == 7 and reg.problem is None
    got = {p.name: (p.memory_mb, p.core, p.slice_count, len(p.placements)) for p in reg.profiles}
    # core = ceil(MP * 100 / 98): 14 -> 15, 28 -> 29, 42 -> 43, 98 -> 100 (register.go discoverMigProfiles)
    assert got == {
        "1g.5gb": (4864, 15, 1, 7),
        "2g.10gb": (9856, 29, 2, 3),
        "3g.20gb": (19968, 43, 3, 2),
        "7g.40gb": (40192, 100, 7, 1),
    }


def test_register_of_an_unlisted_model_is_none() -> None:
    assert register_mig(A100_SXM4_40GB.profiles, "NVIDIA B300", CHART) is None


def test_register_without_an_allowlist_offers_every_base_profile() -> None:
    reg = register_mig(A100_SXM4_40GB.profiles, A100, None)
    assert reg is not None and {p.name for p in reg.profiles} == {
        p.name for p in A100_SXM4_40GB.profiles if p.is_base
    }


@pytest.mark.parametrize("model", [A100_SXM4_80GB, H100_80GB, H200_141GB])
def test_every_allowlisted_profile_of_the_chart_resolves_on_its_model(model: Any) -> None:
    entry = allowlist_entry_for(CHART, model.name)
    assert entry is not None
    assert all(resolve_profile(model.profiles, name) is not None for name in entry.profiles)


def test_hamis_7g_79gb_name_resolves_to_the_a100_80gb_seven_slice_profile() -> None:
    found = resolve_profile(A100_SXM4_80GB.profiles, "7g.79gb")
    assert found is not None and found.slices == 7


def test_a_gpu_with_mig_disabled_registers_unhealthy_with_the_enable_command(backend: FakeBackend) -> None:
    regs = discover_registrations(backend, backend.list_gpus(), CHART)
    assert regs["GPU-a"].problem is None
    problem = regs["GPU-off"].problem
    assert problem is not None and "-mig 1" in problem and "GPU-off" in problem


# --- the instances ----------------------------------------------------------------------------------


def test_ensure_creates_once_and_is_idempotent(backend: FakeBackend) -> None:
    manager = MigManager(backend)
    key = MigKey("GPU-a", "1g.5gb", 6, 1)
    first, created = manager.ensure(key)
    again, created_again = manager.ensure(key)
    assert created and not created_again and first == again
    assert [d.uuid for d in backend.mig_devices("GPU-a")] == [first.mig_uuid]


def test_ensure_refuses_a_placement_the_profile_does_not_have(backend: FakeBackend) -> None:
    with pytest.raises(
        MigAllocateError, match=r"invalid placement \{Start:5 Size:2\} for profile 2g.10gb on GPU GPU-a"
    ):
        MigManager(backend).ensure(MigKey("GPU-a", "2g.10gb", 5, 2))
    assert backend.mig_devices("GPU-a") == ()


def test_ensure_on_a_gpu_with_mig_disabled_says_how_to_enable_it(backend: FakeBackend) -> None:
    with pytest.raises(MigAllocateError, match="nvidia-smi -mig 1"):
        MigManager(backend).ensure(MigKey("GPU-off", "1g.5gb", 6, 1))


def test_ensure_container_rolls_back_what_it_created_when_one_fails(backend: FakeBackend) -> None:
    manager = MigManager(backend)
    allocations = (
        MigAllocation(0, 0, "GPU-a", "3g.20gb", MigPlacement(4, 4)),
        MigAllocation(0, 1, "GPU-a", "2g.10gb", MigPlacement(4, 2)),  # overlaps the 3g: refused
    )
    with pytest.raises(MigAllocateError):
        manager.ensure_container(allocations)
    assert backend.mig_devices("GPU-a") == () and manager.managed() == {}


def test_reconcile_destroys_only_managed_instances_no_live_pod_holds(backend: FakeBackend) -> None:
    foreign = backend.create_mig_device("GPU-a", "1g.5gb", Placement(0, 1))  # not ours: left alone
    manager = MigManager(backend)
    kept, _ = manager.ensure(MigKey("GPU-a", "1g.5gb", 6, 1))
    gone, _ = manager.ensure(MigKey("GPU-a", "1g.5gb", 5, 1))
    pods = [mig_pod(one("GPU-a", "1g.5gb", 6, 1)), mig_pod(one("GPU-a", "1g.5gb", 5, 1), "Succeeded")]
    reconciler = MigReconciler(manager, lambda: pods)
    assert reconciler.reconcile_once() == [gone.key]
    assert {d.uuid for d in backend.mig_devices("GPU-a")} == {foreign.uuid, kept.mig_uuid}


def test_reconcile_round_is_skipped_when_an_annotation_does_not_decode(backend: FakeBackend) -> None:
    manager = MigManager(backend)
    manager.ensure(MigKey("GPU-a", "1g.5gb", 6, 1))
    reconciler = MigReconciler(manager, lambda: [mig_pod("not json")])
    assert reconciler.reconcile_once() == [] and reconciler.skipped == 1
    assert len(backend.mig_devices("GPU-a")) == 1


def test_restart_adopts_a_live_pods_instance_and_reports_one_that_is_not_live(backend: FakeBackend) -> None:
    inst, _ = MigManager(backend).ensure(MigKey("GPU-a", "2g.10gb", 0, 2))
    annotated = json.loads(one("GPU-a", "2g.10gb", 0, 2))
    annotated[0].update(
        migUUID=inst.mig_uuid, gpuInstanceID=inst.gpu_instance_id, computeInstanceID=inst.compute_instance_id
    )
    stale = json.loads(one("GPU-a", "1g.5gb", 6, 1))
    stale[0].update(migUUID="MIG-gone", gpuInstanceID=9, computeInstanceID=0)
    fresh = MigManager(backend)
    problems = prime_from_pods(
        fresh, [mig_pod(json.dumps(annotated)), mig_pod(json.dumps(stale), name="q")], {"GPU-a"}
    )
    assert list(fresh.managed()) == [inst.key]
    assert problems == [
        "adopt pod ns/q MIG allocation: annotated MIG allocation MIG-gone profile=1g.5gb "
        "placement={Start:6 Size:1} is not live"
    ]


def test_a_live_pod_without_runtime_identity_is_hamis_error() -> None:
    assert prime_from_pods(
        MigManager(FakeBackendStub()), [mig_pod(one("GPU-a", "1g.5gb", 6, 1))], {"GPU-a"}
    ) == ["active pod ns/p MIG allocation lacks runtime identity"]


class FakeBackendStub:
    """Never called: prime_from_pods reports the missing identity before asking the backend."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"backend.{name} called")


# --- the container's reservations and the answer ---------------------------------------------------


def test_container_reservations_are_ordered_by_device_index_and_counted() -> None:
    text = json.dumps(
        [
            {
                "containerIndex": 1,
                "deviceIndex": 1,
                "gpuUUID": "GPU-a",
                "profile": "1g.5gb",
                "placement": {"start": 5, "size": 1},
            },
            {
                "containerIndex": 1,
                "deviceIndex": 0,
                "gpuUUID": "GPU-a",
                "profile": "1g.5gb",
                "placement": {"start": 6, "size": 1},
            },
        ]
    )
    got = container_mig_allocations(mig_pod(text), 1, 2)
    assert [a.device_index for a in got] == [0, 1]
    with pytest.raises(MigAllocateError, match="container c0 has 0 MIG reservations, requested 1 devices"):
        container_mig_allocations(mig_pod(text), 0, 1)


def test_runtime_identity_fills_live_entries_and_fails_when_none_is_live(backend: FakeBackend) -> None:
    manager = MigManager(backend)
    inst, _ = manager.ensure(MigKey("GPU-a", "1g.5gb", 6, 1))
    allocations = decode_mig_allocations(one("GPU-a", "1g.5gb", 6, 1))
    (filled,) = with_runtime_identity(allocations, manager.runtime)
    assert filled.runtime_ready and filled.mig_uuid == inst.mig_uuid
    with pytest.raises(MigAllocateError, match="no realised MIG allocation found for pod"):
        with_runtime_identity(decode_mig_allocations(one("GPU-a", "1g.5gb", 5, 1)), manager.runtime)


def test_mig_response_is_the_mig_uuids_without_hami_core() -> None:
    config = load_config(["--node-name", "n"], env={}, read_file=_read)
    response = mig_container_response(["MIG-1", "MIG-2"], config)
    assert dict(response.envs) == {VISIBLE_DEVICES_ENV: "MIG-1,MIG-2"} and response.mounts == ()


def test_device_config_file_gives_the_allowlist(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(
        yaml.safe_dump({"nvidia": {"migProfileAllowlist": [{"models": ["A30"], "profiles": ["1g.6gb"]}]}})
    )
    config = load_config(["--node-name", "n", "--device-config-file", str(path)], env={}, read_file=_read)
    assert config.mig_profile_allowlist == (AllowedMigProfiles(("A30",), ("1g.6gb",)),)


def test_device_config_file_with_a_bad_profile_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(
        yaml.safe_dump({"nvidia": {"migProfileAllowlist": [{"models": ["A30"], "profiles": ["six"]}]}})
    )
    with pytest.raises(Exception, match=r"--device-config-file.*invalid MIG profile 'six'"):
        load_config(["--node-name", "n", "--device-config-file", str(path)], env={}, read_file=_read)


def _read(path: Path) -> str:
    return Path(path).read_text(encoding="utf-8")
