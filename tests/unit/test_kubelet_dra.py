"""The kubelet stand-in's DRA rules, pure: the choice of a plugin's gRPC service, the names and checks
of a pod's claims, the CDI IDs each container gets (GetResources), and kubelet's DRA checkpoint format
(with the samples of kubernetes pkg/kubelet/cm/dra/state/checkpointer_test.go)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from hami_sim.kubelet.dra import claims as rules
from hami_sim.kubelet.dra.checkpoint import (
    API_VERSION,
    ClaimInfoState,
    DraCheckpointError,
    PreparedDevice,
    decode_checkpoint,
    encode_checkpoint,
    read_dra_checkpoint,
    write_checkpoint,
)
from hami_sim.kubelet.dra.registration import ServiceChoiceError, choose_service, validation_error
from tests.builders import claim_refs, container, dra_result, pod, resource_claim

# kubernetes pkg/kubelet/cm/dra/state/checkpointer_test.go (a 1.34 kubelet's files: no ShareID yet).
UPSTREAM_ONE_CLAIM = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",'
    r"\"Entries\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\","
    r"\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},"
    r"\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\","
    r"\"DeviceName\":\"dev-1\",\"RequestNames\":[\"test request\"],"
    r'\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1597924435}'
)
UPSTREAM_TWO_CLAIMS = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",'
    r"\"Entries\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example-1\","
    r"\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},"
    r"\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\","
    r"\"DeviceName\":\"dev-1\",\"RequestNames\":[\"test request\"],"
    r"\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}},"
    r"{\"ClaimUID\":\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\",\"ClaimName\":\"example-2\","
    r"\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},"
    r"\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\","
    r'\"DeviceName\":\"dev-2\",\"RequestNames\":null,\"CDIDeviceIDs\":null}]}}}]}","Checksum":3633532417}'
)


# ------------------------------------------------------------------------------ service choice


def test_kubelet_takes_the_first_service_of_the_plugins_list_that_it_supports() -> None:
    assert choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert choose_service(["v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert choose_service(["v1alpha4.Node", "v1.DRAPlugin"]) == "v1.DRAPlugin"


def test_a_plugin_offering_no_service_kubelet_supports_is_refused_with_kubelets_text() -> None:
    with pytest.raises(ServiceChoiceError) as err:
        choose_service(["v1alpha4.Node", "v2.DRAPlugin"])
    assert str(err.value) == (
        'none of services supported by the plugin (["v1alpha4.Node" "v2.DRAPlugin"]) are supported by the '
        'kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )
    with pytest.raises(
        ServiceChoiceError, match=r"^empty list of supported gRPC services \(aka supported versions\)$"
    ):
        choose_service([])
    assert validation_error("d.example.com", "/p/dra.sock", "x") == (
        "invalid supported gRPC versions of DRA driver plugin d.example.com at endpoint /p/dra.sock: x"
    )


# ------------------------------------------------------------------------------ claims of a pod


def claim_pod(*containers: dict[str, object], generated: dict[str, str] | None = None) -> dict[str, object]:
    """A pod with a claim named directly and one made from a template (`generated`: the claim
    controller's resourceClaimStatuses)."""
    return pod(
        "p",
        *containers,
        namespace="ns",
        uid="pod-uid",
        claim_statuses=generated,
        resourceClaims=[
            {"name": "direct", "resourceClaimName": "shared-claim"},
            {"name": "templated", "resourceClaimTemplateName": "vgpu"},
        ],
    )


def test_claim_names_come_from_the_spec_or_from_the_claim_controllers_status() -> None:
    generated = claim_pod(generated={"templated": "p-templated-x1"})
    direct, templated = rules.pod_claims(generated)
    assert rules.claim_name(generated, direct) == ("shared-claim", False)
    assert rules.claim_name(generated, templated) == ("p-templated-x1", True)
    not_created = claim_pod()
    not_created["status"] = {"resourceClaimStatuses": [{"name": "templated"}]}
    assert rules.claim_name(not_created, templated) == (None, True)
    waiting = claim_pod()
    with pytest.raises(rules.ClaimError, match=r'^pod "ns/p": ResourceClaim not created yet$'):
        rules.claim_name(waiting, templated)
    with pytest.raises(rules.ClaimError, match="none of the supported fields are set"):
        rules.claim_name(waiting, {"name": "odd"})


def test_a_generated_claim_must_be_controlled_by_its_pod_and_reserved_for_it() -> None:
    owner = claim_pod()
    mine = resource_claim("c", namespace="ns", owner_pod=("p", "pod-uid"), reserved_for=[("p", "pod-uid")])
    rules.check_owner(owner, mine)
    other = resource_claim("c", namespace="ns", uid="u2", owner_pod=("q", "other-uid"))
    with pytest.raises(
        rules.ClaimError, match=r"^ResourceClaim ns/c was not created for pod ns/p \(pod is not owner\)$"
    ):
        rules.check_owner(owner, other)
    assert rules.is_reserved_for_pod(owner, mine)
    assert not rules.is_reserved_for_pod(owner, other)
    assert rules.not_reserved_message(owner, "c", other) == (
        "pod p (pod-uid) is not allowed to use ResourceClaim c (u2)"
    )


def test_the_drivers_of_a_claim_are_those_of_its_allocation_results() -> None:
    results = [
        dra_result("gpu-0", driver="b.example.com"),
        dra_result("gpu-1", driver="a.example.com"),
        dra_result("gpu-2", driver="b.example.com"),
    ]
    assert rules.allocation_drivers(resource_claim(results=results)) == ["b.example.com", "a.example.com"]
    with pytest.raises(rules.ClaimError, match=r"^not allocated$"):
        rules.allocation_drivers(resource_claim())


def _prepared(name: str, *devices: PreparedDevice, driver: str = "gpu.example.com") -> ClaimInfoState:
    return ClaimInfoState(f"{name}-uid", name, "ns", {"pod-uid"}, {driver: devices})


def test_each_container_gets_the_cdi_ids_of_the_claims_it_lists_filtered_by_request() -> None:
    both = container("both", resources=claim_refs("direct", "templated"))
    first_request = container("first", resources=claim_refs(("direct", "a")))
    none = container("none")
    p = claim_pod(both, first_request, none, generated={"templated": "gen"})
    cache = {
        ("ns", "shared-claim"): _prepared(
            "shared-claim",
            PreparedDevice("pool", "d0", request_names=("a",), cdi_device_ids=("v.com/c=d0",)),
            PreparedDevice("pool", "d1", request_names=("b",), cdi_device_ids=("v.com/c=d1",)),
            PreparedDevice("pool", "d2", cdi_device_ids=("v.com/c=d2", "v.com/c=common")),
        ),
        ("ns", "gen"): _prepared("gen", PreparedDevice("pool", "g0", cdi_device_ids=("w.com/g=g0",))),
    }
    assert rules.container_cdi_device_ids(p, both, cache) == [
        "v.com/c=d0",
        "v.com/c=d1",
        "v.com/c=d2",
        "v.com/c=common",
        "w.com/g=g0",
    ]
    # a device with no request names belongs to every request
    assert rules.container_cdi_device_ids(p, first_request, cache) == [
        "v.com/c=d0",
        "v.com/c=d2",
        "v.com/c=common",
    ]
    assert rules.container_cdi_device_ids(p, none, cache) == []
    with pytest.raises(
        rules.ClaimError, match="unable to get claim info for ResourceClaim gen in namespace ns"
    ):
        rules.container_cdi_device_ids(p, both, {k: v for k, v in cache.items() if k[1] != "gen"})


# ------------------------------------------------------------------------------ checkpoint


def test_a_real_kubelets_checkpoint_is_read_and_its_checksum_checked() -> None:
    (entry,) = decode_checkpoint(UPSTREAM_ONE_CLAIM.encode())
    assert entry == ClaimInfoState(
        "067798be-454e-4be4-9047-1aa06aea63f7",
        "example",
        "default",
        {"139cdb46-f989-4f17-9561-ca10cfb509a6"},
        {
            "test-driver.cdi.k8s.io": (
                PreparedDevice(
                    "worker-1", "dev-1", None, ("test request",), ("example.com/example=cdi-example",)
                ),
            )
        },
    )
    first, second = decode_checkpoint(UPSTREAM_TWO_CLAIMS.encode())
    assert (first.claim_name, second.claim_name) == ("example-1", "example-2")
    assert second.driver_state["test-driver.cdi.k8s.io"] == (PreparedDevice("worker-1", "dev-2"),)
    corrupted = UPSTREAM_TWO_CLAIMS.replace("3633532417", "2930258365")
    with pytest.raises(DraCheckpointError, match="checksum mismatch: the file says 2930258365"):
        decode_checkpoint(corrupted.encode())
    with pytest.raises(DraCheckpointError, match=r"^not JSON"):
        decode_checkpoint(b"{")


def test_the_checkpoint_is_written_in_kubelets_encoding_with_a_crc32_of_its_data() -> None:
    entry = decode_checkpoint(UPSTREAM_ONE_CLAIM.encode())[0]
    written = encode_checkpoint([entry])
    # Kubelet 1.35's Device has ShareID (a pointer: null when the plugin sent none) after DeviceName.
    expected_data = json.loads(UPSTREAM_ONE_CLAIM)["Data"].replace(
        '"DeviceName":"dev-1",', '"DeviceName":"dev-1","ShareID":null,'
    )
    document = json.loads(written)
    assert document["Data"] == expected_data
    assert document["Checksum"] == zlib.crc32(expected_data.encode())
    assert written.startswith(b'{"Data":"{\\"kind\\":\\"DRACheckpoint\\",') and b" " not in written.replace(
        b"test request", b""
    )
    assert decode_checkpoint(written) == [entry]


def test_checkpoint_round_trip_keeps_share_ids_empty_lists_and_unprepared_drivers(tmp_path: Path) -> None:
    entries = [
        ClaimInfoState(
            "u2",
            "b",
            "ns",
            {"pod-2", "pod-1"},
            {"x.example.com": (PreparedDevice("pool", "d<1>&", "share-1", ("r",), ("x.example.com/c=d1",)),)},
        ),
        ClaimInfoState("u1", "a", "ns", set(), {"y.example.com": ()}),
    ]
    path = tmp_path / "dra_manager_state"
    write_checkpoint(path, entries)
    raw = path.read_bytes()
    assert b"\\\\u003c" in raw and b"<" not in raw  # Go escapes <, > and & inside Data too
    data = json.loads(json.loads(raw)["Data"])
    assert [e["ClaimName"] for e in data["Entries"]] == ["a", "b"]
    assert data["Entries"][0]["DriverState"] == {"y.example.com": {"Devices": None}}
    assert data["Entries"][1]["PodUIDs"] == {"pod-1": {}, "pod-2": {}}
    assert read_dra_checkpoint(path) == sorted(entries, key=lambda e: e.claim_name)


def test_an_empty_checkpoint_has_null_entries_and_a_bad_one_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "dra_manager_state"
    write_checkpoint(path, None)
    assert json.loads(json.loads(path.read_bytes())["Data"]) == {
        "kind": "DRACheckpoint",
        "apiVersion": API_VERSION,
        "Entries": None,
    }
    assert read_dra_checkpoint(path) == []
    bad_data = '{"apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":7}]}'
    path.write_text(json.dumps({"Data": bad_data, "Checksum": zlib.crc32(bad_data.encode())}))
    with pytest.raises(
        DraCheckpointError,
        match=rf"^DRA checkpoint {path}: Data.Entries\[0\].ClaimUID: expected a string, got 7$",
    ):
        read_dra_checkpoint(path)
    future = '{"apiVersion":"checkpoint.dra.kubelet.k8s.io/v2","Entries":null}'
    path.write_text(json.dumps({"Data": future, "Checksum": zlib.crc32(future.encode())}))
    with pytest.raises(
        DraCheckpointError, match=r"apiVersion: 'checkpoint\.dra\.kubelet\.k8s\.io/v2' is not supported"
    ):
        read_dra_checkpoint(path)
