"""The fake backend's MIG: modes, profiles, the inventory layout, create/destroy honouring placements,
rollback on injected faults, the persisted layout a restarted daemon adopts, and the inventory's MIG
errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hami_api.mig import A100_SXM4_40GB, H100_80GB, Placement
from hami_node.gpu import (
    MigDisabled,
    MigError,
    MigInstanceNotFound,
    MigInUse,
    MigMode,
    MigPlacementRefused,
    MigProfileUnknown,
)
from hami_node.gpu.fake import MIG_STATE_SUFFIX, FakeBackend, fake_mig_uuid
from hami_node.gpu.inventory import InventoryError, parse_inventory

A100 = "NVIDIA A100-SXM4-40GB"
DOC = {
    "gpus": [
        {
            "uuid": "GPU-a",
            "model": A100,
            "memory": 40960,
            "mig": {
                "enabled": True,
                "devices": [{"profile": "3g.20gb", "start": 4}, {"profile": "1g.5gb", "start": 0}],
            },
        },
        {"uuid": "GPU-b", "model": A100, "memory": 40960, "mig": True},
        {"uuid": "GPU-c", "model": A100, "memory": 40960},
        {"uuid": "GPU-t", "model": "Tesla T4", "memory": 15360},
        {
            "uuid": "GPU-h",
            "model": "NVIDIA H100 80GB HBM3",
            "memory": 81559,
            "mig": {"enabled": False, "pending": True},
        },
    ]
}


def write(path: Path, doc: object = DOC) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def started(source: Path) -> FakeBackend:
    backend = FakeBackend(source, watch=False)
    backend.init()
    return backend


@pytest.fixture
def backend(tmp_path: Path) -> FakeBackend:
    return started(write(tmp_path / "gpus.yaml"))


def test_mig_mode_per_gpu_current_and_pending(backend: FakeBackend) -> None:
    assert backend.mig_mode("GPU-a") == MigMode(True, True)
    assert backend.mig_mode("GPU-c") == MigMode(False, False)
    assert backend.mig_mode("GPU-t") == MigMode(False, False)
    assert backend.mig_mode("GPU-h") == MigMode(False, True)
    assert [g.mig_enabled for g in backend.list_gpus()] == [True, True, False, False, False]


def test_profiles_come_from_the_model_table_and_none_for_a_gpu_without_mig(backend: FakeBackend) -> None:
    assert backend.mig_profiles("GPU-c") == A100_SXM4_40GB.profiles  # capable, MIG off: still answered
    assert backend.mig_profiles("GPU-h") == H100_80GB.profiles
    assert backend.mig_profiles("GPU-t") == ()


def test_inventory_layout_is_listed_ordered_by_gi_with_deterministic_uuids(backend: FakeBackend) -> None:
    devices = backend.mig_devices("GPU-a")
    assert [(d.index, d.gpu_instance_id, d.compute_instance_id, d.profile, d.placement) for d in devices] == [
        (0, 1, 0, "3g.20gb", Placement(4, 4)),
        (1, 2, 0, "1g.5gb", Placement(0, 1)),
    ]
    assert devices[0].uuid == fake_mig_uuid("GPU-a", 1, 0)
    assert devices[0].uuid.startswith("MIG-") and len(devices[0].uuid) == 40
    attrs = devices[0].attributes
    assert (attrs.memory_mib, attrs.multiprocessors, attrs.gi_slices, attrs.ci_slices) == (19968, 42, 3, 3)
    assert backend.mig_devices("GPU-b") == ()
    assert backend.mig_devices("GPU-c") == ()


def test_create_takes_a_free_placement_and_lists_it(backend: FakeBackend) -> None:
    device = backend.create_mig_device("GPU-a", "2g.10gb", Placement(2, 2))
    assert (device.gpu_instance_id, device.profile, device.placement, device.parent_uuid) == (
        3,
        "2g.10gb",
        Placement(2, 2),
        "GPU-a",
    )
    assert device in backend.mig_devices("GPU-a")


def test_create_on_an_overlapping_placement_is_insufficient_resources(backend: FakeBackend) -> None:
    with pytest.raises(
        MigPlacementRefused, match=r"3g\.20gb at \{0,4\} on GPU 0 \(GPU-a\).*overlaps GPU instance 2"
    ) as e:
        backend.create_mig_device("GPU-a", "3g.20gb", Placement(0, 4))
    assert e.value.code == 23 and e.value.profile == "3g.20gb" and e.value.placement == Placement(0, 4)
    assert len(backend.mig_devices("GPU-a")) == 2


def test_create_at_a_placement_the_profile_does_not_have_is_refused(backend: FakeBackend) -> None:
    with pytest.raises(
        MigPlacementRefused,
        match=r"not one of the profile's possible placements \(\{0,2\}, \{2,2\}, \{4,2\}\)",
    ):
        backend.create_mig_device("GPU-b", "2g.10gb", Placement(1, 2))


def test_create_beyond_the_profiles_instance_count_is_refused(backend: FakeBackend) -> None:
    backend.create_mig_device("GPU-b", "1g.5gb+me", Placement(0, 1))
    with pytest.raises(MigPlacementRefused, match=r"fits at most 1 time"):
        backend.create_mig_device("GPU-b", "1g.5gb+me", Placement(1, 1))


def test_create_of_an_unknown_profile_names_the_gpu_and_the_profiles(backend: FakeBackend) -> None:
    with pytest.raises(
        MigProfileUnknown,
        match=r"GPU 1 \(GPU-b, NVIDIA A100-SXM4-40GB\) has no MIG profile '1g.10gb\+me'.*1g\.5gb",
    ):
        backend.create_mig_device("GPU-b", "1g.10gb+me", Placement(0, 1))


def test_create_with_mig_disabled_says_how_to_enable_it(backend: FakeBackend) -> None:
    with pytest.raises(
        MigDisabled, match=r"MIG mode is disabled on GPU 2 \(GPU-c\); enable it with nvidia-smi -i 2 -mig 1"
    ):
        backend.create_mig_device("GPU-c", "1g.5gb", Placement(0, 1))
    with pytest.raises(MigDisabled, match=r"MIG mode is pending on GPU 4 \(GPU-h\)"):
        backend.create_mig_device("GPU-h", "1g.10gb", Placement(0, 1))
    with pytest.raises(MigDisabled, match=r"Tesla T4, which is not MIG capable"):
        backend.create_mig_device("GPU-t", "1g.5gb", Placement(0, 1))


@pytest.mark.parametrize("step", ["gpu-instance", "compute-instance", "uuid"])
def test_a_create_failing_at_any_step_leaves_nothing_behind(backend: FakeBackend, step: str) -> None:
    before = backend.mig_devices("GPU-a")
    state_before = (
        backend.mig_state_path.read_bytes()
        if backend.mig_state_path and backend.mig_state_path.exists()
        else None
    )
    backend.fail_next_mig_create("GPU-a", step)  # type: ignore[arg-type]
    with pytest.raises(MigError, match="injected fault") as e:
        backend.create_mig_device("GPU-a", "2g.10gb", Placement(2, 2))
    assert e.value.uuid == "GPU-a" and e.value.profile == "2g.10gb"
    assert backend.mig_devices("GPU-a") == before
    path = backend.mig_state_path
    assert (path.read_bytes() if path and path.exists() else None) == state_before
    assert backend.create_mig_device("GPU-a", "2g.10gb", Placement(2, 2)).placement == Placement(2, 2)


def test_destroy_frees_the_placement(backend: FakeBackend) -> None:
    backend.destroy_mig_device("GPU-a", 1)
    assert [d.profile for d in backend.mig_devices("GPU-a")] == ["1g.5gb"]
    again = backend.create_mig_device("GPU-a", "3g.20gb", Placement(4, 4))
    assert again.gpu_instance_id == 1 and again.uuid != fake_mig_uuid("GPU-a", 1, 0)  # a new UUID


def test_destroy_in_use_and_unknown_instances_are_typed_errors(backend: FakeBackend) -> None:
    backend.set_mig_in_use("GPU-a", 2, True)
    with pytest.raises(
        MigInUse, match=r"GPU instance 2 \(1g\.5gb at \{0,1\}\) on GPU 0 \(GPU-a\) is in use"
    ) as e:
        backend.destroy_mig_device("GPU-a", 2)
    assert e.value.code == 19
    assert len(backend.mig_devices("GPU-a")) == 2
    with pytest.raises(MigInstanceNotFound, match=r"no GPU instance 9 on GPU 0 \(GPU-a\)"):
        backend.destroy_mig_device("GPU-a", 9)


def test_a_restarted_backend_finds_the_instances_created_before(tmp_path: Path) -> None:
    path = write(tmp_path / "gpus.yaml")
    first = started(path)
    created = first.create_mig_device("GPU-b", "7g.40gb", Placement(0, 8))
    first.destroy_mig_device("GPU-a", 2)
    first.shutdown()
    assert Path(str(path) + MIG_STATE_SUFFIX).exists()
    second = started(path)
    assert second.mig_devices("GPU-b") == (created,)
    assert [d.profile for d in second.mig_devices("GPU-a")] == ["3g.20gb"]


def test_editing_a_gpus_mig_section_replaces_its_layout(tmp_path: Path) -> None:
    path = write(tmp_path / "gpus.yaml")
    first = started(path)
    first.create_mig_device("GPU-b", "7g.40gb", Placement(0, 8))
    first.shutdown()
    doc = json.loads(json.dumps(DOC))
    doc["gpus"][0]["mig"]["devices"] = [{"profile": "7g.40gb", "start": 0}]
    write(path, doc)
    second = started(path)
    assert [d.profile for d in second.mig_devices("GPU-a")] == ["7g.40gb"]  # edited: from the file
    assert [d.profile for d in second.mig_devices("GPU-b")] == ["7g.40gb"]  # untouched: as created


def test_a_corrupt_state_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path / "gpus.yaml")
    Path(str(path) + MIG_STATE_SUFFIX).write_text('{"version": 1, "gpus": {"GPU-a": {"serial": -1}}}')
    with pytest.raises(
        InventoryError, match=r"gpus\.yaml\.mig\.json: gpus\.GPU-a\.serial: expected an integer >= 0"
    ):
        FakeBackend(path, watch=False)


# --- the inventory's MIG section -------------------------------------------------------------------


def one_gpu_doc(mig: object, model: str = A100) -> dict[str, object]:
    return {"gpus": [{"uuid": "GPU-0", "model": model, "memory": 40960, "mig": mig}]}


@pytest.mark.parametrize(
    ("mig", "model", "message"),
    [
        (
            True,
            "Tesla T4",
            'gpus[0].mig: model "Tesla T4" is not MIG capable in the fake (MIG models: NVIDIA A100',
        ),
        (
            {"devices": [{"profile": "2g.20gb", "start": 0}]},
            A100,
            'gpus[0].mig.devices[0].profile: "2g.20gb" is not a MIG profile of NVIDIA A100-SXM4-40GB',
        ),
        (
            {"devices": [{"profile": "3g.20gb", "start": 2}]},
            A100,
            "gpus[0].mig.devices[0].start: 2 is not a placement of 3g.20gb on NVIDIA A100-SXM4-40GB "
            "(starts: 0, 4)",
        ),
        (
            {"devices": [{"profile": "3g.20gb", "start": 0}, {"profile": "2g.10gb", "start": 2}]},
            A100,
            "gpus[0].mig.devices[1].start: 2g.10gb at {2,2} overlaps gpus[0].mig.devices[0] at {0,4}",
        ),
        (
            {"enabled": False, "devices": [{"profile": "1g.5gb", "start": 0}]},
            A100,
            "gpus[0].mig.devices: MIG devices need MIG mode enabled",
        ),
        ({"devices": [{"profile": "1g.5gb"}]}, A100, "gpus[0].mig.devices[0].start: is required"),
        ({"enabled": "yes"}, A100, 'gpus[0].mig.enabled: expected true or false, got "yes"'),
        ({"mode": "on"}, A100, "gpus[0].mig.mode: unknown field"),
    ],
)
def test_bad_mig_sections_name_the_field_and_the_value(mig: object, model: str, message: str) -> None:
    with pytest.raises(InventoryError) as e:
        parse_inventory(one_gpu_doc(mig, model), "gpus.yaml")
    assert str(e.value).startswith("gpus.yaml: " + message), str(e.value)


def test_the_boolean_form_and_the_mapping_form_parse() -> None:
    plain = parse_inventory(one_gpu_doc(True)).gpus[0]
    assert plain.mig_enabled and plain.mig_devices == () and plain.mig_pending is None
    mapped = parse_inventory(one_gpu_doc({"devices": [{"profile": "1g.5gb", "start": 6}]})).gpus[0]
    assert mapped.mig_enabled and [(d.profile, d.start) for d in mapped.mig_devices] == [("1g.5gb", 6)]
