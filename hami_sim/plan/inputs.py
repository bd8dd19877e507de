"""What `hami-sim plan` replays: an inventory of nodes and a list of tasks, read from the OpenB CSV files
(Alibaba's cluster-trace-gpu-v2023) or from our YAML. Any bad value raises `InputError` naming the file,
the line, the field and the value.

OpenB nodes: `sn,cpu_milli,memory_mib,gpu,model`. OpenB pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
and optionally `gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time` (the multigpu50 list has
only the first five). `num_gpu` 1 with `gpu_milli` < 1000 shares one GPU (a slice of gpu_milli/10 % of its
memory and cores); `num_gpu` > 1 asks whole GPUs; `num_gpu` 0 asks CPU and memory only. `gpu_spec` lists
the models a task accepts (`V100M16|V100M32`, empty: any).

YAML inventory (`--nodes pools.yaml`):

    nodes:
      - pool: a100            # node names are <pool>-<n>
        count: 16
        gpus: 8
        model: A100
        cpu_milli: 96000
        memory_mib: 786432
        gpu_memory_mib: 81920 # optional (default: by model, else 16384)
        split: 10             # optional: tasks per GPU (HAMi's deviceSplitCount, default 10)
      - pool: mig             # GPUs in MIG mode, HAMi's dynamic MIG (optional, default false): a model
        mig: true             # with a profile table (MIG_MODEL_NAMES: A100-40GB, A100-80GB, H100, H200,
        count: 4              # A30, or the NVML name); no split or gpu_memory_mib (from the table)
        gpus: 8
        model: A100-40GB
        cpu_milli: 96000
        memory_mib: 786432
      - pool: npu             # another vendor's devices (default: nvidia); see below
        vendor: ascend
        count: 4
        gpus: 8
        model: 910B4
        gpu_memory_mib: 32768
        cpu_milli: 192000
        memory_mib: 786432

Other vendors (`vendor:` one of `VENDORS`, the registry's families, hami_control/devices): their
devices are modelled with HAMi's common Fit (the rule Hygon's and most vendors' backends follow: slots,
memory, cores), not each vendor's own rules (Ascend's templates, Kunlun's topology, ...), and a pod
goes only to its own vendor's devices: a pod mix names its `vendor:` (default nvidia). The devices'
model is written `<VENDOR>-<model>` (`ASCEND-910B4`), so `models:` of a vendor's pod mix name its models.

YAML workload (`--workload mix.yaml`): Poisson arrivals per mix over `horizon_s`, each task staying
`duration_s` (absent: forever):

    horizon_s: 86400
    pods:
      - name: notebook
        rate_per_hour: 20
        duration_s: 7200
        num_gpu: 1
        gpu_milli: 250
        cpu_milli: 4000
        memory_mib: 16384
        models: [A100]        # optional
        gpu_memory_mib: 10240 # optional, share tasks only: MiB asked (nvidia.com/gpumem, no gpucores)
        vendor: nvidia        # optional: the vendor whose devices it asks (default nvidia)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hami_sim.plan import DEFAULT_SPLIT

MILLI = 1000
NVIDIA = "nvidia"
VENDORS = (
    NVIDIA, "ascend", "hygon", "cambricon", "iluvatar", "metax", "mthreads", "enflame", "kunlun",
    "awsneuron", "amd", "vastai", "biren",
)  # fmt: skip
"""The vendor families a node pool or a pod mix may name (hami_control.devices' `VendorNames.family`)."""
DEFAULT_GPU_MEMORY = 16384
GPU_MEMORY_MIB = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "A100": 81920,
    "H100": 81920,
    "A100-40GB": 40960,
    "A100-80GB": 81920,
    "H100-80GB": 81559,
    "H200": 143771,
    "H200-141GB": 143771,
    "A30": 24576,
}
"""MiB per GPU by model; G1-G3 (undisclosed models in OpenB) get the default. Only shares matter to the
planner (memory is asked as a percentage), so the value only shows in the HAMi accounting."""


MIG_MODEL_NAMES = {
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "H100": "NVIDIA H100 80GB HBM3",
    "H100-80GB": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "H200-141GB": "NVIDIA H200",
    "A30": "NVIDIA A30",
}
"""A pool's short model name -> the NVML name of its profile table (`hami_api.mig.MIG_MODELS`); a pool
may also name the NVML name itself ("NVIDIA A100-SXM4-40GB")."""


def mig_model_name(model: str) -> str | None:
    """The NVML name of the MIG profile table for a pool's `model`, None when the model has no MIG."""
    from hami_api.mig import MIG_MODELS

    name = MIG_MODEL_NAMES.get(model, model)
    return name if name in MIG_MODELS else None


class InputError(ValueError):
    """A bad input file; the message names the file, line, field and value."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    gpu_memory_mib: int = DEFAULT_GPU_MEMORY
    split: int = DEFAULT_SPLIT
    numa_nodes: int = 1
    vendor: str = NVIDIA
    """The devices' vendor (`VENDORS`); another vendor's model is written `<VENDOR>-<model>`."""
    """The GPUs spread evenly over this many NUMA nodes in index order (as the fake inventory of the
    local cluster lays them out, two by default there); GPU policies order equal GPUs by NUMA node."""
    mig: bool = False
    """The GPUs are in MIG mode under HAMi's dynamic MIG (hami-node `operatingmode: mig`): registered as
    hami-node registers them (`engine.mig_gpu_info`: the model's base profiles, HAMi's core %, count = the
    most instances), `split` unused. Only for models with a profile table (`mig_model_name`)."""


@dataclass(frozen=True, slots=True)
class Task:
    """One pod: `num_gpu` whole GPUs, or one share of `gpu_milli` (num_gpu 1), or none (CPU only).
    `deletion` None: it stays."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...] = ()
    creation: float = 0.0
    deletion: float | None = None
    gpu_memory_mib: int = 0
    """MiB of GPU memory asked per GPU (`nvidia.com/gpumem`, no `gpucores`), for a share task (num_gpu 1,
    gpu_milli < 1000); 0: `gpu_milli/10` % of the GPU's memory and cores, as the trace asks."""

    @property
    def gpu_request(self) -> int:
        """Milli-GPUs asked (the trace's unit of GPU request)."""
        if self.num_gpu <= 0:
            return 0
        return self.gpu_milli if self.num_gpu == 1 else MILLI * self.num_gpu

    @property
    def share(self) -> int:
        """Milli-GPUs per GPU."""
        return 0 if self.num_gpu <= 0 else (self.gpu_milli if self.num_gpu == 1 else MILLI)


# --- CSV ---------------------------------------------------------------------------------------------------


def _where(path: Path, line: int, field: str, value: str) -> str:
    return f"{path} line {line}: {field}: got {value!r}"


def _int(  # noqa: PLR0917 (where, field and bounds, named)
    path: Path, line: int, row: Mapping[str, str], field: str, low: int, high: int | None = None
) -> int:
    text = (row.get(field) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{_where(path, line, field, text)}, expected a whole number") from None
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f"at least {low}"
        raise InputError(f"{_where(path, line, field, text)}, expected {span}")
    return value


def _time(path: Path, line: int, row: Mapping[str, str], field: str) -> float | None:
    text = (row.get(field) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{_where(path, line, field, text)}, expected seconds") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{_where(path, line, field, text)}, expected seconds >= 0")
    return value


def _rows(path: Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [f for f in required if f not in header]
    if missing:
        raise InputError(
            f"{path} line 1: header: missing column(s) {', '.join(missing)}, got {','.join(header)!r}"
        )
    out: list[tuple[int, dict[str, str]]] = []
    for row in reader:
        line = reader.line_num
        if None in row:
            raise InputError(f"{path} line {line}: row: more fields than the header names")
        out.append((line, {k: (v or "") for k, v in row.items()}))
    return out


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def read_nodes_csv(path: Path, split: int = DEFAULT_SPLIT) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name or name in seen:
            raise InputError(f"{_where(path, line, 'sn', name)}, expected a new node name")
        seen.add(name)
        model = row["model"].strip()
        gpus = _int(path, line, row, "gpu", 0, 64)
        if gpus and not model:
            raise InputError(f"{_where(path, line, 'model', model)}, expected the GPU model")
        nodes.append(
            NodeSpec(
                name,
                _int(path, line, row, "cpu_milli", 0),
                _int(path, line, row, "memory_mib", 0),
                gpus,
                model,
                GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY),
                split,
            )
        )
    if not nodes:
        raise InputError(f"{path}: no node")
    return nodes


def read_pods_csv(path: Path) -> list[Task]:
    tasks: list[Task] = []
    for line, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, line, row, "num_gpu", 0, 64)
        milli = _int(path, line, row, "gpu_milli", 0, MILLI)
        if num_gpu == 1 and milli == 0:
            raise InputError(
                f"{_where(path, line, 'gpu_milli', row['gpu_milli'])}, expected 1..1000 for num_gpu 1"
            )
        if num_gpu == 1 and milli % 10:
            raise InputError(
                f"{_where(path, line, 'gpu_milli', row['gpu_milli'])}, "
                "expected a multiple of 10 (a whole percent)"
            )
        spec = row.get("gpu_spec", "").strip()
        creation = _time(path, line, row, "creation_time") or 0.0
        deletion = _time(path, line, row, "deletion_time")
        if deletion is not None and deletion < creation:
            raise InputError(
                f"{_where(path, line, 'deletion_time', row['deletion_time'])}, "
                f"expected >= creation_time {creation:g}"
            )
        tasks.append(
            Task(
                row["name"].strip() or f"pod-{line}",
                _int(path, line, row, "cpu_milli", 0),
                _int(path, line, row, "memory_mib", 0),
                num_gpu,
                milli if num_gpu == 1 else (MILLI if num_gpu > 1 else 0),
                tuple(m for m in (p.strip() for p in spec.split("|")) if m),
                creation,
                deletion,
            )
        )
    if not tasks:
        raise InputError(f"{path}: no pod")
    return tasks


# --- YAML --------------------------------------------------------------------------------------------------


class _Doc:
    """A YAML document with line numbers: values are read from its nodes, errors name the line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            text = path.read_text()
        except OSError as err:
            raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
        try:
            self._loader = yaml.SafeLoader(text)
            root = self._loader.get_single_node()
        except yaml.YAMLError as err:
            raise InputError(f"{path}: not YAML: {err}") from None
        if not isinstance(root, yaml.MappingNode):
            raise InputError(f"{path} line 1: expected a mapping at the top")
        self.root = root

    def line(self, node: yaml.Node) -> int:
        return int(node.start_mark.line) + 1

    def fields(self, node: yaml.Node, where: str) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise InputError(f"{self.path} line {self.line(node)}: {where}: expected a mapping")
        out: dict[str, yaml.Node] = {}
        for key, value in node.value:
            out[str(key.value)] = value
        return out

    def items(self, node: yaml.Node, where: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise InputError(f"{self.path} line {self.line(node)}: {where}: expected a list")
        return list(node.value)

    def value(self, node: yaml.Node) -> Any:
        return self._loader.construct_object(node, deep=True)

    def get(  # noqa: PLR0917 (the field, its parser and default, named)
        self,
        fields: Mapping[str, yaml.Node],
        key: str,
        where: str,
        parse: Callable[[Any], Any],
        expected: str,
        default: Any = ...,
        at: yaml.Node | None = None,
    ) -> Any:
        node = fields.get(key)
        if node is None:
            if default is ...:
                line = self.line(at) if at is not None else 1
                raise InputError(f"{self.path} line {line}: {where}.{key}: missing, expected {expected}")
            return default
        raw = self.value(node)
        try:
            return parse(raw)
        except (TypeError, ValueError):
            raise InputError(
                f"{self.path} line {self.line(node)}: {where}.{key}: got {raw!r}, expected {expected}"
            ) from None


def _whole(low: int, high: int | None = None) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if (
            isinstance(raw, bool)
            or not isinstance(raw, int)
            or raw < low
            or (high is not None and raw > high)
        ):
            raise ValueError
        return raw

    return parse


def _positive(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
        raise ValueError
    return float(raw)


def _text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError
    return raw.strip()


def _models(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = raw.split("|")
    if not isinstance(raw, list) or not all(isinstance(m, str) and m.strip() for m in raw):
        raise ValueError
    return tuple(m.strip() for m in raw)


def _vendor(raw: Any) -> str:
    if not isinstance(raw, str) or raw.strip().lower() not in VENDORS:
        raise ValueError
    return raw.strip().lower()


def _bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValueError
    return raw


def _mig_memory(model: str) -> int:
    from hami_api.mig import MIG_MODELS

    return MIG_MODELS[mig_model_name(model) or model].memory_mib


def _check_mig_pool(doc: _Doc, f: Mapping[str, yaml.Node], where: str, model: str, vendor: str) -> None:
    """A MIG pool: an NVIDIA model with a profile table; its GPU memory and slots come from the table."""
    line = doc.line(f["mig"])
    if vendor != NVIDIA:
        raise InputError(f"{doc.path} line {line}: {where}.mig: got true, expected false for vendor {vendor}")
    if mig_model_name(model) is None:
        known = ", ".join(MIG_MODEL_NAMES)
        raise InputError(
            f"{doc.path} line {line}: {where}.mig: model {model!r} has no MIG profile table, expected one "
            f"of {known} (or its NVML name)"
        )
    for key in ("split", "gpu_memory_mib"):
        if key in f:
            raise InputError(
                f"{doc.path} line {doc.line(f[key])}: {where}.{key}: not allowed with mig: true (a MIG GPU's "
                "slots and memory come from its profile table)"
            )


def vendor_model(vendor: str, model: str) -> str:
    """The model string of another vendor's devices (`ASCEND-910B4`; `ASCEND-` matches every model of it
    as a `models:` entry, a case-insensitive substring of the device's type)."""
    return f"{vendor.upper()}-{model}"


def keep_vendors_apart(nodes: Sequence[NodeSpec], tasks: Sequence[Task]) -> list[Task]:
    """NVIDIA's pods (no vendor named, so no model constraint of another vendor) may only go to NVIDIA
    devices once the cluster has other vendors' pools: they get the NVIDIA pools' models as their
    `models` when they name none."""
    nvidia_models = tuple(sorted({n.model for n in nodes if n.vendor == NVIDIA}))
    if all(n.vendor == NVIDIA for n in nodes) or not nvidia_models:
        return list(tasks)
    return [replace(t, models=nvidia_models) if t.num_gpu > 0 and not t.models else t for t in tasks]


def read_nodes_yaml(path: Path) -> list[NodeSpec]:
    doc = _Doc(path)
    top = doc.fields(doc.root, "document")
    if "nodes" not in top:
        raise InputError(f"{path} line 1: nodes: missing, expected a list of node pools")
    nodes: list[NodeSpec] = []
    for i, item in enumerate(doc.items(top["nodes"], "nodes")):
        where = f"nodes[{i}]"
        f = doc.fields(item, where)
        pool = doc.get(f, "pool", where, _text, "a pool name", at=item)
        model = doc.get(f, "model", where, _text, "a GPU model", at=item)
        count = doc.get(f, "count", where, _whole(1, 100_000), "a node count 1..100000", at=item)
        gpus = doc.get(f, "gpus", where, _whole(0, 64), "GPUs per node 0..64", at=item)
        cpu = doc.get(f, "cpu_milli", where, _whole(0), "milli-CPUs >= 0", at=item)
        mem = doc.get(f, "memory_mib", where, _whole(0), "MiB >= 0", at=item)
        gmem = doc.get(
            f, "gpu_memory_mib", where, _whole(1), "MiB >= 1", GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY)
        )
        split = doc.get(f, "split", where, _whole(1, 1000), "tasks per GPU 1..1000", DEFAULT_SPLIT)
        vendor = doc.get(f, "vendor", where, _vendor, f"one of {', '.join(VENDORS)}", NVIDIA)
        mig = doc.get(f, "mig", where, _bool, "true or false", False)
        if mig:
            _check_mig_pool(doc, f, where, model, vendor)
            gmem = _mig_memory(model)
        if vendor != NVIDIA:
            model = vendor_model(vendor, model)
        nodes.extend(
            NodeSpec(f"{pool}-{n}", cpu, mem, gpus, model, gmem, split, vendor=vendor, mig=mig)
            for n in range(count)
        )
    if not nodes:
        raise InputError(f"{path}: nodes: no node pool")
    return nodes


def read_workload_yaml(path: Path, seed: int) -> list[Task]:
    """Tasks drawn from the YAML's pod mixes: Poisson arrivals (seeded) over `horizon_s`."""
    doc = _Doc(path)
    top = doc.fields(doc.root, "document")
    horizon = doc.get(top, "horizon_s", "workload", _positive, "seconds > 0", at=doc.root)
    if "pods" not in top:
        raise InputError(f"{path} line 1: pods: missing, expected a list of pod mixes")
    rng = np.random.default_rng(seed)
    tasks: list[Task] = []
    for i, item in enumerate(doc.items(top["pods"], "pods")):
        where = f"pods[{i}]"
        f = doc.fields(item, where)
        name = doc.get(f, "name", where, _text, "a mix name", at=item)
        rate = doc.get(f, "rate_per_hour", where, _positive, "arrivals per hour > 0", at=item)
        duration = doc.get(f, "duration_s", where, _positive, "seconds > 0", None)
        num_gpu = doc.get(f, "num_gpu", where, _whole(0, 64), "GPUs 0..64", at=item)
        milli = doc.get(
            f, "gpu_milli", where, _whole(1, MILLI), "milli-GPUs 1..1000", MILLI if num_gpu else 0
        )
        if num_gpu == 1 and milli % 10:
            raise InputError(
                f"{path} line {doc.line(f['gpu_milli'])}: {where}.gpu_milli: got {milli}, "
                "expected a multiple of 10"
            )
        if num_gpu > 1 and milli != MILLI:
            raise InputError(
                f"{path} line {doc.line(f['gpu_milli'])}: {where}.gpu_milli: got {milli}, expected 1000 "
                "(several GPUs are whole GPUs)"
            )
        cpu = doc.get(f, "cpu_milli", where, _whole(0), "milli-CPUs >= 0", 0)
        mem = doc.get(f, "memory_mib", where, _whole(0), "MiB >= 0", 0)
        gpu_mem = doc.get(f, "gpu_memory_mib", where, _whole(1), "MiB >= 1", 0)
        if gpu_mem and (num_gpu != 1 or milli == MILLI):
            raise InputError(
                f"{path} line {doc.line(f['gpu_memory_mib'])}: {where}.gpu_memory_mib: got {gpu_mem}, "
                "expected only on a share task (num_gpu 1, gpu_milli below 1000)"
            )
        models = doc.get(f, "models", where, _models, "a list of GPU models", ())
        vendor = doc.get(f, "vendor", where, _vendor, f"one of {', '.join(VENDORS)}", NVIDIA)
        if vendor != NVIDIA:
            models = tuple(vendor_model(vendor, m) for m in models) or (vendor_model(vendor, ""),)
        t = 0.0
        n = 0
        while True:
            t += float(rng.exponential(3600.0 / rate))
            if t >= horizon:
                break
            tasks.append(
                Task(
                    f"{name}-{n}",
                    cpu,
                    mem,
                    num_gpu,
                    milli if num_gpu else 0,
                    models,
                    t,
                    None if duration is None else t + duration,
                    gpu_mem,
                )
            )
            n += 1
    tasks.sort(key=lambda task: (task.creation, task.name))
    if not tasks:
        raise InputError(f"{path}: pods: no pod arrives within horizon_s {horizon:g}")
    return tasks


def read_nodes(path: Path, split: int = DEFAULT_SPLIT) -> list[NodeSpec]:
    """OpenB CSV (by its .csv suffix) or our YAML node pools."""
    return read_nodes_csv(path, split) if path.suffix.lower() == ".csv" else read_nodes_yaml(path)


__all__ = [
    "DEFAULT_SPLIT",
    "MIG_MODEL_NAMES",
    "InputError",
    "NodeSpec",
    "Task",
    "mig_model_name",
    "read_nodes",
    "read_nodes_csv",
    "read_nodes_yaml",
    "read_pods_csv",
    "read_workload_yaml",
]
