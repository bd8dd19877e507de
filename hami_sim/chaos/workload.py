"""The chaos run's workload, pure and seeded: a stream of pod plans with churn, for `hami-sim chaos`.

`build_workload(WorkloadSpec(...))` returns the namespaces (with their ResourceQuotas and DRA labels) and
`pods` plans in creation order. Each plan carries its pod manifest (plain JSON, as the API server takes
it) and what happens to it after creation:

- `complete`: the pod's containers exit 0 after `run_s` seconds (the kubelet stand-in reads the
  annotation `sim.hami.io/run-seconds`), so it ends Succeeded (restartPolicy Never);
- `delete`: the runner deletes it `delete_after_s` seconds after creating it, whatever its phase
  (some before they are bound: a delete racing the scheduler, the extender's bind and Allocate).

Every pod's life is finite, so capacity frees up all the time and every pod can run eventually.
The requests are the demo's kinds (`examples/demo/`): GPU memory in MiB (`mem`) and as a percentage of
the GPU (`percent`), cores (`cores`), several GPUs (`multi`), an init container and two containers
each with a slice (`init`), the whole GPU (`exclusive`), a GPU model pin (`type-pin`,
`nvidia.com/use-gputype`) and a GPU UUID pin (`uuid-pin`, `nvidia.com/use-gpuuuid`). Some pods go to
namespaces with a GPU memory ResourceQuota (`limits.nvidia.com/gpumem`, HAMi's quota key: pods past it
are refused at creation by the webhook). A share of the pods goes through DRA: namespaces labelled
`hami.io/dra=enabled`, whose pods the webhook translates into ResourceClaims (mixed mode, as
`hami-sim demo --mode mixed`); in `dra` mode every pod does, in `device-plugin` mode none.

A whole GPU (`exclusive`) goes to a quota namespace only when the path's smallest GPU fits its quota:
HAMi admits it counting 0 MiB and then never schedules it (its Fit counts the whole GPU's memory against
the quota), which on a small cluster of A100s alone would leave it Pending for good.

Percentages go only to device-plugin namespaces without a quota: a DRA claim needs absolute memory
(hami_control/dra_translate.py), and a quota counts a percentage as 0 MiB at admission (HAMi's
pkg/device/quota.go), so the run would test the workload's choice rather than the system.

Some pods come in bursts (created back to back, without the run's rate), which is when binds pile up
and when the fault schedule's "kill during a bind" lands best.

With nodes of other vendors (`WorkloadSpec.vendors`, one `VendorShape` per vendor; issue 26) a share of
the pods (`vendor_share`) asks one of them instead, in the namespace `chaos-vendors`, with the vendor's
own resources (HAMi v2.10's names, reference/vendors.md): a share of one device with memory and cores
where the vendor has them (`<vendor>-share`), two devices (`<vendor>-multi`: Hygon, Ascend, Iluvatar,
MetaX sGPU, Kunlun XPU), a whole device (`<vendor>-whole`: Hygon without memory or cores, so exclusive;
MetaX GPU, Enflame GCU, AWS Neuron devices), an Enflame DRS profile of 1 to 3 slices, an AWS NeuronCore.
A workload without vendors draws nothing for them: the same seed gives the same NVIDIA workload.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_api.annotations import USE_GPU_TYPE, USE_GPU_UUID

RUN_SECONDS = "sim.hami.io/run-seconds"
"""Pod annotation the kubelet stand-in reads: the containers exit 0 after that many seconds."""
RUN_LABEL = "sim.hami.io/chaos-run"
"""Label on every pod of a run (its value: the run's id), what the runner watches."""
KIND_LABEL = "sim.hami.io/chaos-kind"
DRA_LABEL = "hami.io/dra"
"""Namespaces labelled hami.io/dra=enabled have their GPU pods translated to claims (mixed clusters)."""
QUOTA_KEY = "limits.nvidia.com/gpumem"

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"

MODES = ("mixed", "device-plugin", "dra")
KINDS = ("mem", "percent", "cores", "multi", "init", "exclusive", "type-pin", "uuid-pin")
_WEIGHTS: Mapping[str, int] = {
    "mem": 30,
    "percent": 10,
    "cores": 10,
    "multi": 10,
    "init": 10,
    "exclusive": 3,
    "type-pin": 8,
    "uuid-pin": 4,
}
IMAGE = "busybox:1.36"


@dataclass(frozen=True)
class GPUModel:
    name: str
    memory_mib: int
    match: str
    """What `nvidia.com/use-gputype` says to pick this model (a substring of its name)."""


@dataclass(frozen=True)
class PathShape:
    """The GPUs one path (device plugin or DRA) can use: their models and UUIDs."""

    models: tuple[GPUModel, ...]
    uuids: tuple[str, ...]

    @property
    def smallest_mib(self) -> int:
        return min(m.memory_mib for m in self.models)


@dataclass(frozen=True)
class VendorShape:
    """The devices of one other vendor the run's nodes hold (all alike): HAMi's common word of them (the
    chip's for Ascend and Iluvatar), their memory (MiB), cores (the vendor's unit) and shares."""

    vendor: str
    mode: str
    word: str
    memory_mib: int
    cores: int
    split: int
    devices_per_node: int

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.mode}" if self.mode else self.vendor


VENDOR_NAMESPACE = "chaos-vendors"


@dataclass(frozen=True)
class WorkloadSpec:
    pods: int
    seed: int
    mode: str = "mixed"
    device_plugin: PathShape | None = None
    """The device-plugin nodes' GPUs (None: no such nodes)."""
    dra: PathShape | None = None
    """The DRA nodes' GPUs (None: no such nodes)."""
    dra_share: float = 0.3
    """In mixed mode, the share of pods that goes through DRA."""
    quota_share: float = 0.2
    """The share of pods created in a namespace with a GPU memory quota."""
    quota_mib: int = 200_000
    """Each quota namespace's `limits.nvidia.com/gpumem` (MiB)."""
    burst_every: int = 100
    """About every this many pods a burst starts (0: no bursts)."""
    burst_size: tuple[int, int] = (10, 30)
    run_id: str = "chaos"
    vendors: tuple[VendorShape, ...] = ()
    """The other vendors' devices (none: every pod asks NVIDIA GPUs)."""
    vendor_share: float = 0.5
    """With vendors, the share of pods that asks one of them (the vendor drawn evenly)."""

    def __post_init__(self) -> None:
        if isinstance(self.pods, bool) or not isinstance(self.pods, int) or self.pods < 1:
            raise ValueError(f"pods: expected an integer >= 1, got {self.pods!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode != "dra" and self.device_plugin is None:
            raise ValueError(f"mode {self.mode}: the cluster has no device-plugin nodes")
        if self.mode != "device-plugin" and self.dra is None:
            raise ValueError(f"mode {self.mode}: the cluster has no DRA nodes")
        for name in ("dra_share", "quota_share", "vendor_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: expected a share between 0 and 1, got {value!r}")
        if self.quota_mib < 1:
            raise ValueError(f"quota_mib: expected a positive number of MiB, got {self.quota_mib!r}")


@dataclass(frozen=True)
class NamespacePlan:
    name: str
    dra: bool
    quota_mib: int | None

    def manifests(self) -> list[dict[str, Any]]:
        """The Namespace (labelled for DRA translation when `dra`) and its ResourceQuota, if any."""
        labels = {DRA_LABEL: "enabled"} if self.dra else {}
        out: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.name, "labels": labels}}
        ]
        if self.quota_mib is not None:
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu", "namespace": self.name},
                    "spec": {"hard": {QUOTA_KEY: str(self.quota_mib)}},
                }
            )
        return out


@dataclass(frozen=True)
class PodPlan:
    index: int
    namespace: str
    name: str
    kind: str
    path: str
    """device-plugin or dra."""
    end: str
    """complete (Succeeded after run_s) or delete (deleted by the runner after delete_after_s)."""
    run_s: float | None
    delete_after_s: float | None
    burst: bool
    """Created right after the previous pod, without waiting for the run's rate."""
    body: dict[str, Any] = field(compare=False, repr=False)
    vendor: str = "nvidia"
    """Whose devices it asks (hami_sim.vendors' name, `nvidia` for NVIDIA GPUs)."""


@dataclass(frozen=True)
class Workload:
    namespaces: tuple[NamespacePlan, ...]
    pods: tuple[PodPlan, ...]

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pod in self.pods:
            out[pod.kind] = out.get(pod.kind, 0) + 1
        return dict(sorted(out.items()))


def namespaces_for(spec: WorkloadSpec) -> tuple[NamespacePlan, ...]:
    out: list[NamespacePlan] = []
    if spec.mode != "dra":
        out += [
            NamespacePlan("chaos-dp", False, None),
            NamespacePlan("chaos-dp-quota", False, spec.quota_mib),
        ]
    if spec.mode != "device-plugin":
        out += [
            NamespacePlan("chaos-dra", True, None),
            NamespacePlan("chaos-dra-quota", True, spec.quota_mib),
        ]
    if spec.vendors:
        out.append(NamespacePlan(VENDOR_NAMESPACE, False, None))
    return tuple(out)


def _limits(gpus: int, mem: int | None = None, percent: int | None = None, cores: int | None = None) -> Any:
    limits = {GPU: str(gpus)}
    if mem is not None:
        limits[GPUMEM] = str(mem)
    if percent is not None:
        limits[GPUMEM_PERCENT] = str(percent)
    if cores is not None:
        limits[GPUCORES] = str(cores)
    return {"limits": limits}


def _container(name: str, resources: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "resources": resources}


def _containers(
    kind: str, rng: random.Random, shape: PathShape
) -> tuple[list[Any], list[Any], dict[str, str]]:
    """(init containers, containers, annotations) for one pod of `kind` on a path of `shape`. Sizes fit
    the path's smallest GPU, so every pod can run on any GPU its pins allow."""
    small = shape.smallest_mib
    mem_cap = max(1000, min(8000, small // 2))

    def mem(low: int = 1000, high: int = mem_cap) -> int:
        return rng.randrange(low, max(low, high) + 1, 250) if high > low else low

    def cores() -> int | None:
        return rng.choice((None, 10, 20, 30, 50))

    annotations: dict[str, str] = {}
    inits: list[Any] = []
    if kind == "percent":
        main = [_container("main", _limits(1, percent=rng.choice((5, 10, 20, 25)), cores=cores()))]
    elif kind == "cores":
        main = [_container("main", _limits(1, mem=mem(1000, 3000), cores=rng.choice((50, 60, 80, 100))))]
    elif kind == "multi":
        gpus = 2
        main = [_container("main", _limits(gpus, mem=mem(1000, min(6000, mem_cap)), cores=cores()))]
    elif kind == "init":
        inits = [_container("warm", _limits(1, mem=mem(1000, 3000)))]
        main = [
            _container("server", _limits(1, mem=mem(1000, 4000), cores=cores())),
            _container("sidecar", _limits(1, mem=mem(1000, 2000), cores=rng.choice((None, 10)))),
        ]
    elif kind == "exclusive":
        main = [_container("main", _limits(1))]
    elif kind == "type-pin":
        model = rng.choice(shape.models)
        annotations[USE_GPU_TYPE] = model.match
        main = [
            _container("main", _limits(1, mem=mem(1000, min(mem_cap, model.memory_mib // 3)), cores=cores()))
        ]
    elif kind == "uuid-pin":
        annotations[USE_GPU_UUID] = rng.choice(shape.uuids)
        main = [_container("main", _limits(1, mem=mem(500, 1500), cores=rng.choice((None, 5, 10))))]
    else:  # mem
        main = [_container("main", _limits(1, mem=mem(), cores=cores()))]
    return inits, main, annotations


def _one(name: str, limits: Mapping[str, int]) -> list[Any]:
    return [_container(name, {"limits": {k: str(v) for k, v in limits.items()}})]


def _vendor_containers(shape: VendorShape, rng: random.Random) -> tuple[str, list[Any]]:
    """(kind, containers) of one pod asking `shape`'s vendor. Sizes fit one device of the shape."""
    mem_cap = max(1000, min(8000, shape.memory_mib // 2))
    mem = rng.randrange(1000, mem_cap + 1, 250) if mem_cap > 1000 else 1000
    share = rng.random() < 0.7
    cw, key = shape.word, shape.key
    if key == "hygon":
        if share:
            limits = {
                "hygon.com/dcunum": 1,
                "hygon.com/dcumem": mem,
                "hygon.com/dcucores": rng.choice((10, 20, 30, 50)),
            }
            return "hygon-share", _one("main", limits)
        if rng.random() < 0.5:
            return "hygon-whole", _one("main", {"hygon.com/dcunum": 1})
        limits = {"hygon.com/dcunum": 2, "hygon.com/dcumem": 1000, "hygon.com/dcucores": 10}
        return "hygon-multi", _one("main", limits)
    if key == "ascend":
        if share:
            return "ascend-share", _one("main", {f"huawei.com/{cw}": 1, f"huawei.com/{cw}-memory": mem})
        return "ascend-multi", _one("main", {f"huawei.com/{cw}": 2})
    if key == "cambricon":
        limits = {
            "cambricon.com/vmlu": 1,
            "cambricon.com/mlu.smlu.vmemory": max(4, mem // 256),
            "cambricon.com/mlu.smlu.vcore": rng.choice((10, 20, 30)),
        }
        return "cambricon-share", _one("main", limits)
    if key == "iluvatar":
        if share:
            limits = {f"iluvatar.ai/{cw}-vgpu": 1, f"iluvatar.ai/{cw}.vMem": max(4, mem // 256),
                      f"iluvatar.ai/{cw}.vCore": rng.choice((10, 20, 30, 50))}  # fmt: skip
            return "iluvatar-share", _one("main", limits)
        return "iluvatar-multi", _one("main", {f"iluvatar.ai/{cw}-vgpu": 2})
    if key == "metax/sgpu":
        if share:
            limits = {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": max(1, mem // 1024),
                      "metax-tech.com/vcore": rng.choice((10, 20, 30, 50))}  # fmt: skip
            return "metax-share", _one("main", limits)
        return "metax-multi", _one("main", {"metax-tech.com/sgpu": 2, "metax-tech.com/vcore": 20})
    if key == "mthreads":
        limits = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": rng.choice((2, 4, 8, 16)),
                  "mthreads.com/sgpu-core": rng.choice((1, 2, 4, 8))}  # fmt: skip
        return "mthreads-share", _one("main", limits)
    if key == "enflame/drs":
        return "enflame-share", _one("main", {"enflame.com/drs-gcu": rng.choice((1, 1, 2, 3))})
    if key == "kunlun/vxpu":
        if share:
            limits = {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": rng.choice((24576, 24576, 49152))}
            return "kunlun-share", _one("main", limits)
        return "kunlun-multi", _one("main", {"kunlunxin.com/vxpu": 2, "kunlunxin.com/vxpu-memory": 24576})
    if key == "awsneuron":
        if share:
            return "awsneuron-share", _one("main", {"aws.amazon.com/neuroncore": 1})
        return "awsneuron-whole", _one("main", {"aws.amazon.com/neuron": 1})
    if key == "amd":
        limits = {"amd.com/gpu": 1, "amd.com/gpumem": mem, "amd.com/gpucores": rng.choice((10, 20, 30, 50))}
        return "amd-share", _one("main", limits)
    count = {
        "metax/gpu": "metax-tech.com/gpu",
        "enflame/gcu": "enflame.com/gcu",
        "kunlun/xpu": "kunlunxin.com/xpu",
        "vastai": "vastaitech.com/va",
        "biren": "birentech.com/gpu",
    }.get(key)
    if count is None:
        raise ValueError(f"vendors: no workload for {key!r}")
    whole = key in ("metax/gpu", "enflame/gcu", "kunlun/xpu")
    return f"{shape.vendor}-{'whole' if whole else 'share'}", _one("main", {count: 1})


def _kind(rng: random.Random, path: str, quota: bool, whole_fits_quota: bool = True) -> str:
    kinds = [
        k
        for k in KINDS
        if not (k == "percent" and (path == "dra" or quota))
        and not (k == "exclusive" and quota and not whole_fits_quota)
    ]
    return rng.choices(kinds, weights=[_WEIGHTS[k] for k in kinds])[0]


def _end(rng: random.Random, kind: str) -> tuple[str, float | None, float | None]:
    if kind == "exclusive":  # a whole GPU: held briefly, so others are not starved
        return "complete", round(rng.uniform(1.0, 5.0), 2), None
    if rng.random() < 0.65:
        return "complete", round(rng.uniform(1.0, 12.0), 2), None
    if rng.random() < 0.15:  # deleted while it is still being scheduled, bound or allocated
        return "delete", None, round(rng.uniform(0.05, 1.5), 2)
    return "delete", None, round(rng.uniform(3.0, 40.0), 2)


def _path(rng: random.Random, spec: WorkloadSpec) -> str:
    if spec.mode == "device-plugin":
        return "device-plugin"
    if spec.mode == "dra":
        return "dra"
    return "dra" if rng.random() < spec.dra_share else "device-plugin"


def build_workload(spec: WorkloadSpec) -> Workload:
    """The namespaces and the pod plans of a run; the same spec gives the same workload."""
    rng = random.Random(f"workload:{spec.seed}")
    namespaces = namespaces_for(spec)
    by_path = {
        path: ([n for n in namespaces if n.dra == (path == "dra") and n.quota_mib is None],
               [n for n in namespaces if n.dra == (path == "dra") and n.quota_mib is not None])
        for path in ("device-plugin", "dra")
    }  # fmt: skip
    pods: list[PodPlan] = []
    burst_left = 0
    width = max(5, len(str(spec.pods)))
    for index in range(spec.pods):
        burst = burst_left > 0
        if burst:
            burst_left -= 1
        elif spec.burst_every and index > 0 and rng.random() < 1.0 / spec.burst_every:
            burst_left = rng.randint(*spec.burst_size) - 1
        if spec.vendors and rng.random() < spec.vendor_share:
            pods.append(_vendor_pod(spec, rng, index, width, burst))
            continue
        path = _path(rng, spec)
        shape = spec.dra if path == "dra" else spec.device_plugin
        assert shape is not None  # checked in WorkloadSpec
        plain, quota = by_path[path]
        in_quota = bool(quota) and rng.random() < spec.quota_share
        namespace = (quota if in_quota else plain)[0].name
        kind = _kind(rng, path, in_quota, shape.smallest_mib <= spec.quota_mib)
        end, run_s, delete_after_s = _end(rng, kind)
        inits, containers, annotations = _containers(kind, rng, shape)
        name = f"c{index:0{width}d}-{kind}"
        if run_s is not None:
            annotations[RUN_SECONDS] = f"{run_s:g}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {RUN_LABEL: spec.run_id, KIND_LABEL: kind},
                "annotations": annotations,
            },
            "spec": {"restartPolicy": "Never", "containers": containers},
        }
        if inits:
            body["spec"]["initContainers"] = inits
        pods.append(PodPlan(index, namespace, name, kind, path, end, run_s, delete_after_s, burst, body))
    return Workload(namespaces, tuple(pods))


def _vendor_pod(spec: WorkloadSpec, rng: random.Random, index: int, width: int, burst: bool) -> PodPlan:
    shape = rng.choice(spec.vendors)
    kind, containers = _vendor_containers(shape, rng)
    whole = kind.endswith("-whole")
    end, run_s, delete_after_s = _end(rng, "exclusive" if whole else kind)
    name = f"c{index:0{width}d}-{kind}"
    annotations = {RUN_SECONDS: f"{run_s:g}"} if run_s is not None else {}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": VENDOR_NAMESPACE,
            "labels": {RUN_LABEL: spec.run_id, KIND_LABEL: kind},
            "annotations": annotations,
        },
        "spec": {"restartPolicy": "Never", "containers": containers},
    }
    return PodPlan(
        index, VENDOR_NAMESPACE, name, kind, "device-plugin", end, run_s, delete_after_s, burst, body,
        shape.vendor,
    )  # fmt: skip


def path_shape(models: Sequence[tuple[str, int]], uuids: Sequence[str]) -> PathShape:
    """A `PathShape` from (model name, MiB) pairs (duplicates dropped) and the GPUs' UUIDs. A model's
    `match` is the word of its name that no other model's name contains (e.g. "T4", "A100")."""
    distinct = sorted(set(models))
    out = []
    for name, mib in distinct:
        words = [w for w in name.replace("-", " ").split() if w.upper() not in ("NVIDIA", "TESLA")]
        others = [o for o, _ in distinct if o != name]
        match = next((w for w in words if not any(w.lower() in o.lower() for o in others)), name)
        out.append(GPUModel(name, mib, match))
    if not out or not uuids:
        raise ValueError("a path needs at least one GPU")
    return PathShape(tuple(out), tuple(uuids))


__all__ = [
    "GPU",
    "KINDS",
    "KIND_LABEL",
    "MODES",
    "RUN_LABEL",
    "RUN_SECONDS",
    "VENDOR_NAMESPACE",
    "GPUModel",
    "NamespacePlan",
    "PathShape",
    "PodPlan",
    "VendorShape",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "namespaces_for",
    "path_shape",
]
