"""hami_control.pod_store: the uid-keyed pod store that the pods watch feeds. One table test per rule
(what a pod holds, the binder's assumptions, deletes by name, relists, listeners, the quota totals and
the webhook's admissions, the ask rebuilt from a record), and a property test that for any sequence of
events the GPU usage the store gives the cache equals a from-scratch recomputation over the live pods."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hami_api.annotations import (
    BIND_PHASE,
    DEVICE_CORDON,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GPU_SCHEDULER_POLICY,
    NODE_PAIR_SCORE,
    NODE_REGISTER,
    VGPU_NODE,
    decode_node_register,
    decode_pair_scores,
    decode_pod_allocation,
    encode_node_register,
    encode_node_register_legacy,
    encode_pair_scores,
    encode_pod_allocation,
)
from hami_api.containers import ContainerKind, footprint_slices, init_kinds
from hami_api.errors import WireFormatError
from hami_api.types import ContainerAllocation, GPUInfo, GPUPairScore, GPUSlice, PodAllocation
from hami_control.cache import ClusterCache
from hami_control.config import ControlConfig, FragmentationFilter
from hami_control.extender import ExtenderArgsError, read_pod_ask
from hami_control.pod_store import PodRecord, PodStore, pod_cpu_milli, pod_record
from hami_control.quota import QuotaUsage
from hami_control.usage import NodeGPUs, with_slices
from tests.builders import (
    Json,
    allocation,
    allocation_annotations,
    container,
    gpu_info,
    gpu_pod,
    gpu_usage,
    node,
    pod,
)

CONFIG = ControlConfig()

# --- builders ------------------------------------------------------------------------------------------


def peak(allocation: PodAllocation, inits: int) -> tuple[GPUSlice, ...]:
    """The footprint of a pod whose first `inits` containers are plain init containers."""
    return footprint_slices(allocation, init_kinds(inits, len(allocation)))


def watched_pod(
    uid: str,
    node: str | None = "n1",
    placed: PodAllocation | str | None = None,
    *,
    inits: int = 0,
    regular: int = 1,
    phase: str = "Running",
    key: str = DEVICES_ALLOCATED,
    name: str | None = None,
) -> Json:
    """Pod `default/pod-<uid>` (or `name`) as the watch shows it: `hami.io/vgpu-node` `node` and `placed`
    under `key`, each when given; `inits` init containers then `regular` containers."""
    return pod(
        name or f"pod-{uid}",
        *(container(f"c{i}") for i in range(regular)),
        init=[container(f"i{i}") for i in range(inits)],
        namespace="default",
        uid=uid,
        phase=phase,
        annotations=allocation_annotations(node, placed, bind_phase=None, keys=(key,)),
    )


def asking_pod(
    uid: str,
    *,
    namespace: str = "ns",
    name: str | None = None,
    mem: int = 4000,
    phase: str = "Pending",
    version: str = "1",
    annotations: dict[str, str] | None = None,
) -> Json:
    """A pod asking one GPU with `mem` MiB (what the webhook and the extender see)."""
    return gpu_pod(
        name or f"pod-{uid}",
        gpumem=mem,
        namespace=namespace,
        uid=uid,
        phase=phase,
        resource_version=version,
        annotations=dict(annotations or {}),
    )


G0, G1 = gpu_info(0, count=4), gpu_info(1, count=4)


def cluster(
    *gpus: GPUInfo, registered: bool = True, config: ControlConfig = CONFIG
) -> tuple[ClusterCache, PodStore]:
    """A GPU cache (with node n1 unless not `registered`) and the pod store that feeds it."""
    cache = ClusterCache()
    if registered:
        cache.node_upserted(node("n1", gpus or (G0, G1)))
    return cache, PodStore(config, cache)


def delete(pods: PodStore, namespace: str, name: str, uid: str) -> None:
    """A DELETED watch event (without a uid when `uid` is empty)."""
    meta = {"namespace": namespace, "name": name}
    if uid:
        meta["uid"] = uid
    pods.apply("DELETED", {"metadata": meta})


# --- pods ----------------------------------------------------------------------------------------------


def test_pod_counted_from_allocated() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    holding = cache.holding("u1")
    assert holding is not None and (holding.namespace, holding.name, holding.node) == (
        "default",
        "pod-u1",
        "n1",
    )
    assert not holding.assumed


def test_pod_falls_back_to_to_allocate() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-1", 700, 0)]), key=DEVICES_TO_ALLOCATE))
    assert gpu_usage(cache, "GPU-1") == (1, 700, 0)


def test_allocated_wins_over_to_allocate() -> None:
    cache, pods = cluster()
    pod = watched_pod("u1", "n1", allocation([("GPU-1", 700, 0)]))
    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = ";"  # consumed by the node daemon
    pods.apply("MODIFIED", pod)
    assert gpu_usage(cache, "GPU-1") == (1, 700, 0)


def test_pod_without_vgpu_node_not_counted() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", None, allocation([("GPU-0", 1000, 10)])))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert cache.holding("u1") is None


def test_init_container_peak_accounting() -> None:
    cache, pods = cluster()
    placed = allocation([("GPU-0", 8000, 50)], [("GPU-0", 2000, 10)], [("GPU-0", 1000, 10)])
    pods.apply("MODIFIED", watched_pod("u1", "n1", placed, inits=1, regular=2))
    assert gpu_usage(cache, "GPU-0") == (2, 8000, 50)  # the init's 8000 at peak, two regular slots


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pod_releases(phase: str) -> None:
    cache, pods = cluster()
    placed = allocation([("GPU-0", 1000, 10)])
    pods.apply("MODIFIED", watched_pod("u1", "n1", placed))
    pods.apply("MODIFIED", watched_pod("u1", "n1", placed, phase=phase))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    delete(pods, "default", "pod-u1", "u1")  # the later delete is a no-op
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


@pytest.mark.parametrize("uid", ["u1", ""])
def test_deleted_pod_releases(uid: str) -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    delete(pods, "default", "pod-u1", uid)
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert cache.holding("u1") is None


def test_changed_annotation_is_re_accounted() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-1", 3000, 30)])))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert gpu_usage(cache, "GPU-1") == (1, 3000, 30)
    pods.apply(
        "MODIFIED", watched_pod("u1", "n1", allocation([("GPU-1", 3000, 30)]))
    )  # same again: unchanged
    assert gpu_usage(cache, "GPU-1") == (1, 3000, 30)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (watched_pod("u1", "n1", "GPU-0,NVIDIA,1000"), DEVICES_ALLOCATED),
        (watched_pod("u1", "N_1!", allocation([("GPU-0", 1000, 10)])), VGPU_NODE),
        (watched_pod("u1", "n1", "GPU-0,NVIDIA,x,0:;", key=DEVICES_TO_ALLOCATE), DEVICES_TO_ALLOCATE),
    ],
)
def test_bad_annotation_skips_pod_with_logged_reason(
    pod: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    with caplog.at_level(logging.WARNING, logger="hami_control.cache"):
        pods.apply("MODIFIED", pod)
        pods.apply("MODIFIED", pod)  # the same reason is logged once
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0] and "default/pod-u1" in warnings[0]


def test_bad_spec_skips_pod() -> None:
    cache, pods = cluster()
    pod = watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)]))
    pod["spec"]["containers"] = "nope"
    pods.apply("MODIFIED", pod)
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


def test_pod_without_uid_ignored() -> None:
    cache, pods = cluster()
    pod = watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)]))
    del pod["metadata"]["uid"]
    pods.apply("MODIFIED", pod)
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


def test_slices_on_unknown_gpu_ignored_and_never_negative() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-zz", 1000, 10)])))
    delete(pods, "default", "pod-u1", "u1")
    delete(pods, "default", "pod-u1", "u1")
    delete(pods, "default", "never", "u9")
    pods.forget("u9")
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


# --- assumptions ---------------------------------------------------------------------------------------


def test_assumed_pod_counts_from_bind() -> None:
    cache, pods = cluster()
    pods.assume(
        "u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=100.0, namespace="default", name="pod-u1"
    )
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    holding = cache.holding("u1")
    assert holding is not None and holding.assumed
    assert cache.stats().assumed == 1


def test_watch_event_replaces_assumption() -> None:
    cache, pods = cluster()
    placed = allocation([("GPU-0", 1000, 10)])
    pods.assume("u1", "n1", placed, (), now=100.0)
    pods.apply("MODIFIED", watched_pod("u1", "n1", placed))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    holding = cache.holding("u1")
    assert holding is not None and not holding.assumed
    assert pods.expire(now=10_000.0, ttl=30.0) == []  # confirmed: nothing to expire
    pods.forget("u1")  # a confirmed pod is left alone
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)


def test_watch_event_with_other_allocation_replaces_assumption() -> None:
    cache, pods = cluster()
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=100.0)
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-1", 2000, 0)])))
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert gpu_usage(cache, "GPU-1") == (1, 2000, 0)


def test_stale_watch_event_keeps_assumption() -> None:
    cache, pods = cluster()
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=100.0)
    pods.apply("MODIFIED", watched_pod("u1", None))  # the pre-bind copy of the pod
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)


def test_confirmed_assumption_does_not_come_back() -> None:
    cache, pods = cluster()
    placed = allocation([("GPU-0", 1000, 10)])
    pods.assume("u1", "n1", placed, (), now=1.0)
    pods.apply("MODIFIED", watched_pod("u1", "n1", placed))
    pods.apply("MODIFIED", watched_pod("u1", None))  # annotations removed later: nothing left to count
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


def test_assume_on_confirmed_pod_is_ignored() -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)])))
    pods.assume("u1", "n1", allocation([("GPU-1", 1000, 10)]), (), now=1.0)
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)
    assert gpu_usage(cache, "GPU-1") == (0, 0, 0)


def test_assume_twice_keeps_latest() -> None:
    cache, pods = cluster()
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=1.0)
    pods.assume("u1", "n1", allocation([("GPU-1", 500, 0)]), (), now=2.0)
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert gpu_usage(cache, "GPU-1") == (1, 500, 0)


def test_forget_releases_assumption() -> None:
    cache, pods = cluster()
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=1.0)
    pods.forget("u1")
    pods.forget("u1")
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert cache.holding("u1") is None and cache.stats().pods == 0


def test_assumed_init_peak() -> None:
    cache, pods = cluster()
    pods.assume(
        "u1", "n1", allocation([("GPU-0", 4000, 0)], [("GPU-0", 1000, 0)]), (ContainerKind.INIT,), now=1.0
    )
    assert gpu_usage(cache, "GPU-0") == (1, 4000, 0)


def test_expire_only_old_unconfirmed_assumptions() -> None:
    cache, pods = cluster()
    pods.assume("old", "n1", allocation([("GPU-0", 1000, 10)]), (), now=100.0)
    pods.assume("new", "n1", allocation([("GPU-1", 1000, 10)]), (), now=125.0)
    assert pods.expire(now=130.0, ttl=30.0) == []
    assert pods.expire(now=131.0, ttl=30.0) == ["old"]
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)
    assert gpu_usage(cache, "GPU-1") == (1, 1000, 10)


@pytest.mark.parametrize("how", ["terminal", "deleted"])
def test_terminal_or_deleted_releases_assumption(how: str) -> None:
    cache, pods = cluster()
    pods.apply("MODIFIED", watched_pod("u1", None))
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=1.0)
    if how == "terminal":
        pods.apply("MODIFIED", watched_pod("u1", None, phase="Failed"))
    else:
        delete(pods, "default", "pod-u1", "")
    assert gpu_usage(cache, "GPU-0") == (0, 0, 0)


def test_assumption_on_unregistered_node_counts_when_it_registers() -> None:
    cache, pods = cluster(registered=False)
    pods.assume("u1", "n1", allocation([("GPU-0", 1000, 10)]), (), now=1.0)
    cache.node_upserted(node("n1", [G0]))
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10)


# --- property: incremental == from scratch -------------------------------------------------------------

NODES = ("n1", "n2", "n3")
UUIDS = ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-gone")
INVENTORY = tuple(gpu_info(i, id=u, count=4) for i, u in enumerate(UUIDS[:4]))
UIDS = ("u1", "u2", "u3")


@dataclass(frozen=True)
class Op:
    kind: str
    target: str
    payload: Any = None


slice_st = st.builds(
    lambda u, m, c: (u, m, c),
    st.sampled_from(UUIDS),
    st.integers(0, 20000),
    st.integers(0, 100),
)
allocation_st = st.lists(st.lists(slice_st, max_size=3), min_size=1, max_size=4).map(
    lambda cs: allocation(*cs)
)


@st.composite
def node_op(draw: st.DrawFn) -> Op:
    name = draw(st.sampled_from(NODES))
    if draw(st.integers(0, 5)) == 0:
        return Op("node_del", name)
    gpus = draw(st.lists(st.sampled_from(INVENTORY), unique=True, max_size=4))
    register = draw(st.sampled_from(["json", "legacy", "bad", "none"]))
    text = {
        "json": encode_node_register(gpus),
        "legacy": encode_node_register_legacy(gpus) if gpus else "[]",
        "bad": "nonsense",
        "none": None,
    }[register]
    allocatable = draw(st.sampled_from(["8", "0", None]))
    cordon = ",".join(draw(st.lists(st.sampled_from(UUIDS), max_size=2)))
    scores = draw(
        st.sampled_from([None, "bad", encode_pair_scores([GPUPairScore.of("GPU-a", {"GPU-b": 60})])])
    )
    annotations = {DEVICE_CORDON: cordon} | ({NODE_PAIR_SCORE: scores} if scores is not None else {})
    slots = {"nvidia.com/gpu": allocatable} if allocatable is not None else {}
    doc = node(name, register=text, annotations=annotations, allocatable={"cpu": "4", **slots})
    return Op("node_up", name, doc)


@st.composite
def pod_op(draw: st.DrawFn) -> Op:
    uid = draw(st.sampled_from(UIDS))
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return Op("pod_del", uid, draw(st.booleans()))
    if choice == 1:
        return Op("forget", uid)
    if choice == 2:
        return Op("expire", uid, draw(st.integers(0, 5)))
    placed = draw(allocation_st)
    inits = draw(st.integers(0, len(placed)))
    node = draw(st.sampled_from(NODES))
    if choice <= 4:
        return Op("assume", uid, (node, placed, inits))
    vgpu_node = draw(st.sampled_from([node, node, None, "BAD NODE"]))
    text: str | PodAllocation = placed if draw(st.integers(0, 5)) else "broken"
    key = draw(st.sampled_from([DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE]))
    phase = draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded", "Failed"]))
    doc = watched_pod(uid, vgpu_node, text, inits=inits, regular=len(placed) - inits, phase=phase, key=key)
    return Op("pod_up", uid, doc)


ops_st = st.lists(st.one_of(node_op(), pod_op()), min_size=5, max_size=60)
_A = PodAllocation((ContainerAllocation((GPUSlice("GPU-a", 1, 1),)),))
_CONFIRM_THEN_STALE = [
    Op("assume", "u1", ("n1", _A, 0)),
    Op("pod_up", "u1", watched_pod("u1", "n1", _A)),
    Op("pod_up", "u1", watched_pod("u1", None, _A)),
]

_TERMINAL_THEN_ASSUMED_THEN_DELETED_BY_NAME = [  # found by hypothesis: the name must still map to the uid
    Op("pod_up", "u1", watched_pod("u1", "n1", "broken", phase="Succeeded")),
    Op("assume", "u1", ("n1", PodAllocation((ContainerAllocation(()),)), 0)),
    Op("pod_del", "u1", False),
]


class Model:
    """The from-scratch view: latest objects and live assumptions, recomputed on demand."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.assumed: dict[str, tuple[str, tuple[GPUSlice, ...], float]] = {}

    def observed(self, uid: str) -> tuple[str, tuple[GPUSlice, ...]] | None:
        pod = self.pods.get(uid)
        if pod is None or pod["status"]["phase"] in ("Succeeded", "Failed"):
            return None
        ann = pod["metadata"]["annotations"]
        node = ann.get(VGPU_NODE)
        if node is None or node == "BAD NODE":
            return None
        text = ann.get(DEVICES_ALLOCATED) or ann.get(DEVICES_TO_ALLOCATE) or ""
        if text == "broken":
            return None
        return node, peak(decode_pod_allocation(text), len(pod["spec"].get("initContainers", ())))

    def apply(self, op: Op, now: float) -> None:
        if op.kind == "node_up":
            self.nodes[op.target] = op.payload
        elif op.kind == "node_del":
            self.nodes.pop(op.target, None)
        elif op.kind == "pod_up":
            self.pods[op.target] = op.payload
            if op.payload["status"]["phase"] in ("Succeeded", "Failed") or self.observed(op.target):
                self.assumed.pop(op.target, None)
        elif op.kind == "pod_del":
            if op.payload or op.target in self.pods:  # by name finds only pods a watch has shown
                self.pods.pop(op.target, None)
                self.assumed.pop(op.target, None)
        elif op.kind == "assume":
            if self.observed(op.target) is None:
                node, placed, inits = op.payload
                self.assumed[op.target] = (node, peak(placed, inits), now)
        elif op.kind == "forget":
            self.assumed.pop(op.target, None)
        elif op.kind == "expire":
            for uid, (_, _, at) in list(self.assumed.items()):
                if now - at > op.payload:
                    del self.assumed[uid]

    def counted(self, uid: str) -> tuple[str, tuple[GPUSlice, ...]] | None:
        held = self.observed(uid)
        if held is None and uid in self.assumed:
            held = self.assumed[uid][:2]
        return held

    def expected(self) -> dict[str, NodeGPUs]:
        out: dict[str, NodeGPUs] = {}
        for name, doc in self.nodes.items():
            ann = doc["metadata"]["annotations"]
            if doc["status"]["allocatable"].get("nvidia.com/gpu") in (None, "0"):
                continue
            try:
                gpus = decode_node_register(ann[NODE_REGISTER])
            except (KeyError, WireFormatError):
                continue
            try:
                pairs = decode_pair_scores(ann[NODE_PAIR_SCORE]) if NODE_PAIR_SCORE in ann else ()
            except WireFormatError:
                pairs = ()
            cordon = [u.strip() for u in ann.get(DEVICE_CORDON, "").split(",") if u.strip()]
            out[name] = NodeGPUs.of(name, gpus, cordon, pairs)
        for uid in set(self.pods) | set(self.assumed):
            held = self.counted(uid)
            if held is not None and held[0] in out:
                out[held[0]] = with_slices(out[held[0]], held[1])
        return out


def check(cache: ClusterCache, model: Model) -> None:
    for uid in UIDS:
        holding = cache.holding(uid)
        assert (None if holding is None else (holding.node, holding.slices)) == model.counted(uid)
    expected = model.expected()
    assert set(cache.nodes()) == set(expected)
    for name, want in expected.items():
        got = cache.node_gpus(name)
        assert got is not None
        assert got.gpus == want.gpus
        assert got.pair_scores == want.pair_scores
        for g in got.gpus:
            assert g.used >= 0 and g.usedmem >= 0 and g.usedcores >= 0


@settings(max_examples=400, deadline=None)
@given(ops_st)
@example(_CONFIRM_THEN_STALE)
@example(_TERMINAL_THEN_ASSUMED_THEN_DELETED_BY_NAME)
def test_incremental_usage_equals_recomputation(ops: list[Op]) -> None:
    (cache, pods), model = cluster(registered=False), Model()
    for step, op in enumerate(ops):
        now = float(step)
        model.apply(op, now)
        if op.kind == "node_up":
            cache.node_upserted(op.payload)
        elif op.kind == "pod_up":
            pods.apply("MODIFIED", op.payload)
        elif op.kind == "node_del":
            cache.node_deleted(op.target)
        elif op.kind == "pod_del":
            delete(pods, "default", f"pod-{op.target}", op.target if op.payload else "")
        elif op.kind == "assume":
            node, placed, inits = op.payload
            pods.assume(op.target, node, placed, init_kinds(inits, len(placed)), now)
        elif op.kind == "forget":
            pods.forget(op.target)
        elif op.kind == "expire":
            pods.expire(now, op.payload)
        check(cache, model)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(UIDS), allocation_st, st.booleans()), max_size=30))
def test_release_in_any_order_returns_to_zero(events: list[tuple[str, PodAllocation, bool]]) -> None:
    cache, pods = cluster(registered=False)
    cache.node_upserted(node("n1", INVENTORY))
    for uid, placed, assumed in events:
        if assumed:
            pods.assume(uid, "n1", placed, (), 0.0)
        else:
            pods.apply("MODIFIED", watched_pod(uid, "n1", placed, regular=len(placed)))
    for uid in reversed(UIDS):
        delete(pods, "default", f"pod-{uid}", uid)
        pods.forget(uid)
    gpus = cache.node_gpus("n1")
    assert gpus is not None
    assert all((g.used, g.usedmem, g.usedcores) == (0, 0, 0) for g in gpus.gpus)
    assert cache.stats().pods == 0


# --- records, deletes by name, listeners ---------------------------------------------------------------


def test_one_record_per_uid_found_by_uid_and_by_name() -> None:
    _, pods = cluster()
    pods.apply("ADDED", asking_pod("u1", version="1"))
    pods.apply("MODIFIED", asking_pod("u1", version="2"))
    record = pods.get("u1")
    assert len(pods) == 1 and record is not None and record.resource_version == "2"
    assert pods.find("ns", "pod-u1") is record and pods.find("ns", "other") is None
    assert (record.namespace, record.name, record.phase, record.asks_gpu) == ("ns", "pod-u1", "Pending", True)
    assert record.requests == tuple(r for r, _ in record.container_requests) and len(record.requests) == 1


def test_pod_without_uid_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    _, pods = cluster()
    pod = asking_pod("u1")
    del pod["metadata"]["uid"]
    with caplog.at_level(logging.WARNING, logger="hami_control.pod_store"):
        pods.apply("ADDED", pod)
    assert len(pods) == 0 and pods.used("ns") == QuotaUsage()
    assert any("without metadata.uid" in r.getMessage() for r in caplog.records)


def test_a_terminal_pod_stays_until_deleted_and_a_delete_by_name_finds_its_uid() -> None:
    _, pods = cluster()
    seen: list[tuple[str | None, str | None]] = []
    pods.add_listener(lambda old, new: seen.append((old and old.phase, new and new.phase)))
    pods.apply("ADDED", asking_pod("u1"))
    pods.apply("MODIFIED", asking_pod("u1", phase="Succeeded"))
    assert pods.used("ns") == QuotaUsage() and pods.get("u1") is not None
    delete(pods, "ns", "pod-u1", "")  # the DELETED object carries no uid
    assert pods.get("u1") is None and pods.find("ns", "pod-u1") is None and len(pods) == 0
    delete(pods, "ns", "pod-u1", "")  # again: nothing left to find
    assert seen == [(None, "Pending"), ("Pending", "Succeeded"), ("Succeeded", None)]


def test_a_recreated_pod_of_the_same_name_is_a_new_record() -> None:
    _, pods = cluster()
    pods.apply("ADDED", asking_pod("old", name="p", mem=1000))
    delete(pods, "ns", "p", "old")
    pods.apply("ADDED", asking_pod("new", name="p", mem=3000))
    delete(pods, "ns", "p", "old")  # a late duplicate delete of the old pod leaves the new one
    record = pods.find("ns", "p")
    assert record is not None and record.uid == "new" and pods.used("ns") == QuotaUsage(3000, 0)


def test_listeners_see_a_relist_and_deletes_and_a_broken_listener_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, pods = cluster()
    calls: list[tuple[str, bool]] = []
    pods.add_listener(lambda old, new: calls.append(((new or old).uid if (new or old) else "", new is None)))
    pods.add_listener(
        lambda *_: (_ for _ in ()).throw(RuntimeError("a broken listener is logged, not raised"))
    )
    with caplog.at_level(logging.CRITICAL, logger="hami_control.pod_store"):
        pods.replace([watched_pod("u1"), watched_pod("u2")])
        pods.apply("DELETED", watched_pod("u1"))
    assert calls == [("u1", False), ("u2", False), ("u1", True)]


def test_a_relist_replaces_the_pods_and_tells_listeners_only_the_differences() -> None:
    cache, pods = cluster()
    placed = allocation([("GPU-0", 1000, 10)])
    pods.apply(
        "ADDED",
        dict(
            watched_pod("kept", "n1", placed),
            metadata={**watched_pod("kept", "n1", placed)["metadata"], "resourceVersion": "5"},
        ),
    )
    pods.apply("ADDED", watched_pod("gone", "n1", allocation([("GPU-1", 2000, 0)])))
    pods.assume("gone", "n1", allocation([("GPU-1", 2000, 0)]), (), now=1.0)
    pods.assume(
        "bound", "n1", allocation([("GPU-1", 500, 5)]), (), now=1.0, namespace="default", name="pod-bound"
    )
    changes: list[tuple[str | None, str | None]] = []
    pods.add_listener(lambda old, new: changes.append((old and old.uid, new and new.uid)))
    kept = watched_pod("kept", "n1", placed)
    kept["metadata"]["resourceVersion"] = "5"  # unchanged: no news
    pods.begin_replace()  # a list in two pages
    pods.add_page([kept])
    pods.add_page([asking_pod("new", namespace="default")])
    pods.end_replace()
    assert sorted(p.uid for p in pods.pods()) == ["kept", "new"]
    assert changes == [("gone", None), (None, "new")]
    assert cache.holding("gone") is None  # gone from the list: its assumption too
    bound = cache.holding("bound")  # known only through `assume`: its bind may be in flight
    assert bound is not None and bound.assumed
    assert gpu_usage(cache, "GPU-0") == (1, 1000, 10) and gpu_usage(cache, "GPU-1") == (1, 500, 5)
    delete(pods, "default", "pod-bound", "")  # still found by name
    assert cache.holding("bound") is None


# --- quota usage and the webhook's admissions ----------------------------------------------------------


def test_quota_totals_follow_each_event_and_terminal_pods_do_not_count() -> None:
    _, pods = cluster()
    pods.apply("ADDED", asking_pod("a", mem=1000))
    pods.apply("ADDED", asking_pod("b", mem=2000))
    pods.apply("ADDED", asking_pod("c", namespace="other", mem=500))
    assert pods.used("ns") == QuotaUsage(3000, 0) and pods.used("other") == QuotaUsage(500, 0)
    pods.apply("MODIFIED", asking_pod("b", phase="Failed"))
    assert pods.used("ns") == QuotaUsage(1000, 0)
    delete(pods, "ns", "pod-a", "a")
    assert pods.used("ns") == QuotaUsage()


def test_an_allocated_pod_counts_its_allocation_and_a_bad_one_its_request() -> None:
    _, pods = cluster()
    pod = asking_pod("a", mem=4000)
    pod["metadata"]["annotations"][DEVICES_ALLOCATED] = encode_pod_allocation(
        allocation([("GPU-0", 3000, 20)])
    )
    pods.apply("ADDED", pod)
    assert pods.used("ns") == QuotaUsage(3000, 20)
    pod["metadata"]["annotations"][DEVICES_ALLOCATED] = "not an placed"
    pods.apply("MODIFIED", pod)
    assert pods.used("ns") == QuotaUsage(4000, 0)


def test_a_pod_whose_resources_do_not_parse_counts_nothing_and_says_why() -> None:
    _, pods = cluster()
    pod = asking_pod("a")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    pods.apply("ADDED", pod)
    record = pods.get("a")
    assert record is not None and record.container_requests == () and pods.used("ns") == QuotaUsage()
    with pytest.raises(ExtenderArgsError) as raised:
        read_pod_ask(pod, CONFIG)
    assert record.request_error == str(raised.value) and "'lots'" in record.request_error
    with pytest.raises(ExtenderArgsError, match="'lots'"):
        record.ask(CONFIG)


def test_admissions_count_until_the_watch_shows_the_pod_or_their_ttl_ends() -> None:
    now = [100.0]
    pods = PodStore(CONFIG, ClusterCache(), assume_ttl_s=60.0, clock=lambda: now[0])
    pods.admit("ns", "a", "", QuotaUsage(1000, 10))
    pods.admit("ns", "", "web-", QuotaUsage(2000, 0))
    pods.admit("ns", "", "web-", QuotaUsage(3000, 0))
    pods.admit("ns", "free", "", QuotaUsage())  # asks nothing: not counted
    assert pods.admitted("ns") == 3 and pods.used("ns") == QuotaUsage(6000, 10)
    pods.apply("ADDED", asking_pod("ua", name="a", mem=1000))  # seen by name: the watch counts it now
    assert pods.admitted("ns") == 2 and pods.used("ns") == QuotaUsage(6000, 0)
    web = asking_pod("uw", name="web-x1", mem=2000)
    web["metadata"]["generateName"] = "web-"
    pods.apply("ADDED", web)  # one of the generateName admissions, oldest first
    assert pods.admitted("ns") == 1 and pods.used("ns") == QuotaUsage(3000 + 3000, 0)
    pods.admit("ns", "a", "", QuotaUsage(9999, 0))  # visible already: never counted twice
    assert pods.admitted("ns") == 1
    now[0] += 60.0
    assert pods.admitted("ns") == 0 and pods.used("ns") == QuotaUsage(3000, 0)


def test_a_relist_drops_the_admissions_of_the_pods_it_shows() -> None:
    pods = PodStore(CONFIG, ClusterCache())
    pods.admit("ns", "a", "", QuotaUsage(1000, 0))
    pods.replace([asking_pod("ua", name="a", mem=1000)])
    assert pods.admitted("ns") == 0 and pods.used("ns") == QuotaUsage(1000, 0)


# --- the ask, rebuilt from the record ------------------------------------------------------------------


def test_the_ask_from_a_record_is_the_ask_read_from_the_pod() -> None:
    pod = asking_pod("a", annotations={GPU_SCHEDULER_POLICY: "binpack", "nvidia.com/use-gputype": "A100"})
    pod["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    record = pod_record(pod, CONFIG)
    assert record.ask(CONFIG) == read_pod_ask(pod, CONFIG)
    assert record.sidecars == frozenset({0}) and record.init_containers == 1
    plain = asking_pod("b")
    plain["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert pod_record(plain, CONFIG).ask(CONFIG) is None and read_pod_ask(plain, CONFIG) is None


def test_a_bad_policy_annotation_still_counts_quota_but_the_ask_says_why() -> None:
    pod = asking_pod("a", annotations={GPU_SCHEDULER_POLICY: "sideways"})
    _, pods = cluster()
    pods.apply("ADDED", pod)
    record = pods.get("a")
    assert record is not None and pods.used("ns") == QuotaUsage(4000, 0)
    with pytest.raises(ExtenderArgsError) as from_pod:
        read_pod_ask(pod, CONFIG)
    with pytest.raises(ExtenderArgsError) as from_record:
        record.ask(CONFIG)
    assert str(from_record.value) == str(from_pod.value)


def test_the_bind_phase_is_kept_and_the_allocation_only_decoded() -> None:
    pod = watched_pod("u1", "n1", allocation([("GPU-0", 1000, 10)]))
    pod["metadata"]["annotations"][BIND_PHASE] = "allocating"
    record: PodRecord = pod_record(pod, CONFIG)
    assert record.annotations == {VGPU_NODE: "n1", BIND_PHASE: "allocating"}
    assert record.held is not None and record.held.node == "n1"


def test_records_share_what_did_not_change_and_pods_asking_alike_share_their_requests() -> None:
    cache, pods = cluster()
    pods.apply("ADDED", asking_pod("a", mem=4000))
    pods.apply("ADDED", asking_pod("b", mem=4000))
    a, b = pods.get("a"), pods.get("b")
    assert a is not None and b is not None and a.container_requests is b.container_requests
    bound = watched_pod("c", "n1", allocation([("GPU-0", 1000, 10)]))
    pods.apply("ADDED", bound)
    bound["metadata"]["annotations"][BIND_PHASE] = "success"
    pods.apply("MODIFIED", bound)  # a new bind phase, the same allocation
    c, held = pods.get("c"), cache.holding("c")
    assert c is not None and c.held is not None and held is not None
    assert c.held.slices is held.slices and c.annotations[BIND_PHASE] == "success"


# --- CPU requested per node (--fragmentation-filter best) ---------------------------------------------------


def cpu_pod(uid: str, node: str, cpu: str | None, phase: str = "Running", **spec: Any) -> dict[str, Any]:
    requests = {} if cpu is None else {"cpu": cpu}
    return {
        "metadata": {"namespace": "ns", "name": uid, "uid": uid, "resourceVersion": "1"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": requests}}],
            **spec,
        },
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (
            {
                "containers": [
                    {"resources": {"requests": {"cpu": "1.5"}}},
                    {"resources": {"requests": {"cpu": "250m"}}},
                ]
            },
            1750,
        ),
        ({"containers": [{"resources": {}}]}, 0),
        ({"containers": [{"resources": {"requests": {"cpu": "bad"}}}]}, 0),
        # An init container asking more than the containers sets the pod's request; a sidecar adds to both.
        (
            {
                "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                "initContainers": [
                    {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                    {"resources": {"requests": {"cpu": "3"}}},
                ],
            },
            3500,
        ),
        ({"containers": [{"resources": {"requests": {"cpu": "1"}}}], "overhead": {"cpu": "100m"}}, 1100),
    ],
)
def test_the_pods_cpu_request_is_what_kube_scheduler_counts(spec: dict[str, Any], want: int) -> None:
    assert pod_cpu_milli({"spec": spec}) == want


def test_the_cpu_requested_per_node_follows_binds_updates_ends_deletes_and_relists() -> None:
    _, pods = cluster(config=CONFIG.with_settings(fragmentation_filter=FragmentationFilter.BEST))
    pods.apply("ADDED", cpu_pod("a", "n1", "2"))
    pods.apply("ADDED", cpu_pod("b", "n1", "500m"))
    pods.apply("ADDED", cpu_pod("pending", "", "4"))  # not bound: counts nowhere
    assert pods.node_cpu_requested("n1") == 2500
    pods.apply("MODIFIED", cpu_pod("pending", "n2", "4"))
    assert pods.node_cpu_requested("n2") == 4000
    pods.apply("MODIFIED", cpu_pod("a", "n1", "2", phase="Succeeded"))
    assert pods.node_cpu_requested("n1") == 500
    delete(pods, "ns", "b", "b")
    assert pods.node_cpu_requested("n1") == 0
    pods.replace([cpu_pod("c", "n1", "1")])
    assert (pods.node_cpu_requested("n1"), pods.node_cpu_requested("n2")) == (1000, 0)


def test_the_cpu_per_node_is_not_counted_unless_the_fragmentation_filter_is_best() -> None:
    _, pods = cluster()  # --fragmentation-filter all, the default: no user of it
    pods.apply("ADDED", cpu_pod("a", "n1", "2"))
    assert pods.node_cpu_requested("n1") == 0
