"""MIG partitions in hami-node's DRA mode, on the fake backend with real files: NodePrepareResources makes
the MIG device of each allocated partition (as NVIDIA's DRA driver with DynamicMIG,
cmd/gpu-kubelet-plugin device_state.go: prepare creates, unprepare destroys), records it in the
checkpoint, writes the claim's CDI spec with NVIDIA_VISIBLE_DEVICES=MIG-...; Unprepare destroys it;
nothing half-made stays. And the pool the publisher keeps: whole GPUs beside the split MIG layout,
several slices with one generation (k8s.io/dynamic-resource-allocation resourceslice controller)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_api import dra
from hami_api.mig import A100_SXM4_40GB as A100
from hami_kube.errors import KubeApiError
from hami_node.cdi import claim_spec_file_name
from hami_node.config import NodeConfig, load_config
from hami_node.devices import DeviceState, GPUStatus
from hami_node.dra import checkpoint as ckpt
from hami_node.dra import slices as sl
from hami_node.dra.api.health.v1alpha1 import api_pb2 as health_pb2
from hami_node.dra.claims import ClaimRef, MigRecord, PreparedClaim, PreparedDevice
from hami_node.dra.prepare import ClaimPreparer
from hami_node.dra.publisher import SlicePublisher
from hami_node.dra.server import health_response
from hami_node.gpu.fake import FakeBackend
from tests.builders import dra_result, resource_claim

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
A = ClaimRef("default", "a", UID_A)
B = ClaimRef("default", "b", UID_B)


class Api:
    def __init__(self) -> None:
        self.claims: dict[str, Mapping[str, Any]] = {}

    def get_resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.claims[name]
        except KeyError:
            raise KubeApiError(404, "NotFound", f"claim {name} not found") from None

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise KubeApiError(404, "NotFound", "no pods here")


@pytest.fixture
def config(tmp_path: Path) -> NodeConfig:
    return load_config(
        [
            "--node-name", "n1", "--mode", "dra",
            "--kubelet-plugins-dir", str(tmp_path / "plugins"),
            "--cdi-spec-dir", str(tmp_path / "cdi"),
            "--hook-path", str(tmp_path / "hook"),
        ],
        {},
        lambda p: "",
    )  # fmt: skip


@pytest.fixture
def backend(tmp_path: Path) -> FakeBackend:
    inventory = tmp_path / "gpus.yaml"
    gpus = [
        {"uuid": "GPU-a", "model": A100.name, "memory": 40960, "mig": True},
        {"uuid": "GPU-b", "model": A100.name, "memory": 40960},
    ]
    inventory.write_text(yaml.safe_dump({"gpus": gpus}))
    fake = FakeBackend(inventory, watch=False)
    fake.init()
    return fake


def preparer_for(config: NodeConfig, api: Api, backend: FakeBackend) -> ClaimPreparer:
    gpus = tuple(GPUStatus(g) for g in backend.list_gpus())
    preparer = ClaimPreparer(
        config, lambda: gpus, api, common_nodes=lambda: ("/dev/nvidiactl",), backend=backend
    )
    preparer.start()
    return preparer


def allocate(api: Api, ref: ClaimRef, *devices: str) -> None:
    api.claims[ref.name] = resource_claim(
        ref.name, uid=ref.uid, results=[dra_result(d, request=f"r{i}") for i, d in enumerate(devices)]
    )


def spec_of(config: NodeConfig, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((config.cdi_spec_dir / claim_spec_file_name(uid)).read_text())
    return data


def layout(backend: FakeBackend) -> list[tuple[str, int]]:
    return [(m.profile, m.placement.start) for m in backend.mig_devices("GPU-a")]


def test_prepare_creates_the_mig_device_and_the_spec_names_its_mig_uuid(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-1g5gb-19-6")
    outcome = preparer_for(config, api, backend).prepare([A])[UID_A]
    assert outcome.error == "" and outcome.claim is not None
    (mig,) = backend.mig_devices("GPU-a")
    assert (mig.profile, mig.placement.start) == ("1g.5gb", 6)
    assert outcome.claim.mig == (MigRecord("GPU-a", mig.gpu_instance_id, mig.uuid, "1g.5gb", 6, 1),)
    spec = spec_of(config, UID_A)
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]
    assert spec["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    assert "mounts" not in spec["containerEdits"]  # no HAMi-core: MIG isolates in hardware


def test_prepare_after_a_restart_answers_the_same_without_a_second_instance(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-3g20gb-9-4")
    first = preparer_for(config, api, backend).prepare([A])[UID_A]
    again = preparer_for(config, api, backend).prepare([A])[UID_A]
    assert again == first and layout(backend) == [("3g.20gb", 4)]


def test_unprepare_destroys_the_mig_device_and_forgets_the_claim(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-3g20gb-9-0")
    preparer_for(config, api, backend).prepare([A])
    restarted = preparer_for(config, api, backend)  # Unprepare finds the device through the checkpoint
    assert restarted.unprepare([A]) == {UID_A: ""}
    assert layout(backend) == []
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()
    assert ckpt.decode_journal(restarted.checkpoint_path.read_bytes()).claims == {}


def test_unprepare_of_a_mig_device_in_use_fails_and_keeps_the_claim_until_it_is_free(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-1g5gb-19-0")
    preparer = preparer_for(config, api, backend)
    preparer.prepare([A])
    (mig,) = backend.mig_devices("GPU-a")
    backend.set_mig_in_use("GPU-a", mig.gpu_instance_id, True)
    error = preparer.unprepare([A])[UID_A]
    assert error.startswith("claim default/a: cannot destroy its MIG devices: GPU GPU-a instance")
    assert UID_A in ckpt.decode_journal(preparer.checkpoint_path.read_bytes()).claims
    backend.set_mig_in_use("GPU-a", mig.gpu_instance_id, False)
    assert preparer.unprepare([A]) == {UID_A: ""} and layout(backend) == []


def test_a_failed_create_leaves_nothing_of_the_claim_behind(config: NodeConfig, backend: FakeBackend) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-2g10gb-14-2")
    backend.fail_next_mig_create("GPU-a", "compute-instance")
    preparer = preparer_for(config, api, backend)
    error = preparer.prepare([A])[UID_A].error
    assert error.startswith("claim default/a: MIG device for gpu-0-mig-1g5gb-19-0 on GPU GPU-a:")
    assert layout(backend) == []
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()
    assert (
        not preparer.checkpoint_path.exists()
        or ckpt.decode_journal(preparer.checkpoint_path.read_bytes()).claims == {}
    )


def test_a_claim_mixing_partitions_and_gpu_shares_is_refused_with_what_to_do(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-1g5gb-19-0", dra.device_name(1))
    error = preparer_for(config, api, backend).prepare([A])[UID_A].error
    assert error == (
        "claim default/a: devices hami-gpu-1 are GPU shares and the others MIG partitions; one claim holds "
        "one kind: split the requests into two claims"
    )
    assert layout(backend) == []


def test_a_partition_of_a_profile_the_gpu_lacks_is_refused_naming_the_device(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, A, "gpu-0-mig-9g99gb-99-0")
    error = preparer_for(config, api, backend).prepare([A])[UID_A].error
    assert error == "claim default/a: device gpu-0-mig-9g99gb-99-0: GPU GPU-a has no MIG profile with ID 99"


def test_the_whole_gpu_of_a_gpu_in_mig_mode_cannot_be_prepared(
    config: NodeConfig, backend: FakeBackend
) -> None:
    api = Api()
    allocate(api, B, dra.device_name(0))
    error = preparer_for(config, api, backend).prepare([B])[UID_B].error
    assert error == "claim default/b: device hami-gpu-0 of pool n1 is not one of this node's GPUs"


def test_the_checkpoint_keeps_a_partitions_mig_record_across_encode_and_decode() -> None:
    record = MigRecord("GPU-a", 3, "MIG-x", "2g.10gb", 2, 2)
    device = PreparedDevice("r0", "gpu-0-mig-2g10gb-14-2", None, "GPU-a", 0, 0, 9856, 100, "c", mig=record)
    claim = PreparedClaim("default", "a", UID_A, "n1", (device,), sole=True)
    decoded = ckpt.decode(ckpt.encode(ckpt.Checkpoint({UID_A: claim})))
    assert decoded.claims[UID_A] == claim


def test_a_checkpoint_with_a_malformed_mig_record_is_refused_naming_the_field() -> None:
    device = PreparedDevice(
        "r0", "d", None, "GPU-a", 0, 0, 1, 100, "c", mig=MigRecord("GPU-a", 1, "M", "p", 0, 1)
    )
    doc = json.loads(ckpt.encode(ckpt.Checkpoint({UID_A: PreparedClaim("ns", "a", UID_A, "n1", (device,))})))
    doc["claims"][UID_A]["devices"][0]["mig"]["gpuInstanceID"] = "one"
    doc["checksum"] = ckpt.checksum(doc["version"], doc["claims"])
    with pytest.raises(
        ckpt.CheckpointError, match=r"devices\[0\]\.mig\.gpuInstanceID: unexpected value 'one'"
    ):
        ckpt.decode(json.dumps(doc).encode())


# --- the pool: whole GPUs beside the split MIG layout -------------------------------------------------------


def mig_gpu(backend: FakeBackend) -> sl.MigGpu:
    return sl.MigGpu(0, "GPU-a", A100.name, "550.54.15", backend.mig_profiles("GPU-a"))


WHOLE = [{"name": dra.device_name(1)}]


def test_without_a_mig_gpu_the_pool_is_one_slice_as_before() -> None:
    (spec,) = sl.node_slice_specs("n1", dra.DRIVER, WHOLE, [], 4)
    assert spec == sl.slice_spec("n1", dra.DRIVER, WHOLE, 4)


def test_with_a_mig_gpu_the_pool_is_counters_then_whole_gpus_then_partitions(backend: FakeBackend) -> None:
    specs = sl.node_slice_specs("n1", dra.DRIVER, WHOLE, [mig_gpu(backend)], 4)
    assert [sorted(k for k in s if k in ("sharedCounters", "devices")) for s in specs] == [
        ["sharedCounters"],
        ["devices"],
        ["devices"],
    ]
    assert specs[1]["devices"] == WHOLE and len(specs[2]["devices"]) == 25
    assert {(s["pool"]["generation"], s["pool"]["resourceSliceCount"]) for s in specs} == {(4, 3)}


def test_an_unhealthy_mig_gpus_partitions_carry_its_taint(backend: FakeBackend) -> None:
    taint = {"key": sl.taint_key(dra.DRIVER), "value": "xid-79", "effect": "NoSchedule"}
    specs = sl.node_slice_specs("n1", dra.DRIVER, [], [mig_gpu(backend)], 1, mig_taints={"GPU-a": taint})
    assert len(specs) == 2
    assert all(d["taints"] == [taint] for d in specs[1]["devices"])


def stored(spec: Mapping[str, Any], name: str, generation: int) -> dict[str, Any]:
    body = {**spec, "pool": {**spec["pool"], "generation": generation}}
    return {"metadata": {"name": name, "creationTimestamp": name}, "spec": body}


def test_a_pool_whose_top_generation_matches_is_in_sync_and_older_generations_go(
    backend: FakeBackend,
) -> None:
    desired = sl.node_slice_specs("n1", dra.DRIVER, WHOLE, [mig_gpu(backend)], 0)
    current = [stored(s, f"s{i}", 5) for i, s in reversed(list(enumerate(desired)))]
    old = stored(desired[0], "old", 4)
    plan = sl.plan_pool([*current, old], "n1", desired)
    assert plan.writes == () and [d["metadata"]["name"] for d in plan.deletes] == ["old"]


def test_a_change_writes_every_slice_with_the_next_generation_reusing_the_stored_ones(
    backend: FakeBackend,
) -> None:
    before = sl.node_slice_specs("n1", dra.DRIVER, WHOLE, [], 0)
    current = [stored(before[0], "s0", 5), stored(before[0], "other-pool", 7)]
    current[1]["spec"]["pool"]["name"] = "n0"
    desired = sl.node_slice_specs("n1", dra.DRIVER, WHOLE, [mig_gpu(backend)], 0)
    plan = sl.plan_pool(current, "n1", desired)
    assert plan.generation == 8
    assert [d["metadata"]["name"] for d in plan.deletes] == ["other-pool"]
    assert [None if s is None else s["metadata"]["name"] for s, _ in plan.writes] == [None, "s0", None]
    assert {b["pool"]["generation"] for _, b in plan.writes} == {8}


def test_the_dra_overlay_ships_the_mig_device_class_hami_node_publishes_for() -> None:
    path = Path(__file__).parents[2] / "daemonset" / "overlays" / "dra" / "deviceclass-mig.yaml"
    shipped = yaml.safe_load(path.read_text())
    expected = sl.mig_device_class_self(dra.DRIVER)
    assert shipped["metadata"]["name"] == expected["metadata"]["name"] == sl.MIG_DEVICE_CLASS_SELF
    (selector,) = shipped["spec"]["selectors"]
    (wanted,) = expected["spec"]["selectors"]
    assert " ".join(selector["cel"]["expression"].split()) == wanted["cel"]["expression"]


def test_the_health_stream_lists_a_mig_gpus_partitions_with_its_health(
    config: NodeConfig, backend: FakeBackend
) -> None:
    publisher = SlicePublisher(config, DeviceState(config), Api(), mig_profiles=backend.mig_profiles)  # type: ignore[arg-type]
    mig, whole = (GPUStatus(g) for g in backend.list_gpus())
    sick = GPUStatus(mig.info, fault="Xid 79")
    response = health_response((sick, whole), "n1", 1700000000, 30, publisher.partitions)
    names = [d.device.device_name for d in response.devices]
    assert len(names) == 26 and names[-1] == dra.device_name(1)
    assert set(names[:-1]) == {d["name"] for d in sl.mig_partitions(mig_gpu(backend))}
    assert {(d.health, d.message) for d in response.devices[:-1]} == {(health_pb2.UNHEALTHY, "xid-79")}
    assert publisher.partitions(whole) == []
