"""The other vendors through the control plane (issue 26): the cluster cache decodes each vendor's
inventory, the extender filters, prioritizes and binds a pod asking them (HAMi's per-vendor Fit and
annotations), the pod store counts what such a pod holds, and the webhook runs each vendor's
MutateAdmission. Hygon DCU stands for the vendors with a legacy inventory and handshake; Cambricon for
the ones whose inventory is the node's capacity."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from hami_api.annotations import DEVICES_TO_ALLOCATE, VGPU_NODE
from hami_control.binder import Binder, BindRejected
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, DeviceSettings, FailedNodes
from hami_control.gpu_sinks import InventoryProblems
from hami_control.pod_store import PodStore
from hami_control.quota import QuotaLimits, QuotaUsage, limits_from_resource_quota
from hami_control.scheduling import Extender
from hami_control.webhook import review_pod
from tests.builders import FixedQuota, Json, container, gpu_info, node, pod

CONFIG = ControlConfig()
NO_QUOTA = FixedQuota(QuotaLimits())
DCU_REGISTER = "hami.io/node-dcu-register"


def dcu_node(name: str, devices: int = 2, mem: int = 16384, register: str | None = None) -> Json:
    """Node `name` with `devices` Hygon DCUs `<name>-dcu<i>` (4 slots, `mem` MiB) and no NVIDIA GPU."""
    text = register
    if text is None:
        text = "".join(f"{name}-dcu{i},4,{mem},100,DCU,0,true:" for i in range(devices))
    return node(
        name,
        annotations={DCU_REGISTER: text},
        allocatable={"hygon.com/dcunum": str(devices * 4), "cpu": "8"},
    )


def nvidia_node(name: str) -> Json:
    return node(name, [gpu_info(0, id=f"{name}-g0", count=4, devmem=16000, type="NVIDIA-T4")])


def dcu_pod(name: str = "p", uid: str = "u-1", mem: int = 4000, count: int = 1, **extra: Any) -> Json:
    limits = {"hygon.com/dcunum": str(count), "hygon.com/dcumem": str(mem), "hygon.com/dcucores": "30"}
    return pod(
        name,
        {"name": "c", "image": "rocm", "resources": {"limits": limits}},
        namespace="ns",
        uid=uid,
        **extra,
    )


@dataclass
class Writer:
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    reject: BindRejected | None = None

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.calls.append((name, node, dict(annotations)))
        if self.reject is not None:
            raise self.reject


@dataclass
class Events:
    recorded: list[tuple[str, ...]] = field(default_factory=list)

    def record(self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str) -> None:  # noqa: PLR0917
        self.recorded.append((namespace, name, uid, type_, reason, message))


def service(*nodes: Json, config: ControlConfig = CONFIG) -> tuple[Extender, Writer]:
    cache = ClusterCache(config.requests.names, config.registry.vendors)
    for n in nodes:
        cache.node_upserted(n)
    ext = Extender(config, cache, PodStore(config, cache))
    writer = Writer()
    ext.binder = Binder(ext.cache, ext.pods, writer, Events(), node_lock=lambda _node: None)
    return ext, writer


def body(p: Json, names: list[str]) -> bytes:
    return orjson.dumps({"Pod": p, "NodeNames": names})


def bind_args(p: Json, target: str) -> bytes:
    meta = p["metadata"]
    return orjson.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": target}
    )


def test_the_cache_keeps_a_nodes_dcus_apart_from_its_nvidia_gpus() -> None:
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    cache.node_upserted(dcu_node("d", devices=2))
    devices = cache.vendor_devices("d")
    assert devices is not None and [g.id for g in devices.gpus] == ["d-dcu0", "d-dcu1"]
    assert cache.node_gpus("d") is None  # no NVIDIA GPU: unregistered for NVIDIA pods only


def test_a_malformed_vendor_inventory_leaves_that_vendor_out_and_says_why() -> None:
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    cache.node_upserted(dcu_node("d", register="d-dcu0,4,lots,100,DCU,0,true:"))
    assert cache.vendor_devices("d") is None
    (problem,) = cache.vendor_problems("d")
    assert problem.startswith("hygon: hami.io/node-dcu-register: device 0: devmem 'lots' is not an integer")


def test_a_vendor_whose_plugin_is_not_registered_with_the_kubelet_has_no_devices() -> None:
    n = dcu_node("d")
    n["status"]["allocatable"] = {"cpu": "8"}
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    cache.node_upserted(n)
    assert cache.vendor_devices("d") is None
    assert "status.allocatable['hygon.com/dcunum'] is missing or 0" in cache.vendor_problems("d")[0]


def test_a_dcu_pod_fits_only_the_dcu_node_with_hamis_reason_elsewhere_when_failed_nodes_are_named() -> None:
    always = replace(CONFIG, scheduling=replace(CONFIG.scheduling, failed_nodes=FailedNodes.ALWAYS))
    ext, _ = service(dcu_node("d"), nvidia_node("n"), config=always)
    result = ext.filter(body(dcu_pod(), ["d", "n"]))
    assert result["NodeNames"] == ["d"]
    assert result["FailedAndUnresolvableNodes"] == {"n": "NodeInsufficientDevice"}
    ext, _ = service(dcu_node("d"), nvidia_node("n"))
    result = ext.filter(body(dcu_pod(), ["d", "n"]))
    assert result["NodeNames"] == ["d"]
    assert result["FailedAndUnresolvableNodes"] == {} and result["FailedNodes"] == {}


def test_a_dcu_pod_too_big_for_every_dcu_gets_the_common_fits_text() -> None:
    ext, _ = service(dcu_node("d", devices=2, mem=4000))
    result = ext.filter(body(dcu_pod(mem=8000), ["d"]))
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"d": "2/2 CardInsufficientMemory"}


def test_prioritize_scores_the_busier_dcu_node_higher_under_binpack() -> None:
    ext, _ = service(dcu_node("a"), dcu_node("b"))
    busy = dcu_pod("q", uid="u-q", mem=8000)
    assert ext.filter(body(busy, ["a"]))["NodeNames"] == ["a"]
    assert asyncio.run(ext.bind(bind_args(busy, "a"))) == {"Error": ""}
    scores = {e["Host"]: e["Score"] for e in ext.prioritize(body(dcu_pod(), ["a", "b"]))}
    assert scores["a"] > scores["b"] > 0


def test_a_bound_dcu_pod_carries_hamis_dcu_annotations_and_counts_on_its_device() -> None:
    ext, writer = service(dcu_node("d", devices=1))
    p = dcu_pod(mem=4000)
    assert ext.filter(body(p, ["d"]))["NodeNames"] == ["d"]
    assert asyncio.run(ext.bind(bind_args(p, "d"))) == {"Error": ""}
    (_, target, annotations) = writer.calls[0]
    assert target == "d"
    assert annotations["hami.io/dcu-devices-to-allocate"] == "d-dcu0,DCU,4000,30:;"
    assert annotations["hami.io/dcu-devices-allocated"] == "d-dcu0,DCU,4000,30:;"
    assert annotations[VGPU_NODE] == "d" and DEVICES_TO_ALLOCATE not in annotations
    devices = ext.cache.vendor_devices("d")
    assert devices is not None and (devices.gpus[0].used, devices.gpus[0].usedmem) == (1, 4000)


def test_a_watched_dcu_pod_holds_its_devices_from_its_allocated_annotation() -> None:
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    cache.node_upserted(dcu_node("d", devices=1))
    store = PodStore(CONFIG, cache)
    bound = dcu_pod(
        annotations={VGPU_NODE: "d", "hami.io/dcu-devices-allocated": "d-dcu0,DCU,3000,20:;"}, node_name="d"
    )
    store.apply("ADDED", bound)
    devices = cache.vendor_devices("d")
    assert devices is not None and (devices.gpus[0].used, devices.gpus[0].usedmem) == (1, 3000)
    store.apply("DELETED", bound)
    devices = cache.vendor_devices("d")
    assert devices is not None and devices.gpus[0].used == 0


def test_a_pod_asking_an_nvidia_gpu_and_a_dcu_gets_both_on_a_node_that_has_both() -> None:
    both = nvidia_node("m")
    both["metadata"]["annotations"][DCU_REGISTER] = "m-dcu0,4,16384,100,DCU,0,true:"
    both["status"]["allocatable"]["hygon.com/dcunum"] = "4"
    ext, writer = service(both, dcu_node("d"))
    p = pod(
        "p",
        container("gpu", gpus=1, gpumem=1000),
        {"name": "dcu", "resources": {"limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000"}}},
        namespace="ns",
        uid="u-9",
    )
    result = ext.filter(body(p, ["m", "d"]))
    assert result["NodeNames"] == ["m"]
    assert asyncio.run(ext.bind(bind_args(p, "m"))) == {"Error": ""}
    annotations = writer.calls[0][2]
    assert annotations[DEVICES_TO_ALLOCATE] == "m-g0,NVIDIA,1000,0:;;"
    assert annotations["hami.io/dcu-devices-to-allocate"] == ";m-dcu0,DCU,1000,100:;"


def test_the_webhook_sends_a_dcu_pod_to_hami() -> None:
    decision = review_pod(dcu_pod(), "CREATE", CONFIG, NO_QUOTA)
    assert decision.allowed
    assert {
        "op": "add",
        "path": "/spec/schedulerName",
        "value": CONFIG.webhook.scheduler_name,
    } in decision.patch
    plain = pod("p", {"name": "c", "image": "busybox"}, namespace="ns")
    assert review_pod(plain, "CREATE", CONFIG, NO_QUOTA).patch == ()


def test_an_ascend_mutation_error_is_answered_as_hami_does_with_500_and_its_text() -> None:
    config = ControlConfig(devices=DeviceSettings(enable_ascend=True))
    limits = {"huawei.com/Ascend910B4": "2", "huawei.com/Ascend910B4-memory": "8192"}
    npu = pod("p", {"name": "c", "resources": {"limits": limits}}, namespace="ns")
    decision = review_pod(npu, "CREATE", config, NO_QUOTA)
    assert not decision.allowed
    assert (decision.code, decision.message) == (500, "vNPU not supported for multiple devices")


def test_an_ascend_pod_is_left_to_the_default_scheduler_while_ascend_is_off() -> None:
    limits = {"huawei.com/Ascend910B4": "1"}
    npu = pod("p", {"name": "c", "resources": {"limits": limits}}, namespace="ns")
    decision = review_pod(npu, "CREATE", CONFIG, NO_QUOTA)
    assert decision.allowed and decision.patch == ()


# --- quotas: each vendor's memory and cores, per resource name (HAMi's QuotaManager) --------------------


def test_the_webhook_denies_a_dcu_pod_beyond_its_namespaces_dcu_memory_quota() -> None:
    limits = QuotaLimits(others=(("hygon.com/dcumem", 5000),))
    used = QuotaUsage(others=(("hygon.com/dcumem", 2000),))
    decision = review_pod(dcu_pod(mem=4000), "CREATE", CONFIG, FixedQuota(limits, used))
    assert not decision.allowed and decision.code == 403
    assert decision.message == (
        "namespace ns: hygon.com/dcumem quota exceeded (used 2000 / limit 5000, this pod asks 4000)"
    )
    assert review_pod(dcu_pod(mem=3000), "CREATE", CONFIG, FixedQuota(limits, used)).allowed


def test_a_resource_quota_sets_vendor_limits_with_the_memory_factor() -> None:
    quota = {
        "metadata": {"namespace": "ns", "name": "q"},
        "spec": {"hard": {"limits.hygon.com/dcumem": "6000", "limits.cambricon.com/mlu.smlu.vmemory": "4"}},
    }
    limits = limits_from_resource_quota(quota, CONFIG)
    assert limits.other("hygon.com/dcumem") == 6000  # memoryFactor 1
    assert limits.other("cambricon.com/mlu.smlu.vmemory") == 4 * 256  # Cambricon's factor, as FitQuota


def test_the_pod_store_counts_a_dcu_pods_ask_then_what_it_holds_against_the_quota() -> None:
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    store = PodStore(CONFIG, cache)
    store.apply("ADDED", dcu_pod(mem=4000))
    assert store.used("ns").other("hygon.com/dcumem") == 4000
    assert store.used("ns").other("hygon.com/dcucores") == 30
    bound = dcu_pod(
        mem=4000, annotations={VGPU_NODE: "d", "hami.io/dcu-devices-allocated": "d-dcu0,DCU,3500,20:;"}
    )
    store.apply("MODIFIED", bound)
    assert store.used("ns").other("hygon.com/dcumem") == 3500
    store.apply("DELETED", bound)
    assert store.used("ns").other("hygon.com/dcumem") == 0


# --- prioritize: HAMi's node score with the vendors' ScoreNode -----------------------------------------

ASCEND = ControlConfig(devices=DeviceSettings(enable_ascend=True))


def npu_node(name: str, networks: list[int]) -> Json:
    """Node `name` with one Ascend 910B4 per entry of `networks` (its custominfo NetworkID)."""
    entries = [
        {"id": f"{name}-npu{i}", "index": i, "count": 1, "devmem": 32768, "devcore": 20,
         "type": "Ascend910B4", "health": True, "custominfo": {"NetworkID": net}}
        for i, net in enumerate(networks)
    ]  # fmt: skip
    return node(
        name,
        annotations={"hami.io/node-register-Ascend910B4": orjson.dumps(entries).decode()},
        allocatable={"huawei.com/Ascend910B4": str(len(networks)), "cpu": "8"},
    )


def test_prioritize_adds_ascends_network_score_so_both_npus_on_one_network_win() -> None:
    cache = ClusterCache(ASCEND.requests.names, ASCEND.registry.vendors)
    cache.node_upserted(npu_node("same", [0, 0]))
    cache.node_upserted(npu_node("split", [0, 1]))
    ext = Extender(ASCEND, cache, PodStore(ASCEND, cache))
    npu = pod("p", container("c", limits={"huawei.com/Ascend910B4": "2"}), namespace="ns", uid="u-n")
    assert ext.filter(body(npu, ["same", "split"]))["NodeNames"] == ["same", "split"]
    scores = {e["Host"]: e["Score"] for e in ext.prioritize(body(npu, ["same", "split"]))}
    assert scores["same"] == 10 and scores["split"] < scores["same"]


# --- the node lock the vendors' device plugins find their pod by ---------------------------------------


@dataclass
class Locker:
    locks: list[tuple[str, str, str]] = field(default_factory=list)
    refuse: bool = False

    async def lock(self, node: str, annotation: str, value: str) -> None:
        if self.refuse:
            raise BindRejected(409, "Conflict", "the object has been modified")
        self.locks.append((node, annotation, value))

    async def unlock(self, node: str, annotation: str) -> None:
        self.locks = [lock for lock in self.locks if lock[:2] != (node, annotation)]


def locking_service(*nodes: Json, refuse: bool = False) -> tuple[Extender, Writer, Locker]:
    ext, writer = service(*nodes)
    locker = Locker(refuse=refuse)
    assert ext.binder is not None
    ext.binder = Binder(ext.cache, ext.pods, writer, Events(), node_lock=lambda _node: None, locker=locker)
    return ext, writer, locker


def test_a_dcu_pods_bind_takes_hamis_node_lock_naming_the_pod_before_the_binding() -> None:
    ext, writer, locker = locking_service(dcu_node("d"))
    p = dcu_pod()
    assert ext.filter(body(p, ["d"]))["NodeNames"] == ["d"]
    assert asyncio.run(ext.bind(bind_args(p, "d"))) == {"Error": ""}
    ((target, annotation, value),) = locker.locks
    assert (target, annotation) == ("d", "hami.io/mutex.lock")
    assert value.endswith(",ns,p") and len(writer.calls) == 1
    assert "hami.io/bind-node-lock" not in writer.calls[0][2]  # the lock is there to read and release


def test_a_refused_node_lock_fails_the_bind_and_frees_what_it_reserved() -> None:
    ext, writer, _ = locking_service(dcu_node("d"), refuse=True)
    assert ext.filter(body(dcu_pod(), ["d"]))["NodeNames"] == ["d"]
    answer = asyncio.run(ext.bind(bind_args(dcu_pod(), "d")))
    assert answer["Error"].startswith("cannot lock node d (hami.io/mutex.lock): 409 Conflict")
    assert writer.calls == []
    devices = ext.cache.vendor_devices("d")
    assert devices is not None and all(g.used == 0 for g in devices.gpus)


def test_a_refused_binding_releases_the_node_lock_it_took_as_hamis_release_all_devices_does() -> None:
    ext, writer, locker = locking_service(dcu_node("d"))
    writer.reject = BindRejected(409, "Conflict", "pod ns/p is being deleted")
    assert ext.filter(body(dcu_pod(), ["d"]))["NodeNames"] == ["d"]
    answer = asyncio.run(ext.bind(bind_args(dcu_pod(), "d")))
    assert "was not bound to node d" in answer["Error"] and len(writer.calls) == 1
    assert locker.locks == []


def test_an_nvidia_pod_takes_no_node_lock() -> None:
    ext, writer, locker = locking_service(nvidia_node("n"))
    gpu = pod("p", container("c", gpus=1, gpumem=1000), namespace="ns", uid="u-g")
    assert ext.filter(body(gpu, ["n"]))["NodeNames"] == ["n"]
    assert asyncio.run(ext.bind(bind_args(gpu, "n"))) == {"Error": ""}
    assert locker.locks == [] and len(writer.calls) == 1


def test_a_bad_vendor_inventory_gets_one_warning_event_on_its_node_per_new_problem() -> None:
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    recorded: list[tuple[str, ...]] = []

    class Recorder:
        def record(  # noqa: PLR0917
            self,
            namespace: str,
            name: str,
            uid: str,
            type_: str,
            reason: str,
            message: str,
            *,
            kind: str = "Pod",
        ) -> None:
            recorded.append((kind, name, type_, reason, message))

    hook = InventoryProblems(cache, Recorder())
    bad = dcu_node("d", register="d-dcu0,4,lots,100,DCU,0,true:")
    for _ in range(2):  # the same problem again: no second event
        cache.node_upserted(bad)
        hook("d")
    ((kind, name, type_, reason, message),) = recorded
    assert (kind, name, type_, reason) == ("Node", "d", "Warning", "InvalidDeviceInventory")
    assert message.startswith("hygon: hami.io/node-dcu-register: device 0: devmem 'lots' is not an integer")
    cache.node_upserted(dcu_node("d"))
    hook("d")
    assert len(recorded) == 1 and cache.vendor_devices("d") is not None


def test_a_node_whose_vendor_devices_are_left_out_says_why_to_a_vendor_pod() -> None:
    gone = dcu_node("d")
    gone["status"]["allocatable"] = {"cpu": "8"}
    ext, _ = service(gone, nvidia_node("n"))
    result = ext.filter(body(dcu_pod(), ["d", "n"]))
    assert result["FailedAndUnresolvableNodes"] == {
        "d": "node unregistered: hygon: status.allocatable['hygon.com/dcunum'] is missing or 0 "
        "(its device plugin is not registered with the kubelet)",
        "n": "NodeInsufficientDevice",
    }


def test_a_capacity_vendor_needs_no_allocatable_count_as_hamis_check_health() -> None:
    # Cambricon's dynamic-smlu plugin registers vcore and vmemory, never cambricon.com/vmlu
    capacity = {"cambricon.com/mlu.smlu.vcore": "100", "cambricon.com/mlu.smlu.vmemory": "64"}
    mlu = node("m", capacity=capacity, allocatable={**capacity, "cpu": "8"})
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    cache.node_upserted(mlu)
    devices = cache.vendor_devices("m")
    assert devices is not None and [g.id for g in devices.gpus] == ["m-cambricon-mlu-0"]


# --- Metax sGPU's Fit reads the pods on each device (HAMi's DeviceUsage.PodInfos) -----------------------


def sgpu_node(name: str, devices: int = 1) -> Json:
    entries = [
        {"uuid": f"{name}-{i}", "model": "sgpu", "totalDevCount": 16, "totalCompute": 100, "totalVRam": 32768,
         "numa": 0, "healthy": True, "qosPolicy": "best-effort"}
        for i in range(devices)
    ]  # fmt: skip
    return node(
        name,
        annotations={"metax-tech.com/node-gpu-devices": orjson.dumps(entries).decode()},
        allocatable={"metax-tech.com/sgpu": str(16 * devices), "cpu": "8"},
        capacity={"metax-tech.com/sgpu": str(16 * devices)},
    )


def sgpu_pod(name: str, uid: str, app_class: str | None) -> Json:
    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4", "metax-tech.com/vcore": "20"}
    annotations = {"metax-tech.com/sgpu-qos-policy": "best-effort"}
    if app_class is not None:
        annotations = {"metax-tech.com/sgpu-app-class": app_class}
    return pod(name, container("c", limits=limits), namespace="ns", uid=uid, annotations=annotations)


def test_a_pod_without_app_class_is_kept_off_a_device_running_an_online_pod_as_the_fit_sees_its_pods() -> (
    None
):
    ext, _ = service(sgpu_node("m"))
    online = sgpu_pod("a", "u-a", "online")
    assert ext.filter(body(online, ["m"]))["NodeNames"] == ["m"]
    assert asyncio.run(ext.bind(bind_args(online, "m"))) == {"Error": ""}
    held = ext.cache.device_pods("m")["m-0"]
    assert [p["metadata"]["annotations"]["metax-tech.com/sgpu-app-class"] for p in held] == ["online"]
    result = ext.filter(body(sgpu_pod("b", "u-b", None), ["m"]))
    assert result["FailedNodes"] == {"m": "1/1 CardAppClassMismatch"}


def test_a_placement_s_qos_policy_is_expected_of_its_device_until_the_inventory_shows_it() -> None:
    ext, _ = service(sgpu_node("m"))
    fixed = sgpu_pod("a", "u-a", None)
    fixed["metadata"]["annotations"]["metax-tech.com/sgpu-qos-policy"] = "fixed-share"
    assert ext.filter(body(fixed, ["m"]))["NodeNames"] == ["m"]
    assert asyncio.run(ext.bind(bind_args(fixed, "m"))) == {"Error": ""}
    assert ext.cache.expectations == {"m-0": "fixed-share"}  # HAMi's JitteryQosCache
    assert ext.binder is not None
    ext.binder.window.release("u-a")
    other = ext.filter(body(sgpu_pod("b", "u-b", None), ["m"]))  # best-effort on a fixed-share device
    assert other["FailedNodes"] == {"m": "1/1 CardQosPolicyMismatch"}
    shown = sgpu_node("m")
    shown["metadata"]["annotations"]["metax-tech.com/node-gpu-devices"] = shown["metadata"]["annotations"][
        "metax-tech.com/node-gpu-devices"
    ].replace("best-effort", "fixed-share")
    ext.cache.node_upserted(shown)
    assert ext.cache.expectations == {}
