"""The node daemon in DRA mode end to end on real sockets: `start_daemon` with `--mode dra` against the
local API server (resource.k8s.io/v1) and the fake GPU backend; kubelet's side is played by plain gRPC
clients on the Unix sockets (registration, DRAPlugin v1 and v1beta1, DRAResourceHealth)."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_api import annotations as ann
from hami_api import dra
from hami_node.cdi import claim_spec_file_name
from hami_node.dra.api.health.v1alpha1 import api_pb2 as health_pb2
from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1beta1 import api_pb2 as v1beta1_pb2
from hami_node.dra.publisher import NO_CONSUMABLE_CAPACITY_REASON
from hami_node.gpu.inventory import NvmlMode, generate_inventory
from hami_node.unixgrpc import socket_identity
from hami_sim.apiserver.resource_v1 import FeatureGates
from hami_sim.apiserver.runner import ApiServerRunner
from tests.apiserver_util import http
from tests.builders import claim_refs, container, dra_result, pod, resource_claim
from tests.conftest import ApiServerHandle
from tests.dra_node_util import SLICES, TIMEOUT, DraRig, make_dra_rig
from tests.node_daemon_util import REPO_ROOT, NodeDaemonProcess, run_daemon_once
from tests.waiting import wait_for

NODE = "dra-n1"
CLAIM_UID = "c1a1a1a1-0000-4000-8000-000000000001"
OTHER_UID = "c2b2b2b2-0000-4000-8000-000000000002"
INVENTORY = generate_inventory(2, seed=NODE)


@pytest.fixture
def rig(apiserver: ApiServerHandle) -> Iterator[DraRig]:
    yield from make_dra_rig(NODE, apiserver.kubeconfig, apiserver.base_url, INVENTORY)


def device_names(slice_: dict[str, Any]) -> list[str]:
    return [d["name"] for d in slice_["spec"]["devices"]]


def taints_of(slice_: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d.get("taints", []) for d in slice_["spec"]["devices"]}


def create_allocated_claim(
    rig: DraRig, name: str, results: list[dict[str, Any]], *, uid_holder: dict[str, str] | None = None
) -> str:
    """Create a claim and write its allocation as the scheduler does (status subresource); its UID."""
    body = resource_claim(name, namespace="default", node=NODE)
    code, created = http(
        rig.base_url, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body
    )
    assert code == 201, created
    status = resource_claim(name, results=results, node=NODE)["status"]
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}/status"
    code, done = http(
        rig.base_url, "PATCH", path, {"status": status}, content_type="application/merge-patch+json"
    )
    assert code == 200, done
    uid: str = created["metadata"]["uid"]
    return uid


# --- registration --------------------------------------------------------------------------------------


def test_the_registration_socket_answers_kubelet_as_the_upstream_helper_does(rig: DraRig) -> None:
    rig.start()
    assert rig.registration_socket.exists() and rig.dra_socket.exists()
    with rig.channel(rig.registration_socket) as channel:
        stub = rig.registration(channel)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=TIMEOUT)
        assert info.type == "DRAPlugin"
        assert info.name == dra.DRIVER
        assert info.endpoint == str(rig.dra_socket) and os.path.isabs(info.endpoint)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
        ]
        assert not rig.servers.registered
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT)
        assert rig.servers.registered and rig.servers.registrations == 1
        with pytest.raises(grpc.RpcError) as failed:
            stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="version check failed"),
                timeout=TIMEOUT,
            )
        assert failed.value.code() is grpc.StatusCode.UNKNOWN
        assert "failed registration process: version check failed" in (failed.value.details() or "")
        assert not rig.servers.registered


def test_stopping_the_daemon_removes_both_sockets(rig: DraRig) -> None:
    rig.start()
    rig.stop_daemon()
    assert not rig.registration_socket.exists() and not rig.dra_socket.exists()


def test_a_removed_socket_is_served_again(rig: DraRig) -> None:
    rig.start()
    servers = rig.servers
    for socket in (rig.dra_socket, rig.registration_socket):
        restarts = servers.restarts
        socket.unlink()
        assert servers.wait_restarts(restarts, TIMEOUT), f"{socket} was not served again"
        wait_for(socket.exists, TIMEOUT, f"{socket} to exist again")
    with rig.channel(rig.registration_socket) as channel:
        assert rig.registration(channel).GetInfo(reg_pb2.InfoRequest(), timeout=TIMEOUT).name == dra.DRIVER
    with rig.channel(rig.dra_socket) as channel:
        response = rig.plugin_v1(channel).NodeUnprepareResources(
            v1_pb2.NodeUnprepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace="default", name="x", uid=CLAIM_UID)]
            ),
            timeout=TIMEOUT,
        )
        assert response.claims[CLAIM_UID].error == ""


def test_rolling_update_names_let_two_instances_serve_side_by_side(rig: DraRig) -> None:
    rig.start("--dra-rolling-update-uid", "pod-a")
    rig.start("--dra-rolling-update-uid", "pod-b")
    for uid in ("pod-a", "pod-b"):
        registration = rig.registry_dir / f"{dra.DRIVER}-{uid}-reg.sock"
        with rig.channel(registration) as channel:
            info = rig.registration(channel).GetInfo(reg_pb2.InfoRequest(), timeout=TIMEOUT)
        assert info.endpoint == str(rig.plugins_dir / dra.DRIVER / f"dra-{uid}.sock")
    rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "one slice for both instances")


# --- the ResourceSlice ---------------------------------------------------------------------------------


def test_the_node_publishes_one_slice_with_a_device_per_gpu(rig: DraRig) -> None:
    rig.start()
    found = rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "the node's slice")
    node_uid = rig.node_object()["metadata"]["uid"]
    assert found["metadata"]["name"].startswith(f"{NODE}-{dra.DRIVER}-")
    assert found["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    spec = found["spec"]
    assert spec["driver"] == dra.DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert device_names(found) == [dra.device_name(g.minor) for g in INVENTORY.gpus]
    first = spec["devices"][0]
    assert first["allowMultipleAllocations"] is True
    assert first["attributes"]["uuid"] == {"string": INVENTORY.gpus[0].uuid}
    assert first["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert first["capacity"]["memory"]["value"] == "80Gi"
    assert rig.servers.serving


def test_a_deleted_slice_is_published_again(rig: DraRig) -> None:
    rig.start()
    first = rig.wait_slice(lambda s: True, "the node's slice")
    code, _ = http(rig.base_url, "DELETE", f"{SLICES}/{first['metadata']['name']}")
    assert code == 200
    again = rig.wait_slice(lambda s: s["metadata"]["name"] != first["metadata"]["name"], "a new slice")
    assert device_names(again) == device_names(first)


def test_a_restarted_daemon_keeps_its_slice_and_removes_duplicates(rig: DraRig) -> None:
    rig.start()
    first = rig.wait_slice(lambda s: True, "the node's slice")
    rig.stop_daemon()
    duplicate = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{NODE}-{dra.DRIVER}-"},
        "spec": {**first["spec"], "pool": {**first["spec"]["pool"], "generation": 1}},
    }
    code, created = http(rig.base_url, "POST", SLICES, duplicate)
    assert code == 201, created
    rig.start()
    kept = rig.wait_slice(lambda s: True, "one slice again")
    assert kept["metadata"]["name"] in (first["metadata"]["name"], created["metadata"]["name"])
    assert device_names(kept) == device_names(first)


def test_an_xid_taints_the_device_and_recovery_removes_the_taint(rig: DraRig) -> None:
    rig.start("--health-recovery-seconds", "1")
    rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "the node's slice")
    gpu = INVENTORY.gpus[1]
    device = dra.device_name(gpu.minor)
    with rig.channel(rig.dra_socket) as channel:
        stream = rig.health(channel).NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), timeout=60.0)
        try:
            first = next(stream)
            assert {d.device.device_name: d.health for d in first.devices} == {
                dra.device_name(g.minor): health_pb2.HEALTHY for g in INVENTORY.gpus
            }
            assert {d.device.pool_name for d in first.devices} == {NODE}
            generation = rig.slices()[0]["spec"]["pool"]["generation"]
            rig.emit_xid("x1", gpu.uuid, 79)
            tainted = rig.wait_slice(lambda s: taints_of(s)[device] != [], "the Xid's taint")
            (taint,) = taints_of(tainted)[device]
            assert taint["key"] == f"{dra.DRIVER}/unhealthy" and taint["value"] == "xid-79"
            assert taint["effect"] == "NoSchedule" and taint["timeAdded"]
            assert tainted["spec"]["pool"]["generation"] > generation
            report = next(r for r in stream if any(d.health == health_pb2.UNHEALTHY for d in r.devices))
            bad = [d for d in report.devices if d.health == health_pb2.UNHEALTHY]
            assert [(d.device.device_name, d.message) for d in bad] == [(device, "xid-79")]
            rig.wait_slice(lambda s: taints_of(s)[device] == [], "the taint to go on recovery")
            healed = next(r for r in stream if all(d.health == health_pb2.HEALTHY for d in r.devices))
            assert len(healed.devices) == 2
        finally:
            stream.cancel()


def test_nvml_failing_taints_every_device_until_it_answers_again(rig: DraRig) -> None:
    rig.start()
    rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "the node's slice")
    rig.set_nvml(NvmlMode.FAILING)
    fenced = rig.wait_slice(lambda s: all(taints_of(s).values()), "every device tainted")
    assert {t[0]["value"] for t in taints_of(fenced).values()} == {"nvml-failing"}
    rig.set_nvml(NvmlMode.OK)
    rig.wait_slice(
        lambda s: not any(taints_of(s).values()), "the taints to go when NVML answers", timeout=40.0
    )


def test_no_execute_is_the_taint_effect_when_configured(rig: DraRig) -> None:
    rig.start("--dra-taint-effect", "NoExecute")
    rig.emit_xid("x1", INVENTORY.gpus[0].uuid, 48)
    device = dra.device_name(INVENTORY.gpus[0].minor)
    found = rig.wait_slice(lambda s: taints_of(s)[device] != [], "the Xid's taint")
    assert taints_of(found)[device][0]["effect"] == "NoExecute"


def test_the_device_plugin_annotations_are_removed_so_the_extender_skips_the_node(
    apiserver: ApiServerHandle,
) -> None:
    stale = {ann.NODE_REGISTER: "[]", ann.NODE_PAIR_SCORE: "[]", "other": "kept"}
    for rig in make_dra_rig("dra-n2", apiserver.kubeconfig, apiserver.base_url, INVENTORY, annotations=stale):
        rig.start()
        rig.wait_slice(lambda s: True, "the node's slice")
        assert rig.node_object()["metadata"]["annotations"] == {"other": "kept"}


def test_a_cluster_without_consumable_capacity_gets_whole_gpus_and_is_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami_node.dra.publisher")
    gates = FeatureGates.parse("DRAConsumableCapacity=false")
    with ApiServerRunner(feature_gates=gates) as runner:
        kubeconfig = runner.write_kubeconfig(tmp_path / "kubeconfig")
        for rig in make_dra_rig("dra-n3", kubeconfig, runner.base_url, INVENTORY):
            rig.start()

            def told() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "no DRA consumable capacity" in r.getMessage()]

            wait_for(told, TIMEOUT, "the warning about consumable capacity")
            whole = rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "the whole-GPU slice")
            for device in whole["spec"]["devices"]:
                assert "allowMultipleAllocations" not in device
                assert "requestPolicy" not in device["capacity"]["memory"]

            def events() -> list[dict[str, Any]]:
                code, body = http(runner.base_url, "GET", "/api/v1/namespaces/default/events")
                assert code == 200
                return [e for e in body["items"] if e["reason"] == NO_CONSUMABLE_CAPACITY_REASON]

            (event,) = wait_for(events, TIMEOUT, "the Warning Event on the Node")
            assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
            assert event["involvedObject"]["name"] == "dra-n3"
            assert "DRAConsumableCapacity" in event["message"]
            # Once: the whole-GPU slice matches what is stored, nothing more is written or said.
            rig.emit_xid("x1", INVENTORY.gpus[0].uuid, 79)
            rig.wait_slice(lambda s: taints_of(s)["hami-gpu-0"] != [], "the Xid's taint on the whole GPU")
            assert len(told()) == 1 and len(events()) == 1


# --- NodePrepareResources / NodeUnprepareResources -----------------------------------------------------


def test_prepare_and_unprepare_over_v1_return_cdi_ids_and_share_ids(rig: DraRig) -> None:
    rig.start()
    gpu = INVENTORY.gpus[1]
    device = dra.device_name(gpu.minor)
    uid = create_allocated_claim(
        rig, "c1", [dra_result(device, pool=NODE, share_id="0f0e", memory="4000Mi", cores="30")]
    )
    claim = v1_pb2.Claim(namespace="default", name="c1", uid=uid)
    with rig.channel(rig.dra_socket) as channel:
        stub = rig.plugin_v1(channel)
        response = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45.0)
        entry = response.claims[uid]
        assert entry.error == ""
        (prepared,) = entry.devices
        assert list(prepared.request_names) == ["gpu"]
        assert (prepared.pool_name, prepared.device_name, prepared.share_id) == (NODE, device, "0f0e")
        assert list(prepared.cdi_device_ids) == [f"k8s.gpu.hami.io/claim={uid}-{device}-0f0e"]
        spec_path = rig.cdi_dir / claim_spec_file_name(uid)
        spec = json.loads(spec_path.read_text())
        assert spec["devices"][0]["containerEdits"]["env"] == [
            "CUDA_DEVICE_MEMORY_LIMIT_0=4000m",
            "CUDA_DEVICE_SM_LIMIT_0=30",
            "CUDA_DEVICE_SM_LIMIT=30",
        ]
        again = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45.0)
        assert again == response  # idempotent
        done = stub.NodeUnprepareResources(v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45.0)
        assert done.claims[uid].error == ""
        assert not spec_path.exists()
        assert not (rig.hook_path / "vgpu" / "claims" / uid).exists()


def test_prepare_over_v1beta1_answers_the_same_without_share_ids(rig: DraRig) -> None:
    rig.start()
    device = dra.device_name(INVENTORY.gpus[0].minor)
    uid = create_allocated_claim(
        rig, "c2", [dra_result(device, pool=NODE, share_id="aa", memory="1Gi", cores="5")]
    )
    claim = v1beta1_pb2.Claim(namespace="default", name="c2", uid=uid)
    with rig.channel(rig.dra_socket) as channel:
        stub = rig.plugin_v1beta1(channel)
        response = stub.NodePrepareResources(
            v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45.0
        )
        (prepared,) = response.claims[uid].devices
        assert "share_id" not in v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
        assert list(prepared.cdi_device_ids) == [f"k8s.gpu.hami.io/claim={uid}-{device}-aa"]
        done = stub.NodeUnprepareResources(
            v1beta1_pb2.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45.0
        )
        assert done.claims[uid].error == ""


def test_prepare_answers_every_claim_with_its_own_error(rig: DraRig) -> None:
    rig.start()
    code, created = http(
        rig.base_url,
        "POST",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        resource_claim("pending"),
    )
    assert code == 201, created
    pending = v1_pb2.Claim(namespace="default", name="pending", uid=created["metadata"]["uid"])
    replaced = v1_pb2.Claim(namespace="default", name="pending", uid=OTHER_UID)
    missing = v1_pb2.Claim(namespace="default", name="nowhere", uid=CLAIM_UID)
    with rig.channel(rig.dra_socket) as channel:
        response = rig.plugin_v1(channel).NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(claims=[pending, replaced, missing]), timeout=45.0
        )
    assert set(response.claims) == {pending.uid, OTHER_UID, CLAIM_UID}
    assert response.claims[pending.uid].error == "claim default/pending is not allocated"
    assert response.claims[OTHER_UID].error.startswith("claim default/pending got replaced")
    assert response.claims[CLAIM_UID].error.startswith("claim default/nowhere: cannot read it: 404")


def test_a_claim_prepared_before_a_restart_is_prepared_again_with_the_same_answer(rig: DraRig) -> None:
    rig.start()
    device = dra.device_name(INVENTORY.gpus[0].minor)
    uid = create_allocated_claim(
        rig, "c3", [dra_result(device, pool=NODE, share_id="s", memory="2Gi", cores="20")]
    )
    claim = v1_pb2.Claim(namespace="default", name="c3", uid=uid)
    request = v1_pb2.NodePrepareResourcesRequest(claims=[claim])
    with rig.channel(rig.dra_socket) as channel:
        before = rig.plugin_v1(channel).NodePrepareResources(request, timeout=45.0)
    cache = rig.hook_path / "vgpu" / "claims" / uid / f"{uid}.cache"
    cache.write_bytes(b"HAMi-core region")
    rig.stop_daemon()
    rig.start()
    with rig.channel(rig.dra_socket) as channel:
        after = rig.plugin_v1(channel).NodePrepareResources(request, timeout=45.0)
    assert after == before and after.claims[uid].error == ""
    assert cache.read_bytes() == b"HAMi-core region"


def test_a_new_claims_pod_the_pod_watch_shows_is_not_read_and_one_it_does_not_show_is(
    rig: DraRig, apiserver: ApiServerHandle
) -> None:
    """Issue 29: the pods bound to the node are watched (spec.nodeName), so Prepare of a new claim whose
    pod the watch has shown makes no pod GET; a pod the watch never shows (bound elsewhere) is read."""
    rig.start()
    preparer = rig.servers.preparer
    watched = preparer.watched
    assert watched is not None
    device = dra.device_name(INVENTORY.gpus[0].minor)

    def reserved_claim(claim: str, pod_name: str, node_name: str) -> tuple[v1_pb2.Claim, str]:
        body = pod(
            pod_name,
            container("main", resources=claim_refs("gpu")),
            namespace="default",
            node_name=node_name,
            resourceClaims=[{"name": "gpu", "resourceClaimName": claim}],
        )
        code, made = http(rig.base_url, "POST", "/api/v1/namespaces/default/pods", body)
        assert code == 201, made
        pod_uid: str = made["metadata"]["uid"]
        code, created = http(
            rig.base_url,
            "POST",
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
            resource_claim(claim, namespace="default", node=NODE),
        )
        assert code == 201, created
        status = resource_claim(
            claim,
            results=[dra_result(device, pool=NODE, share_id=claim, memory="1Gi", cores="10")],
            reserved_for=[(pod_name, pod_uid)],
            node=NODE,
        )["status"]
        path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim}/status"
        code, done = http(
            rig.base_url, "PATCH", path, {"status": status}, content_type="application/merge-patch+json"
        )
        assert code == 200, done
        return v1_pb2.Claim(namespace="default", name=claim, uid=created["metadata"]["uid"]), pod_uid

    here, here_pod = reserved_claim("cw", "pw", NODE)
    elsewhere, _ = reserved_claim("ce", "pe", "dra-other-node")
    wait_for(lambda: watched.pod("default", "pw", here_pod) is not None, TIMEOUT, "the pod watch to show pw")
    with rig.channel(rig.dra_socket) as channel:
        stub = rig.plugin_v1(channel)
        for claim, pod_gets, counts in ((here, 0, (1, 0)), (elsewhere, 1, (1, 1))):
            apiserver.runner.reset_counters()
            response = stub.NodePrepareResources(
                v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45.0
            )
            assert response.claims[claim.uid].error == "", claim.name
            counters = apiserver.runner.counters()
            assert counters.get(("get", "pods", ""), 0) == pod_gets, (claim.name, counters)
            assert counters.get(("get", "resourceclaims", ""), 0) == 1, (claim.name, counters)
            assert (preparer.pods_watched, preparer.pods_read) == counts


# --- as a process --------------------------------------------------------------------------------------


def test_hami_node_runs_in_dra_mode_as_a_process_and_cleans_up_on_sigterm(rig: DraRig) -> None:
    log_path = rig.base / "hami-node.log"
    process = NodeDaemonProcess(rig.args(), log_path)
    try:
        rig.wait_slice(lambda s: len(s["spec"]["devices"]) == 2, "the process's slice")
        # Running (signal handlers installed) once it says so.
        wait_for(
            lambda: "in DRA mode" in process.log_text(), TIMEOUT, "hami-node to run", detail=process.describe
        )
        assert rig.registration_socket.exists() and rig.dra_socket.exists()
    finally:
        code = process.stop()  # SIGTERM
    assert code == 0, process.describe()
    assert not rig.registration_socket.exists() and not rig.dra_socket.exists()


def test_a_sigterm_that_another_thread_of_the_daemon_receives_still_stops_it(rig: DraRig) -> None:
    """A process-directed SIGTERM may land on any thread that does not block it (gRPC's, watchdog's);
    Python runs the handler in the main thread only, which the daemon must not block for good
    (python/cpython#85300; seen as a daemon SIGKILLed after ignoring SIGTERM for 15 s, 1 run in 100
    under load). Sent to one other thread with tgkill, it stops the daemon at once, cleanly."""
    process = NodeDaemonProcess(rig.args(), rig.base / "hami-node.log")
    try:
        wait_for(
            lambda: "in DRA mode" in process.log_text(), TIMEOUT, "hami-node to run", detail=process.describe
        )
        pid = process.process.pid
        other = next(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
        assert ctypes.CDLL(None, use_errno=True).tgkill(pid, other, signal.SIGTERM) == 0
        code = process.process.wait(TIMEOUT)
    finally:
        process.stop()
    assert code == 0, process.describe()
    assert not rig.registration_socket.exists() and not rig.dra_socket.exists()


def test_a_configuration_asking_for_both_modes_exits_2_naming_the_setting() -> None:
    result = run_daemon_once("--node-name", "n1", "--mode", "dra", "--resource-name", "nvidia.com/gpu")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "hami-node: configuration: flag --resource-name configures the device plugin"
    )
    assert REPO_ROOT.is_dir()


# --- probes and SIGHUP -------------------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, str]:
    code, body = http(f"http://127.0.0.1:{port}", "GET", path)
    return code, str(body)


def test_the_daemon_is_ready_once_kubelet_registered_it_and_its_slice_is_published(rig: DraRig) -> None:
    daemon = rig.start("--health-bind", "127.0.0.1:0")
    assert daemon.health_endpoint is not None
    port = daemon.health_endpoint.port
    rig.wait_slice(lambda s: True, "the node's slice")
    wait_for(
        lambda: get(port, "/readyz") == (503, "kubelet: not registered with kubelet\n"), TIMEOUT, "unready"
    )
    assert get(port, "/healthz") == (200, "ok\n")
    with rig.channel(rig.registration_socket) as channel:
        rig.registration(channel).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT
        )
    wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), TIMEOUT, "ready")


def test_a_restart_request_serves_both_sockets_anew_for_kubelet_to_register_again(rig: DraRig) -> None:
    rig.start()
    servers = rig.servers
    with rig.channel(rig.registration_socket) as channel:
        rig.registration(channel).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT
        )
    before = {p: socket_identity(p) for p in (rig.registration_socket, rig.dra_socket)}
    restarts = servers.restarts
    servers.request_restart("SIGHUP")
    wait_for(lambda: servers.restarts >= restarts + 2, TIMEOUT, "both sockets served anew")
    assert not servers.registered
    assert all(socket_identity(p) not in (None, identity) for p, identity in before.items())
