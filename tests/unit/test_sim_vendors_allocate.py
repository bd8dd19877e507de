"""The vendor stand-ins' Allocate (hami_sim.vendors.allocate), pure: which pod a plugin takes, what one
container gets, what the plugin writes on the pod and when it reports success."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from hami_sim.vendors.allocate import (
    AMD_CU_ALLOCATED,
    AllocateFailed,
    Outcome,
    allocate_container,
    dsmlu_assigned,
    dsmlu_slot,
    is_primary,
    pending_pods,
    pick_pod,
)
from hami_sim.vendors.inventory import Device, node_devices
from hami_sim.vendors.plugin import lock_holder
from hami_sim.vendors.table import DeviceSpec, device_spec
from tests.builders import container, pod

NODE = "n1"
HYGON = device_spec({"vendor": "hygon", "count": 2})
DCU = node_devices(NODE, HYGON)


def bound(
    name: str,
    annotations: Mapping[str, str],
    *containers: Mapping[str, Any],
    phase: str = "allocating",
    bind_time: str = "100",
    node: str = NODE,
    **fields: Any,
) -> dict[str, Any]:
    """A pod hami-control bound to `node`, with the vendor's annotations."""
    notes = {
        "hami.io/vgpu-node": node,
        "hami.io/bind-phase": phase,
        "hami.io/bind-time": bind_time,
        **annotations,
    }
    return pod(
        name,
        *(containers or (container("c"),)),
        namespace="ns",
        uid=f"uid-{name}",
        annotations=notes,
        phase="Pending",
        **fields,
    )


def dcu(i: int, mem: int = 2000, cores: int = 30) -> str:
    return f"{DCU[i].uuid},DCU,{mem},{cores}:"


def hygon_pod(name: str, text: str, **fields: Any) -> dict[str, Any]:
    return bound(
        name, {"hami.io/dcu-devices-to-allocate": text, "hami.io/dcu-devices-allocated": text}, **fields
    )


def allocate(p: Mapping[str, Any], spec: DeviceSpec, devices: tuple[Device, ...], **options: Any) -> Outcome:
    resource = options.pop("resource", spec.count_resource)
    ids = options.pop("device_ids", ("x",))
    return allocate_container(p, NODE, spec, devices, resource=resource, device_ids=ids, **options)


def applied(p: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    p["metadata"]["annotations"].update(outcome.patch)
    return p


# --- which pod ---------------------------------------------------------------------------------------------


def test_a_plugin_takes_the_pod_bound_here_oldest_bind_time_first() -> None:
    old, new = hygon_pod("old", dcu(0) + ";", bind_time="100"), hygon_pod("new", dcu(1) + ";", bind_time="90")
    other_node = hygon_pod("elsewhere", dcu(0) + ";", bind_time="1")
    other_node["metadata"]["annotations"]["hami.io/vgpu-node"] = "n2"
    assert [p["metadata"]["name"] for p in pending_pods([old, new, other_node], NODE, HYGON)] == [
        "new",
        "old",
    ]


def test_the_pod_the_node_lock_names_and_then_a_pod_already_started_come_first() -> None:
    a = hygon_pod("a", dcu(0) + ";", bind_time="1")
    b = hygon_pod("b", dcu(1) + ";", bind_time="2", phase="success")
    c = hygon_pod("c", dcu(1) + ";", bind_time="3")
    assert [p["metadata"]["name"] for p in pending_pods([a, b, c], NODE, HYGON)] == ["b", "a", "c"]
    assert pick_pod([a, b, c], NODE, HYGON, lock_pod="ns/c")["metadata"]["name"] == "c"


@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Running"},
        {"deletion": "2025-01-01T00:00:00Z"},
        {"bind_phase": "failed"},
        {"no_bind_time": True},
        {"to_allocate": ";"},
        {"to_allocate": "not a device string"},
    ],
)
def test_a_pod_without_work_for_the_plugin_is_not_taken(change: Mapping[str, Any]) -> None:
    p = hygon_pod("p", change.get("to_allocate", dcu(0) + ";"), phase=change.get("bind_phase", "allocating"))
    if "phase" in change:
        p["status"]["phase"] = change["phase"]
    if "deletion" in change:
        p["metadata"]["deletionTimestamp"] = change["deletion"]
    if "no_bind_time" in change:
        del p["metadata"]["annotations"]["hami.io/bind-time"]
    assert pending_pods([p], NODE, HYGON) == []
    with pytest.raises(AllocateFailed, match="get pending pod error: no binding pod found on node n1"):
        pick_pod([p], NODE, HYGON)


def test_a_pod_of_another_vendor_is_not_taken() -> None:
    nvidia = bound("gpu", {"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1000,0:;"})
    assert pending_pods([nvidia], NODE, HYGON) == []


def test_hamis_node_lock_value_names_a_pod() -> None:
    assert lock_holder("2025-01-01T00:00:00Z,ns,p") == "ns/p"
    assert lock_holder("2025-01-01T00:00:00Z") == lock_holder(None) == ""


# --- HAMi's protocol ---------------------------------------------------------------------------------------


def test_each_allocate_takes_the_next_container_blanks_it_and_success_comes_with_the_last() -> None:
    p = hygon_pod("p", f"{dcu(0)};{dcu(1, 1000, 10)};")
    p["spec"]["containers"] = [container("a"), container("b")]
    first = allocate(p, HYGON, DCU)
    assert (first.container, first.done, first.success) == ("a", False, False)
    assert first.patch == {"hami.io/dcu-devices-to-allocate": f";{dcu(1, 1000, 10)};"}
    assert [d[0] for d in first.answer.devices] == [
        "/dev/kfd",
        "/dev/mkfd",
        "/dev/dri/card0",
        "/dev/dri/renderD128",
    ]
    second = allocate(applied(p, first), HYGON, DCU)
    assert (second.container, second.done, second.success) == ("b", True, True)
    assert second.patch == {"hami.io/dcu-devices-to-allocate": ";;"}
    assert ("/etc/vdev/docker/", "/usr/local/vgpu/dcu/uid-p_b_1", False) in second.answer.mounts


def test_a_container_given_as_many_kubelet_devices_as_it_has_in_the_annotation_or_allocate_fails() -> None:
    p = hygon_pod("p", dcu(0) + ";")
    with pytest.raises(AllocateFailed, match="device number not matched: annotation has 1, request has 2"):
        allocate(p, HYGON, DCU, device_ids=("x", "y"))


def test_a_device_the_plugin_does_not_have_fails_allocate() -> None:
    p = hygon_pod("p", "DCU-0000,DCU,1,1:;")
    with pytest.raises(AllocateFailed, match="unknown uuid: DCU-0000"):
        allocate(p, HYGON, DCU)


def test_a_pod_that_also_asks_nvidia_gpus_reads_success_once_the_plugins_own_part_is_done() -> None:
    # HAMi's PodAllocationTrySuccess looks at the plugin's own to-allocate annotation only
    p = hygon_pod("p", f";{dcu(0)};")
    p["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-1,NVIDIA,1000,0:;;"
    p["spec"]["containers"] = [container("gpu"), container("dcu")]
    outcome = allocate(p, HYGON, DCU)
    assert (outcome.container, outcome.done, outcome.success) == ("dcu", True, True)


def test_ascend_answers_the_physical_ids_and_the_template_hami_chose() -> None:
    spec = device_spec({"vendor": "ascend", "model": "910B4", "count": 2})
    devices = node_devices(NODE, spec)
    text = f"{devices[1].uuid},Ascend910B4,8192,0:;"
    runtime = json.dumps([{"UUID": devices[1].uuid, "temp": "vir05_1c_8g", "memory": 8192}])
    p = bound(
        "p",
        {
            "hami.io/Ascend910B4-devices-to-allocate": text,
            "hami.io/Ascend910B4-devices-allocated": text,
            "huawei.com/Ascend910B4": runtime,
        },
    )
    outcome = allocate(p, spec, devices)
    assert outcome.answer.envs == {"ASCEND_VISIBLE_DEVICES": "1", "ASCEND_VNPU_SPECS": "vir05_1c_8g"}
    assert outcome.patch == {"hami.io/Ascend910B4-devices-to-allocate": ";"} and outcome.success


def test_ascend_without_its_runtime_annotation_fails_as_the_plugin_does() -> None:
    spec = device_spec({"vendor": "ascend", "model": "910B4"})
    devices = node_devices(NODE, spec)
    p = bound("p", {"hami.io/Ascend910B4-devices-to-allocate": f"{devices[0].uuid},Ascend910B4,8192,0:;"})
    with pytest.raises(AllocateFailed, match=r"annotation huawei\.com/Ascend910B4 not set"):
        allocate(p, spec, devices)


def test_amd_takes_the_first_compute_units_the_nodes_pods_leave_free() -> None:
    spec = device_spec({"vendor": "amd"})
    devices = node_devices(NODE, spec)
    uuid = devices[0].uuid
    text = f"{uuid},AMD Instinct MI300X,4096,10:;"
    holder = bound("holder", {AMD_CU_ALLOCATED: json.dumps({uuid: "0-75"})}, phase="success")
    p = bound("p", {"hami.io/amd-devices-to-allocate": text, "hami.io/amd-devices-allocated": text})
    outcome = allocate(p, spec, devices, node_pods=[holder, p])
    assert outcome.answer.envs == {
        "HSA_CU_MASK": "0:76-85",
        "ROCR_VISIBLE_DEVICES": devices[0].rocr_uuid,
        "HIP_DEVICE_MEMORY_LIMIT": "4096m",
        "LD_AUDIT": "/usr/local/vgpu/libamvgpu.so",
    }
    assert json.loads(outcome.patch[AMD_CU_ALLOCATED]) == {uuid: "76-85"}


def test_amd_compute_units_of_finished_pods_are_free_again() -> None:
    spec = device_spec({"vendor": "amd"})
    devices = node_devices(NODE, spec)
    uuid = devices[0].uuid
    text = f"{uuid},AMD Instinct MI300X,4096,10:;"
    done = bound("done", {AMD_CU_ALLOCATED: json.dumps({uuid: "0-75"})}, phase="success")
    failed = bound("failed", {AMD_CU_ALLOCATED: json.dumps({uuid: "76-90"})}, phase="success")
    done["status"]["phase"], failed["status"]["phase"] = "Succeeded", "Failed"
    p = bound("p", {"hami.io/amd-devices-to-allocate": text, "hami.io/amd-devices-allocated": text})
    outcome = allocate(p, spec, devices, node_pods=[done, failed, p])
    assert json.loads(outcome.patch[AMD_CU_ALLOCATED]) == {uuid: "0-9"}


def test_amd_refuses_more_compute_units_than_are_free() -> None:
    spec = device_spec({"vendor": "amd", "cores": 8})
    devices = node_devices(NODE, spec)
    text = f"{devices[0].uuid},AMD Instinct MI300X,1,9:;"
    p = bound("p", {"hami.io/amd-devices-to-allocate": text})
    with pytest.raises(AllocateFailed, match="insufficient free CUs: need=9 free=8"):
        allocate(p, spec, devices)


def test_biren_answers_the_cards_by_id() -> None:
    spec = device_spec({"vendor": "biren"})
    devices = node_devices(NODE, spec)
    card = devices[0].uuid
    p = bound("p", {"hami.io/Biren-devices-to-allocate": f"{card},Biren,0,0:;"})
    outcome = allocate(p, spec, devices)
    assert outcome.answer.envs == {"BR_PHY_CARDS": card}
    assert outcome.answer.devices == ((f"/dev/biren/{card}", f"/dev/biren/{card}", "rw"),)


# --- the vendors HAMi writes no to-allocate annotation for --------------------------------------------------


def enflame_pod(name: str, containers: Mapping[str, int], **annotations: str) -> dict[str, Any]:
    """A pod as hami-control leaves it for gcushare: a 1g.6gb slice of GCU 1 per container."""
    records = ",".join(
        f'"{c}":{{"allocated":false,"request":1,"profileID":"0","profileName":"1g.6gb"}}'
        for c in sorted(containers)
    )
    notes = {
        "hami.io/enflame-vgpu-devices-allocated": f"{NODE}-enflame-drs-1,Enflame,6144,17:;" * len(containers),
        "enflame.com/gcu-assigned": "false",
        "enflame.com/gcu-assigned-time": "100",
        "enflame.com/gcu-assigned-index": "1",
        "enflame.com/gcu-assigned-minor": "1",
        "assigned-containers": "{" + records + "}",
        **annotations,
    }
    cs = [container(c, limits={"enflame.com/drs-gcu": str(n)}) for c, n in containers.items()]
    return bound(name, notes, *cs)


def test_enflame_takes_the_container_gcushare_matches_and_answers_minor_and_drs_instance() -> None:
    spec = device_spec({"vendor": "enflame", "count": 2})
    devices = node_devices(NODE, spec)
    p = enflame_pod("p", {"a": 2, "b": 1})
    first = allocate(p, spec, devices, device_ids=("x",))
    assert (first.container, first.success) == ("b", False)
    records = json.loads(first.patch["assigned-containers"])
    made = records["b"]["instanceUUID"]
    assert records["b"]["allocated"] is True and records["b"]["instanceID"] == "0"
    assert records["a"] == {"allocated": False, "request": 1, "profileID": "0", "profileName": "1g.6gb"}
    assert first.patch["enflame.com/gcu-assigned"] == "false"
    assert first.answer.envs == {"ENFLAME_VISIBLE_DEVICES": "1", "TOPS_VISIBLE_DEVICES": f"DRS-{made}"}
    assert pending_pods([applied(p, first)], NODE, spec) == [p]
    second = allocate(p, spec, devices, device_ids=("x", "y"), consumed=first.consumed)
    assert (second.container, second.success) == ("a", True)
    assert second.patch["enflame.com/gcu-assigned"] == "true"
    assert json.loads(second.patch["assigned-containers"])["a"]["instanceID"] == "1"
    assert second.patch["assigned-containers"].startswith('{"a":{"allocated":true,"request":1,')
    assert pending_pods([applied(p, second)], NODE, spec) == []


def test_enflame_refuses_a_request_no_open_container_asks_and_a_pod_without_minor() -> None:
    spec = device_spec({"vendor": "enflame"})
    devices = node_devices(NODE, spec)
    with pytest.raises(AllocateFailed, match=r"unable to find pod request enflame.com/drs-gcu: 2"):
        allocate(enflame_pod("p", {"a": 1}), spec, devices, device_ids=("x", "y"))
    with pytest.raises(AllocateFailed, match="has not been assigned device"):
        allocate(enflame_pod("p", {"a": 1}, **{"enflame.com/gcu-assigned-minor": ""}), spec, devices)


def test_enflame_drs_instances_of_live_pods_on_the_gcu_are_not_reused() -> None:
    spec = device_spec({"vendor": "enflame", "count": 2})
    devices = node_devices(NODE, spec)
    held = '{"a":{"allocated":true,"request":1,"profileID":"0","profileName":"1g.6gb","instanceID":"0"}}'
    other = enflame_pod("q", {"a": 1}, **{"assigned-containers": held})
    done = enflame_pod("r", {"a": 1}, **{"assigned-containers": held.replace('"0"}', '"1"}')})
    done["status"]["phase"] = "Succeeded"
    p = enflame_pod("p", {"a": 1})
    outcome = allocate(p, spec, devices, node_pods=[other, done, p])
    assert json.loads(outcome.patch["assigned-containers"])["a"]["instanceID"] == "1"


@pytest.mark.parametrize(
    ("limits", "used", "env"),
    [
        ({"aws.amazon.com/neuroncore": "1"}, 2, {"NEURON_RT_VISIBLE_CORES": "3"}),
        ({"aws.amazon.com/neuroncore": "2"}, 3, {"NEURON_RT_VISIBLE_CORES": "2,3"}),
        ({"aws.amazon.com/neuron": "1"}, 3, {"AWS_NEURON_VISIBLE_DEVICES": "1"}),
    ],
)
def test_aws_neuron_answers_devices_or_cores_as_the_container_asked(
    limits: Mapping[str, str], used: int, env: Mapping[str, str]
) -> None:
    spec = device_spec({"vendor": "awsneuron", "count": 2})
    devices = node_devices(NODE, spec)
    text = f"{NODE}-AWSNeuron-1,AWSNeuron,0,{used}:;"
    p = bound("p", {"hami.io/aws-neuron-devices-allocated": text}, container("c", limits=limits))
    resource = next(iter(limits))
    outcome = allocate(p, spec, devices, resource=resource)
    assert outcome.answer.envs == env
    # AWS's docs: cores come with their devices' nodes (`--device=/dev/neuron1`).
    cores = "NEURON_RT_VISIBLE_CORES" in env
    assert outcome.answer.devices == ((("/dev/neuron1", "/dev/neuron1", "rw"),) if cores else ())
    assert outcome.patch == {"NEURON_ALLOCATED": "true"}


def test_a_resource_that_only_counts_answers_empty_and_takes_no_pod() -> None:
    spec = device_spec({"vendor": "mthreads"})
    assert not is_primary(spec, "mthreads.com/sgpu-memory") and is_primary(spec, "mthreads.com/vgpu")
    outcome = allocate({}, spec, node_devices(NODE, spec), resource="mthreads.com/sgpu-core")
    assert outcome.answer.envs == {} and outcome.patch == {}


# --- Cambricon's dynamic-smlu -------------------------------------------------------------------------------

CAMBRICON = device_spec({"vendor": "cambricon", "count": 2})
SMLU_LIMITS = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "10"}


def smlu_pod(name: str, profile: str = "1_10_20", assigned: str = "false") -> dict[str, Any]:
    notes = {"CAMBRICON_DSMLU_ASSIGNED": assigned, "CAMBRICON_DSMLU_PROFILE": profile}
    return bound(name, notes, container("c", limits=SMLU_LIMITS))


def test_cambricon_takes_the_one_pod_not_yet_assigned_and_answers_its_smlu_instance() -> None:
    p = smlu_pod("p")
    done = smlu_pod("done", assigned="true")
    assert pick_pod([p, done], NODE, CAMBRICON) is p
    outcome = allocate(p, CAMBRICON, node_devices(NODE, CAMBRICON), instance=3)
    assert [d[0] for d in outcome.answer.devices] == [
        "/dev/cambricon_dev1",
        "/dev/cambricon_ipcm1",
        "/dev/cambricon-caps/cap_dev1_mi3",
    ]
    assert dsmlu_assigned(p, 3) == {
        "CAMBRICON_DSMLU_ASSIGNED": "true",
        "CAMBRICON_DSMLU_PROFILE_INSTANCE": "0_769_1_3",
    }


def test_cambricon_refuses_two_candidate_pods_as_its_plugin_does() -> None:
    with pytest.raises(AllocateFailed, match="number of dynamic smlu candidate pods large than one"):
        pick_pod([smlu_pod("a"), smlu_pod("b")], NODE, CAMBRICON)


@pytest.mark.parametrize(
    ("profile", "error"),
    [
        ("1_10", "invalid pod annotation 1_10"),
        ("a_10_20", "invalid pod annotation a_10_20"),
    ],
)
def test_a_bad_dsmlu_profile_fails_allocate(profile: str, error: str) -> None:
    with pytest.raises(AllocateFailed, match=error):
        dsmlu_slot(smlu_pod("p", profile))


def test_a_dsmlu_profile_naming_a_slot_the_node_lacks_fails_allocate() -> None:
    with pytest.raises(AllocateFailed, match="failed GetDeviceUUIDByIndex 5"):
        allocate(smlu_pod("p", "5_10_20"), CAMBRICON, node_devices(NODE, CAMBRICON))
