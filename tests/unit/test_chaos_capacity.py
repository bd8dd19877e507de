"""The chaos report's room check (`hami_sim.chaos.capacity`): for a pod that did not settle, whether the
cluster had room for it at the end (a real loss) or not (a wait), on the device-plugin and DRA paths."""

from __future__ import annotations

from typing import Any

from hami_api import dra
from hami_sim.chaos.capacity import room_for
from hami_sim.chaos.invariants import Snapshot
from tests.builders import (
    allocation,
    allocation_annotations,
    claim_refs,
    container,
    device_class,
    dra_claim,
    dra_result,
    gpu_info,
    gpu_share,
    hami_gpu_device,
    node,
    pod,
    resource_claim,
    resource_slice,
)

Json = dict[str, Any]
A100 = "NVIDIA-A100-SXM4-40GB"


def holding(name: str, *slices: tuple[str, int, int]) -> Json:
    """A Running pod hami-control placed on n1, one container holding `slices`."""
    return pod(
        name,
        container("main", gpus=len(slices)),
        uid=f"uid-{name}",
        namespace="default",
        node_name="n1",
        phase="Running",
        annotations=allocation_annotations("n1", allocation(slices), bind_phase="success"),
    )


def waiting(name: str, *containers: Json, **annotations: str) -> Json:
    return pod(
        name, *containers, uid=f"uid-{name}", namespace="default", phase="Pending", annotations=annotations
    )


def cluster(*pods: Json, **more: Any) -> Snapshot:
    gpus = [gpu_info(0), gpu_info(1, type=A100, devmem=40000)]
    return Snapshot(pods=pods, nodes=more.pop("nodes", [node("n1", gpus)]), **more)


def test_a_whole_gpu_pod_waits_while_every_gpu_holds_a_slice_and_is_a_loss_once_one_is_free() -> None:
    whole = waiting("whole", container("main", gpus=1))
    small = holding("a", ("GPU-0", 1000, 0))
    full = room_for(whole, cluster(whole, small, holding("b", ("GPU-1", 500, 10))))
    assert not full.room and full.detail == "no node had room for 1 GPU x 100% MiB, 0 cores"
    free = room_for(whole, cluster(whole, small))
    assert free.room and free.detail.startswith("n1 had room")
    gone = holding("b", ("GPU-1", 500, 10))
    gone["status"]["phase"] = "Succeeded"  # a pod that ended holds nothing
    assert room_for(whole, cluster(whole, small, gone)).room


def test_all_cores_need_a_gpu_alone_and_pins_and_memory_are_honoured() -> None:
    cores = waiting("cores", container("main", gpus=1, gpumem=1000, gpucores=100))
    zero_core_slices = [holding("a", ("GPU-0", 1000, 0)), holding("b", ("GPU-1", 1000, 0))]
    assert not room_for(cores, cluster(cores, *zero_core_slices)).room
    assert room_for(cores, cluster(cores, zero_core_slices[0])).room
    pinned = waiting("pinned", container("main", gpus=1, gpumem=1000), **{"nvidia.com/use-gputype": "a100"})
    assert not room_for(pinned, cluster(pinned, holding("c", ("GPU-1", 39500, 0)))).room
    assert room_for(pinned, cluster(pinned, holding("c", ("GPU-0", 15000, 0)))).room
    two = waiting("two", container("main", gpus=2, gpumem=2000))
    assert not room_for(two, cluster(two, holding("d", ("GPU-1", 39000, 0)))).room


def test_a_dra_pod_waits_while_each_device_holds_a_share_and_a_missing_claim_is_a_loss() -> None:
    devices = [hami_gpu_device(0, memory_mib=16000), hami_gpu_device(1, memory_mib=16000)]
    whole = dra_claim("c-whole", uid="uid-c-whole", owner_pod={"metadata": {"name": "p", "uid": "uid-p"}})
    p = pod(
        "p",
        container("main", resources=claim_refs("gpu")),
        uid="uid-p",
        namespace="default",
        phase="Pending",
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
    )
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "c-whole"}]

    def share(name: str, device: str) -> Json:
        result = dra_result(device, share_id=f"share-{name}", memory="1000Mi", cores="10")
        return resource_claim(name, uid=f"uid-{name}", results=[result], reserved_for=[(name, f"uid-{name}")])

    def at_end(*claims: Json, own: Json = whole) -> Snapshot:
        slices = [resource_slice("n1", *devices)]
        return cluster(p, nodes=[node("n1")], resource_claims=[own, *claims], resource_slices=slices)

    classes = [device_class()]
    full = room_for(p, at_end(share("s0", dra.device_name(0)), share("s1", dra.device_name(1))), classes)
    assert not full.room and "cannot allocate all claims" in full.detail
    assert room_for(p, at_end(share("s0", dra.device_name(0))), classes).room
    p["status"]["resourceClaimStatuses"] = []
    missing = room_for(p, at_end(), classes)
    assert missing.room and "ResourceClaim not created yet" in missing.detail
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "c-whole"}]
    # a share of a GPU (8000 MiB, 50 cores) still fits beside the two small shares
    sized = dra_claim("c-whole", gpu_share("8000Mi", "50"), uid="uid-c-whole")
    both = (share("s0", dra.device_name(0)), share("s1", dra.device_name(1)))
    assert room_for(p, at_end(*both, own=sized), classes).room
