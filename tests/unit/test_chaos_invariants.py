"""The chaos checker's invariants on synthetic snapshots: a clean cluster has none, and each kind of
violation is found with its evidence (device-plugin and DRA paths, the end-of-run checks)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_node.plugin.api import api_pb2
from hami_sim.chaos import decoding as D
from hami_sim.chaos.checker import read_node_files
from hami_sim.chaos.invariants import NodeFiles, Snapshot, Violation, final_findings, findings
from hami_sim.kubelet import checkpoint as kcp
from hami_sim.kubelet import runtime
from hami_sim.kubelet.dra import checkpoint as dcp
from tests.builders import (
    allocation,
    allocation_annotations,
    claim_refs,
    container,
    dra_result,
    gpu_info,
    gpu_share,
    hami_gpu_device,
    node,
    pod,
    resource_claim,
    resource_quota,
    resource_slice,
)

NOW = 1_800_000_000.0
Json = dict[str, Any]
Slices = Sequence[tuple[str, int, int]]


def two_gpu_node(name: str = "n1", **fields: Any) -> Json:
    return node(name, [gpu_info(0, **fields), gpu_info(1, **fields)])


def placed(
    name: str,
    *containers: Slices,
    init: Sequence[Slices] = (),
    sidecar: bool = False,
    phase: str = "Running",
    bind_phase: str | None = "success",
    bound_at: int = int(NOW) - 10,
    namespace: str = "default",
) -> Json:
    """A pod hami-control placed on n1: one container per `containers` entry (`init` first)."""
    choice = allocation(*init, *containers)
    inits = [
        container(f"init{i}", gpus=max(len(s), 1), restart_policy="Always" if sidecar else None)
        for i, s in enumerate(init)
    ]
    apps = [container(f"c{i}", gpus=max(len(s), 1)) for i, s in enumerate(containers)]
    return pod(
        name,
        *apps,
        init=inits,
        uid=f"uid-{name}",
        namespace=namespace,
        node_name="n1",
        phase=phase,
        annotations=allocation_annotations("n1", choice, bind_phase=bind_phase, bound_at=bound_at),
    )


def started(
    p: Json, ctr: str = "c0", *, gpus: Sequence[str] = (), limits: Sequence[int] = ()
) -> runtime.ContainerRecord:
    env = [f"CUDA_DEVICE_MEMORY_LIMIT_{i}={m}m" for i, m in enumerate(limits)]
    if gpus:
        env.append(f"NVIDIA_VISIBLE_DEVICES={','.join(gpus)}")
    return runtime.ContainerRecord(
        p["metadata"]["uid"], "default", p["metadata"]["name"], ctr, env=tuple(env)
    )


def held(p: Json, ctr: str, *device_ids: str) -> kcp.PodDeviceEntry:
    return kcp.PodDeviceEntry(
        p["metadata"]["uid"], ctr, "nvidia.com/gpu", {-1: device_ids}, api_pb2.ContainerAllocateResponse()
    )


def kubelet_files(
    entries: Sequence[kcp.PodDeviceEntry] = (),
    records: Sequence[runtime.ContainerRecord] = (),
    claims: Sequence[dcp.ClaimInfoState] | None = None,
) -> NodeFiles:
    """The node's files as the stand-in writes them, read back by the checker's decoders."""
    return NodeFiles(
        device_entries=D.decode_device_checkpoint(kcp.encode_checkpoint(entries, {})),
        claim_entries=None if claims is None else D.decode_dra_checkpoint(dcp.encode_checkpoint(claims)),
        containers=D.decode_containers(runtime.encode_containers(records)),
    )


def check(
    *pods: Json, files: NodeFiles | None = None, timeout: float = 300.0, **more: Any
) -> list[Violation]:
    snapshot = Snapshot(
        pods=pods,
        nodes=more.pop("nodes", [two_gpu_node()]),
        kubelet={"n1": files or NodeFiles()},
        wall_time=NOW,
        at=7.0,
        **more,
    )
    return findings(snapshot, bind_timeout_s=timeout)


def kinds(violations: Sequence[Violation]) -> list[tuple[str, str]]:
    """The (kind, subject) of each violation, sorted; every evidence is plain JSON (reports dump it)."""
    for v in violations:
        json.dumps(v.evidence, allow_nan=False)
    return sorted(v.key for v in violations)


# --- clean --------------------------------------------------------------------------------------------------


def test_a_clean_device_plugin_cluster_has_no_violation() -> None:
    a = placed("a", [("GPU-0", 4000, 30)])
    b = placed("b", [("GPU-0", 12000, 70)], [("GPU-1", 16000, 100)])
    files = kubelet_files(
        [held(a, "c0", "GPU-0-3"), held(b, "c0", "GPU-0-1"), held(b, "c1", "GPU-1-0")],
        [
            started(a, gpus=["GPU-0"], limits=[4000]),
            started(b, "c0", gpus=["GPU-0"], limits=[12000]),
            started(b, "c1", gpus=["GPU-1"], limits=[16000]),
        ],
    )
    assert check(a, b, files=files) == []
    assert final_findings(Snapshot(pods=[a, b], kubelet={"n1": files}, wall_time=NOW)) == []


def test_slices_without_cores_set_no_limit_and_take_none() -> None:
    pods = [placed(f"p{i}", [("GPU-0", 1000, 0)]) for i in range(9)]
    assert check(*pods, placed("x", [("GPU-0", 1000, 100)], phase="Succeeded")) == []


def test_a_pod_holds_its_busiest_phase_not_the_sum_of_its_containers() -> None:
    # init 12000 then app 4000 on GPU-0: the pod holds 12000 at most, so 4000 more fit in 16000.
    a = placed("a", [("GPU-0", 4000, 10)], init=[[("GPU-0", 12000, 10)]])
    assert check(a, placed("b", [("GPU-0", 4000, 10)])) == []
    # a sidecar runs beside the app: 12000 + 4000 + 4000 does not fit
    s = placed("s", [("GPU-0", 4000, 10)], init=[[("GPU-0", 12000, 10)]], sidecar=True)
    assert kinds(check(s, placed("b", [("GPU-0", 4000, 10)]))) == [("gpu-memory-overcommit", "n1/GPU-0")]


def test_terminal_pods_hold_nothing() -> None:
    done = placed("done", [("GPU-0", 16000, 100)], phase="Succeeded")
    failed = placed("failed", [("GPU-0", 16000, 100)], phase="Failed")
    assert check(done, failed, placed("a", [("GPU-0", 16000, 100)])) == []


# --- GPUs ---------------------------------------------------------------------------------------------------


def test_memory_over_a_gpu_is_a_violation_with_the_pods_and_numbers() -> None:
    (v,) = check(placed("a", [("GPU-0", 10000, 10)]), placed("b", [("GPU-0", 8000, 10)]))
    assert v.key == ("gpu-memory-overcommit", "n1/GPU-0")
    assert v.at == 7.0
    assert v.evidence["registered"] == {"count": 10, "devmem": 16000, "devcore": 100}
    assert v.evidence["held"] == {"slots": 2, "mem": 18000, "cores": 20}
    assert [p["pod"] for p in v.evidence["pods"]] == ["default/a", "default/b"]
    assert any(ann.NODE_REGISTER in s for s in v.evidence["sources"])


def test_cores_over_a_gpu_are_a_violation() -> None:
    found = check(placed("a", [("GPU-0", 1000, 60)]), placed("b", [("GPU-0", 1000, 50)]))
    assert kinds(found) == [("gpu-cores-overcommit", "n1/GPU-0")]


def test_an_exclusive_slice_shares_its_gpu_with_no_slot() -> None:
    found = check(placed("a", [("GPU-0", 1000, 100)]), placed("b", [("GPU-0", 1000, 0)]))
    assert kinds(found) == [("gpu-cores-overcommit", "n1/GPU-0")]
    assert "exclusive" in found[0].message


def test_slots_over_a_gpu_are_a_violation() -> None:
    found = check(
        placed("a", [("GPU-1", 100, 0)]), placed("b", [("GPU-1", 100, 0)]), nodes=[two_gpu_node(count=1)]
    )
    assert kinds(found) == [("gpu-slots-overcommit", "n1/GPU-1")]


def test_a_gpu_dropped_from_its_node_is_still_held_to_what_it_registered() -> None:
    known = {"GPU-0": ("n1", D.Gpu("GPU-0", 10, 16000, 100))}
    snapshot = Snapshot(
        pods=[placed("a", [("GPU-0", 10000, 0)]), placed("b", [("GPU-0", 10000, 0)])],
        nodes=[node("n1", [])],
        wall_time=NOW,
    )
    assert kinds(findings(snapshot, bind_timeout_s=300, known_gpus=known)) == [
        ("gpu-memory-overcommit", "n1/GPU-0")
    ]


def test_an_undecodable_annotation_is_reported() -> None:
    bad = placed("a", [("GPU-0", 1000, 0)])
    bad["metadata"]["annotations"][ann.DEVICES_ALLOCATED] = "GPU-0,NVIDIA,x,0:;"
    assert kinds(check(bad)) == [("annotation-undecodable", "default/a")]
    assert kinds(check(nodes=[node("n1", register="[{")])) == [("annotation-undecodable", "node/n1")]


# --- containers ---------------------------------------------------------------------------------------------


def test_a_container_on_another_gpu_than_kubelet_recorded_is_a_mismatch() -> None:
    a = placed("a", [("GPU-0", 4000, 30)])
    files = kubelet_files([held(a, "c0", "GPU-1-3")], [started(a, gpus=["GPU-0"], limits=[4000])])
    (v,) = check(a, files=files)
    assert v.key == ("container-gpu-mismatch", "default/a/c0")
    assert v.evidence["kubelet_checkpoint"] == ["GPU-1"]
    assert v.evidence["runtime"] == ["GPU-0"]
    assert v.evidence["annotation"] == ["GPU-0"]


def test_a_memory_limit_other_than_the_annotation_is_a_mismatch() -> None:
    a = placed("a", [("GPU-0", 4000, 30), ("GPU-1", 2000, 30)])
    files = kubelet_files(
        [held(a, "c0", "GPU-0-3", "GPU-1-1")], [started(a, gpus=["GPU-0", "GPU-1"], limits=[4000, 3000])]
    )
    (v,) = check(a, files=files)
    assert v.key == ("container-memory-mismatch", "default/a/c0")
    assert v.evidence["env"] == {"GPU-0": 4000, "GPU-1": 3000}
    assert v.evidence["annotation"] == {"GPU-0": 4000, "GPU-1": 2000}


def test_volume_mounts_and_cdi_names_name_the_gpus_too() -> None:
    a = placed("a", [("GPU-0", 4000, 30)], [("GPU-1", 2000, 30)])
    mounted = runtime.ContainerRecord(
        "uid-a",
        "default",
        "a",
        "c0",
        env=("NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices", "CUDA_DEVICE_MEMORY_LIMIT_0=4000m"),
        mounts=({"containerPath": "/var/run/nvidia-container-devices/GPU-0", "hostPath": "/dev/null"},),
    )
    cdi = runtime.ContainerRecord(
        "uid-a",
        "default",
        "a",
        "c1",
        cdi_devices=("k8s.device-plugin.nvidia.com/gpu=GPU-1",),
        env=("CUDA_DEVICE_MEMORY_LIMIT_0=2000m",),
    )
    files = kubelet_files([held(a, "c0", "GPU-0-0"), held(a, "c1", "GPU-1-0")], [mounted, cdi])
    assert check(a, files=files) == []
    annotated = runtime.ContainerRecord(
        "uid-a",
        "default",
        "a",
        "c1",
        env=("CUDA_DEVICE_MEMORY_LIMIT_0=2000m",),
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": "k8s.device-plugin.nvidia.com/gpu=GPU-1"},
    )
    files = kubelet_files([held(a, "c0", "GPU-0-0"), held(a, "c1", "GPU-1-0")], [mounted, annotated])
    assert check(a, files=files) == []


def test_containers_the_runtime_has_not_started_are_not_compared() -> None:
    a = placed("a", [("GPU-0", 4000, 30)])
    assert check(a, files=kubelet_files([held(a, "c0", "GPU-1-3")], [])) == []


# --- bind ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("age", "stuck"), [(400, True), (100, False)])
def test_a_pod_allocating_past_the_bind_timeout_is_stuck(age: int, stuck: bool) -> None:
    a = placed("a", [("GPU-0", 4000, 30)], phase="Pending", bind_phase="allocating", bound_at=int(NOW) - age)
    found = check(a)
    assert kinds(found) == ([("bind-phase-stuck", "default/a")] if stuck else [])
    if stuck:
        assert found[0].evidence["bind_time"] == int(NOW) - age


def test_a_bound_gpu_pod_without_allocation_annotations_is_a_violation() -> None:
    bare = pod(
        "bare",
        container(gpus=1, gpumem=1000),
        namespace="default",
        uid="uid-bare",
        node_name="n1",
        phase="Pending",
    )
    assert kinds(check(bare)) == [("bound-without-allocation", "default/bare")]
    cpu_only = pod("cpu", container(), uid="uid-cpu", node_name="n1", phase="Running")
    rejected = pod("rej", container(gpus=1), uid="uid-rej", node_name="n1", phase="Failed")
    assert check(cpu_only, rejected) == []


# --- quotas -------------------------------------------------------------------------------------------------


def test_live_pods_over_a_namespace_quota_are_a_violation() -> None:
    quota = resource_quota(
        {"limits.nvidia.com/gpumem": "6000", "limits.nvidia.com/gpucores": "100"}, namespace="t"
    )
    a = placed("a", [("GPU-0", 4000, 30)], namespace="t")
    b = placed("b", [("GPU-1", 4000, 30)], namespace="t")
    other = placed("o", [("GPU-1", 4000, 30)])
    (v,) = check(a, b, other, resource_quotas=[quota])
    assert v.key == ("quota-exceeded", "t/limits.nvidia.com/gpumem")
    assert (v.evidence["limit"], v.evidence["used"]) == (6000, 8000)
    # an init container counts at its peak, not on top of the app containers
    c = placed("c", [("GPU-0", 3000, 30)], init=[[("GPU-0", 6000, 30)]], namespace="t")
    assert check(c, resource_quotas=[quota]) == []


# --- DRA ----------------------------------------------------------------------------------------------------

DEVICES = [
    hami_gpu_device(0, memory_mib=16000, pcieBusID={"string": "0000:02:00.0"}),
    hami_gpu_device(1, memory_mib=16000, pcieBusID={"string": "0000:01:00.0"}),
]


def dra_pod(name: str, *claims: str) -> Json:
    return pod(
        name,
        container("main", resources=claim_refs(*claims)),
        uid=f"uid-{name}",
        namespace="default",
        node_name="n1",
        phase="Running",
        resourceClaims=[{"name": c, "resourceClaimName": c} for c in claims],
    )


def claimed(name: str, *results: Json, owner: str | None = None, uid: str = "") -> Json:
    return resource_claim(
        name,
        uid=uid or f"claim-{name}",
        results=list(results),
        reserved_for=[(owner, f"uid-{owner}")] if owner else [],
        owner_pod=(owner, f"uid-{owner}") if owner else None,
    )


def prepared(name: str, owner: str, *devices: str) -> dcp.ClaimInfoState:
    return dcp.ClaimInfoState(
        f"claim-{name}",
        name,
        "default",
        {f"uid-{owner}"},
        {"hami-core-gpu.project-hami.io": tuple(dcp.PreparedDevice("n1", d) for d in devices)},
    )


def dra_started(p: Json, minors: Sequence[int], limits: Sequence[int]) -> runtime.ContainerRecord:
    return runtime.ContainerRecord(
        p["metadata"]["uid"],
        "default",
        p["metadata"]["name"],
        "main",
        env=tuple(f"CUDA_DEVICE_MEMORY_LIMIT_{i}={m}m" for i, m in enumerate(limits)),
        device_nodes=tuple({"path": f"/dev/nvidia{m}", "hostPath": f"/dev/nvidia{m}"} for m in minors),
    )


def dra_check(
    pods: Sequence[Json], claims: Sequence[Json], files: NodeFiles | None = None
) -> list[Violation]:
    return check(*pods, files=files, resource_claims=claims, resource_slices=[resource_slice("n1", *DEVICES)])


def test_a_clean_dra_cluster_has_no_violation() -> None:
    a, b = dra_pod("a", "ca"), dra_pod("b", "cb")
    ca = claimed(
        "ca",
        dra_result("hami-gpu-0", memory="4000Mi", cores="30"),
        dra_result("hami-gpu-1", memory="2000Mi", cores="30"),
        owner="a",
    )
    cb = claimed("cb", dra_result("hami-gpu-0", memory="12000Mi", cores="70"), owner="b")
    files = kubelet_files(
        records=[dra_started(a, [0, 1], [2000, 4000]), dra_started(b, [0], [12000])],
        claims=[prepared("ca", "a", "hami-gpu-0", "hami-gpu-1"), prepared("cb", "b", "hami-gpu-0")],
    )
    # GPU 1 comes first on the PCI bus, so CUDA index 0 is hami-gpu-1
    assert dra_check([a, b], [ca, cb], files) == []


def test_dra_claims_over_a_device_are_a_violation() -> None:
    ca = claimed("ca", dra_result("hami-gpu-0", memory="10000Mi", cores="60"))
    cb = claimed("cb", dra_result("hami-gpu-0", memory="8000Mi", cores="50"))
    found = dra_check([], [ca, cb])
    assert kinds(found) == [
        ("gpu-cores-overcommit", "n1/hami-gpu-0"),
        ("gpu-memory-overcommit", "n1/hami-gpu-0"),
    ]
    assert found[0].evidence["held"]["claims"] == 2


def test_a_whole_device_allocated_twice_is_a_violation() -> None:
    exclusive = [hami_gpu_device(0, memory_mib=16000, shareable=False)]
    claims = [claimed("ca", dra_result("hami-gpu-0")), claimed("cb", dra_result("hami-gpu-0"))]
    found = check(resource_claims=claims, resource_slices=[resource_slice("n1", *exclusive)])
    assert ("gpu-slots-overcommit", "n1/hami-gpu-0") in kinds(found)


def test_a_dra_container_on_another_device_than_its_claim_is_a_mismatch() -> None:
    a = dra_pod("a", "ca")
    ca = claimed("ca", dra_result("hami-gpu-0", memory="4000Mi", cores="30"), owner="a")
    files = kubelet_files(records=[dra_started(a, [1], [4000])], claims=[prepared("ca", "a", "hami-gpu-0")])
    (v,) = dra_check([a], [ca], files)
    assert v.key == ("container-gpu-mismatch", "default/a/main")
    assert v.evidence["runtime"] == [["n1", "hami-gpu-1"]]
    assert v.evidence["claim_allocation"] == [["n1", "hami-gpu-0"]]
    files = kubelet_files(records=[dra_started(a, [0], [5000])], claims=[prepared("ca", "a", "hami-gpu-0")])
    assert kinds(dra_check([a], [ca], files)) == [("container-memory-mismatch", "default/a/main")]


def test_dra_pods_count_what_their_claims_ask_against_the_quota() -> None:
    quota = resource_quota({"limits.nvidia.com/gpumem": "6000"}, namespace="default")
    a, b = dra_pod("a", "ca"), dra_pod("b", "cb")
    ca = claimed("ca", dra_result("hami-gpu-0", memory="4000Mi", cores="30"), owner="a")
    cb = claimed("cb", dra_result("hami-gpu-1", memory="4000Mi", cores="30"), owner="b")
    for claim in (ca, cb):
        claim["spec"]["devices"]["requests"] = [gpu_share("4000Mi", "30")]
    slices = [resource_slice("n1", *DEVICES)]
    found = check(a, b, resource_claims=[ca, cb], resource_slices=slices, resource_quotas=[quota])
    assert kinds(found) == [("quota-exceeded", "default/limits.nvidia.com/gpumem")]
    assert found[0].evidence["used"] == 8000
    # a whole GPU asks no memory: it counts 0 MiB, as hami-control counts a translated whole-GPU pod
    whole = claimed("cb", dra_result("hami-gpu-1", memory="16000Mi", cores="100"), owner="b")
    assert check(a, b, resource_claims=[ca, whole], resource_slices=slices, resource_quotas=[quota]) == []


# --- files --------------------------------------------------------------------------------------------------


def test_an_unreadable_state_file_is_reported() -> None:
    files = NodeFiles(errors={"containers.json": "not JSON"})
    assert kinds(check(files=files)) == [("state-unreadable", "n1/containers.json")]


def test_a_container_starting_or_stopping_while_its_node_is_read_is_left_to_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: a container that starts between the checker's reads of the checkpoint and of
    containers.json showed without its devices (`container-gpu-mismatch`, kubelet recorded []); the
    reader keeps only containers both reads of containers.json show, and a lasting mismatch stays found."""
    a = placed("a", [("GPU-0", 4000, 30)])
    entry, record = held(a, "c0", "GPU-0-1"), started(a, gpus=["GPU-0"], limits=[4000])

    def kubelet_writes(
        entries: Sequence[kcp.PodDeviceEntry], records: Sequence[runtime.ContainerRecord]
    ) -> None:
        (tmp_path / "kubelet_internal_checkpoint").write_bytes(kcp.encode_checkpoint(entries, {}))
        (tmp_path / "containers.json").write_bytes(runtime.encode_containers(records))

    after_reading: dict[str, list[Callable[[], None]]] = {}
    read_bytes = Path.read_bytes

    def read_then_act(path: Path) -> bytes:
        data = read_bytes(path)
        for act in after_reading.pop(path.name, []):
            act()
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_act)
    kubelet_writes([], [])
    # kubelet records the devices, then the runtime starts the container, right after the checkpoint read
    after_reading["kubelet_internal_checkpoint"] = [
        lambda: kubelet_writes([entry], []),
        lambda: kubelet_writes([entry], [record]),
    ]
    starting = read_node_files(tmp_path)
    assert starting.containers == () and check(a, files=starting) == []
    running = read_node_files(tmp_path)
    assert running.containers is not None and len(running.containers) == 1
    assert check(a, files=running) == []
    # the runtime stops it, then kubelet frees the devices, right after the first read of containers.json
    after_reading["containers.json"] = [lambda: kubelet_writes([entry], []), lambda: kubelet_writes([], [])]
    stopping = read_node_files(tmp_path)
    assert stopping.containers == () and check(a, files=stopping) == []
    kubelet_writes([], [record])
    assert kinds(check(a, files=read_node_files(tmp_path))) == [("container-gpu-mismatch", "default/a/c0")]


# --- the end of a run ---------------------------------------------------------------------------------------


def final(*pods: Json, events: Sequence[Mapping[str, Any]] = (), **more: Any) -> list[tuple[str, str]]:
    return kinds(final_findings(Snapshot(pods=pods, events=events, wall_time=NOW, **more)))


def test_a_pod_ending_pending_or_failed_needs_a_reason_a_person_can_act_on() -> None:
    pending = pod("pending", namespace="default", uid="u1", phase="Pending")
    assert final(pending) == [("pod-not-settled", "default/pending")]
    unschedulable = pod("pending", namespace="default", uid="u1", phase="Pending")
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes fit"}
    ]
    assert final(unschedulable) == []
    event = {
        "involvedObject": {"kind": "Pod", "uid": "u1"},
        "reason": "FailedScheduling",
        "message": "no GPU",
    }
    assert final(pending, events=[event]) == []
    rejected = pod("rej", namespace="default", uid="u2", phase="Failed")
    assert final(rejected) == [("pod-not-settled", "default/rej")]
    rejected["status"].update(reason="UnexpectedAdmissionError", message="Allocate failed")
    assert final(rejected) == []


def test_a_pod_left_in_a_bind_phase_is_a_violation() -> None:
    a = placed("a", [("GPU-0", 4000, 30)], bind_phase="allocating")
    assert final(a) == [("pod-in-bind-phase", "default/a")]
    rejected = placed("r", [("GPU-0", 4000, 30)], bind_phase="allocating", phase="Failed")
    rejected["status"].update(
        reason="UnexpectedAdmissionError", message="Allocate failed: no healthy devices"
    )
    assert final(rejected) == []


def test_allocations_left_for_a_gone_pod_are_leaks() -> None:
    gone = placed("gone", [("GPU-0", 4000, 30)])
    files = kubelet_files(
        [held(gone, "c0", "GPU-0-1")],
        [started(gone, gpus=["GPU-0"], limits=[4000])],
        claims=[prepared("cg", "gone", "hami-gpu-0")],
    )
    claim = claimed("cg", dra_result("hami-gpu-0"), owner="gone")
    assert final(kubelet={"n1": files}, resource_claims=[claim]) == [
        ("allocation-leaked", "claim/default/cg/uid-gone"),
        ("allocation-leaked", "n1/containers.json/uid-gone"),
        ("allocation-leaked", "n1/dra_manager_state/uid-gone"),
        ("allocation-leaked", "n1/kubelet_internal_checkpoint/uid-gone"),
    ]
    assert final(gone, kubelet={"n1": files}, resource_claims=[claim]) == []
