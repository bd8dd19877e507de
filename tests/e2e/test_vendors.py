"""End to end on `hami-sim` with a node of every accelerator HAMi shares besides NVIDIA (issue 26): one
local cluster (scale mode: all kubelets in one process, the vendor device-plugin stand-ins and the one
hami-node in another), one small node per vendor served by its stand-in (hami_sim.vendors), and a node
with a Hygon DCU and an NVIDIA GPU. For each vendor a pod asking it, created with the official client,
runs on its node, and:

- its annotations are HAMi v2.10's, byte for byte (written by hami-control on the Binding, then by the
  vendor's plugin: to-allocate blanked, markers flipped, `hami.io/bind-phase: success`);
- the container got what that vendor's plugin answers Allocate with (the kubelet stand-in's runtime
  record, `containers.json`);
- the kubelet's checkpoint holds as many of the plugin's advertised devices as the container asked.

Plus pods asking NVIDIA and Hygon (two containers, the Hygon one first; one container asking both), and
a pod of a vendor hami-control leaves out (an Ascend chip missing from the device config) staying with
the default scheduler.

Cambricon's dynamic-smlu plugin registers `cambricon.com/real-mlu-counts`, `.../mlu.smlu.vcore` and
`.../mlu.smlu.vmemory`, never `cambricon.com/vmlu`: hami-control reads its devices from the capacity and,
as HAMi's CheckHealth for MLU, asks nothing else of the node.

Cost (measured with /usr/bin/time around `pytest -n 0` of this module, every process of the cluster
included): about 5.6 s of CPU and 12-14 s of wall time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, uuid5

import pytest
import yaml

from hami_api.annotations import BIND_PHASE, BIND_TIME, VGPU_NODE
from hami_node.gpu.inventory import load_inventory
from hami_sim.cluster import Cluster, ClusterSpec
from hami_sim.cluster.spec import parse_inventory_spec
from hami_sim.kubelet import read_checkpoint, read_containers
from hami_sim.kubelet.runtime import ContainerRecord
from hami_sim.vendors.inventory import Device, advertised, node_devices
from hami_sim.vendors.table import device_spec
from tests.builders import container, pod
from tests.e2e.e2e_util import core_v1
from tests.waiting import wait_pod

MIXED = "mix-1"
ENFLAME_DRS_UUID = str(uuid5(NAMESPACE_URL, "hami-sim/enflame-drs/gcu-1/0/0"))
NODES: Mapping[str, Mapping[str, Any]] = {
    "dcu-1": {"vendor": "hygon"},
    "npu-1": {"vendor": "ascend", "model": "910B4"},
    "mlu-1": {"vendor": "cambricon"},
    "ix-1": {"vendor": "iluvatar", "model": "MR-V100"},
    "mx-1": {"vendor": "metax"},
    "mt-1": {"vendor": "mthreads"},
    "gcu-1": {"vendor": "enflame"},
    "xpu-1": {"vendor": "kunlun"},
    "inf-1": {"vendor": "awsneuron"},
    "amd-1": {"vendor": "amd"},
    "va-1": {"vendor": "vastai"},
    "br-1": {"vendor": "biren"},
    MIXED: {"vendor": "hygon", "nvidia": {"count": 1, "model": "NVIDIA A100-SXM4-40GB"}},
}
DISABLED = "huawei.com/Ascend910A"
"""A resource of an Ascend chip the cluster's device config leaves out."""


def device(node: str) -> Device:
    """The node's first (only) device as its stand-in made it."""
    data = {k: v for k, v in NODES[node].items() if k != "nvidia"}
    return node_devices(node, device_spec(data))[0]


def advertised_ids(node: str) -> dict[str, tuple[str, ...]]:
    spec = device_spec({k: v for k, v in NODES[node].items() if k != "nvidia"})
    return advertised(spec, node_devices(node, spec))


@dataclass(frozen=True)
class Case:
    """A pod asking one vendor on its node, and what it must end with."""

    node: str
    limits: Mapping[str, int]
    annotations: Callable[[Device], Mapping[str, str]]
    """The vendor's annotations, exactly (besides `hami.io/vgpu-node`, bind-phase and bind-time)."""
    env: Callable[[Device], Mapping[str, str]]
    devices: Callable[[Device], tuple[str, ...]] = lambda d: ()
    """Device nodes the container must have."""
    checkpoint: Mapping[str, int] = field(default_factory=dict)
    """Resource -> devices the kubelet's checkpoint holds for the container."""
    present: tuple[str, ...] = ()
    """Annotations whose value is a time (present, digits)."""

    @property
    def pod(self) -> str:
        return f"p-{self.node}"


CASES: dict[str, Case] = {
    "hygon": Case(
        "dcu-1",
        {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 30},
        lambda d: {
            "hami.io/dcu-devices-to-allocate": ";",
            "hami.io/dcu-devices-allocated": f"{d.uuid},DCU,2000,30:;",
        },
        lambda d: {},
        lambda d: ("/dev/kfd", "/dev/mkfd", "/dev/dri/card0", "/dev/dri/renderD128"),
        {"hygon.com/dcunum": 1},
    ),
    "ascend": Case(
        "npu-1",
        {"huawei.com/Ascend910B4": 1, "huawei.com/Ascend910B4-memory": 2000},
        lambda d: {
            "hami.io/Ascend910B4-devices-to-allocate": ";",
            "hami.io/Ascend910B4-devices-allocated": f"{d.uuid},Ascend910B4,8192,0:;",
            "huawei.com/Ascend910B4": json.dumps(
                [{"UUID": d.uuid, "temp": "vir05_1c_8g", "memory": 8192}], separators=(",", ":")
            ),
        },
        lambda d: {"ASCEND_VISIBLE_DEVICES": "0", "ASCEND_VNPU_SPECS": "vir05_1c_8g"},
        checkpoint={"huawei.com/Ascend910B4": 1},
        present=("predicate-time",),
    ),
    "cambricon": Case(
        "mlu-1",
        {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 20, "cambricon.com/mlu.smlu.vcore": 10},
        lambda d: {
            "hami.io/cambricon-mlu-devices-to-allocate": "mlu-1-cambricon-mlu-0,MLU,5120,10:;",
            "hami.io/cambricon-mlu-devices-allocated": "mlu-1-cambricon-mlu-0,MLU,5120,10:;",
            "CAMBRICON_DSMLU_ASSIGNED": "true",
            "CAMBRICON_DSMLU_PROFILE": "0_10_20",
            "CAMBRICON_DSMLU_PROFILE_INSTANCE": "0_256_0_1",
        },
        lambda d: {},
        lambda d: ("/dev/cambricon_dev0", "/dev/cambricon_ipcm0", "/dev/cambricon-caps/cap_dev0_mi1"),
        {"cambricon.com/mlu.smlu.vmemory": 20, "cambricon.com/mlu.smlu.vcore": 10},
    ),
    "iluvatar": Case(
        "ix-1",
        {"iluvatar.ai/MR-V100-vgpu": 1, "iluvatar.ai/MR-V100.vCore": 50, "iluvatar.ai/MR-V100.vMem": 64},
        lambda d: {
            "hami.io/MR-V100-devices-to-allocate": ";",
            "hami.io/MR-V100-devices-allocated": f"{d.uuid},MR-V100,16384,50:;",
        },
        lambda d: {"IX_VISIBLE_DEVICES": "0"},
        checkpoint={"iluvatar.ai/MR-V100-vgpu": 1},
    ),
    "metax": Case(
        "mx-1",
        {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60, "metax-tech.com/vmemory": 4},
        lambda d: {
            "metax-tech.com/sgpu-qos-policy": "best-effort",
            "hami.io/metax-sgpu-devices-to-allocate": ";",
            "hami.io/metax-sgpu-devices-allocated": f"{d.uuid},Metax-SGPU,4096,60:;",
            "metax-tech.com/gpu-devices-allocated": f'[[{{"uuid":"{d.uuid}","compute":60,"vRam":4096}}]]',
        },
        lambda d: {"METAX_VISIBLE_DEVICES": "0"},
        checkpoint={"metax-tech.com/sgpu": 1},
        present=("metax-tech.com/predicate-time",),
    ),
    "mthreads": Case(
        "mt-1",
        {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8},
        lambda d: {
            "hami.io/mthreads-vgpu-devices-allocated": "mt-1-mthreads-0,Mthreads,16384,8:;",
            "mthreads.com/gpu-index": "0",
            "mthreads.com/predicate-node": "mt-1",
        },
        lambda d: {"MTHREADS_VISIBLE_DEVICES": "0"},
        checkpoint={"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8},
        present=("mthreads.com/predicate-time",),
    ),
    "enflame": Case(
        "gcu-1",
        {"enflame.com/drs-gcu": 1},
        lambda d: {
            "hami.io/enflame-vgpu-devices-allocated": "gcu-1-enflame-drs-0,Enflame,6144,17:;",
            "enflame.com/gcu-assigned": "true",
            "enflame.com/gcu-assigned-index": "0",
            "enflame.com/gcu-assigned-id": "0",
            "enflame.com/gcu-assigned-minor": "0",
            "enflame.com/gcu-request-size": "1",
            # gcushare marks the container allocated with the DRS instance it made (the stand-in's
            # instance 0 of GCU 0, its UUID made from node, GCU and instance).
            "assigned-containers": '{"c":{"allocated":true,"request":1,"profileID":"0",'
            f'"profileName":"1g.6gb","instanceID":"0","instanceUUID":"{ENFLAME_DRS_UUID}"}}}}',
        },
        lambda d: {"ENFLAME_VISIBLE_DEVICES": "0", "TOPS_VISIBLE_DEVICES": f"DRS-{ENFLAME_DRS_UUID}"},
        checkpoint={"enflame.com/drs-gcu": 1},
        present=("enflame.com/gcu-assigned-time",),
    ),
    "kunlun": Case(
        "xpu-1",
        {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576},
        lambda d: {
            "hami.io/xpu-devices-to-allocate": ";",
            "hami.io/xpu-devices-allocated": f"{d.uuid},XPU,24576,25:;",
        },
        lambda d: {"XPU_VISIBLE_DEVICES": "0"},
        checkpoint={"kunlunxin.com/vxpu": 1},
    ),
    "awsneuron": Case(
        "inf-1",
        {"aws.amazon.com/neuroncore": 1},
        lambda d: {
            "hami.io/aws-neuron-devices-allocated": "inf-1-AWSNeuron-0,AWSNeuron,0,1:;",
            "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuroncore",
            "AWS_NEURON_IDS": "0",
            "NEURON_ALLOCATED": "true",
            "aws.amazon.com/predicate-node": "inf-1",
        },
        lambda d: {"NEURON_RT_VISIBLE_CORES": "0"},
        lambda d: ("/dev/neuron0",),
        checkpoint={"aws.amazon.com/neuroncore": 1},
        present=("NEURON_ALLOC_TIME",),
    ),
    "amd": Case(
        "amd-1",
        {"amd.com/gpu": 1, "amd.com/gpumem": 4096, "amd.com/gpucores": 25},
        lambda d: {
            "hami.io/amd-devices-to-allocate": ";",
            "hami.io/amd-devices-allocated": f"{d.uuid},AMD Instinct MI300X,4096,76:;",
            "hami.io/amd-cu-allocated": f'{{"{d.uuid}":"0-75"}}',
        },
        lambda d: {
            "HSA_CU_MASK": "0:0-75",
            "ROCR_VISIBLE_DEVICES": d.rocr_uuid,
            "HIP_DEVICE_MEMORY_LIMIT": "4096m",
            "LD_AUDIT": "/usr/local/vgpu/libamvgpu.so",
        },
        lambda d: ("/dev/kfd", "/dev/dri/card0", "/dev/dri/renderD128"),
        {"amd.com/gpu": 1},
    ),
    "vastai": Case(
        "va-1",
        {"vastaitech.com/va": 1},
        lambda d: {
            "hami.io/Vastai-devices-to-allocate": ";",
            "hami.io/Vastai-devices-allocated": f"{d.uuid},Vastai,0,0:;",
        },
        lambda d: {"VASTAI_VISIBLE_DEVICES": "0"},
        checkpoint={"vastaitech.com/va": 1},
    ),
    "biren": Case(
        "br-1",
        {"birentech.com/gpu": 1},
        lambda d: {
            "hami.io/Biren-devices-to-allocate": ";",
            "hami.io/Biren-devices-allocated": f"{d.uuid},Biren,0,0:;",
        },
        lambda d: {"BR_PHY_CARDS": d.uuid},
        lambda d: (f"/dev/biren/{d.uuid}",),
        {"birentech.com/gpu": 1},
    ),
}

BROKEN: dict[str, str] = {}


def device_config(path: Path) -> Path:
    """HAMi's default device config without the Ascend910A chip (so its pods are no vendor's)."""
    source = Path(__file__).resolve().parents[2] / "hami_control" / "devices" / "device-config.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data["vnpus"]["configs"] = [c for c in data["vnpus"]["configs"] if c["commonWord"] != "Ascend910A"]
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("vendors")
    config = device_config(base / "device-config.yaml")
    spec = ClusterSpec(
        parse_inventory_spec(NODES, "vendors"),
        scale=True,
        control_args=("--device-config-file", str(config)),
    )
    with Cluster.up(spec, base / ".hami-sim") as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Iterator[Any]:
    with core_v1(cluster) as api:
        yield api


def _pod(name: str, node: str, *containers: Mapping[str, Any]) -> dict[str, Any]:
    return pod(name, *containers, node_selector={"kubernetes.io/hostname": node})


def _limits(limits: Mapping[str, int]) -> dict[str, str]:
    return {k: str(v) for k, v in limits.items()}


@pytest.fixture(scope="module")
def created(core: Any) -> dict[str, Any]:
    """Every pod of the module, created at once (they are scheduled and allocated side by side)."""
    out = {}
    for case in CASES.values():
        body = _pod(case.pod, case.node, container("c", limits=_limits(case.limits)))
        out[case.pod] = core.create_namespaced_pod("default", body)
    dcu = container(
        "dcu", limits={"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000", "hygon.com/dcucores": "20"}
    )
    out["mixed"] = core.create_namespaced_pod(
        "default", _pod("mixed", MIXED, dcu, container("gpu", gpus=1, gpumem=1000))
    )
    both = container("both", gpus=1, gpumem=1000, limits=dict(dcu["resources"]["limits"]))
    out["mixed-one"] = core.create_namespaced_pod("default", _pod("mixed-one", MIXED, both))
    out["disabled"] = core.create_namespaced_pod(
        "default", _pod("disabled", "npu-1", container("c", limits={DISABLED: "1"}))
    )
    return out


def running(core: Any, name: str, timeout: float = 60.0) -> Any:
    """The pod once it runs (its watch: a phase that comes and goes is still seen)."""
    return wait_pod(core, name, lambda p: p.status.phase in ("Running", "Failed"), timeout)


def record(cluster: Cluster, node: str, uid: str, name: str) -> ContainerRecord:
    found = read_containers(cluster.kubelet_dir(node) / "containers.json").get(uid, name)
    assert found is not None, f"the runtime started no container {name} of pod {uid} on {node}"
    return found


def checkpoint_counts(cluster: Cluster, node: str, uid: str, name: str) -> dict[str, tuple[str, ...]]:
    entries = read_checkpoint(cluster.kubelet_dir(node) / "kubelet_internal_checkpoint").for_container(
        uid, name
    )
    return {e.resource_name: e.all_device_ids for e in entries}


@pytest.mark.parametrize(
    "vendor",
    [
        pytest.param(v, marks=pytest.mark.xfail(strict=True, reason=BROKEN[v])) if v in BROKEN else v
        for v in CASES
    ],
)
def test_a_vendor_pod_runs_with_hamis_annotations_its_plugins_env_and_kubelets_devices(
    cluster: Cluster, core: Any, created: dict[str, Any], vendor: str
) -> None:
    case = CASES[vendor]
    d = device(case.node)
    p = running(core, case.pod, 10.0 if vendor in BROKEN else 60.0)
    assert (p.status.phase, p.spec.node_name) == ("Running", case.node), p.status.message
    annotations = dict(p.metadata.annotations or {})
    assert annotations.pop(VGPU_NODE) == case.node
    assert annotations.pop(BIND_TIME).isdigit()
    assert annotations.pop("hami.io/vgpu-time").isdigit()
    # Cambricon's plugin writes no bind phase (HAMi's scheduler lets its dsmlu lock expire instead)
    assert annotations.pop(BIND_PHASE) == ("allocating" if vendor == "cambricon" else "success")
    for key in case.present:
        assert annotations.pop(key).isdigit(), key
    assert annotations == case.annotations(d)
    started = record(cluster, case.node, p.metadata.uid, "c")
    assert started.env_map == case.env(d)
    paths = [n["path"] for n in started.device_nodes]
    assert paths == list(case.devices(d))
    held = checkpoint_counts(cluster, case.node, p.metadata.uid, "c")
    assert {r: len(ids) for r, ids in held.items()} == dict(case.checkpoint)
    offered = advertised_ids(case.node)
    for resource, ids in held.items():
        assert set(ids) <= set(offered[resource]), resource


def test_a_pod_asking_nvidia_and_hygon_gets_both_whichever_container_comes_first(
    cluster: Cluster, core: Any, created: dict[str, Any]
) -> None:
    p = running(core, "mixed")
    assert (p.status.phase, p.spec.node_name) == ("Running", MIXED), p.status.message
    gpu = load_inventory(cluster.inventory_path(MIXED)).gpus[0].uuid
    dcu = device(MIXED)
    annotations = p.metadata.annotations
    assert annotations["hami.io/vgpu-devices-allocated"] == f";{gpu},NVIDIA,1000,0:;"
    assert annotations["hami.io/dcu-devices-allocated"] == f"{dcu.uuid},DCU,1000,20:;;"
    assert annotations["hami.io/dcu-devices-to-allocate"] == ";;"
    assert annotations[BIND_PHASE] == "success"
    env = record(cluster, MIXED, p.metadata.uid, "gpu").env_map
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (gpu, "1000m")
    dcu_paths = [n["path"] for n in record(cluster, MIXED, p.metadata.uid, "dcu").device_nodes]
    assert dcu_paths[:3] == ["/dev/kfd", "/dev/mkfd", "/dev/dri/card0"]
    assert {r: len(i) for r, i in checkpoint_counts(cluster, MIXED, p.metadata.uid, "gpu").items()} == {
        "nvidia.com/gpu": 1
    }
    assert {r: len(i) for r, i in checkpoint_counts(cluster, MIXED, p.metadata.uid, "dcu").items()} == {
        "hygon.com/dcunum": 1
    }


def test_one_container_asking_nvidia_and_hygon_gets_both(
    cluster: Cluster, core: Any, created: dict[str, Any]
) -> None:
    p = running(core, "mixed-one")
    assert (p.status.phase, p.spec.node_name) == ("Running", MIXED), p.status.message
    gpu = load_inventory(cluster.inventory_path(MIXED)).gpus[0].uuid
    annotations = p.metadata.annotations
    assert annotations["hami.io/vgpu-devices-allocated"] == f"{gpu},NVIDIA,1000,0:;"
    assert annotations["hami.io/dcu-devices-allocated"] == f"{device(MIXED).uuid},DCU,1000,20:;"
    assert (annotations["hami.io/dcu-devices-to-allocate"], annotations[BIND_PHASE]) == (";", "success")
    started = record(cluster, MIXED, p.metadata.uid, "both")
    assert started.env_map["NVIDIA_VISIBLE_DEVICES"] == gpu
    assert [n["path"] for n in started.device_nodes][:2] == ["/dev/kfd", "/dev/mkfd"]
    held = checkpoint_counts(cluster, MIXED, p.metadata.uid, "both")
    assert {r: len(i) for r, i in held.items()} == {"nvidia.com/gpu": 1, "hygon.com/dcunum": 1}


def test_a_pod_of_a_vendor_left_out_stays_with_the_default_scheduler(
    cluster: Cluster, core: Any, created: dict[str, Any]
) -> None:
    assert created["disabled"].spec.scheduler_name == "default-scheduler"
    running(core, "p-npu-1")  # the scheduler has been through the Ascend node meanwhile
    p = core.read_namespaced_pod("disabled", "default")
    assert p.spec.node_name is None and not (p.metadata.annotations or {})
