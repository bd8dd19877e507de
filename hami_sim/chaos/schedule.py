"""The chaos run's fault schedule, pure and seeded: which faults, on what, when, for how long.

`build_schedule(ScheduleSpec(...))` returns `Fault`s; the same spec (seed included) gives the same list.
A fault fires when the run has created its `at_pod`-th pod (so the schedule is tied to the workload's
progress, not to the machine's speed) and lasts `duration_s`: a killed component stays down that long
and is then started again; a GPU stays faulty that long and then recovers; an API server fault window
keeps its rule that long.

Faults run in lanes (`Fault.lane`): one at a time within a lane, lanes in parallel, so hami-control's
two replicas are never both killed by the schedule, and one API fault window is open at a time (the
fault switch takes one set of rules; `PUT /hami-sim/faults` replaces them).

Kinds:

- kills (SIGKILL, no grace): `kill-control-leader`, `kill-control-follower`, `kill-control-in-bind`
  (the leader, at a moment a pod is in `hami.io/bind-phase: allocating`: the runner waits for one),
  `kill-scheduler`, `kill-controller-manager` (DRA nodes only), `kill-kubelet` (any node),
  `kill-hami-node` (a node with NVIDIA GPUs), `kill-vendor-plugin` (the device-plugin stand-in of a node
  of another vendor, `vendor/<node>`: only with such nodes);
- GPU faults through the fake inventory of a node with NVIDIA GPUs: `gpu-xid` (an Xid event: the GPU
  turns unhealthy and recovers by itself after hami-node's quiet period, `--health-recovery-seconds`),
  `gpu-failing` (the GPU fails its probe until cleared), `gpu-nvml` (every NVML call of the node fails
  until cleared);
- API server faults (interface of hami_sim/apiserver/faults.py): `api-conflict` (409 on writes),
  `api-throttle` (429 with Retry-After), `api-error` (500), `api-slow` (answers delayed, some past the
  clients' timeouts), `api-drop-watch` (watches closed mid-stream), `api-gone` (410 on a resumed watch),
  `api-stale-list` (a list served from an older snapshot; with 410s on resumed watches in the same
  window, so that components list again and get the older answer). Their rules match only the components under
  test by User-Agent (`TARGET_USER_AGENTS`), never the runner or the checker, which observe.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KILL_KINDS = (
    "kill-control-leader",
    "kill-control-follower",
    "kill-control-in-bind",
    "kill-scheduler",
    "kill-controller-manager",
    "kill-kubelet",
    "kill-hami-node",
)
GPU_KINDS = ("gpu-xid", "gpu-failing", "gpu-nvml")
GPU_FAULT_OF: Mapping[str, str] = {"gpu-xid": "xid", "gpu-failing": "unhealthy", "gpu-nvml": "nvml-failing"}
"""`Cluster.inject_gpu_fault`'s kind for each GPU fault kind."""
API_KINDS = (
    "api-conflict",
    "api-throttle",
    "api-error",
    "api-slow",
    "api-drop-watch",
    "api-gone",
    "api-stale-list",
)
ALL_KINDS = KILL_KINDS + GPU_KINDS + API_KINDS
"""Every fault kind a cluster of NVIDIA nodes takes."""
VENDOR_KINDS = ("kill-vendor-plugin",)
"""The fault kinds of clusters with nodes of other vendors."""
EVERY_KIND = ALL_KINDS + VENDOR_KINDS

TARGET_USER_AGENTS = (
    "hami-control",
    "hami-node",
    "hami-sim-scheduler",
    "hami-sim-kubelet",
    "hami-sim-controller-manager",
)
"""User-Agent prefixes of the components under test (each composition root names itself)."""

_LANES: Mapping[str, str] = {
    "kill-control-leader": "control",
    "kill-control-follower": "control",
    "kill-control-in-bind": "control",
    "kill-scheduler": "standins",
    "kill-controller-manager": "standins",
    "kill-kubelet": "nodes",
    "kill-hami-node": "nodes",
    "kill-vendor-plugin": "nodes",
    **{k: "gpu" for k in GPU_KINDS},
    **{k: "api" for k in API_KINDS},
}
LANES = ("control", "standins", "nodes", "gpu", "api")


@dataclass(frozen=True)
class ScheduleSpec:
    seed: int
    pods: int
    nodes: tuple[str, ...]
    gpus_per_node: int
    dra: bool = False
    """The cluster has DRA nodes (so a controller-manager to kill)."""
    nvidia_nodes: tuple[str, ...] | None = None
    """The nodes with NVIDIA GPUs (hami-node's kills, GPU faults); None: every node."""
    vendor_nodes: tuple[str, ...] = ()
    """The nodes of other vendors (`kill-vendor-plugin`; none: no such faults)."""
    per_kind: int | None = None
    """Faults of each kind; None: max(2, pods / 500)."""
    kinds: tuple[str, ...] = ALL_KINDS
    window_s: tuple[float, float] = (2.0, 5.0)
    """How long an API fault window or a GPU fault lasts (uniform)."""
    down_s: tuple[float, float] = (0.3, 3.0)
    """How long a killed component stays down (uniform)."""
    slow_delay_s: tuple[float, float] = (1.0, 6.0)
    """How late a slow answer comes (uniform)."""
    past_timeout_s: float = 35.0
    """The delay of the one slow answer per `api-slow` window that outlives the clients' request timeout
    (hami_kube's default is 30 s)."""
    span: tuple[float, float] = (0.03, 0.9)
    """Faults fire between these fractions of the workload."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(EVERY_KIND))
        if unknown:
            raise ValueError(f"kinds: unknown fault kind {unknown[0]!r} (known: {', '.join(EVERY_KIND)})")
        if self.per_kind is not None and self.per_kind < 0:
            raise ValueError(f"per_kind: expected an integer >= 0, got {self.per_kind!r}")
        if not self.nodes:
            raise ValueError("nodes: the schedule needs at least one node")
        if self.nvidia_nodes is not None and not self.nvidia_nodes:
            raise ValueError("nvidia_nodes: the schedule needs at least one node with NVIDIA GPUs")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: expected an integer >= 1, got {self.gpus_per_node!r}")
        for name in ("window_s", "down_s", "slow_delay_s", "span"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name}: expected 0 <= low <= high, got {(low, high)!r}")

    @property
    def count_per_kind(self) -> int:
        return self.per_kind if self.per_kind is not None else max(2, round(self.pods / 500))


@dataclass(frozen=True)
class Fault:
    seq: int
    kind: str
    lane: str
    at_pod: int
    duration_s: float
    target: str = ""
    """The component (kill-kubelet: kubelet/<node>, ...), the node (GPU faults), "" otherwise; the
    control kills name a role (leader, follower) resolved when the fault fires."""
    gpu: int | None = None
    rules: tuple[Mapping[str, Any], ...] = field(default=(), compare=True)
    """API fault windows: the fault switch's rules (`PUT /hami-sim/faults`)."""

    def describe(self) -> str:
        where = self.target + (f" gpu {self.gpu}" if self.gpu is not None else "")
        where = f" {where}" if where else ""
        return f"#{self.seq} {self.kind}{where} at pod {self.at_pod} for {self.duration_s:g} s"


def _rule(name: str, fault: str, probability: float, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "fault": fault,
        "probability": probability,
        "userAgents": list(TARGET_USER_AGENTS),
        **more,
    }


def api_rules(kind: str, name: str, rng: random.Random, spec: ScheduleSpec) -> tuple[dict[str, Any], ...]:
    """The fault switch's rules for one API fault window of `kind`."""
    writes = ["create", "update", "patch", "delete"]
    if kind == "api-conflict":
        return (_rule(name, "conflict", round(rng.uniform(0.2, 0.5), 2), verbs=["update", "patch"]),)
    if kind == "api-throttle":
        return (_rule(name, "throttle", round(rng.uniform(0.1, 0.3), 2), retryAfterSeconds=1),)
    if kind == "api-error":
        verbs = ["get", "list", *writes]
        return (_rule(name, "error", round(rng.uniform(0.05, 0.2), 2), verbs=verbs),)
    if kind == "api-slow":
        delay = round(rng.uniform(*spec.slow_delay_s), 2)
        return (
            _rule(name, "slow", round(rng.uniform(0.05, 0.2), 2), delaySeconds=delay,
                  verbs=["get", "list", *writes]),
            _rule(f"{name}-past-timeout", "slow", 0.05, delaySeconds=spec.past_timeout_s, limit=1,
                  verbs=["get", "patch"]),
        )  # fmt: skip
    if kind == "api-drop-watch":
        return (_rule(name, "drop-watch", round(rng.uniform(0.3, 0.8), 2), verbs=["watch"]),)
    if kind == "api-gone":
        return (_rule(name, "gone", round(rng.uniform(0.3, 0.8), 2), verbs=["watch"]),)
    if kind == "api-stale-list":  # components list again after a 410: then they get an older answer
        return (
            _rule(f"{name}-relist", "gone", round(rng.uniform(0.3, 0.6), 2), verbs=["watch"]),
            _rule(name, "stale-list", round(rng.uniform(0.3, 0.6), 2), verbs=["list"]),
        )
    raise ValueError(f"not an API fault kind: {kind!r}")


def _target(kind: str, rng: random.Random, spec: ScheduleSpec) -> tuple[str, int | None]:
    if kind == "kill-control-follower":
        return "follower", None
    if kind in ("kill-control-leader", "kill-control-in-bind"):
        return "leader", None
    if kind == "kill-scheduler":
        return "scheduler", None
    if kind == "kill-controller-manager":
        return "controller-manager", None
    if kind == "kill-kubelet":
        return f"kubelet/{rng.choice(spec.nodes)}", None
    nvidia = spec.nodes if spec.nvidia_nodes is None else spec.nvidia_nodes
    if kind == "kill-hami-node":
        return f"hami-node/{rng.choice(nvidia)}", None
    if kind == "kill-vendor-plugin":
        return f"vendor/{rng.choice(spec.vendor_nodes)}", None
    if kind == "gpu-nvml":  # about the whole node
        return rng.choice(nvidia), None
    if kind in GPU_KINDS:
        return rng.choice(nvidia), rng.randrange(spec.gpus_per_node)
    return "", None


def build_schedule(spec: ScheduleSpec) -> tuple[Fault, ...]:
    """The faults of a run, ordered by the pod they fire at (then by kind); same spec, same faults."""
    rng = random.Random(f"schedule:{spec.seed}")
    kinds = [
        k
        for k in EVERY_KIND
        if k in spec.kinds
        and (spec.dra or k != "kill-controller-manager")
        and (spec.vendor_nodes or k != "kill-vendor-plugin")
    ]
    low = max(1, int(spec.pods * spec.span[0]))
    high = max(low, int(spec.pods * spec.span[1]))
    drawn: list[tuple[int, str, float, str, int | None, tuple[dict[str, Any], ...]]] = []
    for kind in kinds:
        for n in range(spec.count_per_kind):
            at = rng.randint(low, high)
            span = spec.down_s if kind in KILL_KINDS + VENDOR_KINDS else spec.window_s
            duration = round(rng.uniform(*span), 2)
            target, gpu = _target(kind, rng, spec)
            rules = api_rules(kind, f"{kind}-{n}", rng, spec) if kind in API_KINDS else ()
            drawn.append((at, kind, duration, target, gpu, rules))
    drawn.sort(key=lambda d: (d[0], EVERY_KIND.index(d[1])))
    return tuple(
        Fault(seq, kind, _LANES[kind], at, duration, target, gpu, rules)
        for seq, (at, kind, duration, target, gpu, rules) in enumerate(drawn)
    )


def by_lane(faults: Sequence[Fault]) -> dict[str, list[Fault]]:
    out: dict[str, list[Fault]] = {lane: [] for lane in LANES}
    for fault in faults:
        out[fault.lane].append(fault)
    return {lane: items for lane, items in out.items() if items}


def schedule_data(faults: Sequence[Fault]) -> list[dict[str, Any]]:
    """The schedule as JSON (the report's `schedule`)."""
    return [
        {
            "seq": f.seq,
            "kind": f.kind,
            "atPod": f.at_pod,
            "durationSeconds": f.duration_s,
            "target": f.target,
            "gpu": f.gpu,
            "rules": [dict(r) for r in f.rules],
        }
        for f in faults
    ]


__all__ = [
    "ALL_KINDS",
    "API_KINDS",
    "EVERY_KIND",
    "GPU_FAULT_OF",
    "GPU_KINDS",
    "KILL_KINDS",
    "LANES",
    "TARGET_USER_AGENTS",
    "VENDOR_KINDS",
    "Fault",
    "ScheduleSpec",
    "api_rules",
    "build_schedule",
    "by_lane",
    "schedule_data",
]
