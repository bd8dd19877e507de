"""hami-control's metrics with the other vendors (issue 26, hami_control/metrics.py): HAMi's device and vGPU
families carry every vendor's devices and a `vendor` label (`nvidia` for NVIDIA's GPUs, whose series keep
their values, else the vendor's family), a node with only vendor devices is exported, the quota families
carry the vendors' resources, and the fast text renderer still says what the registry scrape says. Hygon
DCU (a legacy inventory) stands for the vendors; the stores are real (ClusterCache built with the
registry's vendors, PodStore, QuotaCache)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami_api import annotations as ann
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig
from hami_control.metrics import MIB, ControlMetrics
from hami_control.pod_store import PodStore
from hami_control.quota_store import ClusterQuotaView, QuotaCache
from tests.builders import (
    Json,
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    node,
    pod,
    resource_quota,
)

CONFIG = ControlConfig()
DCU_REGISTER = "hami.io/node-dcu-register"

Series = dict[str, dict[frozenset[tuple[str, str]], float]]


def dcu_node(name: str, devices: int = 2) -> Json:
    """Node `name` with `devices` Hygon DCUs `<name>-dcu<i>` (index i, 4 slots, 16384 MiB), no NVIDIA GPU."""
    text = "".join(f"{name}-dcu{i},4,16384,100,DCU,0,true,{i},hami-core:" for i in range(devices))
    return node(name, annotations={DCU_REGISTER: text}, allocatable={"hygon.com/dcunum": str(devices * 4)})


def mixed_node(name: str) -> Json:
    """An NVIDIA T4 `<name>-g0` and one DCU `<name>-dcu0` on one node."""
    both = node(name, [gpu_info(0, id=f"{name}-g0", count=4)])
    both["metadata"]["annotations"][DCU_REGISTER] = f"{name}-dcu0,4,16384,100,DCU,0,true,0,hami-core:"
    both["status"]["allocatable"]["hygon.com/dcunum"] = "4"
    return both


def dcu_holder(name: str, where: str, device: str, mem: int, cores: int) -> Json:
    """A Running pod of namespace ml bound to `where` holding `mem` MiB and `cores` % of DCU `device`."""
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": str(mem), "hygon.com/dcucores": str(cores)}
    annotations = {ann.VGPU_NODE: where, "hami.io/dcu-devices-allocated": f"{device},DCU,{mem},{cores}:;"}
    return pod(
        name,
        container("c", limits=limits),
        namespace="ml",
        uid=f"uid-{name}",
        node_name=where,
        phase="Running",
        annotations=annotations,
    )


def stores(*nodes: Json) -> tuple[ClusterCache, PodStore]:
    """The cache as hami-control builds it (with the registry's vendors), its pod store, and `nodes`."""
    cache = ClusterCache(CONFIG.requests.names, CONFIG.registry.vendors)
    for n in nodes:
        cache.node_upserted(n)
    return cache, PodStore(CONFIG, cache)


def parse(body: bytes) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def device(uuid: str, index: int, vendor: str, node: str, **extra: str) -> frozenset[tuple[str, str]]:
    labels = {"zone": "vGPU", "node": node, "device_uuid": uuid, "device_index": str(index), "vendor": vendor}
    return frozenset({**labels, **extra}.items())


def test_a_dcu_nodes_devices_are_hamis_gpu_series_with_vendor_hygon() -> None:
    cache, pods = stores(dcu_node("dcu-1"))
    pods.apply("ADDED", dcu_holder("train", "dcu-1", "dcu-1-dcu1", 6000, 30))
    s = parse(ControlMetrics(cache).render()[0])
    dcu = {"device_type": "DCU"}
    assert s["hami_gpu_memory_limit_bytes"] == {
        device("dcu-1-dcu0", 0, "hygon", "dcu-1", **dcu): 16384 * MIB,
        device("dcu-1-dcu1", 1, "hygon", "dcu-1", **dcu): 16384 * MIB,
    }
    assert s["hami_gpu_shared_count"] == {
        device("dcu-1-dcu0", 0, "hygon", "dcu-1", **dcu): 0,
        device("dcu-1-dcu1", 1, "hygon", "dcu-1", **dcu): 1,
    }
    assert s["hami_gpu_memory_allocated_bytes"][
        device("dcu-1-dcu1", 1, "hygon", "dcu-1", device_cores="100", **dcu)
    ] == (6000 * MIB)
    assert s["hami_gpu_core_allocated_ratio"][device("dcu-1-dcu1", 1, "hygon", "dcu-1", **dcu)] == 30
    assert (
        s["hami_node_gpu_memory_allocated_ratio"][device("dcu-1-dcu1", 1, "hygon", "dcu-1")] == 6000 / 16384
    )
    overview = {"device_cores": "100", "device_memory_limit": "16384", **dcu}
    assert s["hami_node_gpu_overview"][device("dcu-1-dcu1", 1, "hygon", "dcu-1", **overview)] == 6000 * MIB


def test_a_mixed_node_exports_its_gpu_as_nvidia_and_its_dcu_as_hygon() -> None:
    cache, pods = stores(mixed_node("m"))
    nvidia = pod(
        "inf",
        container("c", gpus=1, gpumem=1000),
        uid="uid-inf",
        phase="Running",
        annotations=allocation_annotations(
            "m", allocation([("m-g0", 1000, 10)]), bind_phase=None, keys=(ann.DEVICES_ALLOCATED,)
        ),
    )
    pods.apply("ADDED", nvidia)
    pods.apply("ADDED", dcu_holder("train", "m", "m-dcu0", 2000, 20))
    s = parse(ControlMetrics(cache).render()[0])
    shared = {dict(k)["device_uuid"]: (dict(k)["vendor"], v) for k, v in s["hami_gpu_shared_count"].items()}
    assert shared == {"m-g0": ("nvidia", 1), "m-dcu0": ("hygon", 1)}
    vgpu = {
        (dict(k)["pod"], dict(k)["device_uuid"], dict(k)["vendor"]): v
        for k, v in s["hami_vgpu_memory_allocated_bytes"].items()
    }
    assert vgpu == {("inf", "m-g0", "nvidia"): 1000 * MIB, ("train", "m-dcu0", "hygon"): 2000 * MIB}
    cores = {dict(k)["vendor"]: v for k, v in s["hami_vgpu_core_allocated_ratio"].items()}
    assert cores == {"nvidia": 10, "hygon": 20}


def test_the_quota_families_carry_the_vendors_resources() -> None:
    cache, pods = stores(dcu_node("dcu-1"))
    pods.apply("ADDED", dcu_holder("train", "dcu-1", "dcu-1-dcu0", 6000, 30))
    quotas = QuotaCache(CONFIG)
    quotas.apply("ADDED", resource_quota({"limits.hygon.com/dcumem": "20000"}, namespace="ml"))
    s = parse(ControlMetrics(cache, ClusterQuotaView(pods, quotas)).render()[0])

    def q(name: str, **limit: str) -> frozenset[tuple[str, str]]:
        return frozenset({"zone": "vGPU", "namespace": "ml", "quota_name": name, **limit}.items())

    assert s["hami_resource_quota_used"] == {
        q("nvidia.com/gpumem", limit="0"): 0,
        q("nvidia.com/gpucores", limit="0"): 0,
        q("hygon.com/dcucores", limit="0"): 30,
        q("hygon.com/dcumem", limit="20000"): 6000,
    }
    assert s["hami_resource_quota_limit"] == {q("hygon.com/dcumem"): 20000}


def test_the_text_renderer_says_what_the_registry_scrape_says_with_vendor_devices() -> None:
    cache, pods = stores(mixed_node("m"), dcu_node("dcu-1"))
    pods.apply("ADDED", dcu_holder("train", "dcu-1", "dcu-1-dcu0", 6000, 30))
    quotas = QuotaCache(CONFIG)
    quotas.apply("ADDED", resource_quota({"limits.hygon.com/dcucores": "100"}, namespace="ml"))
    metrics = ControlMetrics(cache, ClusterQuotaView(pods, quotas))
    assert parse(metrics.render()[0]) == parse(generate_latest(metrics.registry))


def test_a_snapshot_holds_the_vendor_devices_of_the_nodes_without_nvidia_gpus() -> None:
    cache, _ = stores(dcu_node("dcu-1"), node("cpu-1"))
    snap = ControlMetrics(cache).snapshot()
    assert snap.nodes == () and [n.name for n in snap.vendor_nodes] == ["dcu-1"]
