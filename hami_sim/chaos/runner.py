"""The chaos run: bring a local cluster up, drive the workload under the fault schedule while the
invariant checker watches, wait for the end, and report (`run_chaos(ChaosOptions(...)) -> ChaosReport`).

Threads, each with one job:

- the main thread creates the workload's pods at `rate` pods/s (bursts back to back), never more than
  `max_live` at once, through `concurrency` workers; a create refused for a transient reason (hami-control's
  webhook unreachable while a replica restarts, a 5xx, a timeout) is sent again, one refused for good
  (a quota) is counted as refused;
- a deleter deletes the pods whose plan says so when their time comes;
- one thread per fault lane (`schedule.LANES`) fires its faults in order as the run reaches each
  fault's pod, holds it, and recovers (starts the component again, clears the GPU fault, closes the API
  fault window, adding the API server's own counters to the report first);
- the checker's thread calls `InvariantChecker.check_once()` every `check_every_s`;
- a reflector (hami_kube's, the one watch loop of the project) follows the run's pods into a tracker:
  first Running, phase, bind phase, why a pod waits.

The runner and the checker talk to the API server with User-Agents the fault rules never match
(`schedule.TARGET_USER_AGENTS`): they observe, only the components under test see the faults.

At the end the run waits (up to `settle_s`) until every pod it created and did not delete is Running,
Succeeded or Failed, then calls `final_check()`. A pod created, not deleted by the run, and then
neither Running nor Succeeded nor Failed with a reason is lost.

With `vendors` (issue 26) the cluster also has nodes of other vendors, each served by its device-plugin
stand-in (made as `hami-sim up --inventory` makes them), a share of the pods asks them
(`workload.VendorShape`), the fault schedule may kill their plugins (`kill-vendor-plugin`), and the report
counts the pods and the violations per vendor.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hami_api.annotations import BIND_PHASE
from hami_kube.blocking import BlockingKubeApi
from hami_kube.client import JSONDict
from hami_kube.errors import KubeApiError
from hami_sim.chaos.capacity import room_for
from hami_sim.chaos.report import ChaosReport, LatencySummary, LostPod, ViolationSummary
from hami_sim.chaos.schedule import (
    API_KINDS,
    EVERY_KIND,
    GPU_FAULT_OF,
    GPU_KINDS,
    Fault,
    ScheduleSpec,
    build_schedule,
    by_lane,
)
from hami_sim.chaos.workload import (
    RUN_LABEL,
    NamespacePlan,
    PathShape,
    PodPlan,
    VendorShape,
    Workload,
    WorkloadSpec,
    build_workload,
    path_shape,
)
from hami_sim.cluster import Cluster, ClusterError, ClusterSpec, GPUSpec, NodeSpec, node_inventory
from hami_sim.cluster.spec import SpecError, parse_inventory_spec
from hami_sim.progress import ProgressBar

log = logging.getLogger("hami_sim.chaos")

CONTROLLER_MANAGER = "controller-manager"
A100 = GPUSpec("NVIDIA A100-SXM4-80GB")
T4 = GPUSpec("NVIDIA Tesla T4", 15360)
USER_AGENT = "hami-sim-chaos-runner"
FAULT_GRACE_S = 5.0
"""A pod created up to this long after a fault ended still counts as created under it."""
IN_BIND_WAIT_S = 5.0
"""How long `kill-control-in-bind` waits for a pod in bind-phase allocating before it kills anyway."""
TRANSIENT = (0, 429, 500, 502, 503, 504)
START_ATTEMPTS = 5


@dataclass(frozen=True)
class ChaosOptions:
    pods: int = 10_000
    nodes: int = 20
    gpus_per_node: int = 4
    split: int = 10
    seed: int = 1
    mode: str = "mixed"
    state_dir: Path = Path(".hami-sim-chaos")
    rate: float = 10.0
    """Pods created per second (bursts aside)."""
    concurrency: int = 8
    """Creates and deletes in flight at once."""
    max_live: int | None = None
    """Pods alive at once (created, not yet Succeeded, Failed or deleted); None: a third of the slots."""
    duration_cap_s: float = 3 * 3600.0
    """The run stops creating pods after this long (the report says so), then settles."""
    settle_s: float = 300.0
    """How long the end waits for every pod to be Running, Succeeded or Failed."""
    quiet_s: float = 10.0
    """At the end, once no more pods are deleted, how long the cluster gets to act on the last changes
    before the checker's final check."""
    faults_per_kind: int | None = None
    """None: max(2, pods / 500)."""
    fault_kinds: tuple[str, ...] = EVERY_KIND
    """The kinds to draw (`kill-vendor-plugin` only with `vendors`, `kill-controller-manager` only with
    DRA nodes)."""
    vendors: tuple[str, ...] = ()
    """Other vendors' nodes beside the NVIDIA ones (`hygon`, `ascend`, `metax/gpu`, ...: a vendor, or a
    vendor and its plugin mode, as hami-sim up's inventory file names them): `vendor_nodes` nodes of each,
    `gpus_per_node` devices each, its product's defaults."""
    vendor_nodes: int = 1
    """Nodes of each vendor in `vendors`."""
    vendor_share: float = 0.5
    """With `vendors`, the share of pods that asks one of them."""
    bind_timeout_s: float = 300.0
    """The checker's limit for a pod in a bind phase (hami-control's own is 30 s for Allocate)."""
    check_every_s: float = 2.0
    health_recovery_s: float = 3.0
    """hami-node --health-recovery-seconds: a GPU recovers after this quiet period."""
    progress: bool = True
    keep: bool = False
    """Leave the cluster running at the end."""

    def __post_init__(self) -> None:
        checks: Sequence[tuple[str, bool]] = (
            ("pods", self.pods >= 1),
            ("nodes", self.nodes >= 2 if self.mode == "mixed" else self.nodes >= 1),
            ("gpus_per_node", self.gpus_per_node >= 2),
            ("split", self.split >= 1),
            ("rate", self.rate > 0),
            ("concurrency", self.concurrency >= 1),
            ("max_live", self.max_live is None or self.max_live >= 1),
            ("duration_cap_s", self.duration_cap_s > 0),
            ("settle_s", self.settle_s > 0),
            ("quiet_s", self.quiet_s >= 0),
            ("vendor_nodes", self.vendor_nodes >= 1),
            ("vendor_share", 0.0 <= self.vendor_share <= 1.0),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")
        unknown = sorted(set(self.fault_kinds) - set(EVERY_KIND))
        if unknown:
            raise ValueError(f"fault kinds: unknown {unknown[0]!r} (known: {', '.join(EVERY_KIND)})")
        if self.vendors and self.mode == "dra":
            raise ValueError(
                "vendors: other vendors' nodes serve their devices through the device plugin, not DRA"
            )
        duplicate = next((v for v in self.vendors if self.vendors.count(v) > 1), None)
        if duplicate is not None:
            raise ValueError(f"vendors: {duplicate!r} is listed twice")
        vendor_node_specs(self)  # every vendor known (ValueError naming it)


def vendor_node_specs(options: ChaosOptions) -> tuple[NodeSpec, ...]:
    """The run's nodes of other vendors, `chaos-<vendor>[-<mode>]-<i>`, made as `hami-sim up` makes them
    from an inventory file (`{vendor, mode, count}`); ValueError naming a vendor that is not one."""
    entries: dict[str, Any] = {}
    for name in options.vendors:
        vendor, _, mode = name.partition("/")
        entry: dict[str, Any] = {"vendor": vendor, "count": options.gpus_per_node}
        if mode:
            entry["mode"] = mode
        for i in range(options.vendor_nodes):
            entries[f"chaos-{vendor}{'-' + mode if mode else ''}-{i + 1}"] = entry
    if not entries:
        return ()
    try:
        nodes = parse_inventory_spec(entries, "--vendors")
    except SpecError as exc:
        raise ValueError(str(exc)) from None
    vendors = [n.vendor for n in nodes]
    if "nvidia" in vendors:
        raise ValueError("vendors: nvidia: the run's NVIDIA nodes are --nodes")
    return nodes


OVERDUE_S = 120.0
"""A pod that should have completed and is still Running this long after its run time is lost."""
CONTROLLER_MANAGER_ARGS = ("--kube-api-qps", "100", "--kube-api-burst", "100")
"""The controller-manager's client limit in a chaos run: 100 requests a second, as Kubernetes' own
throughput tests run kube-controller-manager (`CONTROLLER_MANAGER_TEST_ARGS="--kube-api-qps=100
--kube-api-burst=100"` of the clusterloader2 jobs), not its default 20. The ResourceClaim controller writes
five times per DRA pod (the claim, the pod's status; at the end the claim's status, its finalizer, its
deletion), so at 20 it keeps up with 4 DRA pods a second and the run's churn (10 pods a second, a third of
them through DRA in mixed mode, all of them with `--mode dra`), with its retries under API faults, left
claims created and released minutes late (issue 31)."""


def cluster_spec(options: ChaosOptions) -> ClusterSpec:
    """The run's cluster: `nodes` nodes of A100s, every third pair T4s (so both paths have both models
    from 6 nodes on), then `vendor_nodes` nodes of each of `vendors`, scale mode, two hami-control
    replicas, GPUs that recover after a quiet period."""
    nodes = tuple(
        NodeSpec(f"chaos-{i + 1}", ((T4 if i % 6 >= 4 else A100),) * options.gpus_per_node)
        for i in range(options.nodes)
    ) + vendor_node_specs(options)
    spec = ClusterSpec(
        nodes,
        split=options.split,
        scale=True,
        control_replicas=2,
        node_args=("--health-recovery-seconds", f"{options.health_recovery_s:g}"),
        controller_manager_args=CONTROLLER_MANAGER_ARGS,
        extra={"chaos": {"seed": options.seed, "pods": options.pods}},
    )
    return spec.with_mode(options.mode)


def shapes(spec: ClusterSpec) -> tuple[PathShape | None, PathShape | None]:
    """(device-plugin, DRA) paths' GPUs: models and UUIDs from the nodes' fake inventories."""
    out: dict[str, tuple[list[tuple[str, int]], list[str]]] = {"device-plugin": ([], []), "dra": ([], [])}
    for node in spec.nodes:
        if not node.gpus:
            continue
        models, uuids = out[node.mode]
        for gpu in node_inventory(node).gpus:
            models.append((gpu.model, gpu.memory_mib))
            uuids.append(gpu.uuid)
    dp, dra = out["device-plugin"], out["dra"]
    return (path_shape(*dp) if dp[1] else None, path_shape(*dra) if dra[1] else None)


def vendor_shapes(spec: ClusterSpec) -> tuple[VendorShape, ...]:
    """The other vendors' devices of the cluster, one shape per vendor (and mode)."""
    shapes: dict[str, VendorShape] = {}
    for node in spec.nodes:
        d = node.devices
        if d is None:
            continue
        shape = VendorShape(d.vendor, d.mode, d.common_word, d.memory_mib, d.cores, d.split, d.count)
        shapes.setdefault(shape.key, shape)
    return tuple(shapes.values())


def default_max_live(options: ChaosOptions) -> int:
    """A third of the slots: NVIDIA's (`split` per GPU) and the vendor devices' shares."""
    slots = options.nodes * options.gpus_per_node * options.split
    vendors = [n.devices for n in vendor_node_specs(options) if n.devices is not None]
    slots += sum(d.count * d.split for d in vendors)
    return max(10, slots // 3)


def plan(options: ChaosOptions, run_id: str = "chaos") -> tuple[ClusterSpec, Workload, tuple[Fault, ...]]:
    """The cluster, workload and fault schedule of a run, all pure: the same options give the same."""
    spec = cluster_spec(options)
    dp, dra = shapes(spec)
    max_live = options.max_live or default_max_live(options)
    # A quota namespace gets about a fifth of the pods; its limit is about half of what they would hold
    # at the busiest, so some are refused and most are not.
    quota_mib = max(20_000, int(max_live * 0.2 * 3000 * 0.5))
    workload = build_workload(
        WorkloadSpec(
            options.pods,
            options.seed,
            options.mode,
            dp,
            dra,
            quota_mib=quota_mib,
            run_id=run_id,
            vendors=vendor_shapes(spec),
            vendor_share=options.vendor_share,
        )
    )
    schedule = build_schedule(
        ScheduleSpec(
            options.seed,
            options.pods,
            tuple(n.name for n in spec.nodes),
            options.gpus_per_node,
            dra=bool(spec.dra_nodes),
            nvidia_nodes=spec.nvidia_nodes if spec.vendor_nodes else None,
            vendor_nodes=spec.vendor_nodes,
            per_kind=options.faults_per_kind,
            kinds=options.fault_kinds,
        )
    )
    return spec, workload, schedule


# --- the pods' tracker -------------------------------------------------------------------------------------


@dataclass
class PodTrack:
    plan: PodPlan
    created_at: float | None = None
    """When the create was sent (the one that succeeded)."""
    running_at: float | None = None
    phase: str = ""
    bind_phase: str = ""
    reason: str = ""
    message: str = ""
    waiting: str = ""
    """Why it is not running yet: the PodScheduled condition's message, a container's waiting reason."""
    refused: str = ""
    deleted_by_run: bool = False
    vanished: bool = False
    """Gone from the API server without the run deleting it."""
    gone: bool = False
    """Gone from the API server (a DELETED event, or missing from a relist)."""

    @property
    def done(self) -> bool:
        return bool(self.refused) or self.deleted_by_run or self.phase in ("Succeeded", "Failed")

    @property
    def deleting(self) -> bool:
        """Deleted by the run and still on the API server."""
        return self.deleted_by_run and not self.gone

    @property
    def settled(self) -> bool:
        return self.done or self.vanished or self.phase == "Running"


class PodTracker:
    """The run's pods as the reflector sees them (its sink: called on the client's loop thread) and as
    the runner creates and deletes them (called from the workers). Thread-safe."""

    def __init__(self, plans: Sequence[PodPlan], clock: Callable[[], float]) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.pods: dict[tuple[str, str], PodTrack] = {(p.namespace, p.name): PodTrack(p) for p in plans}
        self._page: list[JSONDict] = []

    # WatchSink
    def begin_replace(self) -> None:
        self._page = []

    def add_page(self, items: Sequence[JSONDict]) -> None:
        self._page.extend(items)

    def end_replace(self) -> None:
        items, self._page = self._page, []
        seen = set()
        for obj in items:
            seen.add(self._observe(obj))
        with self._lock:
            for key, track in self.pods.items():
                if track.created_at is not None and key not in seen:
                    track.gone = True
                    if not track.deleted_by_run:
                        track.vanished = True

    def apply(self, kind: str, obj: JSONDict) -> None:
        key = self._observe(obj)
        if kind == "DELETED":
            with self._lock:
                track = self.pods.get(key)
                if track is not None:
                    track.gone = True
                    if not track.deleted_by_run and track.phase not in ("Succeeded", "Failed"):
                        track.vanished = True

    def _observe(self, obj: JSONDict) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "")
        now = self._clock()
        with self._lock:
            track = self.pods.get(key)
            if track is None:
                return key
            track.phase = phase
            track.bind_phase = str((meta.get("annotations") or {}).get(BIND_PHASE) or "")
            track.reason = str(status.get("reason") or "")
            track.message = str(status.get("message") or "")
            track.waiting = _waiting(status)
            if phase in ("Running", "Succeeded") and track.running_at is None:
                track.running_at = now
        return key

    # the runner's side
    def created(self, key: tuple[str, str], at: float) -> None:
        with self._lock:
            self.pods[key].created_at = at

    def refused(self, key: tuple[str, str], why: str) -> None:
        with self._lock:
            self.pods[key].refused = why

    def deleted(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.pods[key].deleted_by_run = True

    def snapshot(self) -> list[PodTrack]:
        with self._lock:
            return [replace(t) for t in self.pods.values()]

    def counts(self) -> dict[str, int]:
        out = {"live": 0, "running": 0, "succeeded": 0, "created": 0}
        with self._lock:
            for t in self.pods.values():
                if t.created_at is None:
                    continue
                out["created"] += 1
                out["live"] += not t.done
                out["running"] += t.phase == "Running" and not t.deleted_by_run
                out["succeeded"] += t.phase == "Succeeded"
        return out

    def any_allocating(self) -> bool:
        with self._lock:
            return any(t.bind_phase == "allocating" and not t.done for t in self.pods.values())


def _waiting(status: Mapping[str, Any]) -> str:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".strip()
    for cs in (*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            reason = waiting.get("reason") or "Waiting"
            return f"{cs.get('name')}: {reason}: {waiting.get('message') or ''}".strip()
    return ""


# --- faults ------------------------------------------------------------------------------------------


@dataclass
class FaultLog:
    """What the lanes did: faults injected by kind, the windows they were active in, errors, and the API
    server's own counters (read before each window closes: a new `PUT` resets them)."""

    injected: dict[str, int] = field(default_factory=dict)
    windows: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    api_injected: dict[str, int] = field(default_factory=dict)
    start_failures: list[str] = field(default_factory=list)
    """Components that exited at a start (each was started again)."""
    in_bind: int = 0
    """`kill-control-in-bind` faults that found a pod in bind-phase allocating when they killed."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self, kind: str, start: float, end: float) -> None:
        with self.lock:
            self.injected[kind] = self.injected.get(kind, 0) + 1
            self.windows.append((start, end))

    def error(self, text: str) -> None:
        log.warning("fault: %s", text)
        with self.lock:
            self.errors.append(text)

    def add_api(self, counts: Mapping[str, Any]) -> None:
        with self.lock:
            for key, value in counts.items():
                if isinstance(value, int):
                    self.api_injected[key] = self.api_injected.get(key, 0) + value

    def active_at(self, at: float) -> bool:
        with self.lock:
            return any(start <= at <= end + FAULT_GRACE_S for start, end in self.windows)


class FaultRunner:
    """Fires one lane's faults in order as the run reaches their pods (`reached(at_pod)`), until stopped."""

    def __init__(
        self,
        cluster: Cluster,
        api: BlockingKubeApi,
        tracker: PodTracker,
        faults_log: FaultLog,
        *,
        seed: int,
        clock: Callable[[], float],
    ) -> None:
        self.cluster = cluster
        self.api = api
        self.tracker = tracker
        self.log = faults_log
        self.seed = seed
        self.clock = clock
        self.stop = threading.Event()
        self.hurry = threading.Event()
        """Set at the duration cap: faults still to come are skipped."""
        self._created = 0
        self._cond = threading.Condition()

    def reached(self, created: int) -> None:
        with self._cond:
            self._created = created
            self._cond.notify_all()

    def all_created(self) -> None:
        self.reached(1 << 62)

    def run_lane(self, faults: Sequence[Fault]) -> None:
        for fault in faults:
            with self._cond:
                while self._created < fault.at_pod and not self.stop.is_set():
                    self._cond.wait(0.5)
            if self.stop.is_set() or self.hurry.is_set():
                return
            try:
                self.fire(fault)
            except Exception as exc:  # a fault that fails is reported, the run goes on
                self.log.error(f"{fault.describe()}: {type(exc).__name__}: {exc}")

    def _hold(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def fire(self, fault: Fault) -> None:
        start = self.clock()
        if fault.kind in API_KINDS:
            self._api_window(fault)
        elif fault.kind in GPU_KINDS:
            kind = GPU_FAULT_OF[fault.kind]
            self.cluster.inject_gpu_fault(fault.target, fault.gpu, kind)
            try:
                self._hold(fault.duration_s)
            finally:
                self.cluster.clear_gpu_fault(fault.target, fault.gpu)
        else:
            self._kill(fault)
        self.log.done(fault.kind, start, self.clock())

    def _component(self, fault: Fault) -> str:
        if fault.target in ("leader", "follower"):
            leader = self.cluster.leader()
            if fault.target == "leader":
                return leader
            others = [r for r in self.cluster.control_replicas if r != leader]
            return others[0] if others else leader
        return fault.target

    def _kill(self, fault: Fault) -> None:
        if fault.kind == "kill-control-in-bind":
            deadline = self.clock() + IN_BIND_WAIT_S
            while not self.tracker.any_allocating() and self.clock() < deadline and not self.stop.is_set():
                time.sleep(0.01)
            if self.tracker.any_allocating():
                with self.log.lock:
                    self.log.in_bind += 1
        component = self._component(fault)
        self.cluster.kill(component)
        try:
            self._hold(fault.duration_s)
        finally:
            self._start(component)

    def _start(self, component: str) -> None:
        """Start a killed component again; one that exits at start is started again after 1, 2, 4, 8 s
        (as kubelet restarts a crashed container), each such exit noted in the report."""
        for attempt in range(START_ATTEMPTS):
            try:
                self.cluster.start_component(component, timeout_s=120.0)
                return
            except ClusterError as exc:
                first = str(exc).splitlines()[0][:300]
                with self.log.lock:
                    self.log.start_failures.append(f"{component}: {first}")
                if attempt == START_ATTEMPTS - 1:
                    raise
            self.stop.wait(2.0**attempt)

    def _api_window(self, fault: Fault) -> None:
        body = {"seed": self.seed * 100_003 + fault.seq, "rules": [dict(r) for r in fault.rules]}
        self.api.request("PUT", "/hami-sim/faults", body, timeout_s=10.0)
        try:
            self._hold(fault.duration_s)
        finally:
            try:
                state = self.api.get("/hami-sim/faults", timeout_s=10.0)
                self.log.add_api(state.get("injected") or {})
            finally:
                self.api.request("DELETE", "/hami-sim/faults", timeout_s=10.0)


# --- the run ----------------------------------------------------------------------------------------------


class ChaosRun:
    def __init__(self, options: ChaosOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self.run_id = f"seed-{options.seed}"
        self.spec, self.workload, self.schedule = plan(options, self.run_id)
        self.max_live = options.max_live or default_max_live(options)
        self.tracker = PodTracker(self.workload.pods, clock)
        self.faults = FaultLog()
        self.report = ChaosReport(
            options.seed,
            options.mode,
            options.nodes,
            options.gpus_per_node,
            options.pods,
            vendors=list(options.vendors),
            vendor_nodes=len(self.spec.vendor_nodes),
        )
        self.t0 = clock()
        self._deletes: list[tuple[float, int, tuple[str, str]]] = []
        self._deletes_lock = threading.Lock()
        self._stop = threading.Event()
        self._no_more_deletes = threading.Event()
        self._retries = 0
        self._checker: Any = None
        self._checker_lock = threading.Lock()

    # -- entry -----------------------------------------------------------------------------------------

    def run(self, progress: Callable[[str], None] | None = None) -> ChaosReport:
        say = progress or (lambda message: log.info("%s", message))
        say(
            f"chaos run: {self.options.pods} pods ({_kinds_text(self.workload)}), "
            f"{len(self.schedule)} faults, seed {self.options.seed}"
        )
        started = self.clock()
        cluster = Cluster.up(self.spec, self.options.state_dir, progress=say)
        self.report.cluster_up_s = self.clock() - started
        try:
            with self._client(cluster) as api:
                self._drive(cluster, api, say)
        finally:
            if not self.options.keep:
                cluster.down()
        return self.report

    @contextmanager
    def _client(self, cluster: Cluster) -> Iterator[BlockingKubeApi]:
        options: dict[str, Any] = {"qps": 0, "max_connections": self.options.concurrency + 8}
        options["user_agent"] = USER_AGENT
        api = BlockingKubeApi.connect(cluster.kubeconfig, name="chaos-client", **options)
        try:
            yield api
        finally:
            api.close()

    def _drive(self, cluster: Cluster, api: BlockingKubeApi, say: Callable[[str], None]) -> None:
        from hami_sim.chaos.checker import InvariantChecker

        for namespace in self.workload.namespaces:
            self._create_namespace(api, namespace)
        reflector = api.start_reflector(
            "chaos-pods", "/api/v1/pods", self.tracker, params={"labelSelector": f"{RUN_LABEL}={self.run_id}"}
        )
        reflector.wait_synced(60.0)
        kubelet_dirs = {node: cluster.kubelet_dir(node) for node in cluster.node_names}
        self._checker = InvariantChecker(
            cluster.kubeconfig, kubelet_dirs, bind_timeout_s=self.options.bind_timeout_s
        )
        faults = FaultRunner(
            cluster, api, self.tracker, self.faults, seed=self.options.seed, clock=self.clock
        )
        self.t0 = self.clock()
        threads = [
            threading.Thread(target=faults.run_lane, args=(lane,), name=f"chaos-lane-{name}", daemon=True)
            for name, lane in by_lane(self.schedule).items()
        ]
        threads.append(threading.Thread(target=self._check_loop, name="chaos-checker", daemon=True))
        threads.append(
            threading.Thread(target=self._delete_loop, args=(api,), name="chaos-deleter", daemon=True)
        )
        for thread in threads:
            thread.start()
        bar = ProgressBar(self.options.pods, unit="pods", enabled=self.options.progress, clock=self.clock)
        try:
            self._create_all(api, faults, bar)
            faults.all_created()
            say(f"all pods sent in {self.clock() - self.t0:.0f} s; waiting for the fault lanes to finish")
            for thread in threads[:-2]:
                while thread.is_alive():
                    thread.join(1.0)
                    self._progress(bar)
            say("faults done; waiting for every pod to settle")
            self._settle(bar)
            say(f"settled; no more deletes, waiting {self.options.quiet_s:g} s for the cluster to be quiet")
            self._quiesce(api)
        finally:
            faults.stop.set()
            self._stop.set()
            for thread in threads:
                thread.join(130.0)
            bar.close()
        with self._checker_lock:
            try:
                final = self._checker.final_check()
            finally:
                self._checker.close()
        self._record(final)
        self.report.checker_passes += 1
        self._finish(api)
        reflector.stop()

    def _create_namespace(self, api: BlockingKubeApi, namespace: NamespacePlan) -> None:
        for manifest in namespace.manifests():
            path = "/api/v1/namespaces"
            if manifest["kind"] == "ResourceQuota":
                path = f"/api/v1/namespaces/{namespace.name}/resourcequotas"
            try:
                api.request("POST", path, manifest, timeout_s=30.0)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise

    # -- creating -------------------------------------------------------------------------------------

    def _create_all(self, api: BlockingKubeApi, faults: FaultRunner, bar: ProgressBar) -> None:
        interval = 1.0 / self.options.rate
        next_at = self.clock()
        sent = 0
        with concurrent.futures.ThreadPoolExecutor(self.options.concurrency, "chaos-create") as pool:
            pending: set[concurrent.futures.Future[None]] = set()
            for pod in self.workload.pods:
                if self.clock() - self.t0 > self.options.duration_cap_s:
                    self.report.notes.append(
                        f"duration cap {self.options.duration_cap_s:g} s reached after {sent} pods: "
                        "the rest were not created"
                    )
                    faults.hurry.set()
                    break
                if not pod.burst:
                    wait = next_at - self.clock()
                    if wait > 0:
                        time.sleep(wait)
                    next_at = max(next_at + interval, self.clock() - 1.0)
                while True:  # bounded: never more than max_live alive, never more than `concurrency` sends
                    pending = {f for f in pending if not f.done()}
                    live = self.tracker.counts()["live"]
                    if live < self.max_live and len(pending) < self.options.concurrency * 2:
                        break
                    self._progress(bar)
                    time.sleep(0.05)
                pending.add(pool.submit(self._create, api, pod))
                sent += 1
                faults.reached(sent)
                self._progress(bar)
            concurrent.futures.wait(pending)
        self.report.pods_created = sum(t.created_at is not None for t in self.tracker.snapshot())

    def _create(self, api: BlockingKubeApi, pod: PodPlan) -> None:
        key = (pod.namespace, pod.name)
        delay = 0.2
        while not self._stop.is_set():
            at = self.clock()
            try:
                api.request("POST", f"/api/v1/namespaces/{pod.namespace}/pods", pod.body, timeout_s=30.0)
            except KubeApiError as exc:
                if exc.status == 409 and exc.reason == "AlreadyExists":  # an earlier try got through
                    self.tracker.created(key, at)
                    break
                if _transient(exc):
                    self._retries += 1
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                self.tracker.refused(key, _refusal(exc))
                return
            self.tracker.created(key, at)
            break
        else:
            return
        if pod.delete_after_s is not None:
            with self._deletes_lock:
                heapq.heappush(self._deletes, (self.clock() + pod.delete_after_s, pod.index, key))

    # -- deleting ------------------------------------------------------------------------------------

    def _delete_loop(self, api: BlockingKubeApi) -> None:
        with concurrent.futures.ThreadPoolExecutor(
            max(1, self.options.concurrency // 2), "chaos-delete"
        ) as pool:
            while not self._stop.is_set() and not self._no_more_deletes.is_set():
                due: list[tuple[str, str]] = []
                with self._deletes_lock:
                    while self._deletes and self._deletes[0][0] <= self.clock():
                        due.append(heapq.heappop(self._deletes)[2])
                for key in due:
                    pool.submit(self._delete, api, key)
                self._stop.wait(0.05)

    def _delete(self, api: BlockingKubeApi, key: tuple[str, str]) -> None:
        namespace, name = key
        delay = 0.2
        while not self._stop.is_set():
            try:
                api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", timeout_s=30.0)
            except KubeApiError as exc:
                if exc.not_found:
                    break
                if not _transient(exc):
                    log.warning("deleting %s/%s: %s", namespace, name, exc)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            break
        self.tracker.deleted(key)

    def deletes_due(self) -> int:
        with self._deletes_lock:
            return len(self._deletes)

    # -- checking ------------------------------------------------------------------------------------

    def _check_loop(self) -> None:
        while not self._stop.wait(self.options.check_every_s):
            try:
                with self._checker_lock:
                    found = self._checker.check_once()
            except Exception as exc:  # the API server under faults: the next pass tries again
                log.debug("checker pass failed: %s", exc)
                continue
            self._record(found)
            self.report.checker_passes += 1

    def _record(self, found: Sequence[Any]) -> None:
        self.report.add_violations(
            [ViolationSummary(v.kind, v.subject, v.message, dict(v.evidence), v.at - self.t0) for v in found]
        )

    # -- the end ---------------------------------------------------------------------------------------

    def _settle(self, bar: ProgressBar) -> None:
        deadline = self.clock() + self.options.settle_s
        while self.clock() < deadline:
            tracks = self.tracker.snapshot()
            if all(t.settled for t in tracks if t.created_at is not None):
                return
            self._progress(bar)
            time.sleep(0.5)
        self.report.notes.append(f"not every pod settled within {self.options.settle_s:g} s")

    def _quiesce(self, api: BlockingKubeApi) -> None:
        """The end's quiet: no more deletes (pods due later stay Running), the pods deleted so far gone
        from the API server and (with DRA nodes) no ResourceClaim left of a gone pod (up to `settle_s`:
        the controller-manager, rate-limited as kube-controller-manager is, may be tens of seconds behind
        after a burst of deletes), then `quiet_s` for node daemons and kubelets to act on the last
        changes, before `final_check`, which wants a cluster meant to be quiet."""
        self._no_more_deletes.set()
        deadline = self.clock() + self.options.settle_s
        while self.clock() < deadline and any(t.deleting for t in self.tracker.snapshot()):
            time.sleep(0.2)
        still = sum(t.deleting for t in self.tracker.snapshot())
        if still:
            self.report.notes.append(
                f"{still} pods deleted by the run were still on the API server at the end"
            )
        if self.spec.dra_nodes:
            started = self.clock()
            while self.clock() < deadline and (orphans := self._orphan_claims(api)):
                time.sleep(0.5)
            waited = self.clock() - started
            if orphans:
                self.report.notes.append(f"{orphans} ResourceClaims of gone pods were left at the end")
            elif waited > 1.0:
                self.report.notes.append(
                    f"the controller-manager removed the last claims of gone pods {waited:.0f} s after "
                    "the last delete"
                )
        self._stop.wait(self.options.quiet_s)

    def _orphan_claims(self, api: BlockingKubeApi) -> int:
        """ResourceClaims generated for a pod (owner reference) that is gone: the controller-manager (the
        local cluster's garbage collector too) has not caught up yet; -1 when the lists fail."""
        try:
            claims = api.get("/apis/resource.k8s.io/v1/resourceclaims", timeout_s=30.0).get("items") or []
            pods = api.get("/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={self.run_id}"}, timeout_s=30.0)
        except KubeApiError:
            return -1
        uids = {str((p.get("metadata") or {}).get("uid")) for p in pods.get("items") or []}
        owners = [
            str(ref.get("uid"))
            for claim in claims
            for ref in (claim.get("metadata") or {}).get("ownerReferences") or []
            if ref.get("kind") == "Pod" and ref.get("controller")
        ]
        return sum(uid not in uids for uid in owners)

    def _progress(self, bar: ProgressBar) -> None:
        c = self.tracker.counts()
        with self.faults.lock:
            injected = sum(self.faults.injected.values())
        bar.update(
            c["created"],
            f"live {c['live']} Running {c['running']} Succeeded {c['succeeded']} faults {injected} "
            f"violations {self.report.violation_count}",
        )

    @staticmethod
    def _overdue(track: PodTrack, now: float) -> float | None:
        """How long past its end a pod that should have completed is still Running (None: not overdue).
        Its containers exit `run_s` after they start; one still Running `OVERDUE_S` later is a pod its
        kubelet no longer runs (it ended, or was forgotten) whose end never reached the API server: it
        holds its GPUs in the scheduler's and hami-control's eyes for good."""
        plan = track.plan
        if plan.end != "complete" or plan.run_s is None or track.running_at is None:
            return None
        overdue = now - track.running_at - plan.run_s
        return overdue if overdue > OVERDUE_S else None

    def _weigh_room(self, api: BlockingKubeApi, lost: list[LostPod]) -> list[LostPod]:
        """Each lost pod with whether the cluster had room for it at the end (`capacity.room_for`, on
        what the checker's final check read): a real loss, or a wait for a cluster that was full."""
        snapshot = getattr(self._checker, "final_snapshot", None)
        if not lost or snapshot is None:
            return lost
        classes: list[dict[str, Any]] = []
        if self.spec.dra_nodes:
            try:
                classes = api.get("/apis/resource.k8s.io/v1/deviceclasses", timeout_s=30.0).get("items") or []
            except KubeApiError as exc:
                self.report.notes.append(f"room of the lost pods not weighed: deviceclasses: {exc}")
                return lost
        pods = {
            (str((p.get("metadata") or {}).get("namespace")), str((p.get("metadata") or {}).get("name"))): p
            for p in snapshot.pods
        }
        weighed = []
        for pod in lost:
            if pod.phase == "Running":  # placed: room is not the question
                weighed.append(pod)
                continue
            found = pods.get((pod.namespace, pod.name))
            if found is None:
                weighed.append(replace(pod, room_detail="gone from the API server at the end"))
                continue
            room = room_for(found, snapshot, classes)
            weighed.append(replace(pod, room=room.room, room_detail=room.detail))
        return weighed

    def _finish(self, api: BlockingKubeApi) -> None:
        report = self.report
        report.duration_s = self.clock() - self.t0
        report.faults = dict(self.faults.injected)
        report.fault_errors = list(self.faults.errors)
        report.api_injected = dict(self.faults.api_injected)
        report.create_retries = self._retries
        report.notes += [f"exited at start, started again: {line}" for line in self.faults.start_failures]
        if report.faults.get("kill-control-in-bind"):
            report.notes.append(
                f"kill-control-in-bind: {self.faults.in_bind} of {report.faults['kill-control-in-bind']} "
                "killed the leader while a pod was in bind-phase allocating"
            )
        now = self.clock()
        with_faults: list[float] = []
        without: list[float] = []
        by_path: dict[str, list[float]] = {}
        whole_by_path: dict[str, list[float]] = {}
        for t in self.tracker.snapshot():
            if t.refused:
                word = t.refused
                report.refused[word] = report.refused.get(word, 0) + 1
                report.count_vendor(t.plan.vendor, "refused")
                continue
            if t.created_at is None:
                continue
            report.count_vendor(t.plan.vendor, "created")
            if t.running_at is not None and t.running_at >= t.created_at:
                took = t.running_at - t.created_at
                (with_faults if self.faults.active_at(t.created_at) else without).append(took)
                by_path.setdefault(t.plan.path, []).append(took)
                if asks_whole_gpus(t.plan):
                    whole_by_path.setdefault(t.plan.path, []).append(took)
            if t.deleted_by_run:
                report.deleted += 1
                report.count_vendor(t.plan.vendor, "deleted")
            elif t.phase == "Succeeded":
                report.succeeded += 1
                report.count_vendor(t.plan.vendor, "succeeded")
            elif t.phase == "Running" and (overdue := self._overdue(t, now)) is not None:
                why = f"Running {overdue:.0f} s after its containers should have ended: its kubelet let it go"
                report.lost.append(
                    LostPod(t.plan.namespace, t.plan.name, "Running", why, t.plan.vendor, t.plan.path)
                )
                report.count_vendor(t.plan.vendor, "lost")
            elif t.phase == "Running":
                report.running += 1
                report.count_vendor(t.plan.vendor, "running")
            elif t.phase == "Failed" and (t.reason or t.message):
                why = t.reason or t.message[:60]
                report.failed[why] = report.failed.get(why, 0) + 1
                report.count_vendor(t.plan.vendor, "failed")
            else:
                why = (
                    "deleted by someone else" if t.vanished else (t.waiting or t.message or "no reason given")
                )
                if t.bind_phase:
                    why += f" (bind-phase {t.bind_phase})"
                report.lost.append(
                    LostPod(
                        t.plan.namespace, t.plan.name, t.phase or "unknown", why, t.plan.vendor, t.plan.path
                    )
                )
                report.count_vendor(t.plan.vendor, "lost")
        report.pods_created = sum(1 for t in self.tracker.snapshot() if t.created_at is not None)
        report.running_with_faults = LatencySummary.of(with_faults)
        report.running_without_faults = LatencySummary.of(without)
        report.running_by_path = {path: LatencySummary.of(v) for path, v in by_path.items()}
        report.whole_gpu_by_path = {path: LatencySummary.of(v) for path, v in whole_by_path.items()}
        report.lost = self._weigh_room(api, report.lost)
        disagreements = getattr(self._checker, "kubelet_disagreements", 0)
        if disagreements:
            report.notes.append(
                f"{disagreements} started vendor containers hold kubelet device IDs of other devices than "
                "their pod's annotation (the vendors' plugins offer no GetPreferredAllocation and answer "
                "Allocate from the annotation): not a violation"
            )


def asks_whole_gpus(plan: PodPlan) -> bool:
    """A pod asking whole GPUs: a GPU alone (`exclusive`) or all the cores of its GPUs (100)."""
    if plan.kind == "exclusive":
        return True
    containers = (plan.body.get("spec") or {}).get("containers") or ()
    return any(
        str(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpucores")) == "100"
        for c in containers
    )


def _transient(exc: KubeApiError) -> bool:
    """A refusal worth another try: no answer, throttled, a server error, or hami-control's webhook
    unreachable (kube-apiserver answers 500 "failed calling webhook" under failurePolicy Fail)."""
    return exc.status in TRANSIENT or "failed calling webhook" in exc.message


def _refusal(exc: KubeApiError) -> str:
    """The reason a create was refused for good, in a few words (the report counts them)."""
    text = exc.message
    if "quota" in text.lower():
        return "GPU quota exceeded"
    return f"{exc.status} {exc.reason}: {text[:80]}"


def _kinds_text(workload: Workload) -> str:
    return ", ".join(f"{k} {v}" for k, v in workload.kinds().items())


def run_chaos(options: ChaosOptions, progress: Callable[[str], None] | None = None) -> ChaosReport:
    return ChaosRun(options).run(progress)


__all__ = [
    "ChaosOptions",
    "ChaosRun",
    "PodTracker",
    "cluster_spec",
    "plan",
    "run_chaos",
    "shapes",
    "vendor_node_specs",
    "vendor_shapes",
]
